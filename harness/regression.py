"""CI guard on compression ratios: a fixed suite compared with a committed baseline.

Compression S = new tokens / decoding steps is deterministic for greedy float32 decoding on a fixed
model, prompts and numeric stack, unlike wall time, so CI can hold it to a tight tolerance. The suite
is the embedded SmolLM2 in float32 on pinned prompts (by example id) from HumanEval, GSM8K and MT-Bench
(turn 1), decoded by ``ar`` (the reference), ``jacobi`` and ``pld`` and four ``lookahead`` settings (two
of the paper's, and two small CPU settings with the output pool and context ranking, one of them with
7-token prompt/output n-grams and a cap of 8 tokens per step).

Fails (exit 1) when, for any config x task, the aggregate S (sum of tokens / sum of steps over the
task's prompts) drops by more than the tolerance relative to the baseline, when any greedy output
differs from ``ar``'s in the same run, or when the suite itself (prompts, max_new_tokens, model,
dtype) no longer matches the baseline. S gains beyond the tolerance are reported, not failed.
Exit 2: the baseline file is missing or unreadable.

    python -m harness.regression                     # compare a fresh run with the baseline
    python -m harness.regression --update-baseline   # rewrite the baseline (deliberate; CI never does)

The comparison (:func:`compare`) is a pure function of two result dicts and :func:`run_suite` takes
any backend, prompts and configs, so both are testable without the model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from decoders.base import Decoder
    from harness.backend import Backend

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BASELINE = REPO_ROOT / "results" / "regression" / "baseline.json"
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"
DEFAULT_TOLERANCE = 0.02  # relative drop of a config x task aggregate S that fails the check
MODEL = "smollm2"
DTYPE = "float32"
MAX_NEW_TOKENS = 48
REFERENCE_DECODER = "ar"
# (task, example id): two records per task, turn 1 only; ids are stable across dataset row order
PINNED_PROMPTS: tuple[tuple[str, str], ...] = (
    ("humaneval", "HumanEval/0"),
    ("humaneval", "HumanEval/2"),
    ("gsm8k", "0"),
    ("gsm8k", "1"),
    ("mt_bench", "81"),
    ("mt_bench", "82"),
)
EXIT_OK, EXIT_FAIL, EXIT_NO_BASELINE = 0, 1, 2
UPDATE_COMMAND = "write a new baseline with `python -m harness.regression --update-baseline` and commit it"


# ---- suite definition --------------------------------------------------------------------------------
@dataclass(frozen=True)
class SuiteConfig:
    """One decoder configuration of the suite; ``label`` is its key in the baseline."""

    label: str
    decoder: str
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, label: str, decoder: str, **params: Any) -> SuiteConfig:
        return cls(label, decoder, tuple(sorted(params.items())))

    def build(self) -> Decoder:
        from decoders import build_decoder

        return build_decoder(self.decoder, **dict(self.params))


@dataclass(frozen=True)
class SuitePrompt:
    """A pre-encoded prompt: tests pass synthetic token lists, the CLI encodes the pinned records."""

    task: str
    id: str
    token_ids: tuple[int, ...]

    @property
    def token_hash(self) -> str:
        """Detects a changed prompt (tokenizer, chat template or dataset edit) under the same id."""
        return hashlib.sha1(",".join(map(str, self.token_ids)).encode()).hexdigest()[:16]


def suite_configs() -> list[SuiteConfig]:
    """The guarded configurations; lookahead labels use the paper's (N, W, G) order."""
    return [
        SuiteConfig.of("ar", "ar"),
        SuiteConfig.of("jacobi(window=5)", "jacobi", window=5),
        SuiteConfig.of("pld(defaults)", "pld"),
        SuiteConfig.of("lookahead(N=5,W=7,G=7)", "lookahead", N=5, W=7, G=7, pool_from_prompt=False),
        SuiteConfig.of("lookahead(N=5,W=15,G=15)+prompt", "lookahead", N=5, W=15, G=15, pool_from_prompt=True),
        SuiteConfig.of("lookahead(N=5,W=1,G=1)+prompt+output+context", "lookahead", N=5, W=1, G=1,
                       pool_from_prompt=True, pool_from_output=True, pool_context=True),
        SuiteConfig.of("lookahead(N=3,W=1,G=3,text_ngram=7,step_tokens=8)+prompt+output+context", "lookahead",
                       N=3, W=1, G=3, pool_from_prompt=True, pool_from_output=True, pool_context=True,
                       text_ngram=7, step_tokens=8),
    ]


def load_prompts(
    tokenizer: Any, data_dir: Path, pinned: Sequence[tuple[str, str]] = PINNED_PROMPTS
) -> list[SuitePrompt]:
    """Encode the pinned records' first-turn prompts, in ``pinned`` order; an unknown id raises."""
    from tasks import build_task, encode_prompt

    by_task: dict[str, dict[str, Any]] = {}
    prompts = []
    for task_name, ex_id in pinned:
        if task_name not in by_task:
            task = build_task(task_name, data_dir=str(data_dir))
            by_task[task_name] = {"task": task, "examples": {ex.id: ex for ex in task.examples()}}
        entry = by_task[task_name]
        ex = entry["examples"].get(ex_id)
        if ex is None:
            raise ValueError(f"pinned prompt {task_name}:{ex_id} not found in {data_dir}")
        ids = encode_prompt(entry["task"].prompt(ex, 0, []), tokenizer)
        prompts.append(SuitePrompt(task_name, ex_id, tuple(ids)))
    return prompts


# ---- running -----------------------------------------------------------------------------------------
def run_suite(
    backend: Backend,
    prompts: Sequence[SuitePrompt],
    configs: Sequence[SuiteConfig],
    max_new_tokens: int,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Decode every prompt with every config; results in the baseline's layout (no environment meta).

    Layout: ``{"max_new_tokens", "prompts": [{task, id, prompt_tokens, prompt_hash}], "configs":
    {label: {decoder, params, tasks: {task: {tokens, steps, S, prompts: {id: {tokens, steps, S,
    output_hash}}}}}}}``; ``params`` are the decoder's resolved parameters, defaults included.
    """
    out: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "prompts": [
            {"task": p.task, "id": p.id, "prompt_tokens": len(p.token_ids), "prompt_hash": p.token_hash}
            for p in prompts
        ],
        "configs": {},
    }
    for cfg in configs:
        dec = cfg.build()
        t0 = time.perf_counter()
        tasks: dict[str, Any] = {}
        for p in prompts:
            res = dec.generate(backend, list(p.token_ids), max_new_tokens)
            agg = tasks.setdefault(p.task, {"tokens": 0, "steps": 0, "S": 0.0, "prompts": {}})
            agg["prompts"][p.id] = {
                "tokens": len(res.tokens),
                "steps": res.steps,
                "S": round(res.compression, 6),
                "output_hash": res.output_hash,
            }
            agg["tokens"] += len(res.tokens)
            agg["steps"] += res.steps
        for agg in tasks.values():
            agg["S"] = round(_ratio(agg["tokens"], agg["steps"]), 6)
        out["configs"][cfg.label] = {"decoder": cfg.decoder, "params": dict(dec.params), "tasks": tasks}
        if log is not None:
            log(f"  {cfg.label:<48} {len(prompts)} prompts in {time.perf_counter() - t0:6.1f}s")
    return out


def environment(backend: Backend, model: str, dtype: str) -> dict[str, Any]:
    """What the baseline's numbers depend on besides the code: model, dtype, numeric stack."""
    import torch
    import transformers

    return {
        "model": model,
        "dtype": dtype,
        "device": str(backend.device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


# ---- comparison (pure) -------------------------------------------------------------------------------
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


def _ratio(tokens: int, steps: int) -> float:
    return tokens / steps if steps else 0.0


def _task_s(entry: dict[str, Any]) -> float:
    """Aggregate S from the integer counts, so float rounding in the file never matters."""
    return _ratio(int(entry["tokens"]), int(entry["steps"]))


def exactness_failures(results: dict[str, Any], reference: str = REFERENCE_DECODER) -> list[str]:
    """Every (config, prompt) whose greedy output differs from the reference decoder's in ``results``."""
    configs = results.get("configs", {})
    ref_label = next((label for label, c in configs.items() if c.get("decoder") == reference), None)
    if ref_label is None:
        return [f"no {reference!r} config in the run: greedy outputs cannot be checked for exactness"]
    ref = configs[ref_label]["tasks"]
    failures = []
    for label, cfg in configs.items():
        if label == ref_label:
            continue
        for task, agg in cfg["tasks"].items():
            for pid, res in agg["prompts"].items():
                want = ref.get(task, {}).get("prompts", {}).get(pid)
                if want is None:
                    failures.append(f"{label} on {task}:{pid}: no {ref_label} output to compare with")
                elif res["output_hash"] != want["output_hash"]:
                    failures.append(
                        f"{label} on {task}:{pid}: greedy output differs from {ref_label}'s "
                        f"({res['tokens']} vs {want['tokens']} tokens, hash {res['output_hash'][:10]} vs "
                        f"{want['output_hash'][:10]})"
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
    for key in ("torch", "transformers"):
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
        if base.get("decoder") != REFERENCE_DECODER or now is None:
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
                b_s = "-" if b is None else f"{_ratio(b['tokens'], b['steps']):.3f}"
                lines.append(
                    f"{label:<48}{task + ':' + pid:<22}{b_steps:>11}{res['steps']:>10}{b_s:>8}"
                    f"{_ratio(res['tokens'], res['steps']):>8.3f}"
                )
    return "\n".join(lines)


# ---- command line ------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m harness.regression",
        description=(
            "Compare compression ratios S of a fixed suite (SmolLM2 float32, pinned HumanEval/GSM8K/MT-Bench "
            "prompts, ar/jacobi/pld/lookahead) with the committed baseline. Exit 1 when any config x task S "
            "(sum tokens / sum steps) drops by more than the tolerance, or when any greedy output differs "
            "from ar's, or when the suite (prompts, max_new_tokens, model, dtype) no longer matches the "
            "baseline; exit 2 when the baseline is missing; exit 0 otherwise. S gains beyond the tolerance "
            "are reported, not failed."
        ),
    )
    ap.add_argument(
        "--baseline", type=Path, default=DEFAULT_BASELINE, help="baseline JSON (default: %(default)s)"
    )
    ap.add_argument(
        "--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="offline datasets folder (default: %(default)s)"
    )
    ap.add_argument(
        "--tolerance",
        type=float,
        default=DEFAULT_TOLERANCE,
        help="relative S drop that fails, as a fraction (default: %(default)s = 2%%)",
    )
    ap.add_argument(
        "--update-baseline",
        action="store_true",
        help="run the suite and REWRITE the baseline file (refused when an output differs from ar's); "
        "a deliberate step, CI never passes it",
    )
    ap.add_argument("--per-prompt", action="store_true", help="also print steps and S per prompt")
    return ap


def _read_baseline(path: Path) -> dict[str, Any] | str:
    """The baseline dict, or the message explaining why there is none."""
    if not path.is_file():
        return f"no baseline at {path}: {UPDATE_COMMAND} (a deliberate step; CI never does it)"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        return f"cannot read baseline {path}: {err}; {UPDATE_COMMAND}"
    if not isinstance(data, dict) or "configs" not in data:
        return f"baseline {path} has no 'configs'; {UPDATE_COMMAND}"
    return data


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not 0 <= args.tolerance < 1:
        parser.error(f"--tolerance must be a fraction in [0, 1), got {args.tolerance}")
    baseline = _read_baseline(args.baseline)
    if isinstance(baseline, str) and not args.update_baseline:
        print(baseline, file=sys.stderr)
        return EXIT_NO_BASELINE

    from harness import load_backend

    t_start = time.perf_counter()
    backend = load_backend(MODEL, dtype=DTYPE)
    prompts = load_prompts(backend.tokenizer, args.data_dir)
    print(
        f"regression suite: {MODEL} {DTYPE}, {len(prompts)} prompts, max_new_tokens={MAX_NEW_TOKENS} "
        f"(model and prompts ready in {time.perf_counter() - t_start:.1f}s)"
    )
    fresh = run_suite(backend, prompts, suite_configs(), MAX_NEW_TOKENS, log=print)
    fresh = {"meta": environment(backend, MODEL, DTYPE), **fresh}
    elapsed = time.perf_counter() - t_start

    if args.update_baseline:
        return _update(args.baseline, baseline, fresh, args.tolerance, elapsed)

    assert isinstance(baseline, dict)
    cmp = compare(baseline, fresh, args.tolerance)
    print()
    print(cmp.report())
    if args.per_prompt:
        print("\n" + per_prompt_table(baseline, fresh))
    print(f"\nsuite ran in {elapsed:.1f}s")
    return EXIT_OK if cmp.ok else EXIT_FAIL


def _update(
    path: Path, old: dict[str, Any] | str, fresh: dict[str, Any], tolerance: float, elapsed: float
) -> int:
    """Write the fresh results as the baseline, showing what changes; never writes inexact decoders."""
    inexact = exactness_failures(fresh)
    if inexact:
        lines = "\n".join(f"  - {f}" for f in inexact)
        print(f"refusing to write a baseline: greedy outputs differ from ar's:\n{lines}")
        return EXIT_FAIL
    if isinstance(old, dict):
        print("\nchanges against the previous baseline:\n" + compare(old, fresh, tolerance).table())
    else:
        print("\n" + compare({"configs": {}}, fresh, tolerance).table())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(fresh, indent=1) + "\n")
    print(f"\nbaseline written to {path} (suite ran in {elapsed:.1f}s); review and commit it")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
