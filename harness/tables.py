"""``python -m harness.tables {ablation,sampling} <results> [--out DIR]``: the paper's tables beside ours.

The tables are built by :mod:`harness.analysis.tables` (paper values and definitions there), their
intervals by :mod:`harness.analysis.uncertainty` (``--resamples``, ``--seed``, ``--level``).

* ``ablation`` prints and writes ``ablation.{md,csv,png}``: S and speedup with CIs beside the paper's,
  the rank agreement (Kendall tau) in ``ablation_agreement.csv`` and the row pairs with the paired CI
  of their S difference (separated or not) in ``ablation_pairs.csv``.
* ``sampling`` prints and writes ``sampling.{md,csv}``: ROUGE, S, speedup with CIs, the paired CI of
  each ROUGE difference and one verdict per dataset and temperature.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.analysis import plots
from harness.analysis.io import default_out, make_parser, save_figure, write_outputs
from harness.analysis.tables import (
    ablation_table, rank_agreement, render_ablation, render_sampling, sampling_table, separated_pairs,
)
from harness.analysis.uncertainty import CI_NOTE
from harness.records import RecordsError, load_records


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.tables {ablation,sampling} <results dir> [--out DIR]``."""
    parser = argparse.ArgumentParser(prog="harness.tables", description="Paper-comparison tables.")
    sub = parser.add_subparsers(dest="table", required=True)
    for name in ("ablation", "sampling"):
        p = sub.add_parser(name, parents=[make_parser("", None)], add_help=False, conflict_handler="resolve")
        if name == "ablation":
            p.add_argument("--task", default=None, help="task to tabulate (default: where ablation configs ran)")
    args = parser.parse_args(argv)
    boot = dict(n_resamples=args.resamples, seed=args.seed, level=args.level)
    note = CI_NOTE.format(level=args.level, n=args.resamples, seed=args.seed)
    try:
        df = load_records(args.results)
        if args.table == "ablation":
            table = ablation_table(df, task=args.task, **boot)
            agreement, pairs = rank_agreement(table), separated_pairs(df, table, **boot)
            text = render_ablation(table, agreement, pairs, note)
        else:
            table = sampling_table(df, **boot)
            text = render_sampling(table, note)
    except (RecordsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(text)
    out = Path(args.out or default_out(args.results))
    written = write_outputs(table, text, out, args.table)
    if args.table == "ablation":
        for frame, stem in ((agreement, "ablation_agreement"), (pairs, "ablation_pairs")):
            frame.to_csv(out / f"{stem}.csv", index=False)
            written.append(out / f"{stem}.csv")
        written.append(save_figure(plots.ablation_figure(table), out / "ablation.png"))
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
