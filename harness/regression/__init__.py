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
Exit 2: the check could not run (no baseline, no data, no embedded model), with one line saying why.

    python -m harness.regression                     # compare a fresh run with the baseline
    python -m harness.regression --update-baseline   # rewrite the baseline (deliberate; CI never does)

``suite`` defines and runs the suite (:func:`run_suite` takes any backend, prompts and configs);
``compare`` is a pure function of two result dicts; ``cli`` is the command. All are testable without
the model.
"""

from __future__ import annotations

from harness.regression.cli import EXIT_CANNOT_RUN, EXIT_FAIL, EXIT_NO_BASELINE, EXIT_OK, main
from harness.regression.compare import (
    DEFAULT_TOLERANCE, Comparison, Row, compare, exactness_failures, per_prompt_table,
)
from harness.regression.suite import (
    DEFAULT_BASELINE, MAX_NEW_TOKENS, MODEL, PINNED_PROMPTS, SuiteConfig, SuitePrompt, environment,
    load_prompts, run_suite, suite_configs,
)

__all__ = [
    "DEFAULT_BASELINE", "DEFAULT_TOLERANCE", "EXIT_CANNOT_RUN", "EXIT_FAIL", "EXIT_NO_BASELINE", "EXIT_OK",
    "MAX_NEW_TOKENS", "MODEL", "PINNED_PROMPTS", "Comparison", "Row", "SuiteConfig", "SuitePrompt", "compare",
    "environment", "exactness_failures", "load_prompts", "main", "per_prompt_table", "run_suite", "suite_configs",
]
