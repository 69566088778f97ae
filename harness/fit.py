"""``python -m harness.fit <results> [--b G|W|min] [--w-eq-g]``: fit the paper's scaling law.

The law and the fit live in :mod:`harness.analysis.fit`, the bootstrap over prompts in
:mod:`harness.analysis.uncertainty` (``--resamples``, ``--seed``, ``--level``). This entry point prints
the fit table (alpha, f with asymptotic SEs and bootstrap SEs/CIs, R^2, beside the paper's) and the
log2-FLOPs slope per N (OLS SE and bootstrap CI), and writes ``fit.{csv,md}``, ``fit_trend.csv``,
``fit_points.csv`` (per-config S with its CI) and one paper-style figure per fitted group.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from harness.analysis import plots
from harness.analysis.fit import B_CHOICES, fit_per_group, loglinear_trend, render_fit
from harness.analysis.io import default_out, make_parser, save_figure, write_outputs
from harness.analysis.uncertainty import (
    CI_NOTE, add_fit_cis, bootstrap_fits, bootstrap_trend, config_point_cis,
)
from harness.records import RecordsError, load_records


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.fit <results dir> [--out DIR] [--b G|W|min]``."""
    parser = make_parser("Fit the lookahead scaling law (alpha, f) and the log-FLOPs trend.", "harness.fit")
    parser.add_argument("--b", choices=sorted(B_CHOICES), default="G", help="parameter used as b in Eq. 5")
    parser.add_argument("--w-eq-g", action="store_true", help="fit only W == G configs")
    args = parser.parse_args(argv)
    b, boot = args.b, dict(n_resamples=args.resamples, seed=args.seed, level=args.level)
    try:
        df = load_records(args.results)
    except RecordsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    table, fits = fit_per_group(df, b, args.w_eq_g)
    if table.empty:
        print("error: no lookahead records with W/N/G params found; nothing to fit", file=sys.stderr)
        return 2
    cis, fits = bootstrap_fits(df, fits, **boot)
    table = add_fit_cis(table, cis)
    trend = bootstrap_trend(df, loglinear_trend(df), **boot)
    note = ("alpha_boot_se, alpha_lo/hi, f_boot_se, f_lo/hi, slope_boot_se, slope_lo/hi: bootstrap over examples "
            "(every config's S and FLOPs/step recomputed, the law and the slopes refitted). "
            + CI_NOTE.format(level=args.level, n=args.resamples, seed=args.seed))
    text = render_fit(table, trend, b, note)
    print(text)
    out = args.out or default_out(args.results)
    written = write_outputs(table, text, out, "fit")
    trend.to_csv(out / "fit_trend.csv", index=False)
    config_point_cis(df, **boot).to_csv(out / "fit_points.csv", index=False)
    for fit, ci in zip(fits, cis.to_dict("records")):
        g = fit.group
        name = f"scaling_{g['model']}_{g['task']}_T{g['temperature']:g}_pool{g['pool_from_prompt']}.png"
        written.append(save_figure(plots.scaling_figure(fit, ci=ci), out / name))
    for path in written + [out / "fit_trend.csv", out / "fit_points.csv"]:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
