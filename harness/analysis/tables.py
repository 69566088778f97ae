"""Paper reference values and the tables that put our numbers beside them.

* Ablation (paper Table 3, MT-Bench, LLaMA-2-7B-chat on A100): ``ABLATION_ROWS``
  and ``ablation_table(df)``. The paper writes settings as (N, W, G); rows
  here store that tuple as ``setting`` and the params in our record letters.
* Sampling quality (paper Table 2): ``sampling_table(df)`` — ROUGE-1/2/L of
  ``ar`` and ``lookahead`` on CNN/DM and XSum at each temperature, with
  speedup and S, and a 95% CI on each ROUGE difference (lookahead - ar).
  The CI is a *paired t* interval over prompts present in both (matched on
  the same keys as the report, seed included): mean(d) ± t_{0.975, n-1} ·
  sd(d)/sqrt(n). It is exact-zero when outputs are identical (greedy) and
  is chosen over a bootstrap because it is deterministic and cheap; with
  few prompts it leans on approximate normality of the differences.
  The paper's Table 2 values are NOT included: they could not be retrieved
  here, and typing them from memory would risk wrong references.

CLI: ``python -m harness.tables ablation <results dir> [--out DIR] [--task T]``
and ``python -m harness.tables sampling <results dir> [--out DIR]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

from harness.analysis.report import GROUP_KEYS, MATCH_KEYS, SETUP_KEYS, build_report


class AblationRow(NamedTuple):
    """One row of paper Table 3; ``params`` in record letters, ``None`` = any params."""

    label: str
    description: str
    setting: str  # the paper's (N, W, G) text
    decoder: str
    params: Mapping[str, Any] | None
    paper_speedup: float
    paper_S: float


def _la(n: int, w: int, g: int, prompt: bool) -> Mapping[str, Any]:
    """Params of paper setting (N, W, G) in our record letters (read-only)."""
    return MappingProxyType({"W": w, "N": n, "G": g, "pool_from_prompt": prompt})


#: Paper Table 3 (MT-Bench, LLaMA-2-7B-chat, A100). Tuples in ``setting`` are (N, W, G).
ABLATION_ROWS: tuple[AblationRow, ...] = (
    AblationRow("①", "autoregressive", "", "ar", MappingProxyType({}), 1.00, 1.00),
    AblationRow("②", "prompt lookup", "", "pld", None, 1.44, 1.55),
    AblationRow("③", "lookahead + prompt pool", "(10,1,3)", "lookahead", _la(10, 1, 3, True), 1.36, 1.45),
    AblationRow("④", "lookahead + prompt pool", "(5,1,10)", "lookahead", _la(5, 1, 10, True), 1.36, 1.51),
    AblationRow("⑤", "lookahead, no prompt pool", "(5,1,30)", "lookahead", _la(5, 1, 30, False), 1.04, 1.12),
    AblationRow("⑥", "lookahead + prompt pool", "(5,1,30)", "lookahead", _la(5, 1, 30, True), 1.46, 1.59),
    AblationRow("⑦", "lookahead, no prompt pool", "(5,30,1)", "lookahead", _la(5, 30, 1, False), 1.61, 1.79),
    AblationRow("⑧", "lookahead, no prompt pool", "(5,15,15)", "lookahead", _la(5, 15, 15, False), 1.78, 1.96),
    AblationRow("⑨", "lookahead + prompt pool", "(5,15,15)", "lookahead", _la(5, 15, 15, True), 1.88, 2.05),
)
ROUGE: tuple[str, ...] = ("rouge1", "rouge2", "rougeL")
SAMPLING_TASKS: tuple[str, ...] = ("cnn_dm", "xsum")


# --------------------------------------------------------------------------- ablation


def row_mask(df: pd.DataFrame, row: AblationRow) -> pd.Series:
    """Records of ``df`` that belong to an ablation row (decoder + every listed param)."""
    mask = df["decoder"] == row.decoder
    if row.params is None:
        return mask
    if not row.params:  # ar: no params at all
        return mask
    for name, value in row.params.items():
        col = f"p_{name}"
        if col not in df.columns:
            return pd.Series(False, index=df.index)
        mask &= df[col] == value
    return mask


def _ablation_tasks(df: pd.DataFrame) -> list[str]:
    """Tasks with the most ablation rows present (ties kept): where the ablation was run.

    A task that only shares one config with the ablation (say the default
    lookahead config on a summarisation task) is not an ablation run.
    """
    present = {
        task: sum(bool(row_mask(part, row).any()) for row in ABLATION_ROWS)
        for task, part in df.groupby(df["task"].astype(str))
    }
    best = max(present.values(), default=0)
    return sorted(t for t, n in present.items() if n == best)


def _same(col: pd.Series, value: Any) -> pd.Series:
    """Equality that treats NaN as equal to NaN (group keys may be missing)."""
    return col.isna() if pd.isna(value) else col == value


def _in(df: pd.DataFrame, block: Mapping[str, Any]) -> pd.Series:
    return pd.Series(np.logical_and.reduce([_same(df[k], v) for k, v in block.items()]), index=df.index)


def _block_rows(df: pd.DataFrame, report: pd.DataFrame, block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The nine Table 3 rows for one (model, dtype, device, task); one line per matching config."""
    in_block = _in(df, block) if len(df) else pd.Series(dtype=bool)
    rep_block = report[_in(report, block)] if len(report) else report
    out = []
    for row in ABLATION_ROWS:
        base = {**block, "row": row.label, "description": row.description, "setting": row.setting,
                "decoder": row.decoder, "paper_speedup": row.paper_speedup, "paper_S": row.paper_S}
        configs = sorted(df.loc[in_block & row_mask(df, row), "config"].unique()) if len(df) else []
        if not configs:
            out.append({**base, "config": None, "status": "missing"})
        for config in configs:
            r = rep_block[rep_block["config"] == config].iloc[0]  # greedy + block + config fix the group
            out.append({**base, "config": config, "status": "ok" if r["prompts"] > 0 else "skipped",
                        "prompts": r["prompts"], "S": r["S"], "speedup": r["speedup_agg"],
                        "speedup_mean": r["speedup_mean"], "exact_match": r["exact_match"]})
    return out


def ablation_table(df: pd.DataFrame, task: str | None = None, temperature: float = 0.0) -> pd.DataFrame:
    """Our S / speedup / exact match per paper Table 3 row, beside the paper's numbers.

    One block of all nine rows per (model, dtype, device, task); rows with no
    records are kept with ``status == "missing"`` and NaN numbers. Greedy
    records only by default (the paper's ablation is greedy). ``task=None``
    picks the task(s) with the most ablation rows present. ``speedup`` is the
    aggregate ratio (sum ar time / sum time), ``speedup_mean`` the per-prompt mean.
    """
    df = df[df["temperature"].fillna(0.0) == temperature]
    if task is not None:
        df = df[df["task"] == task]
    tasks = [task] if task is not None else _ablation_tasks(df)
    report = build_report(df) if len(df) else pd.DataFrame()
    blocks = df.loc[df["task"].isin(tasks), [*SETUP_KEYS, "task"]].drop_duplicates().to_dict("records")
    if not blocks:
        blocks = [{"model": np.nan, "dtype": np.nan, "device": np.nan, "task": task}]
    rows = [line for block in blocks for line in _block_rows(df, report, block)]
    cols = [*SETUP_KEYS, "task", "row", "description", "setting", "decoder", "config", "status", "prompts",
            "S", "paper_S", "speedup", "paper_speedup", "speedup_mean", "exact_match"]
    return pd.DataFrame(rows).reindex(columns=cols)


# --------------------------------------------------------------------------- sampling


def paired_t_ci(diff: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of a paired t interval; NaN bounds with fewer than 2 pairs."""
    diff = np.asarray(diff, dtype=float)
    diff = diff[~np.isnan(diff)]
    n = len(diff)
    if n == 0:
        return (np.nan, np.nan, np.nan)
    mean = float(diff.mean())
    if n < 2:
        return (mean, np.nan, np.nan)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * diff.std(ddof=1) / np.sqrt(n)
    return (mean, mean - half, mean + half)


def _rouge_diffs(ok: pd.DataFrame, config: str, score_cols: list[str]) -> dict[str, float]:
    """Paired lookahead - ar differences for one config's records (same match keys)."""
    mine = ok[ok["config"] == config]
    ar = ok[ok["decoder"] == "ar"].drop_duplicates(list(MATCH_KEYS))
    pairs = mine.merge(ar[[*MATCH_KEYS, *score_cols]], on=list(MATCH_KEYS), suffixes=("", "_ar"))
    out: dict[str, float] = {"paired": len(pairs)}
    for col in score_cols:
        name = col.removeprefix("score_")
        mean, lo, hi = paired_t_ci(pairs[col] - pairs[f"{col}_ar"])
        out |= {f"d_{name}": mean, f"d_{name}_lo": lo, f"d_{name}_hi": hi}
    return out


def sampling_table(df: pd.DataFrame, tasks: Sequence[str] = SAMPLING_TASKS) -> pd.DataFrame:
    """Paper Table 2 layout: per task x temperature, ar and lookahead rows with ROUGE, S, speedup.

    Lookahead rows carry the paired difference to ar and its 95% paired-t CI.
    Raises ValueError if none of the tasks has ROUGE scores.
    """
    df = df[df["task"].isin(tasks) & df["decoder"].isin(["ar", "lookahead"])]
    score_cols = [f"score_{r}" for r in ROUGE if f"score_{r}" in df.columns]
    if df.empty or not score_cols:
        raise ValueError(
            f"no ar/lookahead records with ROUGE scores (score_rouge1/rouge2/rougeL) for tasks {list(tasks)}"
        )
    report = build_report(df)
    ok = df[df["status"] == "ok"]
    setting = [k for k in GROUP_KEYS if k not in ("decoder", "config")]
    rows = []
    for rep in report.to_dict("records"):
        in_group = np.logical_and.reduce([_same(ok[k], rep[k]) for k in setting])
        row = {k: rep[k] for k in (*SETUP_KEYS, "task", "temperature", "decoder", "config")}
        row |= {"samples": rep["prompts"], "skipped": rep["skipped"],
                **{c.removeprefix("score_"): rep.get(c) for c in score_cols},
                "S": rep["S"], "speedup": rep["speedup_agg"], "exact_match": rep["exact_match"]}
        if rep["decoder"] == "lookahead":
            row |= _rouge_diffs(ok[in_group], rep["config"], score_cols)
        rows.append(row)
    table = pd.DataFrame(rows)
    order = {"ar": 0, "lookahead": 1}
    table = table.sort_values(["model", "task", "temperature", "decoder", "config"],
                              key=lambda s: s.map(order) if s.name == "decoder" else s)
    return table.reset_index(drop=True)


# --------------------------------------------------------------------------- CLI

NOTES: Mapping[str, str] = MappingProxyType({
    "ablation": "Paper: Table 3 (MT-Bench, LLaMA-2-7B-chat, A100); settings are (N, W, G). "
                "speedup = sum ar decode time / sum decode time on matched prompts; "
                "S = total new tokens / total decoding steps (prefill excluded).",
    "sampling": "d_<metric> = lookahead - ar, paired by prompt, with a 95% paired-t CI (_lo, _hi). "
                "S = total new tokens / total decoding steps (prefill excluded). "
                "Paper Table 2 values are not included (not retrievable here).",
})
