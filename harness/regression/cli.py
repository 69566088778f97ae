"""``python -m harness.regression``: run the suite and compare it with the committed baseline."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from harness.regression.compare import (
    DEFAULT_TOLERANCE, UPDATE_COMMAND, compare, exactness_failures, per_prompt_table,
)
from harness.regression.suite import (
    DEFAULT_BASELINE, DTYPE, MAX_NEW_TOKENS, MODEL, environment, load_prompts, run_suite, suite_configs,
)
from tasks.data import SHARED_DATA_DIR

EXIT_OK, EXIT_FAIL, EXIT_CANNOT_RUN = 0, 1, 2  # passed / S regressed or inexact / the check could not run
EXIT_NO_BASELINE = EXIT_CANNOT_RUN


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m harness.regression",
        description=(
            "Compare compression ratios S of a fixed suite (SmolLM2 float32, pinned HumanEval/GSM8K/MT-Bench "
            "prompts, ar/jacobi/pld/lookahead) with the committed baseline. Exit 1 when any config x task S "
            "(sum tokens / sum steps) drops by more than the tolerance, or when any greedy output differs "
            "from ar's, or when the suite (prompts, max_new_tokens, model, dtype) no longer matches the "
            "baseline; exit 2 when the check cannot run (no baseline, no data dir, the model or a dataset "
            "cannot be loaded; one error line); exit 0 otherwise. S gains beyond the tolerance are "
            "reported, not failed."
        ),
    )
    ap.add_argument(
        "--baseline", type=Path, default=DEFAULT_BASELINE, help="baseline JSON (default: %(default)s)"
    )
    ap.add_argument(
        "--data-dir", type=Path, default=SHARED_DATA_DIR, help="offline datasets folder (default: %(default)s)"
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


def _cannot_run(message: str) -> int:
    """One ``error:`` line on stderr; the exit status that says "the check did not run" (2)."""
    print("error: regression suite cannot run: " + " ".join(message.split()), file=sys.stderr)
    return EXIT_CANNOT_RUN


def main(argv: list[str] | None = None) -> int:
    """Exit 0 passed, 1 regressed or inexact, 2 could not run."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not 0 <= args.tolerance < 1:
        parser.error(f"--tolerance must be a fraction in [0, 1), got {args.tolerance}")
    baseline = _read_baseline(args.baseline)
    if isinstance(baseline, str) and not args.update_baseline:
        print(baseline, file=sys.stderr)
        return EXIT_NO_BASELINE

    if not args.data_dir.is_dir():  # before the model loads: this one needs no model to find out
        return _cannot_run(
            f"data dir {args.data_dir} not found; pass --data-dir <dir> holding the offline datasets "
            "(gsm8k, humaneval, mt_bench copies in the Hugging Face schema)"
        )
    from harness import load_backend
    from harness.runtime.backend import ModelLoadError
    from tasks.data import DatasetUnavailable

    t_start = time.perf_counter()
    try:
        backend = load_backend(MODEL, dtype=DTYPE)
        prompts = load_prompts(backend.tokenizer, args.data_dir)
    except (ModelLoadError, DatasetUnavailable, ValueError, OSError) as err:
        return _cannot_run(str(err))
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
