"""Scaling law: formula identities, recovery of known alpha/f, log-linear trend, CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.fit import main
from harness.analysis.fit import (
    PAPER_FIT,
    config_points,
    expected_tokens,
    fit_per_group,
    fit_points,
    fit_scaling_law,
    loglinear_trend,
    predicted_S,
)
from harness.analysis.uncertainty import bootstrap_fits
from harness.records import load_records

FIXTURE = Path(__file__).parent / "fixtures" / "results"


@pytest.mark.parametrize("alpha", [0.1, 0.425, 0.8])
@pytest.mark.parametrize("gamma", [1, 4, 9])
def test_single_speculation_is_geometric(alpha: float, gamma: int) -> None:
    assert expected_tokens(alpha, gamma, 1) == pytest.approx((1 - alpha ** (gamma + 1)) / (1 - alpha))


def test_limits_and_monotonicity() -> None:
    assert expected_tokens(0.5, 0, 10) == pytest.approx(1.0)          # nothing speculated
    assert expected_tokens(1 - 1e-12, 4, 3) == pytest.approx(5.0)     # perfect guesses: gamma + 1
    e = expected_tokens(0.425, 4, np.array([1, 2, 4, 8, 16, 32]))
    assert np.all(np.diff(e) > 0) and e[-1] < 5
    assert predicted_S(0.425, 1.0, 4, 7) == pytest.approx(expected_tokens(0.425, 4, 7))  # f = 1: S = E
    assert predicted_S(0.425, 1e9, 4, 7) == pytest.approx(1.0)                          # f -> inf: no gain


def test_mixed_gamma_vectorises() -> None:
    gammas, bs = np.array([1, 3, 6]), np.array([2, 5, 9])
    together = expected_tokens(0.4, gammas, bs)
    apart = [expected_tokens(0.4, g, b) for g, b in zip(gammas, bs)]
    assert together == pytest.approx(np.array(apart).ravel())


def test_paper_values_reproduce_ablation_row_8() -> None:
    """(N, W, G) = (5, 15, 15): paper measured S = 1.96; the law with b = 15 gives about 1.98."""
    assert predicted_S(PAPER_FIT["alpha"], PAPER_FIT["f"], 4, 15) == pytest.approx(1.96, abs=0.05)


def synthetic_points(alpha: float, f: float, noise: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [{"model": "m", "dtype": "float32", "device": "cpu", "task": "t", "temperature": 0.0,
             "pool_from_prompt": False, "config": f"N{n}G{g}", "W": g, "N": n, "G": g}
            for n in (2, 3, 5, 7) for g in (1, 2, 4, 8, 16, 32)]
    pts = pd.DataFrame(rows)
    pts["S"] = predicted_S(alpha, f, pts["N"] - 1, pts["G"]) + rng.normal(0, noise, len(pts))
    return pts


@pytest.mark.parametrize(("alpha", "f"), [(0.425, 3.106), (0.6, 1.8), (0.3, 1.2)])
def test_fit_recovers_known_parameters(alpha: float, f: float) -> None:
    fit = fit_points(synthetic_points(alpha, f, noise=0.01))
    assert fit.alpha == pytest.approx(alpha, abs=max(4 * fit.alpha_se, 0.01))
    assert fit.f == pytest.approx(f, abs=max(4 * fit.f_se, 0.02))
    assert 0 < fit.alpha_se < 0.05 and 0 < fit.f_se < 0.5
    assert fit.r2 > 0.98 and fit.n_points == 24
    assert fit.points["residual"].abs().max() < 0.06
    table = fit.table().set_index("parameter")
    assert table.loc["alpha", "paper"] == 0.425 and table.loc["f", "paper"] == 3.106


def test_fit_from_records_of_the_model() -> None:
    """Records whose steps are simulated from the law itself (the fixture, W = G sweep)."""
    df = load_records(FIXTURE)
    sweep = df[(df["task"] == "mt_bench") & (df["p_pool_from_prompt"] == False)]  # noqa: E712
    fit = fit_scaling_law(sweep, w_eq_g=True)
    assert fit.n_points == 12 and fit.r2 > 0.6
    assert fit.alpha == pytest.approx(0.45, abs=3 * fit.alpha_se)   # generator's ALPHA
    assert fit.f == pytest.approx(2.5, abs=3 * fit.f_se)            # generator's F


def test_bootstrap_ci_of_the_fixture_fit_covers_the_generator() -> None:
    """The fixture's steps are simulated from the law: the bootstrap CIs cover ALPHA and F."""
    df = load_records(FIXTURE)
    sweep = df[(df["task"] == "mt_bench") & (df["p_pool_from_prompt"] == False)]  # noqa: E712
    fit = fit_scaling_law(sweep, w_eq_g=True)
    row = bootstrap_fits(sweep, [fit])[0].iloc[0]
    assert row["alpha_lo"] < 0.45 < row["alpha_hi"] and row["f_lo"] < 2.5 < row["f_hi"]
    assert row["alpha_lo"] < fit.alpha < row["alpha_hi"] and row["f_lo"] < fit.f < row["f_hi"]
    assert 0 < row["alpha_boot_se"] < 0.1 and 0 < row["f_boot_se"] < 1


def test_fit_refuses_pooled_groups_and_too_few_points() -> None:
    pts = synthetic_points(0.4, 2.0, 0.0)
    two_tasks = pd.concat([pts, pts.assign(task="u")])
    with pytest.raises(ValueError, match="one .* group at a time"):
        fit_points(two_tasks)
    with pytest.raises(ValueError, match="at least 3"):
        fit_points(pts.head(2))


def test_fit_per_group_lists_unfittable_groups() -> None:
    table, fits = fit_per_group(load_records(FIXTURE))
    assert len(fits) == 2  # mt_bench with and without prompt pool
    assert table["note"].str.contains("at least 3").sum() == len(table) - 2


def test_b_choice_changes_the_fit_only_when_w_differs_from_g() -> None:
    pts = synthetic_points(0.5, 2.0, 0.0)
    assert fit_points(pts, b="W").alpha == pytest.approx(fit_points(pts, b="G").alpha)
    skew = pts.assign(W=pts["G"] * 2)
    assert fit_points(skew, b="W").alpha != pytest.approx(fit_points(skew, b="G").alpha, abs=1e-3)
    with pytest.raises(ValueError, match="b must be one of"):
        fit_points(pts, b="Q")


def test_loglinear_trend_recovers_slope() -> None:
    df = load_records(FIXTURE)
    la = df[df["decoder"] == "lookahead"].copy()
    # rewrite S exactly as 0.3 * log2(FLOPs/step) + c at each N: one step per record, new_tokens = S
    per_step = la["flops"] / la["steps"]
    la["steps"] = 1000.0
    la["flops"] = per_step * 1000.0
    la["new_tokens"] = 1000.0 * (0.3 * np.log2(per_step) - 8.0)
    trend = loglinear_trend(la)
    fitted = trend[(trend["task"] == "mt_bench") & (trend["configs"] >= 3)]
    assert len(fitted) >= 2
    assert fitted["slope"].to_numpy() == pytest.approx(0.3)
    assert fitted["slope_se"].to_numpy() == pytest.approx(0.0, abs=1e-6)


def test_config_points_costs() -> None:
    pts = config_points(load_records(FIXTURE))
    row = pts[(pts["task"] == "mt_bench") & (pts["config"] == "lookahead(W=15,N=5,G=15,pool_from_prompt=False)")]
    assert row["input_tokens_theory"].item() == (15 + 15) * 4
    assert row["input_tokens_per_step"].item() == pytest.approx(120)  # the fixture feeds exactly (W+G)(N-1)
    assert row["flops_per_step"].item() == pytest.approx(2 * 135e6 * 120)


def test_cli(tmp_path: Path, capsys) -> None:
    assert main([str(FIXTURE), "--out", str(tmp_path), "--w-eq-g"]) == 0
    out = capsys.readouterr().out
    assert "alpha = 0.425, f = 3.106" in out and "prefill excluded" in out and "bootstrap" in out
    assert (tmp_path / "fit.csv").exists() and (tmp_path / "fit_trend.csv").exists()
    assert list(tmp_path.glob("scaling_*.png"))
    fitted = pd.read_csv(tmp_path / "fit.csv").dropna(subset=["alpha"])
    assert len(fitted) == 1 and {"alpha_boot_se", "f_boot_se", "r2", "paper_alpha", "examples"} <= set(fitted.columns)
    assert (fitted["alpha_lo"] < fitted["alpha"]).all() and (fitted["f"] < fitted["f_hi"]).all()
    trend = pd.read_csv(tmp_path / "fit_trend.csv").dropna(subset=["slope_lo"])
    assert len(trend) >= 3 and ((trend["slope_lo"] < trend["slope"]) & (trend["slope"] < trend["slope_hi"])).all()
    points = pd.read_csv(tmp_path / "fit_points.csv")
    assert ((points["S_lo"] <= points["S"]) & (points["S"] <= points["S_hi"])).all()
    assert main([str(tmp_path / "nothing")]) == 2
