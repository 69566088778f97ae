"""The one generate loop every decoder shares, and its result.

A decoder only says what to *propose* each step (a draft tree, and for lookahead a 2-D window) and
how to *update* its own state from the step's outputs. Laying the proposal into one forward,
verifying it, keeping the accepted cache entries, stopping at EOS / max_new_tokens and counting
steps, tokens and FLOPs happen here, once.

Step layout of the forward's k new tokens: ``[root | draft-tree nodes | window tokens]``. The root is
the last accepted token (not yet in the cache) at position L = cache length; every new token sees the
whole cache and the root; the tree and the window cannot see each other.
"""

from __future__ import annotations

import hashlib
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from decoders.sampling import SamplingParams
from decoders.tree import DraftTree, Verdict, verify_greedy, verify_sampling
from decoders.window import LookaheadWindow

if TYPE_CHECKING:
    from harness.runtime.backend import Backend


@dataclass
class DecodeResult:
    """What one generation produced and cost. S = len(tokens) / steps (prefill not counted)."""

    tokens: list[int]  # new token ids (EOS included when generation stopped on it)
    steps: int  # decoding forwards after prefill
    accepted: list[int]  # tokens emitted per step; sum == len(tokens), len == steps
    input_tokens: list[int]  # tokens fed per step
    flops: list[float]  # FLOPs per step (backend formula)
    prompt_tokens: int
    prefill_flops: float
    prefill_s: float
    decode_s: float
    stop_reason: str  # "eos" or "max_new_tokens"
    forward_s: float = 0.0  # decode time spent inside model forwards (the rest is decoder overhead)
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def compression(self) -> float:
        return len(self.tokens) / self.steps if self.steps else 0.0

    @property
    def output_hash(self) -> str:
        return token_hash(self.tokens)


def token_hash(tokens: list[int]) -> str:
    """Identity of a token sequence: equal hashes are the exactness test against ``ar``."""
    return hashlib.sha1(",".join(map(str, tokens)).encode()).hexdigest()


@dataclass
class Proposal:
    tree: DraftTree
    window: LookaheadWindow | None = None


@dataclass
class StepOutput:
    verdict: Verdict
    tree_pred: list[int]  # argmax at the root and at each tree node (greedy drafts for the next step)
    window_pred: list[int]  # argmax at the window's top level (the next Jacobi level)


def check_int(name: str, value: Any, low: int, what: str) -> int:
    """Validate an integer parameter; the message names the parameter and its valid range."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} ({what}) must be an integer >= {low}, got {value!r}")
    return value


class Decoder(ABC):
    """Subclasses are dataclasses whose fields are their parameters (with the one set of defaults; the
    Hydra schemas are derived from them) and implement ``begin`` / ``propose`` / ``update``."""

    name: ClassVar[str]

    @property
    def params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}  # type: ignore[arg-type]

    @abstractmethod
    def max_step_tokens(self) -> int:
        """Upper bound on tokens fed by one step (sizes the KV cache)."""

    @abstractmethod
    def begin(self, prompt_ids: list[int]) -> Any:
        """Fresh per-generation proposal state."""

    @abstractmethod
    def propose(self, state: Any, seq: list[int]) -> Proposal:
        """Draft for the step after ``seq`` (prompt + accepted tokens; its last token is the root)."""

    def update(self, state: Any, seq: list[int], out: StepOutput) -> None:
        """Learn from the step (``seq`` already extended by the accepted tokens)."""

    def generate(
        self,
        backend: Backend,
        prompt_ids: list[int],
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> DecodeResult:
        """Decode up to ``max_new_tokens`` after ``prompt_ids``; greedy unless temperature > 0."""
        check_int("max_new_tokens", max_new_tokens, 1, "tokens to generate")
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("prompt_ids must hold at least one token")
        limit = backend.shape.max_positions
        if len(prompt_ids) + max_new_tokens > limit:
            raise ValueError(
                f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                f"model's context of {limit} positions; shorten the prompt or lower max_new_tokens"
            )
        sampling = SamplingParams(temperature, top_k, top_p, seed)
        gen = sampling.generator()

        prefill_s = backend.start(prompt_ids, max_new_tokens + self.max_step_tokens())
        state = self.begin(prompt_ids)
        seq = list(prompt_ids)
        tokens: list[int] = []
        accepted: list[int] = []
        stop = "max_new_tokens"
        t0 = time.perf_counter()
        while len(tokens) < max_new_tokens:
            out = self._step(backend, self.propose(state, seq), seq[-1], sampling, gen)
            new = out.verdict.tokens[: max_new_tokens - len(tokens)]
            hit = next((i for i, t in enumerate(new) if t in backend.eos_token_ids), None)
            if hit is not None:
                new = new[: hit + 1]
            tokens.extend(new)
            accepted.append(len(new))
            if hit is not None:
                stop = "eos"
                break
            seq.extend(new)
            self.update(state, seq, out)
        backend.sync()
        decode_s = time.perf_counter() - t0

        c = backend.counters
        steps_flops = [f for f, pre in zip(c.flops, c.is_prefill) if not pre]
        steps_inputs = [n for n, pre in zip(c.input_tokens, c.is_prefill) if not pre]
        return DecodeResult(
            tokens=tokens,
            steps=len(accepted),
            accepted=accepted,
            input_tokens=steps_inputs,
            flops=steps_flops,
            prompt_tokens=len(prompt_ids),
            prefill_flops=sum(f for f, pre in zip(c.flops, c.is_prefill) if pre),
            prefill_s=prefill_s,
            decode_s=decode_s,
            stop_reason=stop,
            forward_s=sum(s for s, pre in zip(c.forward_s, c.is_prefill) if not pre),
            params=dict(self.params),
        )

    def verify(
        self, tree: DraftTree, logits: torch.Tensor | None, pred: list[int], sampling: SamplingParams,
        gen: torch.Generator,
    ) -> Verdict:
        """Greedy walk, or speculative sampling over the tree. ``logits``: [1 + len(tree) (+ the window's
        rows, not read), vocab]; None in a greedy step, which reads only ``pred``.

        A method (not inlined) so tests can substitute a deliberately wrong verifier and show that the
        distribution tests catch it.
        """
        if sampling.greedy:
            return verify_greedy(tree, pred)
        return verify_sampling(tree, logits, sampling, gen)

    def _step(
        self, backend: Backend, prop: Proposal, root: int, sampling: SamplingParams, gen: torch.Generator
    ) -> StepOutput:
        """One forward over [root | tree | window], verification, and the cache commit."""
        tree, window = prop.tree, prop.window
        t = len(tree)
        L = backend.length
        ids = [root] + tree.tokens
        pos = [L] + [L + d for d in tree.depths]  # absolute positions
        # the [k, k] mask in Python rows, one tensor call: everyone sees the root, the tree and the window
        # only themselves (numpy and torch calls on a few rows cost more than the arithmetic, cold)
        k = 1 + t + (window.size if window is not None else 0)
        mask_rows = [[True] + [False] * (k - 1)] + [[True] + row + [False] * (k - 1 - t) for row in tree.mask()]
        rows = None
        if window is not None:
            w_rel, w_mask = window.layout()
            ids += window.tokens()
            pos += [L + r for r in w_rel]
            mask_rows += [[True] + [False] * t + row for row in w_mask]
            rows = torch.tensor(list(range(1 + t)) + [1 + t + i for i in window.top_rows()], device=backend.device)
        mask = torch.tensor(mask_rows, device=backend.device) if k > 1 else None
        step = (torch.tensor(ids, device=backend.device), torch.tensor(pos, device=backend.device), mask, rows)
        if sampling.greedy:  # the rows' argmax alone (through the LM head's screen where it runs)
            logits, pred = None, backend.greedy_forward(*step)  # [1 + t (+ W)] token ids
        else:
            logits = backend.forward(*step)  # [1 + t (+ W), vocab]
            pred = backend.argmax(logits)
        verdict = self.verify(tree, logits, pred, sampling, gen)
        backend.commit([0] + [1 + n for n in verdict.nodes])
        return StepOutput(verdict=verdict, tree_pred=pred[: 1 + t], window_pred=pred[1 + t :])
