"""The paper's scaling law for lookahead decoding (Fu et al. 2024, Sec. 4, Eq. 4-7), fitted to our runs.

Model. Speculative decoding with ``b`` parallel speculations, each ``gamma``
tokens long, whose i-th token is right with probability ``alpha**i`` (given the
previous ones), emits per step in expectation

    E(#tokens) = (gamma + 1) - sum_{i=1..gamma} (1 - alpha**i) ** b          (Eq. 5)

(b = 1 gives the usual (1 - alpha**(gamma+1)) / (1 - alpha)). Lookahead's
n-grams come from Jacobi trajectories and are worse than a draft model's;
the paper absorbs that into a factor f >= 1:

    S = (f - 1 + E) / f

which reads as: a step profits from speculation with probability 1/f and
emits exactly one token otherwise. Paper fit (LLaMA-2-7B, MT-Bench):
alpha = 0.425, f = 3.106.

Mapping to lookahead's (W, N, G): gamma = N - 1 (a verified n-gram carries N-1
speculative tokens after the current one). ``b`` defaults to G: the
verification branch checks up to G pooled n-grams in parallel per step, which
is literally "b speculations of gamma tokens" in Eq. 5. Caveats, printed with
the fit: (1) G is an upper bound - only n-grams whose first token matches the
last emitted token are candidates, and the pool gains at most W n-grams per
step, so the effective b is min(G, #candidates) <= G; (2) b = G ignores how
W improves candidate *quality* - with G << W (paper ablation row 7:
N=5, W=30, G=1, S=1.79) b = G predicts too little (about 1.23 with the
paper's alpha, f) and b = W too much (about 2.14); with W = G (row 8: S=1.96)
both give 1.98. So ``b`` is selectable ("G", "W" or "min") and fits are best
read on W = G sweeps, which is also where the paper's values apply.

S here is always new tokens / decoding steps; prefill is not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd
from scipy import optimize, stats

from harness.analysis.io import to_markdown
from harness.records import compression

#: Paper's fitted values (Sec. 4, LLaMA-2-7B on MT-Bench).
PAPER_FIT: Mapping[str, Any] = MappingProxyType(
    {"alpha": 0.425, "f": 3.106, "model": "LLaMA-2-7B", "dataset": "MT-Bench"}
)
#: Which parameter plays ``b`` in Eq. 5.
B_CHOICES: Mapping[str, str] = MappingProxyType({
    "G": "b = G (n-grams verified per step; upper bound on real candidates)",
    "W": "b = W (n-grams added to the pool per step)",
    "min": "b = min(W, G)",
})
#: One fit per group: the law is per model and workload, never pooled across them; the
#: prompt pool is a different source of guesses (a different alpha), so it splits groups too.
FIT_GROUP: tuple[str, ...] = ("model", "dtype", "device", "task", "temperature", "pool_from_prompt")


# --------------------------------------------------------------------------- the law


def expected_tokens(alpha: float | np.ndarray, gamma: int | np.ndarray, b: float | np.ndarray) -> np.ndarray:
    """Eq. 5: expected tokens per step with b speculations of gamma tokens; vectorised."""
    alpha, gamma, b = np.broadcast_arrays(
        np.asarray(alpha, dtype=float), np.asarray(gamma, dtype=float), np.asarray(b, dtype=float)
    )
    total = gamma + 1.0
    max_gamma = int(np.max(gamma)) if gamma.size else 0
    for i in range(1, max_gamma + 1):
        term = (1.0 - alpha**i) ** b
        total = total - np.where(i <= gamma, term, 0.0)
    return total


def predicted_S(alpha: float | np.ndarray, f: float | np.ndarray, gamma: int | np.ndarray, b: float | np.ndarray) -> np.ndarray:
    """S = (f - 1 + E) / f: compression ratio with the paper's discount factor f."""
    return (np.asarray(f, dtype=float) - 1.0 + expected_tokens(alpha, gamma, b)) / np.asarray(f, dtype=float)


# --------------------------------------------------------------------------- data


def _param(df: pd.DataFrame, name: str) -> pd.Series:
    return df[f"p_{name}"] if f"p_{name}" in df.columns else pd.Series(np.nan, index=df.index)


def config_points(df: pd.DataFrame) -> pd.DataFrame:
    """One row per lookahead (W, N, G, ...) config and FIT_GROUP: aggregated S and cost per step.

    Columns: FIT_GROUP, config, W, N, G, prompts, S (sum new / sum steps),
    flops_per_step (sum flops / sum steps), log2_flops_per_step,
    input_tokens_per_step (measured: mean fed tokens per step, when recorded)
    and input_tokens_theory = (W + G)(N - 1).
    """
    la = df[(df["decoder"] == "lookahead") & (df["status"] == "ok")].copy()
    cols = [*FIT_GROUP, "config", "W", "N", "G", "prompts", "new_tokens", "steps", "S",
            "flops_per_step", "log2_flops_per_step", "input_tokens_per_step", "input_tokens_theory"]
    if la.empty:
        return pd.DataFrame(columns=cols)
    la["W"], la["N"], la["G"] = _param(la, "W"), _param(la, "N"), _param(la, "G")
    la["pool_from_prompt"] = _param(la, "pool_from_prompt")
    la["fed"] = la["input_tokens"].map(lambda x: float(np.sum(x)) if isinstance(x, (list, tuple)) and x else np.nan)
    pts = la.groupby([*FIT_GROUP, "config", "W", "N", "G"], dropna=False, sort=True).agg(
        prompts=("example_id", "size"),
        new_tokens=("new_tokens", "sum"),
        steps=("steps", "sum"),
        flops=("flops", lambda s: s.sum(min_count=len(s))),  # NaN if any record lacks flops
        fed=("fed", lambda s: s.sum(min_count=len(s))),
    ).reset_index()
    pts["S"] = compression(pts["new_tokens"], pts["steps"])
    pts["flops_per_step"] = pts["flops"] / pts["steps"]
    pts["log2_flops_per_step"] = np.log2(pts["flops_per_step"])
    pts["input_tokens_per_step"] = pts["fed"] / pts["steps"]
    pts["input_tokens_theory"] = (pts["W"] + pts["G"]) * (pts["N"] - 1)
    return pts[cols]


def b_values(points: pd.DataFrame, b: str = "G") -> pd.Series:
    """The column used as ``b`` in Eq. 5 (see module doc for why G is the default)."""
    if b == "G":
        return points["G"]
    if b == "W":
        return points["W"]
    if b == "min":
        return np.minimum(points["W"], points["G"])
    raise ValueError(f"b must be one of {sorted(B_CHOICES)}, got {b!r}")


# --------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class ScalingFit:
    """Fitted alpha, f (with standard errors), R^2 and the points behind them."""

    alpha: float
    alpha_se: float
    f: float
    f_se: float
    r2: float
    n_points: int
    b: str
    points: pd.DataFrame = field(repr=False)
    group: dict[str, object] = field(default_factory=dict)

    def table(self) -> pd.DataFrame:
        """Ours beside the paper's values."""
        return pd.DataFrame(
            {
                "parameter": ["alpha", "f", "R2", "points", "b"],
                "ours": [self.alpha, self.f, self.r2, self.n_points, B_CHOICES[self.b]],
                "se": [self.alpha_se, self.f_se, np.nan, np.nan, np.nan],
                "paper": [PAPER_FIT["alpha"], PAPER_FIT["f"], np.nan, np.nan,
                          f"{PAPER_FIT['model']} on {PAPER_FIT['dataset']}"],
            }
        )

    def row(self) -> dict[str, object]:
        """Flat summary for one line of a multi-group table."""
        return {**self.group, "alpha": self.alpha, "alpha_se": self.alpha_se, "f": self.f,
                "f_se": self.f_se, "r2": self.r2, "points": self.n_points, "b": self.b,
                "paper_alpha": PAPER_FIT["alpha"], "paper_f": PAPER_FIT["f"]}


def _single_group(points: pd.DataFrame) -> dict[str, object]:
    groups = points[list(FIT_GROUP)].drop_duplicates()
    if len(groups) > 1:
        listed = "; ".join(", ".join(f"{k}={v}" for k, v in g.items()) for g in groups.to_dict("records"))
        raise ValueError(
            f"fit_scaling_law fits one {'/'.join(FIT_GROUP)} group at a time, got {len(groups)} ({listed}); "
            "filter the records or use fit_per_group"
        )
    return groups.iloc[0].to_dict() if len(groups) else {}


def fit_points(points: pd.DataFrame, b: str = "G", w_eq_g: bool = False) -> ScalingFit:
    """Least-squares fit of predicted_S to per-config S (0 < alpha < 1, f >= 1).

    Unweighted: every config counts once, whatever its number of prompts.
    ``w_eq_g`` keeps only W == G configs, where the choice of b does not matter.
    """
    pts = points[(points["N"] >= 2) & points["S"].notna()].copy()
    if w_eq_g:
        pts = pts[pts["W"] == pts["G"]]
    pts["gamma"] = pts["N"] - 1
    pts["b"] = b_values(pts, b)
    pts = pts[pts["b"] >= 1]
    if len(pts) < 3:
        raise ValueError(f"need at least 3 lookahead configs with N >= 2 to fit alpha and f, got {len(pts)}")
    x = np.vstack([pts["gamma"].to_numpy(float), pts["b"].to_numpy(float)])
    y = pts["S"].to_numpy(float)
    (alpha, f), cov = optimize.curve_fit(
        lambda X, a, ff: predicted_S(a, ff, X[0], X[1]),
        x, y, p0=(0.4, 2.0), bounds=([1e-6, 1.0], [1 - 1e-6, np.inf]), maxfev=20000,
    )
    pts["S_pred"] = predicted_S(alpha, f, pts["gamma"], pts["b"])
    pts["residual"] = pts["S"] - pts["S_pred"]
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(pts["residual"] ** 2)) / ss_tot if ss_tot > 0 else np.nan
    se = np.sqrt(np.clip(np.diag(cov), 0, None))
    return ScalingFit(float(alpha), float(se[0]), float(f), float(se[1]), r2, len(pts), b,
                      pts.reset_index(drop=True), _single_group(pts))


def fit_scaling_law(df: pd.DataFrame, b: str = "G", w_eq_g: bool = False) -> ScalingFit:
    """Fit alpha, f on records of one FIT_GROUP (one point per (W, N, G) config); see fit_points."""
    return fit_points(config_points(df), b, w_eq_g)


def fit_per_group(df: pd.DataFrame, b: str = "G", w_eq_g: bool = False) -> tuple[pd.DataFrame, list[ScalingFit]]:
    """Fit each FIT_GROUP separately; groups with too few configs are listed with a note."""
    points = config_points(df)
    rows, fits = [], []
    for key, part in points.groupby(list(FIT_GROUP), dropna=False, sort=True):
        try:
            fit = fit_points(part, b, w_eq_g)
        except ValueError as err:
            rows.append({**dict(zip(FIT_GROUP, key)), "b": b, "paper_alpha": PAPER_FIT["alpha"],
                         "paper_f": PAPER_FIT["f"], "note": str(err)})
            continue
        fits.append(fit)
        rows.append({**fit.row(), "note": ""})
    cols = [*FIT_GROUP, "alpha", "alpha_se", "f", "f_se", "r2", "points", "b", "paper_alpha", "paper_f", "note"]
    return pd.DataFrame(rows).reindex(columns=cols), fits


def loglinear_trend(df: pd.DataFrame, x: str = "log2_flops_per_step") -> pd.DataFrame:
    """OLS slope (and SE) of S against log2(FLOPs per step) at each fixed N, per FIT_GROUP.

    The paper's claim is that S grows linearly in log(FLOPs per step); the
    slope is S gained per doubling of per-step compute. ``x`` may also be
    ``"input_tokens_theory"`` (log2 taken) when FLOPs were not recorded.
    """
    points = config_points(df)
    if x == "input_tokens_theory":
        points = points.assign(log2_input_tokens=np.log2(points["input_tokens_theory"]))
        x = "log2_input_tokens"
    rows = []
    for key, part in points.dropna(subset=[x, "S"]).groupby([*FIT_GROUP, "N"], dropna=False, sort=True):
        row = dict(zip([*FIT_GROUP, "N"], key)) | {"configs": len(part), "x": x}
        if part[x].nunique() >= 2:
            res = stats.linregress(part[x], part["S"])
            se = res.stderr if len(part) > 2 else np.nan  # 2 points: no residual dof
            row |= {"slope": res.slope, "slope_se": se, "intercept": res.intercept, "r2": res.rvalue**2}
        else:
            row |= {"slope": np.nan, "slope_se": np.nan, "intercept": np.nan, "r2": np.nan}
        rows.append(row)
    cols = [*FIT_GROUP, "N", "configs", "x", "slope", "slope_se", "intercept", "r2"]
    return pd.DataFrame(rows, columns=cols)


# --------------------------------------------------------------------------- CLI


def render_fit(table: pd.DataFrame, trend: pd.DataFrame, b: str, ci_note: str = "") -> str:
    """The Markdown the CLI prints: the fit beside the paper's values, then the log2-FLOPs slopes.

    ``ci_note`` explains the bootstrap columns when ``harness.analysis.uncertainty`` added them
    (alpha_boot_se/alpha_lo/alpha_hi, f_..., slope_boot_se/slope_lo/slope_hi).
    """
    return "\n\n".join(part for part in [
        "## Scaling-law fit: S = (f - 1 + E) / f, E = (gamma+1) - sum_i (1 - alpha^i)^b, gamma = N - 1",
        f"{B_CHOICES[b]}. Caveat: the pool gains at most W n-grams per step and only n-grams "
        "starting with the last token are candidates, so the effective b can be below G; "
        "fits are most comparable to the paper on W = G sweeps.",
        to_markdown(table),
        f"Paper (LLaMA-2-7B, MT-Bench): alpha = {PAPER_FIT['alpha']}, f = {PAPER_FIT['f']}. "
        "alpha_se, f_se: asymptotic (least-squares covariance); R2 over the configs.",
        "## S vs log2(FLOPs per step), slope per fixed N",
        to_markdown(trend),
        "S = total new tokens / total decoding steps (prefill excluded). slope = S gained per doubling "
        "of per-step FLOPs; slope_se: OLS standard error.",
        ci_note,
    ] if part) + "\n"
