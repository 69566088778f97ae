"""MBPP (Austin et al. 2021), "full" config, test split (task ids 11..510): write a function from a
one-line description and its three asserts; pass@1 on those asserts."""

from __future__ import annotations

from typing import Any, ClassVar

from tasks.base import CodeTask, Example, Prompt
from tasks.execution import extract_code, run_python, truncate_at_stops

TEST_TASK_IDS = range(11, 511)  # HF "full" splits: prompt 1-10, test 11-510, validation 511-600, train 601-974

INSTRUCTION = (
    "You are an expert Python programmer, and here is your task: {text} "
    "Your code should pass these tests:\n\n{tests}"
)

# Markers some models copy from the original few-shot MBPP format; code ends there.
_END_MARKERS: tuple[str, ...] = ("[DONE]", "[END]")


def build_program(doc: dict[str, Any], output: str) -> str:
    """The model's code (from a fenced block when present) + setup code + the asserts. Setup goes after
    the code because it may use the solution's definitions (task 367 builds trees of the solution's Node)."""
    code = truncate_at_stops(extract_code(output), _END_MARKERS).replace("[BEGIN]", "")
    tests = "\n".join(doc["test_list"])
    return f"{code}\n\n{doc.get('test_setup_code') or ''}\n{tests}\n"


class MBPP(CodeTask):
    name: ClassVar[str] = "mbpp"
    hf_id: ClassVar[str] = "google-research-datasets/mbpp"
    hf_config: ClassVar[str | None] = "full"
    hf_split: ClassVar[str] = "test"
    local_file: ClassVar[str] = "mbpp/mbpp.jsonl"  # all 974 records; keep() selects the test split
    default_max_new_tokens: ClassVar[int] = 512

    def keep(self, doc: dict[str, Any]) -> bool:
        return int(doc["task_id"]) in TEST_TASK_IDS

    def prompt(self, ex: Example, turn: int, history: list[str]) -> Prompt:
        self._check_turn(ex, turn, history)
        content = INSTRUCTION.format(text=ex.doc["text"], tests="\n".join(ex.doc["test_list"]))
        return Prompt(messages=[{"role": "user", "content": content}])

    def score(self, ex: Example, outputs: list[str]) -> dict[str, float]:
        program = build_program(ex.doc, self._single_output(ex, outputs))
        return {"pass@1": float(run_python(program, timeout_s=self.timeout_s).passed)}
