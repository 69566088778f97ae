"""Comparing a fresh suite run with the baseline: a pure function of two result dicts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from harness.analysis.compare import REFERENCE, against_reference
from harness.records import compression

DEFAULT_TOLERANCE = 0.02  # relative drop of a config x task aggregate S that fails the check
UPDATE_COMMAND = "write a new baseline with `python -m harness.regression --update-baseline` and commit it"


@dataclass(frozen=True)
class Row:
    config: str
    task: str
    baseline_s: float | None
    now_s: float | None
    status: str  # ok | FAIL | improved | new | MISSING

    @property
    def change_pct(self) -> float | None:
        if self.baseline_s is None or self.now_s is None or self.baseline_s == 0:
            return None
        return (self.now_s / self.baseline_s - 1.0) * 100.0


@dataclass
class Comparison:
    """Outcome of :func:`compare`: failures make the check exit non-zero; notes never do."""

    tolerance: float
    rows: list[Row] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def table(self) -> str:
        width = max([48] + [len(r.config) + 2 for r in self.rows])
        header = f"{'config':<{width}}{'task':<12}{'baseline S':>11}{'now S':>9}{'change':>9}  status"
        lines = [header, "-" * len(header)]
        for r in self.rows:
            base = "-" if r.baseline_s is None else f"{r.baseline_s:.3f}"
            now = "-" if r.now_s is None else f"{r.now_s:.3f}"
            pct = "-" if r.change_pct is None else f"{r.change_pct:+.2f}%"
            lines.append(f"{r.config:<{width}}{r.task:<12}{base:>11}{now:>9}{pct:>9}  {r.status}")
        lines.append(
            f"tolerance: FAIL when a config x task S (sum tokens / sum steps) drops by more than "
            f"{self.tolerance * 100:g}% relative to the baseline"
        )
        return "\n".join(lines)

    def report(self) -> str:
        """The table, then notes, then failures: what CI prints."""
        parts = [self.table()]
        if self.notes:
            parts.append("notes:\n" + "\n".join(f"  - {n}" for n in self.notes))
        if self.failures:
            parts.append(f"FAILED ({len(self.failures)}):\n" + "\n".join(f"  - {f}" for f in self.failures))
        else:
            parts.append("PASSED")
        return "\n\n".join(parts)


def _task_s(entry: dict[str, Any]) -> float:
    """Aggregate S from the integer counts, so float rounding in the file never matters."""
    return compression(int(entry["tokens"]), int(entry["steps"]))


def _prompt_rows(results: dict[str, Any]) -> pd.DataFrame:
    """One row per (config, task, prompt) of a suite run: label, decoder, task, id, tokens, output_hash."""
    rows = [
        {"label": label, "decoder": cfg.get("decoder"), "task": task, "id": pid, "tokens": res["tokens"],
         "output_hash": res["output_hash"], "decode_s": 0.0}
        for label, cfg in results.get("configs", {}).items()
        for task, agg in cfg["tasks"].items()
        for pid, res in agg["prompts"].items()
    ]
    return pd.DataFrame(rows, columns=["label", "decoder", "task", "id", "tokens", "output_hash", "decode_s"])


def exactness_failures(results: dict[str, Any], reference: str = REFERENCE) -> list[str]:
    """Every (config, prompt) whose greedy output differs from the reference decoder's in ``results``."""
    rows = _prompt_rows(results)
    refs = rows[rows["decoder"] == reference]
    if refs.empty:
        return [f"no {reference!r} config in the run: greedy outputs cannot be checked for exactness"]
    ref_label = refs["label"].iloc[0]
    paired = against_reference(rows, ["task", "id"], reference=reference)
    ref_tokens = refs.drop_duplicates(["task", "id"]).set_index(["task", "id"])["tokens"]
    failures = []
    for r in paired[paired["decoder"] != reference].itertuples():
        if pd.isna(r.exact):
            failures.append(f"{r.label} on {r.task}:{r.id}: no {ref_label} output to compare with")
        elif not r.exact:
            failures.append(
                f"{r.label} on {r.task}:{r.id}: greedy output differs from {ref_label}'s "
                f"({r.tokens} vs {ref_tokens[(r.task, r.id)]} tokens, hash {r.output_hash[:10]} vs "
                f"{r.ref_output_hash[:10]})"
            )
    return failures


def _prompt_keys(keys: Iterable[tuple[str, str]]) -> str:
    return ", ".join(f"{task}:{pid}" for task, pid in sorted(keys)) or "none"


def _suite_mismatches(baseline: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    """Differences that make S incomparable: the suite or model changed since the baseline was made."""
    out = []
    if baseline.get("max_new_tokens") != fresh.get("max_new_tokens"):
        out.append(f"max_new_tokens is {fresh.get('max_new_tokens')}, baseline used {baseline.get('max_new_tokens')}")
    base_p = {(p["task"], p["id"]): p.get("prompt_hash") for p in baseline.get("prompts", [])}
    now_p = {(p["task"], p["id"]): p.get("prompt_hash") for p in fresh.get("prompts", [])}
    if set(base_p) != set(now_p):
        added, removed = _prompt_keys(set(now_p) - set(base_p)), _prompt_keys(set(base_p) - set(now_p))
        out.append(f"prompt set changed: added {added}; removed {removed}")
    changed = _prompt_keys(k for k in set(base_p) & set(now_p) if base_p[k] != now_p[k])
    if changed != "none":
        out.append(f"prompt tokens changed (tokenizer, chat template or data) for {changed}")
    base_m, now_m = baseline.get("meta", {}), fresh.get("meta", {})
    for key in ("model", "dtype"):
        if key in base_m and key in now_m and base_m[key] != now_m[key]:
            out.append(f"{key} is {now_m[key]!r}, baseline used {base_m[key]!r}")
    return out


def compare(
    baseline: dict[str, Any], fresh: dict[str, Any], tolerance: float = DEFAULT_TOLERANCE
) -> Comparison:
    """Compare fresh results with the baseline (both in :func:`run_suite`'s layout, ``meta`` optional).

    Failures: a config x task aggregate S below ``baseline * (1 - tolerance)``; a greedy output that
    differs from the reference decoder's in the fresh run; a baseline config or task missing from the
    fresh run; a suite mismatch (prompts, max_new_tokens, model, dtype). Notes: S above
    ``baseline * (1 + tolerance)``, configs without a baseline, changed decoder parameters, a changed
    reference output and a changed numeric stack.
    """
    cmp = Comparison(tolerance=tolerance)
    update_hint = f"if intended, {UPDATE_COMMAND}"
    for problem in _suite_mismatches(baseline, fresh):
        cmp.failures.append(f"suite differs from the baseline: {problem}; S is not comparable ({update_hint})")

    base_cfgs, now_cfgs = baseline.get("configs", {}), fresh.get("configs", {})
    for label, base in base_cfgs.items():
        now = now_cfgs.get(label)
        if now is not None and now.get("params") != base.get("params"):
            diff = _params_diff(base.get("params"), now.get("params"))
            cmp.notes.append(f"{label}: decoder parameters changed: {diff}")
        for task, base_agg in base["tasks"].items():
            base_s = _task_s(base_agg)
            now_agg = None if now is None else now["tasks"].get(task)
            if now_agg is None:
                cmp.rows.append(Row(label, task, base_s, None, "MISSING"))
                cmp.failures.append(f"{label} on {task}: in the baseline but not in this run")
                continue
            now_s = _task_s(now_agg)
            if now_s < base_s * (1.0 - tolerance):
                status = "FAIL"
                cmp.failures.append(
                    f"{label} on {task}: S dropped {base_s:.3f} -> {now_s:.3f} "
                    f"({(now_s / base_s - 1) * 100:+.2f}%, tolerance {tolerance * 100:g}%); "
                    f"steps {base_agg['steps']} -> {now_agg['steps']} for {now_agg['tokens']} tokens"
                )
            elif now_s > base_s * (1.0 + tolerance):
                status = "improved"
                cmp.notes.append(
                    f"{label} on {task}: S improved {base_s:.3f} -> {now_s:.3f} "
                    f"({(now_s / base_s - 1) * 100:+.2f}%); {update_hint}"
                )
            else:
                status = "ok"
            cmp.rows.append(Row(label, task, base_s, now_s, status))
    for label, now in now_cfgs.items():
        if label not in base_cfgs:
            for task, agg in now["tasks"].items():
                cmp.rows.append(Row(label, task, None, _task_s(agg), "new"))
            cmp.notes.append(f"{label}: no baseline yet; {update_hint}")

    cmp.failures.extend(exactness_failures(fresh))
    cmp.notes.extend(_reference_drift(baseline, fresh))
    base_m, now_m = baseline.get("meta", {}), fresh.get("meta", {})
    for key in ("torch", "transformers", "matmul_path", "attention_path"):
        if key in base_m and key in now_m and base_m[key] != now_m[key]:
            cmp.notes.append(f"{key} {now_m[key]} (baseline made with {base_m[key]})")
    return cmp


def _params_diff(old: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
    """Only what changed, e.g. ``G 7 -> 1, +pool_from_output=False`` (a new defaulted field shows as +)."""
    old, new = old or {}, new or {}
    parts = [f"{k} {old[k]!r} -> {new[k]!r}" for k in old if k in new and old[k] != new[k]]
    parts += [f"+{k}={new[k]!r}" for k in new if k not in old]
    parts += [f"-{k}" for k in old if k not in new]
    return ", ".join(parts)


def _reference_drift(baseline: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    """The reference's own output changing means the numerics changed; S can move for that reason."""
    notes = []
    for label, base in baseline.get("configs", {}).items():
        now = fresh.get("configs", {}).get(label)
        if base.get("decoder") != REFERENCE or now is None:
            continue
        for task, agg in base["tasks"].items():
            for pid, res in agg["prompts"].items():
                cur = now["tasks"].get(task, {}).get("prompts", {}).get(pid)
                if cur is not None and cur["output_hash"] != res["output_hash"]:
                    notes.append(
                        f"{label} output for {task}:{pid} differs from the baseline's (model weights or "
                        f"numerics changed?); S changes may come from different text, not the decoders"
                    )
    return notes


def per_prompt_table(baseline: dict[str, Any], fresh: dict[str, Any]) -> str:
    """Per-prompt steps and S, for finding which prompt moved an aggregate."""
    header = f"{'config':<48}{'prompt':<22}{'base steps':>11}{'now steps':>10}{'base S':>8}{'now S':>8}"
    lines = [header, "-" * len(header)]
    for label, now in fresh.get("configs", {}).items():
        base_tasks = baseline.get("configs", {}).get(label, {}).get("tasks", {})
        for task, agg in now["tasks"].items():
            for pid, res in agg["prompts"].items():
                b = base_tasks.get(task, {}).get("prompts", {}).get(pid)
                b_steps = "-" if b is None else str(b["steps"])
                b_s = "-" if b is None else f"{compression(b['tokens'], b['steps']):.3f}"
                lines.append(
                    f"{label:<48}{task + ':' + pid:<22}{b_steps:>11}{res['steps']:>10}{b_s:>8}"
                    f"{compression(res['tokens'], res['steps']):>8.3f}"
                )
    return "\n".join(lines)
