"""Jacobi decoding (Santilli et al. 2023; lookahead paper Section 2).

Guess the next ``window`` tokens, feed them after the root in one causal chain, and take each
position's argmax as the next guess: a fixed-point iteration whose converged prefix matches greedy
decoding. Verification is the shared tree walk over that single chain, so the accepted prefix plus
the bonus token is exact; the unaccepted outputs become the next step's guesses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from decoders.base import Decoder, Proposal, StepOutput, check_int
from decoders.tree import DraftTree


@dataclass
class _JacobiState:
    guesses: list[int]


@dataclass
class JacobiDecoder(Decoder):
    name: ClassVar[str] = "jacobi"
    window: int = 8

    def __post_init__(self) -> None:
        check_int("window", self.window, 1, "Jacobi guesses per step")

    def max_step_tokens(self) -> int:
        return 1 + self.window

    def begin(self, prompt_ids: list[int]) -> _JacobiState:
        # initial guess: repeat the last prompt token (any guess is exact; this one is deterministic)
        return _JacobiState(guesses=[prompt_ids[-1]] * self.window)

    def propose(self, state: _JacobiState, seq: list[int]) -> Proposal:
        return Proposal(DraftTree.from_chains([state.guesses]))

    def update(self, state: _JacobiState, seq: list[int], out: StepOutput) -> None:
        # tree_pred[j] guesses relative position j + 1; the bonus sits at m + 1, so guesses resume at m + 2
        m = len(out.verdict.nodes)
        rest = out.tree_pred[m + 1 :]
        fill = rest[-1] if rest else seq[-1]
        state.guesses = (rest + [fill] * self.window)[: self.window]
