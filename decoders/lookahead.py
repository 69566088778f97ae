"""Lookahead decoding (Fu, Bailis, Stoica, Zhang, ICML 2024).

Each step is ONE forward over the root, the verification branch (up to G pooled n-grams whose first
token is the root, merged into a tree) and the lookahead branch (a W x (N-1) window of the Jacobi
trajectory), mutually invisible under one mask. The window's new n-grams go into the pool (keyed by
first token, at most G per key); verification accepts the longest matching prefix plus the bonus
token, which is emitted even when a whole n-gram matched (the official implementation drops it).
``pool_from_prompt`` seeds the pool with the prompt's n-grams (paper Table 3 rows 6 and 9).
``pool_from_output`` (our extension, off by default for the paper's rows) also adds the n-grams of the
accepted output, so text the model repeats from its own answer is proposed as prompt lookup would.
``pool_context`` (our extension, off by default) ranks first the pooled prompt/output n-grams whose
preceding token also matches the text (see ``decoders/pool.py``).
``pool_from_corpus`` (our extension, off by default): where neither the pool nor prompt lookup has a
draft, draft the continuation the model's greedy answers to *other* prompts of the task (``corpus``:
the auto-tuner's held-out calibration prompts) most often wrote after the text's last two tokens, else
its last one (:class:`decoders.pool.CorpusIndex`); an answer to this very prompt is never used. Why: on
HumanEval (SmolLM2, every problem, (1,2,1,t7,cap6,pl5)) 29% of steps have a root token found nowhere in
the prompt or the answer so far (the prose after the code: " function", " returns"), so no text draft
exists; the model phrases its answers alike, so its other answers hold drafts for them, as a server's
history of answers would. Only as a fallback: seeding the pool with the corpus instead let it displace
the window's n-grams (at G=1 a key holds one) and gained a third as much.
``text_ngram`` (our extension; None = N) is the length of the n-grams taken from the prompt and output.
Why decoupled: the window's n-grams are guesses, worth checking only a few tokens deep, while text the
model repeats (code, quoted phrases) runs on for many tokens, so those drafts pay off longer.
``step_tokens`` (our extension; None = no cap) caps the tokens fed per step (root + window + tree): the
pooled n-grams fill the tree in rank order and the one that would overflow is cut short. Why: on a CPU
a forward's cost rises in steps with its token count (``python -m harness.perf`` prints t(k)), so a
cap at the end of a step keeps every forward on the cheaper side of it while G > 1 fills what is left.
``prompt_lookup`` (our extension; None = off) adds prompt lookup's draft (``pld``'s longest-suffix match
over prompt + output, up to ``LOOKUP_NGRAM`` = 6 tokens where ``pld`` defaults to 3, continued for
``prompt_lookup`` tokens), with the recency rule: the match's latest occurrence in the generated text,
else its first in the prompt (``pld(recent=True)``'s draft; see :func:`decoders.pool.lookup_match`).
Why: the pool holds n-grams of one length keyed by one or two tokens, so on code, where the model copies
long spans, ``pld``'s longer match and longer draft accept more per step; and the model repeats its own
latest text more than the prompt's first occurrence. Measured 2026-12-05 (SmolLM2 fp32, 256 tokens, the
16 prompts ``harness.perf --prompts 16`` measures, (1,2,1,t7,cap6,pl10) with both pools and context):
S 2.31 -> 2.36 on HumanEval (1267 -> 1239 steps), 1.81 -> 1.83 on MT-Bench.
How the draft ranks depends on how much text it matched:
- two tokens or more: first, and whole. Under a ``step_tokens`` cap a draft that would not fit beside
  the window is fed alone with the root (the window sits that step out, its trajectory waits), past a
  cap smaller than ``pld``'s step (1 + ``prompt_lookup`` tokens) if need be: the step costs what
  ``pld``'s does instead of trimming its draft for a guess. Wherever ``pld(recent=True)``'s draft rests
  on two or more matched tokens, lookahead's draft set contains it, and the window and pool add to it
  (plain ``pld``'s where the match occurs only in the prompt).
- the last token alone (``LOOKUP_MIN_MATCH``): a weak guess, ranked after the pool's chains (a cap may
  cut it), with the window in.
So with the chain, ``step_tokens`` caps the steps without a strong match, where every draft is a guess.
Measured (before the recency rule; HumanEval, 8 prompts x 256 tokens, (1,2,1,t7,pl10)): cap 6 fed 6.5
tokens a step for S 3.43, cap 11 (``pld``'s step) 8.2 for S 3.53; priced on the EPYC's t(k)
(``results/perf/epyc-2026-12-02c``) cap 6 is the faster: 2.85x against 2.70x `ar` (AVX-512), 2.24x
against 2.00x (AVX2 forced).
``solo_root`` (our extension, off by default; the tuner's choice): a step with nothing to verify (no
draft from the text, the pool or the corpus) feeds the root alone, and the window waits, as it does beside
a long draft. Why: such a step's window rows mint guesses but accept nothing that step, and where a
2-token step costs more than a 1-token one those rows are the price. Measured 2026-12-06 (SmolLM2 fp32,
perf's four measured prompts, 256 tokens, (1,2,1,t7,cap6,pl5) with both pools and context): HumanEval S
2.216 -> 2.199, its 68 2-token steps became 71 1-token ones; MT-Bench S 1.829 -> 1.784, 186 2-token steps
became 202 1-token ones. Priced at the step costs of the Zen 4 AVX2-forced HumanEval rounds (t(2) 1.15,
t(6) 1.45 t(1)): 1.2% and 1.7% faster; at the AVX-512 ones (t(2) 0.99 t(1)) slower. So the tuner decides it
last, for its chosen shape (see decoders/autotune.py).
``auto`` picks (W, N, G, text_ngram, step_tokens, prompt_lookup, solo_root) for this machine before the first
generation: ``build_decoder`` then returns :class:`decoders.autotune.AutoTunedLookahead` (the tuner imports
this module, never the reverse).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Optional

import numpy as np

from decoders.base import Decoder, Proposal, StepOutput, check_int, token_hash
from decoders.pool import CorpusIndex, NgramPool, lookup_match
from decoders.tree import DraftTree
from decoders.window import LookaheadWindow

# The parameters the auto-tuner sets; the pool flags stay the caller's.
SHAPE = ("W", "N", "G", "text_ngram", "step_tokens", "prompt_lookup", "solo_root")
# Longest suffix the prompt-lookup chain matches (pld's default is 3): among the earlier places where the
# text's last token occurred, the chain continues the one whose preceding tokens match the text longest,
# up to 6, so a frequent token (a newline, an indent) continues the occurrence that shares the most
# context. Measured (SmolLM2 fp32, 8 prompts x 256 tokens, deterministic S): HumanEval S 3.28 at 3,
# 3.33 at 4, 3.36 at 5, 3.38 at 6, 3.36 at 8 for (1,2,1,cap11,pl10); `pld` itself gains alike with its
# max_ngram (3.25 at 3, 3.35 at 6), which `python -m harness.perf --pld 6,10` shows beside it.
LOOKUP_NGRAM = 6
# A match of fewer suffix tokens is weak evidence (a newline, a space or a bracket matches somewhere):
# its draft, the continuation of an occurrence of the last token alone (by the recency rule), then ranks
# after the pool's chains (the window's n-grams and the text's latest, context-ranked ones) and does not
# displace the window. Measured (SmolLM2 fp32, 256 tokens, deterministic S, (1,2,1,t7,cap11,pl10) with both pools
# and context): HumanEval (8 prompts) 3.39 -> 3.53, MT-Bench (6) 1.61 -> 1.69, GSM8K (6) 1.80 -> 1.93,
# XSum (6) 2.21 -> 2.34, at 0.1 fewer tokens a step; `pld`(6,10) on the same prompts: 3.35, 1.60, 1.79, 2.21.
# Taking the latest occurrence of the last token instead gained half as much on HumanEval (3.44). (These
# were measured with the first occurrence; the recency rule came after.) Also tried 2026-12-05, offline
# (greedy answers replayed, steps priced on measured t(k)): a threshold of 5 paid 1-3% where extra rows are
# dear (AVX2) and lost up to 1.3% on summaries at AVX-512's flatter curve, with a chain of 10; with a
# chain of 5 it lost on every task (by under 1%). Left at 2.
LOOKUP_MIN_MATCH = 2


def shape_of(values: Sequence[Any]) -> dict[str, Any]:
    """SHAPE's values in order (a candidate tuple) -> a SHAPE dict; absent trailing ones take the decoder's
    defaults, so the tuner's 6-value candidates and records from before solo_root read alike."""
    defaults = {f.name: f.default for f in fields(LookaheadDecoder)}
    return {k: values[i] if i < len(values) else defaults[k] for i, k in enumerate(SHAPE)}


def shape_label(shape: dict[str, Any]) -> str:
    """``(1,2,1,t7,cap12,pl10)``: W, N, G, then the text n-gram length, step cap and prompt-lookup chain
    where set, and ``solo`` where solo_root is (what the demo and perf print for a SHAPE)."""
    tags = {"text_ngram": "t", "step_tokens": "cap", "prompt_lookup": "pl"}
    extra = [f"{tag}{shape[k]}" for k, tag in tags.items() if shape.get(k)]
    solo = ["solo"] if shape.get("solo_root") else []
    return "(" + ",".join([str(shape[k]) for k in ("W", "N", "G")] + extra + solo) + ")"


@dataclass
class _LookaheadState:
    window: LookaheadWindow
    pool: NgramPool
    prompt_len: int  # where the generated text starts: prompt lookup's recency rule
    corpus: CorpusIndex | None = None  # pool_from_corpus: the other answers' continuations


@dataclass
class LookaheadDecoder(Decoder):
    name: ClassVar[str] = "lookahead"
    W: int = 5
    N: int = 3
    G: int = 5
    pool_from_prompt: bool = True
    pool_from_output: bool = False
    pool_context: bool = False
    pool_from_corpus: bool = False
    text_ngram: Optional[int] = None
    step_tokens: Optional[int] = None
    prompt_lookup: Optional[int] = None
    solo_root: bool = False
    auto: bool = False
    tuned: Any = field(default=None, init=False, repr=False)  # autotune's outcome, once tuned
    # pool_from_corpus's answers: token_hash(prompt ids) -> greedy output ids; set by the tuner
    corpus: dict[str, list[int]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        check_int("W", self.W, 1, "lookahead window width")
        check_int("N", self.N, 2, "n-gram size")
        check_int("G", self.G, 0, "verified n-grams per step")
        if self.text_ngram is not None:
            check_int("text_ngram", self.text_ngram, 2, "n-gram size for prompt/output n-grams")
        if self.prompt_lookup is not None:
            check_int("prompt_lookup", self.prompt_lookup, 1, "draft tokens of the prompt-lookup chain")
        if self.step_tokens is not None:
            low = 2 + self.W * (self.N - 1)  # root, full window, one draft token
            check_int("step_tokens", self.step_tokens, low, f"tokens per step; W={self.W}, N={self.N} need {low}")
        for flag in ("pool_from_prompt", "pool_from_output", "pool_context", "pool_from_corpus", "solo_root", "auto"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be true or false, got {getattr(self, flag)!r}")

    def set_shape(self, params: dict[str, Any]) -> None:
        """Take the tuned values (SHAPE) from ``params``; the pool flags stay as they are. A record from
        before text_ngram/step_tokens/prompt_lookup/solo_root existed lacks them: they take their defaults."""
        defaults = shape_of(())
        for k in SHAPE:
            setattr(self, k, params.get(k, defaults[k]))
        self.__post_init__()

    @property
    def text_n(self) -> int:
        return self.text_ngram or self.N

    def max_step_tokens(self) -> int:
        uncapped = 1 + self.W * (self.N - 1) + self.G * (max(self.N, self.text_n) - 1) + (self.prompt_lookup or 0)
        if self.step_tokens is None:
            return uncapped
        # a matched prompt-lookup step may pass the cap with pld's own step (root + draft)
        return min(uncapped, max(self.step_tokens, 1 + (self.prompt_lookup or 0)))

    def begin(self, prompt_ids: list[int]) -> _LookaheadState:
        pool = NgramPool(self.N, self.G, context=self.pool_context)
        if self.pool_from_prompt:
            pool.add_from(prompt_ids, n=self.text_n)
        corpus = None
        if self.pool_from_corpus:
            own = token_hash(prompt_ids)  # never draft from an answer to this very prompt
            corpus = CorpusIndex([a for h, a in self.corpus.items() if h != own], length=self.text_n - 1)
        window = LookaheadWindow.seeded(self.W, self.N, prompt_ids, np.random.default_rng(0))
        return _LookaheadState(window=window, pool=pool, prompt_len=len(prompt_ids), corpus=corpus)

    def propose(self, state: _LookaheadState, seq: list[int]) -> Proposal:
        prev = seq[-2] if len(seq) > 1 else None
        chains = state.pool.get(seq[-1], prev)
        window: LookaheadWindow | None = state.window
        cap = self.step_tokens
        matched, draft = (lookup_match(seq, LOOKUP_NGRAM, self.prompt_lookup, state.prompt_len)
                          if self.prompt_lookup else (0, []))
        if not chains and not draft and state.corpus is not None:  # the text has no draft: other answers
            chains = [cont] if (cont := state.corpus.get(seq)) else []
        if draft and matched < LOOKUP_MIN_MATCH and chains:
            chains = [*chains, draft]  # a weak match: the pool's chains first, the window stays
        elif draft:
            chains = [draft, *chains]
            if cap is not None:
                # the prompt-lookup chain is served before the window, and whole: a step that
                # matched earlier text feeds pld's full draft (past a smaller cap) rather than
                # trimming it for a guess
                cap = max(cap, 1 + len(draft))
                if 1 + len(draft) + window.size > cap:
                    window = None
        if self.solo_root and not chains:
            window = None  # nothing to verify: the root alone, the window waits (see solo_root)
        room = None if cap is None else cap - 1 - (window.size if window else 0)
        return Proposal(DraftTree.from_chains(chains, room), window)

    def update(self, state: _LookaheadState, seq: list[int], out: StepOutput) -> None:
        if out.window_pred:  # empty when the step left the window out: its trajectory waits
            state.pool.add_all(state.window.advance(out.window_pred))
        if self.pool_from_output:  # every n-gram that ends in a newly accepted token
            n = self.text_n
            state.pool.add_from(seq, start=len(seq) - len(out.verdict.tokens) - n + 1, n=n)
