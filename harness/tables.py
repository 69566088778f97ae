"""``python -m harness.tables {ablation,sampling} <results> [--out DIR]``: the paper's tables beside ours.

The tables are built by :mod:`harness.analysis.tables` (paper values and definitions there).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.analysis import plots
from harness.analysis.io import default_out, make_parser, save_figure, to_markdown, write_outputs
from harness.analysis.tables import NOTES, ablation_table, sampling_table
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
    try:
        df = load_records(args.results)
        table = ablation_table(df, task=args.task) if args.table == "ablation" else sampling_table(df)
    except (RecordsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = f"## {args.table}\n\n{to_markdown(table)}\n\n{NOTES[args.table]}\n"
    print(text)
    out = Path(args.out or default_out(args.results))
    written = write_outputs(table, text, out, args.table)
    if args.table == "ablation":
        written.append(save_figure(plots.ablation_figure(table), out / "ablation.png"))
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
