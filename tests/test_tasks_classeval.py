"""ClassEval adapter: skeleton-completion prompt, per-test-class unit test results, strict pass flag."""

from __future__ import annotations

import time

import pytest

from tasks import Example, build_task
from tasks.classeval import _as_list
from tasks.data import SHARED_DATA_DIR as SHARED_DATA

needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"offline datasets not found at {SHARED_DATA} (../shared/data next to the repo)"
)

SKELETON = '''import math

class Circle:
    """A circle."""

    def __init__(self, r):
        self.r = r

    def area(self):
        """Area of the circle."""

    def diameter(self):
        """Twice the radius."""
'''
SOLUTION = '''import math

class Circle:
    def __init__(self, r):
        self.r = r

    def area(self):
        return math.pi * self.r ** 2

    def diameter(self):
        return 2 * self.r
'''
TEST = '''import unittest

class CircleTestArea(unittest.TestCase):
    def test_area_1(self):
        self.assertAlmostEqual(Circle(1).area(), math.pi)

    def test_area_2(self):
        self.assertAlmostEqual(Circle(2).area(), 4 * math.pi)

class CircleTestDiameter(unittest.TestCase):
    def test_diameter(self):
        self.assertEqual(Circle(3).diameter(), 6)

class CircleTestMain(unittest.TestCase):
    def test_main(self):
        c = Circle(1)
        self.assertEqual(c.diameter(), 2)
        self.assertAlmostEqual(c.area(), math.pi)

if __name__ == '__main__':
    unittest.main()
'''
DOC = {
    "task_id": "Synthetic_0",
    "class_name": "Circle",
    "skeleton": SKELETON,
    "solution_code": SOLUTION,
    "test": TEST,
    "import_statement": ["import math"],
    "test_classes": ["CircleTestArea", "CircleTestDiameter", " CircleTestMain"],  # stray space as in ClassEval_97
}
EX = Example("Synthetic_0", DOC)
ZERO = {"pass@1": 0.0, "test_class_pass_rate": 0.0, "test_pass_rate": 0.0}


@pytest.fixture
def task():
    return build_task("classeval", timeout_s=5.0)


def test_prompt(task) -> None:
    prompt = task.prompt(EX, 0, [])
    assert prompt.messages is not None and len(prompt.messages) == 1
    content = prompt.messages[0]["content"]
    assert content.startswith("Please complete the class Circle in the following code.\n")
    assert content.endswith(SKELETON)


def test_gold_solution_passes_everything(task) -> None:
    assert task.score(EX, [SOLUTION]) == {"pass@1": 1.0, "test_class_pass_rate": 1.0, "test_pass_rate": 1.0}


def test_fenced_chat_answer_without_imports(task) -> None:
    answer = "Here is the class:\n```python\n" + SOLUTION.replace("import math\n", "") + "```\nHope it helps."
    assert task.score(EX, [answer])["pass@1"] == 1.0  # import_statement is prepended


def test_partial_solution_gets_partial_credit(task) -> None:
    wrong_area = SOLUTION.replace("math.pi * self.r ** 2", "0")
    scores = task.score(EX, [wrong_area])
    assert scores["pass@1"] == 0.0
    assert scores["test_class_pass_rate"] == pytest.approx(1 / 3)  # only CircleTestDiameter passes
    assert scores["test_pass_rate"] == pytest.approx(1 / 4)


@pytest.mark.parametrize("output", ["class Circle(:\n    pass\n", "raise ValueError('boom')\n", "", "no code"])
def test_broken_code_scores_zero(task, output: str) -> None:
    assert task.score(EX, [output]) == ZERO


def test_infinite_loop_scores_zero_quickly() -> None:
    task = build_task("classeval", timeout_s=1.0)
    looping = SOLUTION.replace("return 2 * self.r", "while True:\n            pass")
    start = time.monotonic()
    assert task.score(EX, [looping]) == ZERO
    assert time.monotonic() - start < 5


def test_list_fields_may_be_strings() -> None:
    assert _as_list("['import math', 'import re']") == ["import math", "import re"]
    assert _as_list(["a"]) == ["a"] and _as_list("") == [] and _as_list(None) == []
    doc = dict(DOC, import_statement="['import math']", test_classes=str(DOC["test_classes"]))
    scores = build_task("classeval").score(Example("s", doc), [SOLUTION.replace("import math\n", "")])
    assert scores["pass@1"] == 1.0


@needs_shared_data
def test_real_data_solutions_pass() -> None:
    task = build_task("classeval", data_dir=str(SHARED_DATA), limit=2)
    examples = task.examples()
    assert [ex.id for ex in examples] == ["ClassEval_0", "ClassEval_1"]
    for ex in examples:
        assert ex.doc["skeleton"] in task.prompt(ex, 0, []).messages[0]["content"]
        assert task.score(ex, [ex.doc["solution_code"]]) == {
            "pass@1": 1.0, "test_class_pass_rate": 1.0, "test_pass_rate": 1.0,
        }
