"""GSM8K adapter: prompts (zero/few-shot), final-number extraction, exact match, real data."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks import Example, build_task
from tasks.gsm8k import FEWSHOT_EXEMPLARS, extract_last_number, gold_answer
from tasks.data import SHARED_DATA_DIR as SHARED_DATA

needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"offline datasets not found at {SHARED_DATA} (../shared/data next to the repo)"
)

DOC = {
    "question": "Tom has 3 boxes with 4 apples each. He eats 2 apples. How many apples are left?",
    "answer": "He had 3 * 4 = <<3*4=12>>12 apples.\nAfter eating, 12 - 2 = <<12-2=10>>10 remain.\n#### 10",
}
EX = Example("0", DOC)


def test_zero_shot_prompt_is_the_question() -> None:
    prompt = build_task("gsm8k").prompt(EX, 0, [])
    assert prompt.text is None
    assert prompt.messages == [{"role": "user", "content": DOC["question"]}]


def test_few_shot_prompt_uses_fixed_exemplars_as_turns() -> None:
    messages = build_task("gsm8k", num_fewshot=3).prompt(EX, 0, []).messages
    assert messages is not None and len(messages) == 7
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3 + ["user"]
    assert messages[0]["content"] == FEWSHOT_EXEMPLARS[0][0]
    assert messages[1]["content"].endswith("The answer is 6.")
    assert messages[-1]["content"] == DOC["question"]
    assert len(build_task("gsm8k", num_fewshot=8).prompt(EX, 0, []).messages) == 17


def test_exemplar_answers_match_their_stated_answers() -> None:
    for _, answer in FEWSHOT_EXEMPLARS:
        assert answer.endswith(f"The answer is {extract_last_number(answer)}.")


@pytest.mark.parametrize("shots", [-1, 9])
def test_num_fewshot_range(shots: int) -> None:
    with pytest.raises(ValueError):
        build_task("gsm8k", num_fewshot=shots)


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("12 - 2 = 10. The answer is 10.", 1.0),
        ("So the answer is $10.", 1.0),
        ("The answer is 10.00", 1.0),
        ("#### 10", 1.0),
        ("I think 10 is close, but the answer is 11.", 0.0),
        ("The answer is ten.", 0.0),  # no number at all
        ("", 0.0),
    ],
)
def test_score(output: str, expected: float) -> None:
    assert build_task("gsm8k").score(EX, [output]) == {"exact_match": expected}


def test_number_extraction_edge_cases() -> None:
    assert extract_last_number("no digits here") is None
    assert extract_last_number("It costs $1,234.50 in total.") == Decimal("1234.50")
    assert extract_last_number("The change is -5 degrees") == Decimal("-5")
    assert extract_last_number("pages 10-12") == Decimal("12")  # a hyphen, not a minus sign
    assert gold_answer("... #### 1,000") == Decimal("1000")
    assert gold_answer("... #### -3") == Decimal("-3")


@given(st.integers(min_value=-10**9, max_value=10**9))
def test_extracts_any_formatted_integer(n: int) -> None:
    text = f"Step one gives 7. Therefore the answer is ${n:,}."
    assert extract_last_number(text) == n


@needs_shared_data
def test_real_data_prompts_and_gold_answers() -> None:
    task = build_task("gsm8k", data_dir=str(SHARED_DATA), limit=2)
    examples = task.examples()
    assert [ex.id for ex in examples] == ["0", "1"]
    assert examples[0].doc["question"].startswith("Janet")
    for ex in examples:
        assert task.num_turns(ex) == 1
        assert task.prompt(ex, 0, []).messages[-1]["content"] == ex.doc["question"]
        assert task.score(ex, [ex.doc["answer"]]) == {"exact_match": 1.0}
    assert len(build_task("gsm8k", data_dir=str(SHARED_DATA)).examples()) == 1319
