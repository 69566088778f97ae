"""Figures from records (never from a model): scaling curves, S vs W, speedups, accepted lengths.

Where a frame carries bootstrap bounds (``<col>_lo``/``<col>_hi``, from
``harness.analysis.uncertainty``) the figures draw them as error bars.

Every function returns a ``matplotlib.figure.Figure`` built with the
object-oriented API (no pyplot, no GUI backend, no global state): it renders
with Agg in scripts and tests and shows inline when it is a notebook cell's
last value. ``harness.analysis.io.save_figure`` writes a PNG.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from harness.analysis.fit import PAPER_FIT, ScalingFit, b_values, config_points, predicted_S
from harness.analysis.report import build_report


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(v) for v in np.linspace(0.05, 0.85, max(n, 1))]


def _empty(fig: Figure, message: str) -> Figure:
    ax = fig.subplots()
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return fig


def _yerr(part: pd.DataFrame, col: str) -> np.ndarray | None:
    """Error-bar lengths below/above ``col`` from ``<col>_lo``/``<col>_hi`` (None if absent)."""
    if f"{col}_lo" not in part.columns:
        return None
    lo = (part[col] - part[f"{col}_lo"]).clip(lower=0).fillna(0)
    hi = (part[f"{col}_hi"] - part[col]).clip(lower=0).fillna(0)
    return np.vstack([lo.to_numpy(float), hi.to_numpy(float)])


def _fit_curve(part: pd.DataFrame, alpha: float, f: float, b: str, x: str) -> tuple[np.ndarray, np.ndarray]:
    """Model S along one N: b on a grid, x interpolated (in log space) between the measured configs."""
    by_b = part.assign(b=b_values(part, b)).groupby("b")[x].mean().sort_index()
    if len(by_b) == 1:
        return by_b.to_numpy(), predicted_S(alpha, f, part["N"].iloc[0] - 1, by_b.index.to_numpy())
    # cost per step grows ~linearly in b on W=G sweeps, so log-cost is interpolated in log b
    grid = np.geomspace(by_b.index.min(), by_b.index.max(), 60)
    xs = np.exp(np.interp(np.log(grid), np.log(by_b.index.to_numpy(float)), np.log(by_b.to_numpy(float))))
    return xs, predicted_S(alpha, f, part["N"].iloc[0] - 1, grid)


def scaling_figure(data: ScalingFit | pd.DataFrame, fit: ScalingFit | None = None,
                   ci: Mapping[str, float] | None = None) -> Figure:
    """The paper's scaling figure: S against FLOPs per step on a log x axis, one colour per N.

    ``data`` is a ScalingFit (its points are used) or a ``config_points`` frame. Points carry error
    bars when they have ``S_lo``/``S_hi`` (``harness.analysis.uncertainty``). With a fit, the fitted
    law is drawn per N (solid) beside the law at the paper's alpha, f (dashed); ``ci`` (a
    ``bootstrap_fits`` row: alpha_lo, alpha_hi, f_lo, f_hi) puts the bootstrap CIs in the title.
    Falls back to the theoretical input tokens (W+G)(N-1) per step when FLOPs were not recorded.
    """
    if hasattr(data, "points"):  # a ScalingFit (duck-typed: survives `python -m harness.fit`)
        fit, points = data, data.points
    else:
        points = data
    fig = Figure(figsize=(6.4, 4.4))
    if points.empty:
        return _empty(fig, "no lookahead configs")
    x, xlabel = "flops_per_step", "FLOPs per decoding step (log scale)"
    if points[x].isna().all():
        x, xlabel = "input_tokens_theory", "(W+G)(N-1) input tokens per step (log scale)"
    ax = fig.subplots()
    ns = sorted(points["N"].dropna().unique())
    for color, n in zip(_colors(len(ns)), ns):
        part = points[points["N"] == n].sort_values(x)
        ax.errorbar(part[x], part["S"], yerr=_yerr(part, "S"), fmt="o", color=color, capsize=3,
                    label=f"N={int(n)}", zorder=3)
        if fit is not None and n >= 2:
            ax.plot(*_fit_curve(part, fit.alpha, fit.f, fit.b, x), color=color, lw=1.5)
            ax.plot(*_fit_curve(part, PAPER_FIT["alpha"], PAPER_FIT["f"], fit.b, x), color=color, lw=1, ls="--", alpha=0.6)
    ax.set_xscale("log", base=2)
    title = "S vs per-step compute"
    if fit is not None:
        a_txt = f"[{ci['alpha_lo']:.3f}, {ci['alpha_hi']:.3f}]" if ci else f"±{fit.alpha_se:.3f}"
        f_txt = f"[{ci['f_lo']:.2f}, {ci['f_hi']:.2f}]" if ci else f"±{fit.f_se:.2f}"
        title += (f"\nfit (solid): α={fit.alpha:.3f} {a_txt}, f={fit.f:.2f} {f_txt}, R²={fit.r2:.2f}, b={fit.b}; "
                  f"dashed: paper α={PAPER_FIT['alpha']}, f={PAPER_FIT['f']}")
    ax.set(xlabel=xlabel, ylabel="S = new tokens / steps (prefill excluded)", title=title)
    ax.title.set_fontsize(8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return fig


def s_vs_w_figure(df: pd.DataFrame) -> Figure:
    """S against window W, one line per N (and per G rule: G=W or a fixed G), per task."""
    points = config_points(df)
    fig = Figure(figsize=(6.4, 4.4))
    if points.empty:
        return _empty(fig, "no lookahead configs")
    points = points.assign(g_rule=np.where(points["G"] == points["W"], "G=W", "G=" + points["G"].astype(int).astype(str)))
    tasks = sorted(points["task"].astype(str).unique())
    axes = np.atleast_1d(fig.subplots(1, len(tasks), sharey=True, squeeze=False)[0])
    fig.set_size_inches(4.8 * len(tasks), 4.2)
    for ax, task in zip(axes, tasks):
        part = points[points["task"] == task]
        lines = sorted(part.groupby(["N", "g_rule"]).groups)
        for color, (n, rule) in zip(_colors(len(lines)), lines):
            line = part[(part["N"] == n) & (part["g_rule"] == rule)].groupby("W")["S"].mean()
            style = "-o" if rule == "G=W" else "--s"
            ax.plot(line.index, line.to_numpy(), style, color=color, label=f"N={int(n)}, {rule}", ms=4)
        ax.set(xscale="log", xlabel="W (window)", title=task)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("S (prefill excluded)")
    return fig


def speedup_figure(report: pd.DataFrame | None = None, df: pd.DataFrame | None = None) -> Figure:
    """Horizontal bars of speedup (aggregate) and S per config, one row of panels per task.

    Pass a ``build_report`` frame, or records as ``df`` to build one; CI columns (``S_lo``...) draw error bars.
    """
    if report is None:
        if df is None:
            raise ValueError("speedup_figure needs a report or records")
        report = build_report(df)
    rep = report[report["prompts"] > 0].copy()
    rep["label"] = rep["config"].astype(str) + np.where(rep["temperature"].fillna(0) > 0, " T=" + rep["temperature"].astype(str), "")
    tasks = sorted(rep["task"].astype(str).unique())
    heights = [max(1.5, 0.28 * (rep["task"] == t).sum() + 0.8) for t in tasks]
    fig = Figure(figsize=(11, sum(heights) if heights else 3))
    if rep.empty:
        return _empty(fig, "no records")
    axes = fig.subplots(len(tasks), 2, squeeze=False, gridspec_kw={"height_ratios": heights})
    for (ax_sp, ax_s), task in zip(axes, tasks):
        part = rep[rep["task"] == task].sort_values("S")
        y = np.arange(len(part))
        colors = ["tab:gray" if d == "ar" else "tab:orange" if d == "pld" else "tab:blue" for d in part["decoder"]]
        ax_sp.barh(y, part["speedup_agg"].fillna(0), color=colors, xerr=_yerr(part, "speedup_agg"), capsize=2)
        ax_s.barh(y, part["S"], color=colors, xerr=_yerr(part, "S"), capsize=2)
        for ax, name in ((ax_sp, "speedup over ar (sum/sum decode time)"), (ax_s, "S (prefill excluded)")):
            ax.axvline(1.0, color="k", lw=0.8)
            ax.set_yticks(y, part["label"], fontsize=6)
            ax.set_title(f"{task}: {name}", fontsize=8)
            ax.grid(axis="x", alpha=0.3)
        ax_s.set_yticks(y, [""] * len(y))
    fig.tight_layout()
    return fig


def accepted_hist_figure(df: pd.DataFrame) -> Figure:
    """Share of decoding steps by tokens accepted in that step, one panel per decoder."""
    ok = df[(df["status"] == "ok") & df["accepted"].map(lambda a: isinstance(a, (list, tuple)) and len(a) > 0)]
    decoders = sorted(ok["decoder"].astype(str).unique())
    fig = Figure(figsize=(3.2 * max(len(decoders), 1), 3.0))
    if not decoders:
        return _empty(fig, "no per-step accepted lengths recorded")
    axes = fig.subplots(1, len(decoders), sharey=True, squeeze=False)[0]
    for ax, dec in zip(axes, decoders):
        lengths = np.concatenate([np.asarray(a, dtype=int) for a in ok.loc[ok["decoder"] == dec, "accepted"]])
        counts = np.bincount(lengths)
        k = np.arange(len(counts))
        ax.bar(k[1:], counts[1:] / counts.sum(), color="tab:blue")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(0.4, max(len(counts) - 0.6, 2.6))
        ax.set(title=f"{dec} (mean {lengths.mean():.2f} = S, {len(lengths)} steps)", xlabel="tokens accepted per step")
        ax.title.set_fontsize(8)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("share of steps")
    fig.tight_layout()
    return fig


def ablation_figure(table: pd.DataFrame) -> Figure:
    """Ours vs paper per Table 3 row (``tables.ablation_table`` output): S and speedup side by side.

    One panel pair per (model, task) block; missing rows show only the paper's bar; ours carry
    error bars when the table has ``S_lo``/``speedup_lo`` columns.
    """
    blocks = list(table.groupby(["model", "task"], dropna=False, sort=True))
    fig = Figure(figsize=(10, 3.2 * max(len(blocks), 1)))
    if not blocks:
        return _empty(fig, "no ablation rows")
    axes = fig.subplots(len(blocks), 2, squeeze=False)
    for (ax_s, ax_sp), ((model, task), part) in zip(axes, blocks):
        x = np.arange(len(part))
        for ax, ours, paper, name in ((ax_s, "S", "paper_S", "S (prefill excluded)"),
                                      (ax_sp, "speedup", "paper_speedup", "speedup over ar")):
            ax.bar(x - 0.2, part[ours].fillna(0), 0.4, label=f"ours ({model}, 95% CI)", color="tab:blue",
                   yerr=_yerr(part, ours), capsize=3)
            ax.bar(x + 0.2, part[paper], 0.4, label="paper (LLaMA-2-7B-chat, A100)", color="tab:gray")
            ax.set_xticks(x, part["row"] + np.where(part["status"] == "missing", "\n(missing)", ""))
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_title(f"{task}: {name}", fontsize=9)
            ax.grid(axis="y", alpha=0.3)
        ax_s.legend(fontsize=7)
    fig.tight_layout()
    return fig
