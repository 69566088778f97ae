"""Bootstrap confidence intervals over prompts, for every number the analysis prints.

The unit is one example of a task (``example_id``): its turns are resampled together, since
MT-Bench's second turn continues the first. A resample draws the n examples of a group with
replacement (``resample_weights``: multinomial counts, one row per resample), and every statistic
is a ratio of weighted sums over examples, so all resamples are computed at once as
``counts @ per-example sums`` (no Python loop over resamples):

* S = sum new tokens / sum steps: a ratio of sums (never a mean of per-prompt S);
* speedup = sum ar decode_s / sum decode_s over the prompts matched with ``ar``: paired, the same
  resampled prompts enter both sums;
* a mean score (ROUGE) = sum / count; a paired difference (lookahead - ar) is the same on the
  per-pair differences, so identical outputs give exactly [0, 0];
* the difference of S between two configs on their shared prompts (one set of counts for both).

Intervals are percentile intervals: 95%, 2000 resamples, seed 0 by default, so every CI is
reproducible. With fewer than 2 examples the bounds are NaN (one example has no spread to
resample). Percentile intervals are too narrow with very few prompts: read them beside the count.

Also here: the report's CI columns (``add_report_cis``), per-config S intervals for the scaling
points, the scaling law's bootstrap (resample prompts, recompute every config's S, refit alpha
and f: ``bootstrap_fits``, vectorised by ``profile_fit``) and the log2-FLOPs slope per N
(``bootstrap_trend``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from harness.analysis.fit import FIT_GROUP, ScalingFit, b_values, config_points, expected_tokens
from harness.analysis.report import GROUP_KEYS, attach_baseline

LEVEL = 0.95
N_RESAMPLES = 2000
SEED = 0
UNIT = "example_id"
#: alpha grid of ``profile_fit`` (refined between grid points by a parabola)
ALPHA_GRID = np.linspace(0.0005, 0.9995, 1000)
CI_NOTE = ("[lo, hi] = {level:.0%} percentile bootstrap CI over prompts (examples resampled with their "
           "turns; {n} resamples, seed {seed}); speedup and differences are paired on matched prompts.")


class CI(NamedTuple):
    """A point estimate with its bootstrap interval and standard error (NaN: too few examples)."""

    point: float
    lo: float
    hi: float
    se: float


def resample_weights(n: int, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> np.ndarray:
    """(n_resamples, n) counts: how often each of n examples is drawn in each resample."""
    rng = np.random.default_rng(seed)
    if n == 0:
        return np.zeros((n_resamples, 0), dtype=np.int64)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_resamples)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, np.asarray(num, float) / np.where(den != 0, den, 1.0), np.nan)


def interval(point: float, samples: np.ndarray, level: float = LEVEL) -> CI:
    """Percentile interval of bootstrap ``samples`` (NaN samples ignored) around ``point``."""
    samples = np.asarray(samples, float)
    samples = samples[np.isfinite(samples)]
    if len(samples) < 2:
        return CI(float(point), np.nan, np.nan, np.nan)
    lo, hi = np.percentile(samples, [50 * (1 - level), 50 * (1 + level)])
    return CI(float(point), float(lo), float(hi), float(samples.std(ddof=1)))


def ratio_ci(num: Sequence[float], den: Sequence[float], n_resamples: int = N_RESAMPLES,
             seed: int = SEED, level: float = LEVEL) -> CI:
    """CI of sum(num) / sum(den), resampling the examples (one entry of num/den per example)."""
    num, den = np.asarray(num, float), np.asarray(den, float)
    point = float(_ratio(num.sum(), den.sum()))
    if len(num) < 2:
        return CI(point, np.nan, np.nan, np.nan)
    w = resample_weights(len(num), n_resamples, seed)
    return interval(point, _ratio(w @ num, w @ den), level)


def ratio_diff_ci(num_a: Sequence[float], den_a: Sequence[float], num_b: Sequence[float],
                  den_b: Sequence[float], n_resamples: int = N_RESAMPLES, seed: int = SEED,
                  level: float = LEVEL) -> CI:
    """Paired CI of sum(num_a)/sum(den_a) - sum(num_b)/sum(den_b): both resampled with one set of counts."""
    a, da, b, db = (np.asarray(v, float) for v in (num_a, den_a, num_b, den_b))
    point = float(_ratio(a.sum(), da.sum()) - _ratio(b.sum(), db.sum()))
    if len(a) < 2:
        return CI(point, np.nan, np.nan, np.nan)
    w = resample_weights(len(a), n_resamples, seed)
    return interval(point, _ratio(w @ a, w @ da) - _ratio(w @ b, w @ db), level)


def mean_ci(frame: pd.DataFrame, col: str, n_resamples: int = N_RESAMPLES, seed: int = SEED,
            level: float = LEVEL) -> CI:
    """CI of the mean of ``col`` over records (NaN skipped), resampling examples with all their records."""
    values = pd.to_numeric(frame[col], errors="coerce")
    per = values.groupby(frame[UNIT]).agg(["sum", "count"])
    per = per[per["count"] > 0]
    return ratio_ci(per["sum"], per["count"], n_resamples, seed, level)


def with_ci(row: dict, name: str, ci: CI) -> dict:
    """``row`` plus ``<name>_lo`` and ``<name>_hi``."""
    return row | {f"{name}_lo": ci.lo, f"{name}_hi": ci.hi}


def insert_after(frame: pd.DataFrame, anchor: str, cols: Sequence[str]) -> pd.DataFrame:
    """Reorder so the present ``cols`` directly follow ``anchor`` (unchanged if it is absent)."""
    cols = [c for c in cols if c in frame.columns and c != anchor]
    order = [c for c in frame.columns if c not in cols]
    if anchor in order:
        at = order.index(anchor) + 1
        order[at:at] = cols
    else:
        order += cols
    return frame[order]


def place_after(frame: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """Reorder so ``<name>_lo``, ``<name>_hi`` follow ``<name>`` for each name."""
    for name in names:
        frame = insert_after(frame, name, [f"{name}_lo", f"{name}_hi"])
    return frame


# --------------------------------------------------------------------------- the report


def add_report_cis(df: pd.DataFrame, report: pd.DataFrame, n_resamples: int = N_RESAMPLES,
                   seed: int = SEED, level: float = LEVEL) -> pd.DataFrame:
    """``report`` (``build_report(df)``) with S_lo/S_hi, speedup_agg_lo/hi and score_*_lo/hi per row.

    Rows are the report's GROUP_KEYS groups; speedup_agg's interval resamples the prompts matched
    with ``ar`` (sum ar decode_s / sum decode_s on the same resampled prompts).
    """
    ok = attach_baseline(df)
    scores = [c for c in report.columns if c.startswith("score_") and c in ok.columns]
    rows = []
    for key, part in ok.groupby(list(GROUP_KEYS), dropna=False, sort=True):
        per = part.groupby(UNIT, sort=True)[["new_tokens", "steps", "ar_decode_s", "decode_s_matched"]].sum(min_count=1)
        row = with_ci(dict(zip(GROUP_KEYS, key)), "S", ratio_ci(per["new_tokens"], per["steps"], n_resamples, seed, level))
        matched = per.dropna(subset=["ar_decode_s", "decode_s_matched"])
        row = with_ci(row, "speedup_agg", ratio_ci(matched["ar_decode_s"], matched["decode_s_matched"],
                                                   n_resamples, seed, level))
        for col in scores:
            row = with_ci(row, col, mean_ci(part, col, n_resamples, seed, level))
        rows.append(row)
    ci_cols = [f"{n}{s}" for n in ("S", "speedup_agg", *scores) for s in ("_lo", "_hi")]
    cis = pd.DataFrame(rows).reindex(columns=[*GROUP_KEYS, *ci_cols])
    out = report.drop(columns=[c for c in ci_cols if c in report.columns]).merge(cis, on=list(GROUP_KEYS), how="left")
    return place_after(out, ["S", "speedup_agg", *scores])


# --------------------------------------------------------------------------- scaling law


def _in_group(df: pd.DataFrame, group: dict) -> pd.Series:
    mask = (df["decoder"] == "lookahead") & (df["status"] == "ok")
    for k, v in group.items():
        col = df[k] if k in df.columns else df.get(f"p_{k}", pd.Series(np.nan, index=df.index))
        mask &= col.isna() if pd.isna(v) else col == v
    return mask


def _resampled(df: pd.DataFrame, group: dict, configs: Sequence[str], n_resamples: int, seed: int
               ) -> tuple[np.ndarray, np.ndarray, int]:
    """Per-config S and FLOPs/step for each resample of the group's examples: two (resamples, configs) arrays."""
    part = df[_in_group(df, group) & df["config"].isin(configs)]

    def matrix(col: str) -> np.ndarray:
        return (part.pivot_table(index=UNIT, columns="config", values=col, aggfunc="sum", fill_value=0.0)
                .reindex(columns=list(configs), fill_value=0.0).to_numpy(float))
    tokens, steps = matrix("new_tokens"), matrix("steps")
    w = resample_weights(len(tokens), n_resamples, seed)
    s_steps = w @ steps
    return _ratio(w @ tokens, s_steps), _ratio(w @ matrix("flops"), s_steps), len(tokens)


def profile_fit(S: np.ndarray, gamma: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares (alpha, f) of the law for every row of S (rows x configs) at once.

    S - 1 = (E(alpha) - 1) / f is linear in c = 1/f at fixed alpha, so c has a closed form at each
    alpha of ALPHA_GRID (clipped to f >= 1); alpha is the grid minimum of the squared error, refined
    by a parabola through its neighbours. Rows with a NaN give NaN.
    """
    S = np.atleast_2d(np.asarray(S, float))
    z = S - 1.0
    e = expected_tokens(ALPHA_GRID[:, None], np.asarray(gamma)[None, :], np.asarray(b)[None, :]) - 1.0
    cross, norm = np.nan_to_num(z) @ e.T, (e**2).sum(1)
    c = np.clip(cross / norm, 1e-12, 1.0)
    sse = (np.nan_to_num(z) ** 2).sum(1)[:, None] - 2 * c * cross + c**2 * norm
    i = sse.argmin(1)
    j = np.clip(i, 1, len(ALPHA_GRID) - 2)
    rows = np.arange(len(S))
    y0, y1, y2 = sse[rows, j - 1], sse[rows, j], sse[rows, j + 1]
    curv = y0 - 2 * y1 + y2
    with np.errstate(divide="ignore", invalid="ignore"):
        shift = np.where((curv > 0) & (i == j), 0.5 * (y0 - y2) / curv, 0.0)
    alpha = ALPHA_GRID[i] + np.clip(shift, -1, 1) * (ALPHA_GRID[1] - ALPHA_GRID[0])
    e_hat = expected_tokens(alpha[:, None], np.asarray(gamma)[None, :], np.asarray(b)[None, :]) - 1.0
    f = 1.0 / np.clip((z * e_hat).sum(1) / (e_hat**2).sum(1), 1e-12, 1.0)
    bad = ~np.isfinite(S).all(1)
    return np.where(bad, np.nan, alpha), np.where(bad, np.nan, f)


def bootstrap_fits(df: pd.DataFrame, fits: Sequence[ScalingFit], n_resamples: int = N_RESAMPLES,
                   seed: int = SEED, level: float = LEVEL) -> tuple[pd.DataFrame, list[ScalingFit]]:
    """Per fit: FIT_GROUP + alpha/f bootstrap SE and CI (examples resampled, every config's S
    recomputed, the law refitted); and the fits with S_lo/S_hi on their points."""
    rows, out = [], []
    for fit in fits:
        pts = fit.points
        S, _, n = _resampled(df, fit.group, list(pts["config"]), n_resamples, seed)
        alpha, f = profile_fit(S, pts["gamma"].to_numpy(float), b_values(pts, fit.b).to_numpy(float))
        a_ci, f_ci = interval(fit.alpha, alpha, level), interval(fit.f, f, level)
        rows.append({**fit.group, "alpha_boot_se": a_ci.se, "alpha_lo": a_ci.lo, "alpha_hi": a_ci.hi,
                     "f_boot_se": f_ci.se, "f_lo": f_ci.lo, "f_hi": f_ci.hi, "examples": n})
        bounds = np.nanpercentile(S, [50 * (1 - level), 50 * (1 + level)], axis=0) if n >= 2 else np.full((2, len(pts)), np.nan)
        out.append(dataclasses.replace(fit, points=pts.assign(S_lo=bounds[0], S_hi=bounds[1])))
    return pd.DataFrame(rows), out


FIT_CI_COLS = ("alpha_boot_se", "alpha_lo", "alpha_hi", "f_boot_se", "f_lo", "f_hi", "examples")


def add_fit_cis(table: pd.DataFrame, boot: pd.DataFrame) -> pd.DataFrame:
    """``fit_per_group``'s table with ``bootstrap_fits``' columns beside alpha and f."""
    merged = table.merge(boot, on=list(FIT_GROUP), how="left") if len(boot) else table.reindex(
        columns=[*table.columns, *FIT_CI_COLS])
    merged = insert_after(merged, "alpha_se", FIT_CI_COLS[:3])
    merged = insert_after(merged, "f_se", FIT_CI_COLS[3:6])
    return insert_after(merged, "points", ["examples"])


def config_point_cis(df: pd.DataFrame, n_resamples: int = N_RESAMPLES, seed: int = SEED,
                     level: float = LEVEL) -> pd.DataFrame:
    """``config_points(df)`` with S_lo/S_hi per config (examples resampled within the config)."""
    points = config_points(df)
    lo, hi = [], []
    for row in points.to_dict("records"):
        part = df[_in_group(df, {k: row[k] for k in FIT_GROUP}) & (df["config"] == row["config"])]
        per = part.groupby(UNIT)[["new_tokens", "steps"]].sum()
        ci = ratio_ci(per["new_tokens"], per["steps"], n_resamples, seed, level)
        lo.append(ci.lo)
        hi.append(ci.hi)
    return place_after(points.assign(S_lo=lo, S_hi=hi), ["S"])


def bootstrap_trend(df: pd.DataFrame, trend: pd.DataFrame, n_resamples: int = N_RESAMPLES,
                    seed: int = SEED, level: float = LEVEL) -> pd.DataFrame:
    """``loglinear_trend``'s table with slope_boot_se, slope_lo, slope_hi: the OLS slope of S on
    log2(FLOPs per step) per N, refitted on each resample of the examples (S and FLOPs recomputed)."""
    points = config_points(df)
    extra = {c: np.nan for c in ("slope_boot_se", "slope_lo", "slope_hi")}
    rows = []
    for row in trend.to_dict("records"):
        row = row | extra
        group = {k: row[k] for k in FIT_GROUP}
        mine = points[np.logical_and.reduce([points[k].isna() if pd.isna(v) else points[k] == v
                                             for k, v in group.items()]) & (points["N"] == row["N"])]
        mine = mine.dropna(subset=["log2_flops_per_step", "S"])
        if row.get("x") == "log2_flops_per_step" and len(mine) >= 2 and mine["log2_flops_per_step"].nunique() >= 2:
            S, flops, _ = _resampled(df, group, list(mine["config"]), n_resamples, seed)
            x = np.log2(flops)
            xc, yc = x - x.mean(1, keepdims=True), S - S.mean(1, keepdims=True)
            with np.errstate(divide="ignore", invalid="ignore"):
                slopes = (xc * yc).sum(1) / (xc**2).sum(1)
            ci = interval(row["slope"], slopes, level)
            row |= {"slope_boot_se": ci.se, "slope_lo": ci.lo, "slope_hi": ci.hi}
        rows.append(row)
    out = pd.DataFrame(rows, columns=[*trend.columns, *extra])
    return insert_after(out, "slope_se", list(extra))
