"""Every saved ``harness.perf`` result against the CPU targets: one row per result file and weight mode.

Why: the targets (issue 14) are judged on figures spread over dozens of perf runs on several machines, and
a hand-copied table drifts from the files it quotes. This reads the JSON files ``harness.perf`` writes
(``<out>/<kernel variant or library>/perf-<dtypes>-<tasks>.json``) and recomputes each figure from them:

- ``t1/floor``: t(1) over the step's weight bytes / the read bandwidth measured in the same rounds;
- ``bf16w/fp32``: t(1) of the bf16w mode over float32's, both from the same file (one time window); both greedy
  steps, so float32's reads the LM head's bfloat16 screen where it has one (``harness.runtime.head_screen``; in
  the files of 2026-12-07n both modes read an int8 screen, tried and reverted: RUNS.md, forty-third run);
- ``screen``: no target; on float32 rows whose greedy steps screen the LM head, their t(1) over a step that
  reads the whole float32 head (timed in the same rounds), and on bf16w rows, bf16w's t(1) over that
  whole-head float32 step (the two weight modes reading every weight once, as files before the screen did);
- ``<task> la/ar`` and ``+corpus``: the auto-tuned lookahead's speedup over our `ar` (total time, prefill
  included, aggregate over the prompts), with prompt/output pools, and also drafting from the held-out
  prompts' answers;
- ``la/pld``: the smallest ratio, over the file's tasks and `pld` settings, of `pld`'s total time to the
  auto-tuned lookahead's (the one without the corpus); `pld` as published (the first occurrence), which the
  target names;
- ``la/pld recent``: the same against `pld(recent=True)` (the recency rule lookahead's chain uses), where
  the file has it: no target, shown so that lookahead's lead is read against the stronger baseline too;
- ``ar/generate``: the smallest ratio, over the file's tasks, of transformers' greedy ``generate`` time to our
  `ar`'s, on the same prompts and weights.

The targets were set for float32 (the reference mode) and for bf16w's t(1); a figure that meets its target
is bold. The kernel variant is the results folder's name (``avx512``; ``avx2`` is also the AVX2 build forced
on an AVX-512 machine), and other paths (libraries, the baseline build, files from before that layout)
get no verdict. Analysis only: nothing here loads a model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis.io import to_markdown
from harness.analysis.perf_names import AUTO, CORPUS, GENERATE, PLD, RECENT


@dataclass(frozen=True)
class Target:
    """A bound per ISA; ``at_most``: the figure meets it at or below the bound (else at or above)."""

    avx512: float
    avx2: float
    at_most: bool = False

    def met(self, value: float, isa: str) -> bool:
        bound = self.avx512 if isa == "avx512" else self.avx2
        return value <= bound if self.at_most else value >= bound


# the table: AVX-512 (native) / AVX2 (forced on the same machine, or native)
TARGETS: dict[str, Target] = {
    "t1/floor": Target(1.25, 1.25, at_most=True),
    "bf16w/fp32": Target(0.6, 0.6, at_most=True),
    "humaneval la/ar": Target(1.8, 1.6),
    "humaneval +corpus": Target(1.8, 1.6),
    "mt_bench la/ar": Target(1.35, 1.25),
    "mt_bench +corpus": Target(1.35, 1.25),
    "la/pld": Target(1.0, 1.0),
    "ar/generate": Target(2.0, 1.8),
}
TARGET_ISAS = ("avx512", "avx2")
TASKS = ("humaneval", "mt_bench")  # the tasks with a speedup target of their own
EXTRA = "la/pld recent"  # a figure shown beside the targets, with none of its own
SCREEN = "screen"  # t(1) against a step reading the whole float32 LM head (see the module docstring); no target


def _speedups(table: list[dict[str, Any]]) -> dict[str, float]:
    """method name -> aggregate speedup over our `ar` (total time ratio)."""
    return {row["method"]: float(row["speedup"]) for row in table}


def _auto(speedups: dict[str, float], corpus: bool) -> float | None:
    """The auto-tuned lookahead's speedup, with or without the corpus (the first such row)."""
    for name, value in speedups.items():
        if name.startswith(AUTO) and name.endswith(CORPUS) == corpus:
            return value
    return None


def _t1(memory: dict[str, Any] | None) -> float | None:
    """A memory run's t(1): timed beside the bandwidth probe (perf since f7ffa8c), else its latency curve's."""
    if not memory:
        return None
    if "t1_s" in memory:
        return float(memory["t1_s"])
    curve = memory.get("curve_s", {})
    return float(curve["1"]) if "1" in curve else None


def figures(report: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The targeted figures of one perf report (a parsed JSON file) for one weight mode; a figure the file
    lacks is absent."""
    runs, out = report.get("runs", {}), {}
    memory, bandwidth = runs.get(f"{dtype}/memory"), report.get("read_bandwidth_Bps")
    t1, t1_fp32 = _t1(memory), _t1(runs.get("float32/memory"))
    if bandwidth:
        out["GB/s"] = bandwidth / 1e9
        if t1 is not None:
            out["t1/floor"] = t1 / (memory["step_weight_bytes"] / bandwidth)
    if dtype == "bf16w" and t1 is not None and t1_fp32 is not None:
        out["bf16w/fp32"] = t1 / t1_fp32
    whole = (runs.get("float32/memory") or {}).get("t1_whole_head_s")
    if whole and t1 is not None and dtype in ("float32", "bf16w"):
        out[SCREEN] = t1 / whole
    vs_pld, vs_recent, vs_generate, counts = [], [], [], {}
    for key, run in runs.items():
        if not key.startswith(f"{dtype}/") or "table" not in run:
            continue
        task, speedups = key.split("/", 1)[1], _speedups(run["table"])
        auto = _auto(speedups, corpus=False)
        if task in TASKS:
            counts.setdefault(str(run["table"][0]["prompts"]), None)
            for column, value in ((f"{task} la/ar", auto), (f"{task} +corpus", _auto(speedups, corpus=True))):
                if value is not None:
                    out[column] = value
        for name, s in speedups.items():
            if auto is not None and name.startswith(PLD):
                (vs_recent if RECENT in name else vs_pld).append((auto / s, task))
        vs_generate += [(1 / s, task) for name, s in speedups.items() if name == GENERATE]
    if counts:
        out["prompts"] = "/".join(counts)  # the targeted tasks' prompt counts, distinct
    for column, pairs in (("la/pld", vs_pld), (EXTRA, vs_recent), ("ar/generate", vs_generate)):
        if pairs:
            out[column], out[f"{column} task"] = min(pairs)
    return out


def perf_files(roots: list[Path]) -> list[Path]:
    """Every perf JSON below the roots (a root may be one file), sorted by path."""
    found = {p for root in roots for p in ([root] if root.is_file() else root.rglob("*.json"))}
    return sorted(p for p in found if p.name.startswith("perf"))


def summary(roots: list[Path], base: Path | None = None) -> pd.DataFrame:
    """One row per (perf file, weight mode): the run (file path relative to ``base``), the kernel variant,
    the weight mode and every targeted figure the file holds (NaN where it holds none)."""
    rows = []
    for path in perf_files(roots):
        report = json.loads(path.read_text(encoding="utf-8"))
        try:
            run = str(path.relative_to(base)) if base else str(path)
        except ValueError:
            run = str(path)
        for dtype in dict.fromkeys(key.split("/", 1)[0] for key in report.get("runs", {})):  # in file order
            rows.append({"run": run, "path": path.parent.name, "dtype": dtype, **figures(report, dtype)})
    columns = ["run", "path", "dtype", "GB/s", "prompts", *TARGETS, EXTRA, SCREEN, "la/pld task", EXTRA + " task",
               "ar/generate task"]
    return pd.DataFrame(rows, columns=columns)


def meets(row: pd.Series, column: str) -> bool:
    """Whether the row's figure meets its target (float32 rows, and bf16w's own t(1) ratio; kernel paths only)."""
    value = row[column]
    if pd.isna(value) or row["path"] not in TARGET_ISAS:
        return False
    if row["dtype"] != "float32" and column != "bf16w/fp32":
        return False
    return TARGETS[column].met(float(value), row["path"])


def render(df: pd.DataFrame) -> str:
    """Markdown: ratios to 2 decimals (3 under 1.1 where the target is 1.0), a met target in bold."""
    shown = df.copy().astype(object)
    for i, row in df.iterrows():
        for column in TARGETS:
            value = row[column]
            if pd.isna(value):
                continue
            text = f"{value:.3f}" if TARGETS[column].avx2 == 1.0 and value < 1.1 else f"{value:.2f}"
            shown.at[i, column] = f"**{text}**" if meets(row, column) else text
        for column in (EXTRA, SCREEN):
            if not pd.isna(row[column]):
                shown.at[i, column] = f"{row[column]:.3f}"
    return to_markdown(shown.drop(columns=["la/pld task", EXTRA + " task", "ar/generate task"]), floatfmt=".1f")
