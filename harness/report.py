"""``python -m harness.report <results> [--out DIR]``: the summary table per task and decoder config.

The table is built by :mod:`harness.analysis.report` (definitions there) and its bootstrap intervals
by :mod:`harness.analysis.uncertainty` (``--resamples``, ``--seed``, ``--level``): this entry point reads
the records, prints one Markdown table per (model, dtype, device) with S, speedup_agg and every score
shown as ``value [lo, hi]``, and writes ``report.csv`` (numbers, with the ``S_lo``/``S_hi``,
``speedup_agg_lo``/``_hi`` and ``score_*_lo``/``_hi`` columns), ``report.md`` and the speedup /
accepted-length figures.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from harness.analysis import plots
from harness.analysis.io import default_out, make_parser, save_figure, with_ci_text, write_outputs
from harness.analysis.report import build_report, render_report
from harness.analysis.uncertainty import CI_NOTE, add_report_cis
from harness.records import RecordsError, load_records


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns a process exit code (2 on unreadable/missing records)."""
    args = make_parser("Speed/quality summary per task and decoder config.", "harness.report").parse_args(argv)
    try:
        df = load_records(args.results)
        report = build_report(df)
    except RecordsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    report = add_report_cis(df, report, args.resamples, args.seed, args.level)
    shown = with_ci_text(report, ["S", "speedup_agg", *(c for c in report.columns if c.startswith("score_"))])
    text = render_report(shown) + "\n" + CI_NOTE.format(level=args.level, n=args.resamples, seed=args.seed) + "\n"
    print(text)
    out = Path(args.out or default_out(args.results))
    written = write_outputs(report, text, out, "report")
    written.append(save_figure(plots.speedup_figure(report), out / "speedup_S.png"))
    written.append(save_figure(plots.accepted_hist_figure(df), out / "accepted_hist.png"))
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
