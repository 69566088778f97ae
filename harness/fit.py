"""``python -m harness.fit <results> [--b G|W|min] [--w-eq-g]``: fit the paper's scaling law.

The law and the fit live in :mod:`harness.analysis.fit`; this entry point prints the fit table and the
log-FLOPs trend and writes them with one figure per fitted group.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from harness.analysis import plots
from harness.analysis.fit import (
    B_CHOICES, config_points, fit_per_group, loglinear_trend, render_fit,
)
from harness.analysis.io import default_out, make_parser, save_figure, write_outputs
from harness.records import RecordsError, load_records


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.fit <results dir> [--out DIR] [--b G|W|min]``."""
    parser = make_parser("Fit the lookahead scaling law (alpha, f) and the log-FLOPs trend.", "harness.fit")
    parser.add_argument("--b", choices=sorted(B_CHOICES), default="G", help="parameter used as b in Eq. 5")
    parser.add_argument("--w-eq-g", action="store_true", help="fit only W == G configs")
    args = parser.parse_args(argv)
    b = args.b
    try:
        df = load_records(args.results)
    except RecordsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    table, fits = fit_per_group(df, b, args.w_eq_g)
    trend = loglinear_trend(df)
    if table.empty:
        print("error: no lookahead records with W/N/G params found; nothing to fit", file=sys.stderr)
        return 2
    text = render_fit(table, trend, b)
    print(text)
    out = args.out or default_out(args.results)
    written = write_outputs(table, text, out, "fit")
    trend.to_csv(out / "fit_trend.csv", index=False)
    config_points(df).to_csv(out / "fit_points.csv", index=False)
    for fit in fits:
        g = fit.group
        name = f"scaling_{g['model']}_{g['task']}_T{g['temperature']:g}_pool{g['pool_from_prompt']}.png"
        written.append(save_figure(plots.scaling_figure(fit), out / name))
    for path in written + [out / "fit_trend.csv", out / "fit_points.csv"]:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
