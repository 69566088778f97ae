"""Paper reference values and the tables that put our numbers, with bootstrap CIs, beside them.

* Ablation (paper Table 3, MT-Bench, LLaMA-2-7B-chat on A100): ``ABLATION_ROWS``
  and ``ablation_table(df)``: S and speedup per row, each with its 95% CI, beside the paper's. The
  paper writes settings as (N, W, G); rows here store that tuple as ``setting`` and the params in
  our record letters. ``rank_agreement``: Kendall tau (and its p-value) of our rows' S (and
  speedup) against the paper's order. ``separated_pairs``: for every pair of rows, the paired
  bootstrap CI of the S difference over their shared prompts; a pair is *separated* when that CI
  excludes 0, and then its direction is compared with the paper's.
* Sampling quality (paper Table 2): ``sampling_table(df)``: ROUGE-1/2/L of ``ar`` and
  ``lookahead`` on CNN/DM and XSum at each temperature, with S and speedup (with CIs) and the
  paired bootstrap CI of each ROUGE difference (lookahead - ar, prompts matched on the report's
  keys, seed included), and a one-line ``verdict`` per dataset and temperature: whether that CI
  excludes 0. Identical outputs (greedy) give exactly [0, 0]. The paper's Table 2 values are NOT
  included: they could not be retrieved here, and typing them from memory would risk wrong
  references.

Every interval comes from :mod:`harness.analysis.uncertainty` (examples resampled with their
turns, percentile CI; 2000 resamples, seed 0 by default).

CLI: ``python -m harness.tables ablation <results dir> [--out DIR] [--task T]``
and ``python -m harness.tables sampling <results dir> [--out DIR]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

from harness.analysis.io import to_markdown, with_ci_text
from harness.analysis.report import GROUP_KEYS, MATCH_KEYS, SETUP_KEYS, build_report, with_optional_keys
from harness.analysis.uncertainty import (
    LEVEL, N_RESAMPLES, SEED, UNIT, add_report_cis, mean_ci, ratio_diff_ci, with_ci,
)

BLOCK: tuple[str, ...] = (*SETUP_KEYS, "task")


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
                        "prompts": r["prompts"], "S": r["S"], "S_lo": r["S_lo"], "S_hi": r["S_hi"],
                        "speedup": r["speedup_agg"], "speedup_lo": r["speedup_agg_lo"],
                        "speedup_hi": r["speedup_agg_hi"], "speedup_mean": r["speedup_mean"],
                        "exact_match": r["exact_match"]})
    return out


def _greedy(df: pd.DataFrame, temperature: float) -> pd.DataFrame:
    return df[df["temperature"].fillna(0.0) == temperature]


def ablation_table(df: pd.DataFrame, task: str | None = None, temperature: float = 0.0,
                   n_resamples: int = N_RESAMPLES, seed: int = SEED, level: float = LEVEL) -> pd.DataFrame:
    """Our S / speedup (with bootstrap CIs) / exact match per paper Table 3 row, beside the paper's.

    One block of all nine rows per (model, dtype, device, task); rows with no
    records are kept with ``status == "missing"`` and NaN numbers. Greedy
    records only by default (the paper's ablation is greedy). ``task=None``
    picks the task(s) with the most ablation rows present. ``speedup`` is the
    aggregate ratio (sum ar time / sum time), ``speedup_mean`` the per-prompt mean.
    """
    df = _greedy(df, temperature)
    if task is not None:
        df = df[df["task"] == task]
    tasks = [task] if task is not None else _ablation_tasks(df)
    report = add_report_cis(df, build_report(df), n_resamples, seed, level) if len(df) else pd.DataFrame()
    blocks = df.loc[df["task"].isin(tasks), list(BLOCK)].drop_duplicates().to_dict("records")
    if not blocks:
        blocks = [{"model": np.nan, "dtype": np.nan, "device": np.nan, "task": task}]
    rows = [line for block in blocks for line in _block_rows(df, report, block)]
    cols = [*BLOCK, "row", "description", "setting", "decoder", "config", "status", "prompts",
            "S", "S_lo", "S_hi", "paper_S", "speedup", "speedup_lo", "speedup_hi", "paper_speedup",
            "speedup_mean", "exact_match"]
    return pd.DataFrame(rows).reindex(columns=cols)


def rank_agreement(table: pd.DataFrame) -> pd.DataFrame:
    """Kendall tau-b (scipy) of our rows' S and speedup against the paper's, per block.

    One value per Table 3 row (the first config of a row matched by several); missing rows are left out.
    """
    out = []
    for key, part in table.groupby(list(BLOCK), dropna=False, sort=True):
        part = part[part["status"] == "ok"].drop_duplicates("row")
        for metric in ("S", "speedup"):
            have = part.dropna(subset=[metric])
            tau, p = stats.kendalltau(have[metric], have[f"paper_{metric}"]) if len(have) >= 2 else (np.nan, np.nan)
            out.append({**dict(zip(BLOCK, key)), "metric": metric, "rows": len(have), "tau": tau, "p_value": p})
    return pd.DataFrame(out, columns=[*BLOCK, "metric", "rows", "tau", "p_value"])


def _keys(df: pd.DataFrame) -> list[str]:
    """The report's match keys this frame has (a key no record carries is one shared value)."""
    return [k for k in MATCH_KEYS if k in df.columns]


def _pair_units(df: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Per example: new tokens and steps of configs a and b summed over their matched records."""
    keys = _keys(df)
    cols = [*keys, "new_tokens", "steps"]
    pairs = df.loc[df["config"] == a, cols].merge(df.loc[df["config"] == b, cols], on=keys, suffixes=("_a", "_b"))
    return pairs.groupby(UNIT)[["new_tokens_a", "steps_a", "new_tokens_b", "steps_b"]].sum()


def separated_pairs(df: pd.DataFrame, table: pd.DataFrame, temperature: float = 0.0,
                    n_resamples: int = N_RESAMPLES, seed: int = SEED, level: float = LEVEL) -> pd.DataFrame:
    """Every pair of ``table``'s ok rows per block: S_a - S_b on their shared prompts with its paired
    bootstrap CI; ``separated`` when the CI excludes 0, ``direction`` against the paper's S difference."""
    ok = _greedy(df, temperature)
    ok = ok[ok["status"] == "ok"]
    out = []
    for key, lines in table[table["status"] == "ok"].groupby(list(BLOCK), dropna=False, sort=True):
        block = ok[_in(ok, dict(zip(BLOCK, key)))]
        for ra, rb in combinations(lines.to_dict("records"), 2):
            units = _pair_units(block, ra["config"], rb["config"])
            ci = ratio_diff_ci(units["new_tokens_a"], units["steps_a"], units["new_tokens_b"], units["steps_b"],
                               n_resamples, seed, level)
            separated = bool(ci.lo > 0 or ci.hi < 0)
            paper = ra["paper_S"] - rb["paper_S"]
            same = np.sign(ci.point) == np.sign(paper)
            out.append(with_ci({
                **dict(zip(BLOCK, key)), "row_a": ra["row"], "row_b": rb["row"], "config_a": ra["config"],
                "config_b": rb["config"], "examples": int(units.shape[0]),
                "S_a": float(units["new_tokens_a"].sum() / units["steps_a"].sum()) if len(units) else np.nan,
                "S_b": float(units["new_tokens_b"].sum() / units["steps_b"].sum()) if len(units) else np.nan,
                "diff": ci.point}, "diff", ci) | {
                "separated": separated, "paper_diff": paper,
                "direction": ("as paper" if same else "opposite") if separated else "—"})
    cols = [*BLOCK, "row_a", "row_b", "config_a", "config_b", "examples", "S_a", "S_b", "diff", "diff_lo",
            "diff_hi", "separated", "paper_diff", "direction"]
    return pd.DataFrame(out, columns=cols)


def render_ablation(table: pd.DataFrame, agreement: pd.DataFrame, pairs: pd.DataFrame, ci_note: str = "") -> str:
    """The Markdown ``harness.tables ablation`` prints: the table, the rank agreement, the pairs."""
    parts = ["## ablation", to_markdown(with_ci_text(table, ["S", "speedup"]))]
    parts += ["### Rank agreement with the paper (Kendall tau-b over the rows present)", to_markdown(agreement)]
    shown = with_ci_text(pairs, ["diff"]).drop(columns=["config_a", "config_b"])
    parts += ["### Row pairs: paired bootstrap CI of S_a - S_b on shared prompts", to_markdown(shown)]
    for key, part in pairs.groupby(list(BLOCK), dropna=False, sort=True):
        sep = part[part["separated"]]
        name = lambda r: f"{r['row_a']}-{r['row_b']}"  # noqa: E731
        parts.append(
            f"{key[3]} ({key[0]}): {len(sep)} of {len(part)} pairs separated (CI of the difference excludes 0); "
            f"as the paper's order: {', '.join(name(r) for r in sep.to_dict('records') if r['direction'] == 'as paper') or 'none'}; "
            f"against it: {', '.join(name(r) for r in sep.to_dict('records') if r['direction'] == 'opposite') or 'none'}; "
            f"not separated: {', '.join(name(r) for r in part[~part['separated']].to_dict('records')) or 'none'}.")
    parts += [NOTES["ablation"], ci_note]
    return "\n\n".join(p for p in parts if p) + "\n"


# --------------------------------------------------------------------------- sampling


def _rouge_diffs(ok: pd.DataFrame, config: str, score_cols: list[str], n_resamples: int, seed: int,
                 level: float) -> dict[str, float]:
    """Paired lookahead - ar differences for one config's records (same match keys), bootstrap CIs."""
    mine, keys = ok[ok["config"] == config], _keys(ok)
    ar = ok[ok["decoder"] == "ar"].drop_duplicates(keys)
    pairs = mine.merge(ar[[*keys, *score_cols]], on=keys, suffixes=("", "_ar"))
    out: dict[str, float] = {"paired": len(pairs)}
    for col in score_cols:
        name = col.removeprefix("score_")
        diff = pd.to_numeric(pairs[col], errors="coerce") - pd.to_numeric(pairs[f"{col}_ar"], errors="coerce")
        ci = mean_ci(pairs.assign(_d=diff), "_d", n_resamples, seed, level)
        out = with_ci(out | {f"d_{name}": ci.point}, f"d_{name}", ci)
    return out


def _verdict(row: Mapping[str, Any], names: Sequence[str]) -> str:
    """One line: does the CI of each ROUGE difference exclude 0?"""
    head = f"{row['task']}, T={row['temperature']:g}"
    if not row.get("paired"):
        return f"{head}: no ar record on the same prompts; no difference to test"
    text = {n: f"{n} {row[f'd_{n}']:+.4f} [{row[f'd_{n}_lo']:+.4f}, {row[f'd_{n}_hi']:+.4f}]" for n in names}
    if any(np.isnan(row[f"d_{n}_lo"]) for n in names):
        return f"{head}: {row['paired']} pair(s), too few for a CI"
    if all(row[f"d_{n}_lo"] == row[f"d_{n}_hi"] == 0 for n in names):
        return f"{head}: the CI of the ROUGE difference includes 0 (identical outputs: every difference is 0; {row['paired']} pairs)"
    excl = [n for n in names if row[f"d_{n}_lo"] > 0 or row[f"d_{n}_hi"] < 0]
    incl = [n for n in names if n not in excl]
    said = [f"the CI of the ROUGE difference excludes 0 for {'; '.join(text[n] for n in excl)}"] if excl else []
    said += [f"the CI of the ROUGE difference includes 0 for {'; '.join(text[n] for n in incl)}"] if incl else []
    return f"{head}: " + " and ".join(said) + f" ({row['paired']} pairs)"


def sampling_table(df: pd.DataFrame, tasks: Sequence[str] = SAMPLING_TASKS, n_resamples: int = N_RESAMPLES,
                   seed: int = SEED, level: float = LEVEL) -> pd.DataFrame:
    """Paper Table 2 layout: per task x temperature, ar and lookahead rows with ROUGE, S, speedup.

    Every number has its bootstrap CI (``_lo``, ``_hi``); lookahead rows carry the paired difference
    to ar (``d_<metric>``) with its CI and a ``verdict``. Raises ValueError if none of the tasks has
    ROUGE scores.
    """
    df = df[df["task"].isin(tasks) & df["decoder"].isin(["ar", "lookahead"])]
    score_cols = [f"score_{r}" for r in ROUGE if f"score_{r}" in df.columns]
    if df.empty or not score_cols:
        raise ValueError(
            f"no ar/lookahead records with ROUGE scores (score_rouge1/rouge2/rougeL) for tasks {list(tasks)}"
        )
    report = add_report_cis(df, build_report(df), n_resamples, seed, level)
    ok = with_optional_keys(df[df["status"] == "ok"])
    setting = [k for k in GROUP_KEYS if k not in ("decoder", "config")]
    names = [c.removeprefix("score_") for c in score_cols]
    rows = []
    for rep in report.to_dict("records"):
        in_group = np.logical_and.reduce([_same(ok[k], rep[k]) for k in setting])
        row = {k: rep[k] for k in (*BLOCK, "temperature", "decoder", "config")}
        row |= {"samples": rep["prompts"], "skipped": rep["skipped"]}
        for c, n in zip(score_cols, names):
            row |= {n: rep.get(c), f"{n}_lo": rep.get(f"{c}_lo"), f"{n}_hi": rep.get(f"{c}_hi")}
        row |= {"S": rep["S"], "S_lo": rep["S_lo"], "S_hi": rep["S_hi"], "speedup": rep["speedup_agg"],
                "speedup_lo": rep["speedup_agg_lo"], "speedup_hi": rep["speedup_agg_hi"],
                "exact_match": rep["exact_match"]}
        if rep["decoder"] == "lookahead":
            row |= _rouge_diffs(ok[in_group], rep["config"], score_cols, n_resamples, seed, level)
            row["verdict"] = _verdict(row, names)
        rows.append(row)
    table = pd.DataFrame(rows)
    order = {"ar": 0, "lookahead": 1}
    table = table.sort_values(["model", "task", "temperature", "decoder", "config"],
                              key=lambda s: s.map(order) if s.name == "decoder" else s)
    return table.reset_index(drop=True)


def render_sampling(table: pd.DataFrame, ci_note: str = "") -> str:
    """The Markdown ``harness.tables sampling`` prints: the table with CIs, then one verdict per line."""
    names = [n for n in (*ROUGE, "S", "speedup") if n in table.columns]
    names += [f"d_{n}" for n in ROUGE if f"d_{n}" in table.columns]
    shown = with_ci_text(table, names).drop(columns=["verdict"], errors="ignore")
    la = table[table["decoder"] == "lookahead"]
    several = la.duplicated(["model", "task", "temperature"], keep=False)
    verdicts = [v + (f" [{c}]" if dup else "") for v, c, dup in zip(la.get("verdict", []), la["config"], several)]
    parts = ["## sampling", to_markdown(shown), "### Verdicts (lookahead - ar)",
             "\n".join(f"- {v}" for v in verdicts) or "no lookahead rows", NOTES["sampling"], ci_note]
    return "\n\n".join(p for p in parts if p) + "\n"


# --------------------------------------------------------------------------- CLI

NOTES: Mapping[str, str] = MappingProxyType({
    "ablation": "Paper: Table 3 (MT-Bench, LLaMA-2-7B-chat, A100); settings are (N, W, G). "
                "speedup = sum ar decode time / sum decode time on matched prompts; "
                "S = total new tokens / total decoding steps (prefill excluded).",
    "sampling": "d_<metric> = lookahead - ar, paired by prompt, mean over pairs with its paired bootstrap CI. "
                "S = total new tokens / total decoding steps (prefill excluded). "
                "Paper Table 2 values are not included (not retrievable here).",
})
