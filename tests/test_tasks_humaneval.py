"""HumanEval adapter: raw-completion prompt, completion handling (body / fenced / restated), pass@1."""

from __future__ import annotations

import time

import pytest

from tasks import Example, build_task
from tasks.humaneval import build_program
from tasks.data import SHARED_DATA_DIR as SHARED_DATA

needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"offline datasets not found at {SHARED_DATA} (../shared/data next to the repo)"
)

DOC = {
    "task_id": "Synthetic/0",
    "prompt": 'def add(a: int, b: int) -> int:\n    """Return a + b.\n    >>> add(2, 3)\n    5\n    """\n',
    "canonical_solution": "    return a + b\n",
    "test": "\n\ndef check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    "entry_point": "add",
}
EX = Example("Synthetic/0", DOC)


@pytest.fixture
def task():
    return build_task("humaneval", timeout_s=2.0)


def test_prompt_is_raw_text(task) -> None:
    prompt = task.prompt(EX, 0, [])
    assert prompt.messages is None and prompt.text == DOC["prompt"]


@pytest.mark.parametrize(
    "output",
    [
        "    return a + b\n",
        "    return a + b\n\n\ndef unrelated():\n    return 1 / 0\n\nprint(unrelated())\n",  # cut at top-level def
        "    return a + b\n\nif __name__ == '__main__':\n    raise SystemExit(1)\n",
        "    return a + b\n```\nThat is the answer.",
        "Here is the solution:\n```python\ndef add(a, b):\n    return a + b\n```\n",  # chat-style, whole function
        "```python\nimport math\n\ndef add(a, b):\n    return int(math.fsum([a, b]))\n```",
        "```python\nassert add(1, 1) == 2\n```\n```python\ndef add(a, b):\n    return a + b\n```",
        "def add(a, b):\n    return a + b\n",  # restated without a fence
    ],
)
def test_correct_completions_pass(task, output: str) -> None:
    assert task.score(EX, [output]) == {"pass@1": 1.0}


@pytest.mark.parametrize(
    "output",
    [
        "    return a - b\n",  # wrong
        "    return a +\n",  # syntax error
        "    raise RuntimeError('boom')\n",  # crash
        "    import sys\n    sys.exit(0)\n",  # exits before the tests run
        "",
    ],
)
def test_wrong_completions_fail(task, output: str) -> None:
    assert task.score(EX, [output]) == {"pass@1": 0.0}


def test_infinite_loop_scores_zero_quickly() -> None:
    task = build_task("humaneval", timeout_s=1.0)
    start = time.monotonic()
    assert task.score(EX, ["    while True:\n        pass\n"]) == {"pass@1": 0.0}
    assert time.monotonic() - start < 5


def test_program_layout() -> None:
    program = build_program(DOC, "    return a + b\n\ndef extra():\n    pass\n")
    assert program.startswith(DOC["prompt"] + "    return a + b\n")
    assert "def extra" not in program
    assert program.rstrip().endswith("check(add)")


@needs_shared_data
def test_real_data_canonical_solutions_pass() -> None:
    task = build_task("humaneval", data_dir=str(SHARED_DATA), limit=2)
    examples = task.examples()
    assert [ex.id for ex in examples] == ["HumanEval/0", "HumanEval/1"]
    for ex in examples:
        assert task.prompt(ex, 0, []).text == ex.doc["prompt"]
        assert task.score(ex, [ex.doc["canonical_solution"]]) == {"pass@1": 1.0}
        assert task.score(ex, ["    return None\n"]) == {"pass@1": 0.0}
