"""MT-Bench (Zheng et al. 2023): 80 two-turn chat questions. The paper uses it for speed, not quality.

There is no GPT-4 judge offline, so :meth:`MTBench.score` reports simple answer statistics. To grade
quality, pass ``judge=callable(example, outputs) -> {metric: float}``; its metrics are merged in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from tasks.base import Example, Prompt, Task

Judge = Callable[[Example, list[str]], Mapping[str, float]]


class MTBench(Task):
    name: ClassVar[str] = "mt_bench"
    # FastChat's question.jsonl schema (question_id, category, turns, reference) as published on the hub.
    hf_id: ClassVar[str] = "lighteval/mt-bench"
    hf_config: ClassVar[str | None] = None
    hf_split: ClassVar[str] = "train"
    local_file: ClassVar[str] = "mt_bench/question.jsonl"
    default_max_new_tokens: ClassVar[int] = 1024

    def __init__(self, data_dir: str | None = None, limit: int | None = None, *, judge: Judge | None = None,
                 **options: Any) -> None:
        super().__init__(data_dir, limit, **options)
        self.judge = judge

    def example_id(self, doc: dict[str, Any], index: int) -> str:
        return str(doc["question_id"])

    def num_turns(self, ex: Example) -> int:
        return len(ex.doc["turns"])

    def prompt(self, ex: Example, turn: int, history: list[str]) -> Prompt:
        """The conversation so far: each user turn followed by the model's own earlier answer."""
        self._check_turn(ex, turn, history)
        messages: list[dict[str, str]] = []
        for question, answer in zip(ex.doc["turns"][:turn], history):
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": ex.doc["turns"][turn]})
        return Prompt(messages=messages)

    def score(self, ex: Example, outputs: list[str]) -> dict[str, float]:
        """Length stats per turn; fewer outputs than turns is allowed (a runner may stop a conversation)."""
        n = self.num_turns(ex)
        if len(outputs) > n:
            raise ValueError(f"{self.name} {ex.id}: {len(outputs)} outputs for {n} turns")
        scores: dict[str, float] = {"turns_answered": float(sum(bool(o.strip()) for o in outputs))}
        for turn in range(n):
            text = outputs[turn] if turn < len(outputs) else ""
            scores[f"chars_turn{turn + 1}"] = float(len(text))
            scores[f"words_turn{turn + 1}"] = float(len(text.split()))
        if self.judge is not None:
            scores.update({key: float(value) for key, value in self.judge(ex, list(outputs)).items()})
        return scores
