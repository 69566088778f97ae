"""CNN/DailyMail and XSum adapters: instruction prompt with the article, ROUGE-1/2/L scoring."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks import Example, build_task
from tasks.data import SHARED_DATA_DIR as SHARED_DATA

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tasks"
needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"offline datasets not found at {SHARED_DATA} (../shared/data next to the repo)"
)
KEYS = {"rouge1", "rouge2", "rougeL"}

CNN = Example("c1", {"id": "c1", "article": "The cat sat on the mat all day long.",
                     "highlights": "The cat sat on the mat ."})
XSUM = Example("x1", {"id": "x1", "document": "A dog barked at the postman twice on Monday.",
                      "summary": "A dog barked at the postman."})


@pytest.mark.parametrize(("name", "ex", "article"), [("cnn_dm", CNN, "The cat sat"), ("xsum", XSUM, "A dog barked")])
def test_prompt_contains_instruction_and_article(name: str, ex: Example, article: str) -> None:
    prompt = build_task(name).prompt(ex, 0, [])
    assert prompt.messages is not None and len(prompt.messages) == 1
    content = prompt.messages[0]["content"]
    assert content.startswith("Summarize the following article") and article in content


@pytest.mark.parametrize(("name", "ex"), [("cnn_dm", CNN), ("xsum", XSUM)])
def test_scores(name: str, ex: Example) -> None:
    task = build_task(name)
    reference = ex.doc["highlights" if name == "cnn_dm" else "summary"]
    perfect = task.score(ex, [reference])
    assert set(perfect) == KEYS and all(v == pytest.approx(1.0) for v in perfect.values())
    partial = task.score(ex, ["The cats were sitting quietly."])
    assert all(0.0 <= v < 1.0 for v in partial.values())
    assert task.score(ex, [""]) == {k: 0.0 for k in KEYS}  # empty summary: zeros, no crash
    assert task.score(ex, ["   \n"]) == {k: 0.0 for k in KEYS}


def test_stemming_is_on() -> None:
    # "cats" only matches the reference's "cat" after Porter stemming
    scores = build_task("cnn_dm").score(CNN, ["cats sitting"])
    assert scores["rouge1"] > 0


def test_cnn_dm_synthetic_fixture() -> None:
    task = build_task("cnn_dm", data_dir=str(FIXTURES), limit=2)
    examples = task.examples()
    assert [ex.id for ex in examples] == ["synthetic-0001", "synthetic-0002"]
    for ex in examples:
        assert ex.doc["article"][:40] in task.prompt(ex, 0, []).messages[0]["content"]
        assert task.score(ex, [ex.doc["highlights"]])["rouge1"] == pytest.approx(1.0)


@needs_shared_data
def test_xsum_real_data() -> None:
    task = build_task("xsum", data_dir=str(SHARED_DATA), limit=2)
    examples = task.examples()
    assert len(examples) == 2 and all(isinstance(ex.id, str) and ex.id for ex in examples)
    for ex in examples:
        assert ex.doc["document"][:40] in task.prompt(ex, 0, []).messages[0]["content"]
        assert task.score(ex, [ex.doc["summary"]])["rougeL"] == pytest.approx(1.0)
