"""ClassEval (Du et al. 2023): complete a whole Python class from its skeleton; unit tests per method.

The prompt is ClassEval's holistic-generation instruction ("Please complete the class X in the following
code." + skeleton) as a chat message. Scores: ``pass@1`` is the strict class-level result (every test class
passes), ``test_class_pass_rate`` the fraction of the record's ``test_classes`` that pass (ClassEval's
method-level view), ``test_pass_rate`` the fraction of individual test methods that pass.
"""

from __future__ import annotations

import ast
import json
import secrets
from typing import Any, ClassVar

from tasks.base import CodeTask, Example, Prompt
from tasks.execution import extract_code, run_python

INSTRUCTION = "Please complete the class {class_name} in the following code.\n{skeleton}"

# Appended after candidate code + tests; runs each test class and reports counts on one marked line.
_RUNNER = """

def __lookahead_run_test_classes(names):
    import io as _io, json as _json, os as _os, unittest as _unittest
    results = {{}}
    for name in names:
        case = globals().get(name)
        if not (isinstance(case, type) and issubclass(case, _unittest.TestCase)):
            results[name] = [0, 0]
            continue
        suite = _unittest.defaultTestLoader.loadTestsFromTestCase(case)
        outcome = _unittest.TextTestRunner(stream=_io.StringIO(), verbosity=0).run(suite)
        bad = len(outcome.failures) + len(outcome.errors) + len(outcome.unexpectedSuccesses)
        results[name] = [outcome.testsRun, outcome.testsRun - bad - len(outcome.skipped)]
    _os.write(1, ("\\n{marker}" + _json.dumps(results) + "\\n").encode())

__lookahead_run_test_classes({names!r})
"""


def _as_list(value: Any) -> list[str]:
    """ClassEval list fields may come as real lists or as the string of a Python list, depending on the copy."""
    if isinstance(value, str):
        value = value.strip()
        if not value:
            return []
        parsed = ast.literal_eval(value) if value.startswith("[") else [value]
        return [str(v) for v in parsed]
    return [str(v) for v in (value or [])]


def _test_class_names(doc: dict[str, Any]) -> list[str]:
    """Names of the record's test classes (stripped: ClassEval_97 lists ' Words2NumbersTestMain')."""
    return [name.strip() for name in _as_list(doc["test_classes"])]


def build_program(doc: dict[str, Any], output: str, marker: str) -> str:
    """Imports + the model's class (fenced block when present) + the unit tests + the runner."""
    imports = "\n".join(_as_list(doc.get("import_statement")))
    code = extract_code(output)
    runner = _RUNNER.format(marker=marker, names=_test_class_names(doc))
    return f"{imports}\n{code}\n\n{doc['test']}\n{runner}"


def _parse_results(stdout: str, marker: str) -> dict[str, list[int]] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(marker):
            try:
                return json.loads(line[len(marker):])
            except json.JSONDecodeError:
                return None
    return None


class ClassEval(CodeTask):
    name: ClassVar[str] = "classeval"
    hf_id: ClassVar[str] = "FudanSELab/ClassEval"
    hf_config: ClassVar[str | None] = None
    hf_split: ClassVar[str] = "test"
    local_file: ClassVar[str] = "classeval/test.jsonl"
    default_max_new_tokens: ClassVar[int] = 2048

    def prompt(self, ex: Example, turn: int, history: list[str]) -> Prompt:
        self._check_turn(ex, turn, history)
        content = INSTRUCTION.format(class_name=ex.doc["class_name"], skeleton=ex.doc["skeleton"])
        return Prompt(messages=[{"role": "user", "content": content}])

    def score(self, ex: Example, outputs: list[str]) -> dict[str, float]:
        output = self._single_output(ex, outputs)
        names = _test_class_names(ex.doc)
        marker = f"__lookahead_classeval_{secrets.token_hex(8)}__"
        result = run_python(build_program(ex.doc, output, marker), timeout_s=self.timeout_s)
        counts = _parse_results(result.stdout, marker) if result.passed else None
        if not counts or not names:
            return {"pass@1": 0.0, "test_class_pass_rate": 0.0, "test_pass_rate": 0.0}
        per_class = [counts.get(name, [0, 0]) for name in names]  # [tests run, tests passed]
        class_ok = [run > 0 and passed == run for run, passed in per_class]
        total_run = sum(run for run, _ in per_class)
        total_passed = sum(passed for _, passed in per_class)
        return {
            "pass@1": float(all(class_ok)),
            "test_class_pass_rate": sum(class_ok) / len(names),
            "test_pass_rate": total_passed / total_run if total_run else 0.0,
        }
