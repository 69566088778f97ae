"""Shared pieces of the summarization tasks (CNN/DailyMail, XSum): the prompt and ROUGE scoring."""

from __future__ import annotations

from typing import Any, ClassVar

from rouge_score import rouge_scorer

from tasks.base import Example, Prompt, Task

ROUGE_TYPES: tuple[str, ...] = ("rouge1", "rouge2", "rougeL")

INSTRUCTION = (
    "Summarize the following article briefly, in a few sentences. "
    "Write only the summary.\n\nArticle:\n{article}"
)


def make_rouge_scorer() -> rouge_scorer.RougeScorer:
    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def rouge_f(scorer: rouge_scorer.RougeScorer, prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1/2/L F-measures; an empty (or whitespace-only) prediction scores zeros."""
    if not prediction.strip() or not reference.strip():
        return {name: 0.0 for name in ROUGE_TYPES}
    scores = scorer.score(reference, prediction)  # rouge_score's order is (target, prediction)
    return {name: float(scores[name].fmeasure) for name in ROUGE_TYPES}


class SummarizationTask(Task):
    """One user message: a fixed instruction with the article; scored by ROUGE against the reference."""

    article_field: ClassVar[str]
    reference_field: ClassVar[str]
    default_max_new_tokens: ClassVar[int] = 1024

    def __init__(self, data_dir: str | None = None, limit: int | None = None, **options: Any) -> None:
        super().__init__(data_dir, limit, **options)
        self._scorer = make_rouge_scorer()

    def example_id(self, doc: dict[str, Any], index: int) -> str:
        return str(doc["id"])

    def prompt(self, ex: Example, turn: int, history: list[str]) -> Prompt:
        self._check_turn(ex, turn, history)
        content = INSTRUCTION.format(article=ex.doc[self.article_field].strip())
        return Prompt(messages=[{"role": "user", "content": content}])

    def score(self, ex: Example, outputs: list[str]) -> dict[str, float]:
        return rouge_f(self._scorer, self._single_output(ex, outputs), ex.doc[self.reference_field])
