"""MT-Bench adapter: two turns with the model's own first answer in the second prompt; length stats."""

from __future__ import annotations


import pytest

from tasks import Example, build_task
from tasks.data import SHARED_DATA_DIR as SHARED_DATA

needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"offline datasets not found at {SHARED_DATA} (../shared/data next to the repo)"
)

DOC = {"question_id": 7, "category": "writing", "turns": ["Write a haiku about rain.", "Now make it about snow."],
       "reference": None}
EX = Example("7", DOC)


def test_two_turns_and_second_turn_includes_first_answer() -> None:
    task = build_task("mt_bench")
    assert task.num_turns(EX) == 2
    first = task.prompt(EX, 0, [])
    assert first.messages == [{"role": "user", "content": "Write a haiku about rain."}]
    second = task.prompt(EX, 1, ["Soft rain on the roof"])
    assert second.messages == [
        {"role": "user", "content": "Write a haiku about rain."},
        {"role": "assistant", "content": "Soft rain on the roof"},
        {"role": "user", "content": "Now make it about snow."},
    ]


def test_second_turn_needs_the_first_answer() -> None:
    with pytest.raises(ValueError):
        build_task("mt_bench").prompt(EX, 1, [])


def test_score_is_length_stats() -> None:
    scores = build_task("mt_bench").score(EX, ["one two three", ""])
    assert scores == {"turns_answered": 1.0, "chars_turn1": 13.0, "words_turn1": 3.0,
                      "chars_turn2": 0.0, "words_turn2": 0.0}
    partial = build_task("mt_bench").score(EX, ["only the first"])
    assert partial["turns_answered"] == 1.0 and partial["chars_turn2"] == 0.0
    with pytest.raises(ValueError):
        build_task("mt_bench").score(EX, ["a", "b", "c"])


def test_judge_hook_scores_are_merged() -> None:
    seen = []

    def judge(ex: Example, outputs: list[str]) -> dict[str, float]:
        seen.append((ex.id, outputs))
        return {"judge_score": 7}

    scores = build_task("mt_bench", judge=judge).score(EX, ["a", "b"])
    assert scores["judge_score"] == 7.0 and seen == [("7", ["a", "b"])]


@needs_shared_data
def test_real_data() -> None:
    task = build_task("mt_bench", data_dir=str(SHARED_DATA), limit=2)
    examples = task.examples()
    assert [ex.id for ex in examples] == ["81", "82"]
    for ex in examples:
        assert isinstance(ex.doc["turns"], list) and task.num_turns(ex) == 2
        history = ["First answer."]
        second = task.prompt(ex, 1, history)
        assert second.messages[1] == {"role": "assistant", "content": "First answer."}
        assert second.messages[2]["content"] == ex.doc["turns"][1]
    assert len(build_task("mt_bench", data_dir=str(SHARED_DATA)).examples()) == 80
