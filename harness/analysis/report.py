"""Summary table per task x decoder config x prompt variant: S, tau, throughput, speedup and exact
match vs ``ar`` (the variant is printed only where one task and sampling setting has several).

``python -m harness.report <results dir> [--out DIR]`` prints one Markdown table
per (model, dtype, device) and writes ``report.csv`` / ``report.md``.

Definitions (printed with every table, because they are easy to misread):

* S (compression ratio) = total new tokens / total decoding steps of the
  config's ok records. Prefill is not a step and is not counted.
* tau = mean over prompts of the mean tokens accepted per step (a per-prompt
  average; S is the token-weighted one).
* tok/s = total new tokens / total decode seconds (prefill excluded).
* speedup over ``ar``: a record is matched with the ``ar`` record of the same
  (model, dtype, device, task, example_id, turn, max_new_tokens, temperature,
  top_k, top_p, seed, variant); ``variant`` is the prompt variant (the job identity
  minus the decoder: task options, data source, attention path, ...), so a gsm8k
  8-shot lookahead run never pairs with a 0-shot ar run. Records written before
  variants existed share one variant (""). ``speedup_mean`` = mean over matched prompts of
  ar decode_s / decode_s; ``speedup_agg`` = sum ar decode_s / sum decode_s over
  the same matched prompts.
* exact_match = share of matched prompts whose ``output_hash`` equals ar's.
  Greedy fp32 must read 1.0; with sampling it measures nothing but chance.

Mixed models: rows always carry model/dtype/device and speedups are only ever
computed against ``ar`` on the same model/dtype/device, so one DataFrame is
safe; the CLI prints and writes a separate table per (model, dtype, device)
so no one compares rows across setups by eye.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from harness.analysis.compare import against_reference
from harness.analysis.io import to_markdown
from harness.records import RecordsError, compression

MATCH_KEYS: tuple[str, ...] = (
    "model", "dtype", "device", "task", "example_id", "turn",
    "max_new_tokens", "temperature", "top_k", "top_p", "seed", "variant",
)
#: Match keys old records may lack: missing means one shared value ("").
OPTIONAL_MATCH_KEYS: tuple[str, ...] = ("variant",)
SETUP_KEYS: tuple[str, ...] = ("model", "dtype", "device")
#: One report row per group. ``variant`` is in it so that two prompt variants of one decoder config
#: (e.g. gsm8k 0-shot and 8-shot) are two rows, not one row pooling both.
GROUP_KEYS: tuple[str, ...] = (
    "model", "dtype", "device", "task", "temperature", "top_k", "top_p",
    "max_new_tokens", "decoder", "config", "variant",
)
#: Columns shown in the printed Markdown (CSV keeps all).
DISPLAY_COLUMNS: tuple[str, ...] = (
    "task", "temperature", "config", "prompts", "skipped", "mean_new_tokens", "S", "tau",
    "tok_per_s", "matched", "speedup_mean", "speedup_agg", "exact_match",
)
DEFINITIONS = (
    "S = total new tokens / total decoding steps (prefill excluded); "
    "tau = mean over prompts of tokens accepted per step; "
    "tok_per_s = new tokens / decode seconds; speedup = ar decode time / decoder decode time "
    "on the same prompts (prefill excluded): speedup_mean per prompt, speedup_agg = sum/sum; "
    "exact_match = output_hash equal to ar's on matched prompts."
)
AR_HINT = (
    "run decoder=ar on the same task (same model, dtype, device, max_new_tokens, "
    "temperature/top_k/top_p, seed and task options/data) into the same results dir"
)


# --------------------------------------------------------------------------- building


def _tau(df: pd.DataFrame) -> pd.Series:
    """Per-record mean accepted per step; from ``accepted`` when present, else new/steps."""
    def one(row: pd.Series) -> float:
        acc = row["accepted"]
        if isinstance(acc, (list, tuple, np.ndarray)) and len(acc) > 0:
            return float(np.mean(acc))
        return row["new_tokens"] / row["steps"] if row["steps"] else math.nan
    return df.apply(one, axis=1) if len(df) else pd.Series(dtype=float)


def with_optional_keys(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every OPTIONAL_MATCH_KEYS column present, missing values as "" (one shared value)."""
    return df.assign(**{k: df[k].fillna("") if k in df.columns else "" for k in OPTIONAL_MATCH_KEYS})


def attach_baseline(df: pd.DataFrame) -> pd.DataFrame:
    """Ok records with ``ar_decode_s``, ``speedup`` and ``match`` against the matching ``ar`` record
    (:func:`harness.analysis.compare.against_reference` on MATCH_KEYS; a duplicate ar record keeps the first).
    """
    ok = with_optional_keys(df[df["status"] == "ok"])
    for col in (c for c in ok.columns if c.startswith("score_")):  # bools/None -> numbers/NaN
        ok[col] = pd.to_numeric(ok[col].map(lambda v: float(v) if isinstance(v, bool) else v), errors="coerce")
    out = against_reference(ok, MATCH_KEYS).rename(
        columns={"ref_decode_s": "ar_decode_s", "ref_output_hash": "ar_output_hash", "exact": "match"})
    out["tau"] = _tau(out)
    out["decode_s_matched"] = out["decode_s"].where(out["ar_decode_s"].notna())
    return out


def build_report(df: pd.DataFrame) -> pd.DataFrame:
    """One row per GROUP_KEYS (task x decoder config x sampling setup); see module doc."""
    for col in (*GROUP_KEYS, *MATCH_KEYS):
        if col not in df.columns and col not in OPTIONAL_MATCH_KEYS:
            raise RecordsError(f"records lack column {col!r}; load them with harness.records.load_records")
    df = with_optional_keys(df)
    ok = attach_baseline(df)
    score_cols = sorted(c for c in ok.columns if c.startswith("score_"))
    grouped = ok.groupby(list(GROUP_KEYS), dropna=False, sort=True)
    rep = grouped.agg(
        prompts=("example_id", "size"),
        new_tokens=("new_tokens", "sum"),
        steps=("steps", "sum"),
        decode_s=("decode_s", "sum"),
        mean_new_tokens=("new_tokens", "mean"),
        tau=("tau", "mean"),
        matched=("ar_decode_s", "count"),
        speedup_mean=("speedup", "mean"),
        ar_s_matched=("ar_decode_s", lambda s: s.sum(min_count=1)),
        dec_s_matched=("decode_s_matched", lambda s: s.sum(min_count=1)),
        exact_match=("match", "mean"),
        **{c: (c, "mean") for c in score_cols},
    )
    rep["S"] = compression(rep["new_tokens"], rep["steps"])
    rep["tok_per_s"] = rep["new_tokens"] / rep["decode_s"]
    rep["speedup_agg"] = rep["ar_s_matched"] / rep["dec_s_matched"]
    skipped = df[df["status"] == "skipped"].groupby(list(GROUP_KEYS), dropna=False).size().rename("skipped")
    rep = rep.join(skipped, how="outer")
    rep["skipped"] = rep["skipped"].fillna(0).astype(int)
    rep["prompts"] = rep["prompts"].fillna(0).astype(int)
    rep["matched"] = rep["matched"].fillna(0).astype(int)
    ordered = [
        "prompts", "skipped", "mean_new_tokens", "new_tokens", "steps", "S", "tau",
        "decode_s", "tok_per_s", "matched", "speedup_mean", "speedup_agg", "exact_match",
    ]
    return rep[ordered + score_cols].reset_index()


def missing_baseline_note(report: pd.DataFrame) -> str | None:
    """One sentence naming the tasks whose rows have no ``ar`` match, or None."""
    lacking = report[(report["matched"] == 0) & (report["prompts"] > 0)]
    if lacking.empty:
        return None
    tasks = ", ".join(sorted(lacking["task"].astype(str).unique()))
    return (
        f"note: no matching ar baseline for some rows (tasks: {tasks}); their speedup and "
        f"exact_match are NaN. To add one, {AR_HINT}."
    )


def setups(report: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """Split a report into (title, rows) per (model, dtype, device)."""
    out = []
    for key, part in report.groupby(list(SETUP_KEYS), dropna=False, sort=True):
        title = "model={} dtype={} device={}".format(*key)
        out.append((title, part))
    return out


def render_report(report: pd.DataFrame) -> str:
    """The Markdown text the CLI prints and writes: one section per setup."""
    parts = []
    for title, part in setups(report):
        cols = [c for c in DISPLAY_COLUMNS if c in part.columns]
        if "variant" in part.columns:  # shown only where one setting's rows come from several prompt variants
            setting = [k for k in GROUP_KEYS if k not in ("decoder", "config", "variant")]
            several = part.groupby(setting, dropna=False)["variant"].transform("nunique") > 1
            part = part.assign(variant=part["variant"].where(several))
            cols.insert(cols.index("config") + 1, "variant")
        cols += [c for c in part.columns if c.startswith("score_")]
        shown = part[cols].dropna(axis=1, how="all")
        parts.append(f"## {title}\n\n{to_markdown(shown)}")
    parts.append(DEFINITIONS)
    note = missing_baseline_note(report)
    if note:
        parts.append(note)
    return "\n\n".join(parts) + "\n"
