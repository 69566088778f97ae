"""The task interface: doc -> prompt -> (runner decodes) -> score.

A task knows its dataset, how to turn one record into a prompt for each turn, and how to score the
decoded texts. It never touches the model or the decoders: the runner encodes the prompt with
:func:`encode_prompt`, decodes, and hands the texts back to :meth:`Task.score`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tasks.data import load_records
from tasks.execution import DEFAULT_TIMEOUT_S, sandbox_kind


@dataclass(frozen=True)
class Example:
    """One benchmark item: a stable id plus the raw dataset record."""

    id: str
    doc: dict[str, Any] = field(hash=False)  # dicts are unhashable; the id identifies the example


@dataclass(frozen=True)
class Prompt:
    """What to feed the model: chat messages (chat template applied later) or raw completion text."""

    messages: list[dict[str, str]] | None = None
    text: str | None = None

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.text is None):
            raise ValueError("Prompt needs exactly one of messages= or text=")
        if self.messages is not None:
            if not self.messages:
                raise ValueError("Prompt.messages must not be empty")
            for message in self.messages:
                if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
                    raise ValueError(f"each message needs string 'role' and 'content', got {message!r}")


class Task(ABC):
    """Base class for one benchmark. Subclasses set the class variables and the three hooks below.

    ``data_dir`` (or the ``LOOKAHEAD_DATA_DIR`` environment variable when it is None) switches loading
    from the Hugging Face hub to ``<data_dir>/<local_file>``; see :mod:`tasks.data`.
    ``limit`` keeps the first ``limit`` examples after task filters. Task-specific options are keyword
    arguments of the subclass constructor; anything unknown is a TypeError, so typos don't pass silently.
    """

    name: ClassVar[str]
    hf_id: ClassVar[str]
    hf_config: ClassVar[str | None] = None
    hf_split: ClassVar[str] = "test"
    local_file: ClassVar[str]
    default_max_new_tokens: ClassVar[int]

    def __init__(self, data_dir: str | None = None, limit: int | None = None, **options: Any) -> None:
        if options:
            raise TypeError(f"{self.name}: unknown option(s) {sorted(options)}")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
        self.data_dir = data_dir
        self.limit = limit
        self._examples: list[Example] | None = None

    # ----------------------------------------------------------------- data
    def examples(self) -> list[Example]:
        """All examples (filtered, limited), loaded once on first call."""
        if self._examples is None:
            records = load_records(
                hf_id=self.hf_id,
                hf_config=self.hf_config,
                hf_split=self.hf_split,
                local_file=self.local_file,
                data_dir=self.data_dir,
            )
            examples = [
                Example(id=self.example_id(doc, index), doc=doc)
                for index, doc in enumerate(records)
                if self.keep(doc)
            ]
            self._examples = examples if self.limit is None else examples[: self.limit]
        return self._examples

    def keep(self, doc: dict[str, Any]) -> bool:
        """Task filter applied before ``limit`` (e.g. MBPP's test-split task ids). Default: keep all."""
        return True

    def example_id(self, doc: dict[str, Any], index: int) -> str:
        """Stable id of a record; default is its row index in the split."""
        return str(index)

    # -------------------------------------------------------------- prompts
    def num_turns(self, ex: Example) -> int:
        """Number of model turns for this example (MT-Bench: 2)."""
        return 1

    @abstractmethod
    def prompt(self, ex: Example, turn: int, history: list[str]) -> Prompt:
        """Prompt for ``turn`` (0-based); ``history`` holds the model's own answers to turns ``0..turn-1``."""

    # -------------------------------------------------------------- scoring
    @abstractmethod
    def score(self, ex: Example, outputs: list[str]) -> dict[str, float]:
        """Metrics for one example from its decoded outputs (one text per turn). Never runs the model."""

    # -------------------------------------------------------------- helpers
    def _check_turn(self, ex: Example, turn: int, history: list[str]) -> None:
        """Catch runner bugs early: the history must hold exactly the earlier turns' answers."""
        n = self.num_turns(ex)
        if not 0 <= turn < n:
            raise ValueError(f"{self.name} {ex.id}: turn {turn} out of range (this example has {n} turn(s))")
        if len(history) != turn:
            raise ValueError(f"{self.name} {ex.id}: turn {turn} needs {turn} earlier answer(s), got {len(history)}")

    def _single_output(self, ex: Example, outputs: list[str]) -> str:
        if len(outputs) != 1:
            raise ValueError(f"{self.name} {ex.id}: expected 1 output, got {len(outputs)}")
        return outputs[0]


class CodeTask(Task):
    """A task scored by running generated code: a ``timeout_s`` option and ids from ``task_id``."""

    def __init__(self, data_dir: str | None = None, limit: int | None = None, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, **options: Any) -> None:
        super().__init__(data_dir, limit, **options)
        self.timeout_s = timeout_s

    def example_id(self, doc: dict[str, Any], index: int) -> str:
        return str(doc["task_id"])

    def sandbox_kind(self) -> str:
        """Which sandbox runs the generated programs here (``namespaces`` or ``rlimits``), for manifests."""
        return sandbox_kind()


def render_plain(messages: list[dict[str, str]]) -> str:
    """Fallback chat rendering for tokenizers without a chat template: one 'role: content' per line,
    ending with an open 'assistant:' line so the model answers rather than continues the user turn."""
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nassistant:"


def encode_prompt(prompt: Prompt, tokenizer: Any) -> list[int]:
    """Token ids for ``prompt``.

    Messages go through the tokenizer's chat template (with the generation prompt); the rendered text is
    tokenized without extra special tokens because the template already contains them (this is what
    ``apply_chat_template(tokenize=True)`` does, minus its version-dependent return type). Without a chat
    template, messages are rendered by :func:`render_plain`. Raw text is tokenized as is (the tokenizer adds
    its usual BOS).
    """
    if prompt.messages is not None:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
            return list(tokenizer(text, add_special_tokens=False)["input_ids"])
        return list(tokenizer(render_plain(prompt.messages))["input_ids"])
    assert prompt.text is not None
    return list(tokenizer(prompt.text)["input_ids"])
