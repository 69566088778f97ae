"""Where a decoder's steps go: its steps grouped by the tokens they fed, each group's yield per unit of cost.

Why: a speedup over ``ar`` is tokens / (sum over steps of t(k)) in units of t(1), so it is the
cost-weighted mean of each step's own "tokens per t(1)". A step that accepts its root alone at a cost
above t(1) runs slower than ``ar``. Grouping by k shows which kind of step pays and which one costs:
on MT-Bench with AVX-512 (Zen 5, results/perf/RUNS.md, twelfth run), lookahead's window-only steps (3 tokens)
accepted 1.00 token at 1.12x t(1), while its steps with a prompt-lookup match (11 tokens) accepted 3.9
at 1.6x. A shape or kernel change can then be aimed at the group that loses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pandas as pd


def steps_by_size(runs: Iterable[Mapping[str, Any]], cost: Callable[[int], float]) -> pd.DataFrame:
    """One row per step size k (tokens fed), over generations' records (each with the per-step lists
    ``accepted`` and ``input_tokens``: see ``harness.jobs.measurement``); ``cost(k)`` = t(k) / t(1).

    Columns: k, steps, share of steps, tokens per step, cost, tokens per t(1) (the group's own speedup
    over ``ar``), and the group's shares of the tokens and of the time.
    """
    pairs = [(k, a) for run in runs for a, k in zip(run["accepted"], run["input_tokens"], strict=True)]
    if not pairs:
        raise ValueError("steps_by_size: no steps given")
    df = pd.DataFrame(pairs, columns=["k", "tokens"])
    df["time"] = df["k"].map({k: cost(k) for k in df["k"].unique()})
    g = df.groupby("k").agg(steps=("tokens", "size"), tokens=("tokens", "sum"), time=("time", "sum")).reset_index()
    return pd.DataFrame({
        "k": g["k"],
        "steps": g["steps"],
        "step_share": g["steps"] / g["steps"].sum(),
        "tokens_per_step": g["tokens"] / g["steps"],
        "cost": g["time"] / g["steps"],
        "tokens_per_t1": g["tokens"] / g["time"],
        "token_share": g["tokens"] / g["tokens"].sum(),
        "time_share": g["time"] / g["time"].sum(),
    })
