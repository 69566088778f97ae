"""Bootstrap intervals: coverage of known values, shrinking width, paired zeros, refits, reproducibility."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.analysis import uncertainty as u
from harness.analysis.fit import expected_tokens, fit_per_group, fit_points, loglinear_trend, predicted_S
from harness.analysis.report import build_report
from harness.records import load_records

FIXTURE = Path(__file__).parent / "fixtures" / "results"


def prompts(n: int, true_s: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt tokens and steps whose pooled ratio estimates ``true_s`` (steps vary by prompt)."""
    rng = np.random.default_rng(seed)
    steps = rng.integers(20, 200, n).astype(float)
    tokens = rng.binomial(steps.astype(int) * 4, true_s / 4).astype(float)  # E[tokens] = true_s * steps
    return tokens, steps


def test_resample_weights_are_counts_of_n_draws() -> None:
    w = u.resample_weights(7, 500, seed=3)
    assert w.shape == (500, 7) and (w.sum(1) == 7).all() and (w >= 0).all()
    assert w.mean() == pytest.approx(1.0, abs=0.05)  # each example drawn once per resample on average
    assert (u.resample_weights(7, 500, seed=3) == w).all()
    assert not (u.resample_weights(7, 500, seed=4) == w).all()


def test_ratio_ci_is_a_ratio_of_sums_and_covers_the_truth() -> None:
    tokens, steps = prompts(40, 1.7, seed=0)
    ci = u.ratio_ci(tokens, steps)
    assert ci.point == pytest.approx(tokens.sum() / steps.sum())     # not the mean of per-prompt S
    assert ci.point != pytest.approx(np.mean(tokens / steps), abs=1e-9)
    assert ci.lo < 1.7 < ci.hi and ci.lo < ci.point < ci.hi and ci.se > 0


def test_ratio_ci_coverage_is_near_nominal() -> None:
    hits = [(lambda c: c.lo <= 1.7 <= c.hi)(u.ratio_ci(*prompts(30, 1.7, seed=s), n_resamples=1000)) for s in range(60)]
    assert 0.8 <= np.mean(hits) <= 1.0


def test_width_shrinks_with_more_prompts() -> None:
    width = {n: (lambda c: c.hi - c.lo)(u.ratio_ci(*prompts(n, 1.7, seed=1))) for n in (10, 40, 160, 640)}
    assert width[10] > width[40] > width[160] > width[640]
    assert width[640] < width[10] / 4   # ~ 1/sqrt(n)


def test_seeded_results_are_reproducible() -> None:
    tokens, steps = prompts(25, 2.0, seed=2)
    assert u.ratio_ci(tokens, steps, seed=0) == u.ratio_ci(tokens, steps, seed=0)
    assert u.ratio_ci(tokens, steps, seed=0) != u.ratio_ci(tokens, steps, seed=1)


def test_too_few_examples_give_nan_bounds() -> None:
    ci = u.ratio_ci([10.0], [5.0])
    assert ci.point == 2.0 and np.isnan(ci.lo) and np.isnan(ci.hi)
    assert np.isnan(u.ratio_ci([], []).point)


def test_identical_configs_have_a_zero_width_difference() -> None:
    tokens, steps = prompts(20, 1.5, seed=5)
    assert u.ratio_diff_ci(tokens, steps, tokens, steps) == (0.0, 0.0, 0.0, 0.0)
    d = u.ratio_diff_ci(tokens * 1.3, steps, tokens, steps)  # a is S_b * 1.3 on every prompt
    assert d.point == pytest.approx(0.3 * tokens.sum() / steps.sum()) and d.lo > 0


def test_pairing_narrows_the_difference() -> None:
    """A config that is b plus a little noise: paired CI of the difference far narrower than unpaired."""
    tokens, steps = prompts(30, 1.5, seed=6)
    noisy = tokens + np.random.default_rng(7).normal(2, 1, 30)
    paired = u.ratio_diff_ci(noisy, steps, tokens, steps)
    a, b = u.ratio_ci(noisy, steps), u.ratio_ci(tokens, steps, seed=1)
    assert paired.lo > 0                       # separated once paired ...
    assert a.lo < b.hi                         # ... though the two marginal CIs overlap
    assert paired.hi - paired.lo < (a.hi - a.lo) / 3


def test_mean_ci_resamples_examples_with_their_turns() -> None:
    frame = pd.DataFrame({"example_id": ["a", "a", "b", "b", "c"], "v": [1.0, 3.0, 2.0, np.nan, 5.0]})
    ci = u.mean_ci(frame, "v")
    assert ci.point == pytest.approx((1 + 3 + 2 + 5) / 4)   # the mean over records, NaN skipped
    assert 1.0 <= ci.lo <= ci.point <= ci.hi <= 5.0


def test_report_cis_bracket_the_report_numbers() -> None:
    df = load_records(FIXTURE)
    rep = u.add_report_cis(df, build_report(df))
    assert len(rep) == len(build_report(df))
    la = rep[rep["decoder"] != "ar"]
    assert ((la["S_lo"] <= la["S"]) & (la["S"] <= la["S_hi"]) & (la["S_lo"] < la["S_hi"])).all()
    assert ((la["speedup_agg_lo"] <= la["speedup_agg"]) & (la["speedup_agg"] <= la["speedup_agg_hi"])).all()
    ar = rep[rep["decoder"] == "ar"]
    assert (ar[["S_lo", "S_hi", "speedup_agg_lo", "speedup_agg_hi"]] == 1.0).all().all()
    rouge = rep.dropna(subset=["score_rouge1"])
    assert (rouge["score_rouge1_lo"] <= rouge["score_rouge1"]).all()
    cols = list(rep.columns)
    assert cols.index("S_lo") == cols.index("S") + 1 and cols.index("speedup_agg_hi") == cols.index("speedup_agg") + 2


def test_report_speedup_ci_is_paired_by_hand() -> None:
    df = load_records(FIXTURE)
    rep = u.add_report_cis(df, build_report(df), n_resamples=500, seed=9)
    config = "lookahead(W=15,N=5,G=15,pool_from_prompt=True)"
    row = rep[(rep["task"] == "humaneval") & (rep["config"] == config)].iloc[0]
    ok = df[(df["task"] == "humaneval") & (df["status"] == "ok")]
    ar = ok[ok["decoder"] == "ar"].set_index("example_id")["decode_s"]
    la = ok[ok["config"] == config].set_index("example_id")["decode_s"].reindex(ar.index)
    w = u.resample_weights(len(ar), 500, seed=9)
    lo, hi = np.percentile((w @ ar.to_numpy()) / (w @ la.to_numpy()), [2.5, 97.5])
    assert (row["speedup_agg_lo"], row["speedup_agg_hi"]) == pytest.approx((lo, hi))


def synthetic_records(alpha: float, f: float, n_prompts: int, seed: int) -> pd.DataFrame:
    """Per-prompt records of a W = G sweep whose expected S follows the law; prompts differ in length."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in (3, 5, 7):
        for g in (1, 2, 4, 8, 15):
            s = float(predicted_S(alpha, f, n - 1, g))
            for p in range(n_prompts):
                steps = int(rng.integers(30, 120))
                rows.append({"model": "m", "dtype": "float32", "device": "cpu", "task": "t", "temperature": 0.0,
                             "p_pool_from_prompt": False, "decoder": "lookahead", "status": "ok",
                             "config": f"lookahead(W={g},N={n},G={g})", "p_W": g, "p_N": n, "p_G": g,
                             "example_id": str(p), "turn": 0, "steps": float(steps),
                             "new_tokens": float(steps * s * rng.lognormal(0, 0.08)),
                             "flops": float(steps * 2e8 * 2 * g * (n - 1)), "input_tokens": None})
    return pd.DataFrame(rows)


def test_profile_fit_matches_least_squares() -> None:
    gamma, b = np.repeat([2, 4, 6], 5), np.tile([1, 2, 4, 8, 15], 3)
    rng = np.random.default_rng(0)
    S = predicted_S(0.4, 2.5, gamma, b) + rng.normal(0, 0.02, (3, 15))
    alpha, f = u.profile_fit(S, gamma, b)
    for row, a, ff in zip(S, alpha, f):
        pts = pd.DataFrame({"N": gamma + 1, "W": b, "G": b, "S": row, "model": "m", "dtype": "d", "device": "c",
                            "task": "t", "temperature": 0.0, "pool_from_prompt": False})
        ref = fit_points(pts)
        assert (a, ff) == pytest.approx((ref.alpha, ref.f), rel=1e-3)
    assert np.isnan(u.profile_fit(np.full((1, 15), np.nan), gamma, b)[0]).all()
    assert expected_tokens(0.4, 2, 1) > 1  # sanity of the law the profile uses


def test_bootstrap_of_alpha_and_f_covers_the_truth() -> None:
    df = synthetic_records(0.45, 2.5, n_prompts=12, seed=1)
    _, fits = fit_per_group(df)
    boot, with_points = u.bootstrap_fits(df, fits, n_resamples=1000)
    row = boot.iloc[0]
    assert row["alpha_boot_se"] > 0 and row["f_boot_se"] > 0 and row["examples"] == 12
    assert row["alpha_lo"] < 0.45 < row["alpha_hi"] and row["f_lo"] < 2.5 < row["f_hi"]
    assert row["alpha_lo"] < fits[0].alpha < row["alpha_hi"]
    pts = with_points[0].points
    assert ((pts["S_lo"] <= pts["S"]) & (pts["S"] <= pts["S_hi"])).all()
    again, _ = u.bootstrap_fits(df, fits, n_resamples=1000)
    pd.testing.assert_frame_equal(boot, again)  # seeded


def test_bootstrap_se_shrinks_with_more_prompts() -> None:
    se = {}
    for n in (6, 48):
        df = synthetic_records(0.45, 2.5, n_prompts=n, seed=2)
        boot, _ = u.bootstrap_fits(df, fit_per_group(df)[1], n_resamples=500)
        se[n] = boot["alpha_boot_se"].item()
    assert se[48] < se[6] / 1.5


def test_trend_slope_ci_covers_the_ols_slope() -> None:
    df = synthetic_records(0.45, 2.5, n_prompts=10, seed=3)
    trend = u.bootstrap_trend(df, loglinear_trend(df), n_resamples=800)
    assert len(trend) == 3 and (trend["slope_boot_se"] > 0).all()
    assert ((trend["slope_lo"] < trend["slope"]) & (trend["slope"] < trend["slope_hi"])).all()
    cols = list(trend.columns)
    assert cols.index("slope_lo") == cols.index("slope_se") + 2


def test_fit_table_gets_ci_columns_beside_alpha_and_f() -> None:
    df = load_records(FIXTURE)
    table, fits = fit_per_group(df[df["task"] == "mt_bench"], w_eq_g=True)
    out = u.add_fit_cis(table, u.bootstrap_fits(df, fits, n_resamples=200)[0])
    cols = list(out.columns)
    assert cols[cols.index("alpha_se") + 1: cols.index("alpha_se") + 4] == ["alpha_boot_se", "alpha_lo", "alpha_hi"]
    assert cols[cols.index("f_se") + 1: cols.index("f_se") + 4] == ["f_boot_se", "f_lo", "f_hi"]
    fitted = out.dropna(subset=["alpha"])
    assert ((fitted["alpha_lo"] < fitted["alpha"]) & (fitted["alpha"] < fitted["alpha_hi"])).all()
    assert out.loc[out["alpha"].isna(), "alpha_lo"].isna().all()


def test_config_point_cis() -> None:
    pts = u.config_point_cis(load_records(FIXTURE), n_resamples=300)
    assert ((pts["S_lo"] <= pts["S"]) & (pts["S"] <= pts["S_hi"])).all()
    assert list(pts.columns)[list(pts.columns).index("S") + 1] == "S_lo"
