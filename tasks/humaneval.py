"""HumanEval (Chen et al. 2021): complete a Python function from its signature and docstring; pass@1.

As in the paper's script, the prompt is the raw ``prompt`` field (code completion, no chat template).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from tasks.base import CodeTask, Example, Prompt
from tasks.execution import fenced_blocks, pick_block, run_python, truncate_at_stops

# Where a completion of a function body ends: the next top-level statement (Codex paper's stop set,
# plus a closing markdown fence). A leading "\n" followed by no indentation means "top level".
STOP_SEQUENCES: tuple[str, ...] = ("\ndef ", "\nclass ", "\nif ", "\nprint(", "\n#", "\nassert ", "\n```")


def _pick_block(blocks: list[str], entry_point: str) -> str:
    """The fenced block that defines ``entry_point`` at top level, else :func:`pick_block`'s choice."""
    defines_entry = re.compile(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)
    for block in blocks:
        if defines_entry.search(block):
            return block
    return pick_block(blocks)


def build_program(doc: dict[str, Any], output: str) -> str:
    """Prompt + completion + the task's tests + ``check(entry_point)``.

    A base model continues the prompt: its output starts with the indented function body, which is cut at
    the first top-level stop sequence. Otherwise the output is top-level code, usually a chat model's
    fenced block restating the whole function; it is appended after the prompt (the later definition
    wins, and helpers defined in the prompt stay available).
    """
    first_line = next((line for line in output.splitlines() if line.strip()), "")
    if first_line[:1] in (" ", "\t"):
        solution = doc["prompt"] + truncate_at_stops(output, STOP_SEQUENCES)
    else:
        blocks = fenced_blocks(output)
        code = _pick_block(blocks, doc["entry_point"]) if blocks else output
        solution = doc["prompt"] + "\n" + truncate_at_stops(code, ("\n```",))
    return f"{solution}\n\n{doc['test']}\n\ncheck({doc['entry_point']})\n"


class HumanEval(CodeTask):
    name: ClassVar[str] = "humaneval"
    hf_id: ClassVar[str] = "openai/openai_humaneval"
    hf_config: ClassVar[str | None] = "openai_humaneval"
    hf_split: ClassVar[str] = "test"
    local_file: ClassVar[str] = "humaneval/HumanEval.jsonl.gz"
    default_max_new_tokens: ClassVar[int] = 512

    def prompt(self, ex: Example, turn: int, history: list[str]) -> Prompt:
        self._check_turn(ex, turn, history)
        return Prompt(text=ex.doc["prompt"])

    def score(self, ex: Example, outputs: list[str]) -> dict[str, float]:
        program = build_program(ex.doc, self._single_output(ex, outputs))
        return {"pass@1": float(run_python(program, timeout_s=self.timeout_s).passed)}
