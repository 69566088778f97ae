"""Autoregressive decoding: one token per step. The reference output and the speed baseline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from decoders.base import Decoder, Proposal
from decoders.tree import DraftTree


@dataclass
class AutoregressiveDecoder(Decoder):
    name: ClassVar[str] = "ar"

    def max_step_tokens(self) -> int:
        return 1

    def begin(self, prompt_ids: list[int]) -> None:
        return None

    def propose(self, state: Any, seq: list[int]) -> Proposal:
        return Proposal(DraftTree())  # root only: the forward feeds just the last token
