"""MBPP adapter: instruction prompt with the tests, test-split filter, code extraction, pass@1."""

from __future__ import annotations

import time

import pytest

from tasks import Example, build_task
from tasks.mbpp import build_program
from tasks.data import SHARED_DATA_DIR as SHARED_DATA

needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"offline datasets not found at {SHARED_DATA} (../shared/data next to the repo)"
)

DOC = {
    "task_id": 42,
    "text": "Write a function to square a number.",
    "code": "def square(x):\r\n\treturn x * x",
    "test_list": ["assert square(2) == 4", "assert square(-3) == 9", "assert square(0) == 0"],
    "test_setup_code": "",
    "challenge_test_list": [],
}
EX = Example("42", DOC)


@pytest.fixture
def task():
    return build_task("mbpp", timeout_s=2.0)


def test_prompt(task) -> None:
    prompt = task.prompt(EX, 0, [])
    assert prompt.messages == [{
        "role": "user",
        "content": "You are an expert Python programmer, and here is your task: Write a function to square a "
                   "number. Your code should pass these tests:\n\nassert square(2) == 4\nassert square(-3) == 9\n"
                   "assert square(0) == 0",
    }]


@pytest.mark.parametrize(
    "output",
    [
        DOC["code"],
        "Sure!\n```python\ndef square(x):\n    return x ** 2\n```\nExample:\n```python\nprint(square(3))\n```",
        "[BEGIN]\ndef square(x):\n    return x * x\n[DONE]",
        "```python\ndef square(x):\n    return x * x\n\nif __name__ == '__main__':\n    print(square(int(input())))\n```",
    ],
)
def test_correct_code_passes(task, output: str) -> None:
    assert task.score(EX, [output]) == {"pass@1": 1.0}


@pytest.mark.parametrize(
    "output",
    [
        "def square(x):\n    return x + x\n",
        "def square(x) return x\n",
        "raise SystemExit(3)\n",
        "Sorry, I can't.",
        "",
    ],
)
def test_wrong_code_fails(task, output: str) -> None:
    assert task.score(EX, [output]) == {"pass@1": 0.0}


def test_infinite_loop_scores_zero_quickly() -> None:
    task = build_task("mbpp", timeout_s=1.0)
    start = time.monotonic()
    assert task.score(EX, ["def square(x):\n    while True:\n        pass\n"]) == {"pass@1": 0.0}
    assert time.monotonic() - start < 5


def test_setup_code_runs_after_the_solution() -> None:
    doc = dict(DOC, test_setup_code="value = square(5)", test_list=["assert value == 25"])
    program = build_program(doc, DOC["code"])
    assert program.index("def square") < program.index("value = square(5)") < program.index("assert value")
    assert build_task("mbpp").score(Example("42", doc), [DOC["code"]]) == {"pass@1": 1.0}


def test_keep_selects_the_test_split(task) -> None:
    assert [task.keep({"task_id": i}) for i in (10, 11, 510, 511)] == [False, True, True, False]


@needs_shared_data
def test_real_data_reference_code_passes() -> None:
    task = build_task("mbpp", data_dir=str(SHARED_DATA), limit=2)
    examples = task.examples()
    assert [ex.id for ex in examples] == ["11", "12"]
    for ex in examples:
        assert isinstance(ex.doc["test_list"], list)
        assert ex.doc["test_list"][0] in task.prompt(ex, 0, []).messages[0]["content"]
        assert task.score(ex, [ex.doc["code"]]) == {"pass@1": 1.0}
    assert len(build_task("mbpp", data_dir=str(SHARED_DATA)).examples()) == 500
