"""End to end: two records of every task through the real embedded model (SmolLM2-135M) and scoring.

Uses the session fixture ``smollm2`` from conftest.py (``harness.load_backend("smollm2")``, loaded once per
test session) and the AR decoder (``decoders.build_decoder("ar")``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tasks import TASKS, build_task, encode_prompt
from tasks.data import SHARED_DATA_DIR as SHARED_DATA

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tasks"
MAX_NEW_TOKENS = 16
CODE_TASKS = {"humaneval", "mbpp", "classeval"}
MAX_PROMPT_TOKENS = 2048  # SmolLM2's context is 8k; skipping long prompts keeps this test fast


@pytest.mark.slow
@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"offline datasets not found at {SHARED_DATA}")
@pytest.mark.parametrize("name", sorted(TASKS))
def test_two_records_through_the_model(name: str, smollm2) -> None:
    from decoders import build_decoder

    backend, decoder = smollm2, build_decoder("ar")
    data_dir = FIXTURES if name == "cnn_dm" else SHARED_DATA
    options = {"timeout_s": 5.0} if name in CODE_TASKS else {}
    task = build_task(name, data_dir=str(data_dir), limit=2, **options)
    scored = 0
    for ex in task.examples():
        outputs: list[str] = []
        for turn in range(task.num_turns(ex)):
            prompt_ids = encode_prompt(task.prompt(ex, turn, outputs), backend.tokenizer)
            assert prompt_ids and all(isinstance(i, int) for i in prompt_ids)
            if len(prompt_ids) > MAX_PROMPT_TOKENS:
                break  # the runner's job in real runs; here: skip the example
            result = decoder.generate(backend, prompt_ids, max_new_tokens=MAX_NEW_TOKENS)
            assert 0 < len(result.tokens) <= MAX_NEW_TOKENS
            outputs.append(backend.tokenizer.decode(result.tokens, skip_special_tokens=True))
        else:
            scores = task.score(ex, outputs)
            assert scores and all(isinstance(v, float) and math.isfinite(v) for v in scores.values())
            scored += 1
    assert scored >= 1
