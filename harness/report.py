"""``python -m harness.report <results> [--out DIR]``: the summary table per task and decoder config.

The table is built by :mod:`harness.analysis.report` (definitions there); this entry point reads the
records, prints one Markdown table per (model, dtype, device) and writes ``report.csv``/``report.md``
and the speedup / accepted-length figures.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from harness.analysis import plots
from harness.analysis.io import default_out, make_parser, save_figure, write_outputs
from harness.analysis.report import build_report, render_report
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
    text = render_report(report)
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
