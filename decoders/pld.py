"""Prompt-lookup decoding (Saxena 2023; transformers' ``prompt_lookup_num_tokens``).

Match the trailing n-gram of prompt + generated text (longest first, ``max_ngram`` down to 1) against
earlier text and propose the ``num_pred`` tokens that followed its first occurrence, as transformers
does; verify that chain in one forward. No match: a plain autoregressive step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from decoders.base import Decoder, Proposal, check_int
from decoders.pool import lookup_continuation
from decoders.tree import DraftTree


@dataclass
class PromptLookupDecoder(Decoder):
    name: ClassVar[str] = "pld"
    max_ngram: int = 3
    num_pred: int = 10

    def __post_init__(self) -> None:
        check_int("max_ngram", self.max_ngram, 1, "longest n-gram to match")
        check_int("num_pred", self.num_pred, 1, "draft tokens per step")

    def max_step_tokens(self) -> int:
        return 1 + self.num_pred

    def begin(self, prompt_ids: list[int]) -> None:
        return None

    def propose(self, state: Any, seq: list[int]) -> Proposal:
        draft = lookup_continuation(seq, self.max_ngram, self.num_pred)
        return Proposal(DraftTree.from_chains([draft] if draft else []))
