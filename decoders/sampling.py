"""Sampling parameters and the target-distribution warp shared by every decoder.

Greedy decoding is temperature 0. Every decoder draws its random numbers from one seeded
``torch.Generator`` so that the same seed, decoder and prompt give the same output. A job seeds each
prompt with :func:`prompt_seed`, so different prompts draw independent random numbers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; top_k 0 = off; top_p 1.0 = off (the paper's Table 2 uses 1.0, 0, 1.0)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1.0 = off), got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self) -> torch.Generator:
        g = torch.Generator(device="cpu")
        g.manual_seed(0 if self.seed is None else int(self.seed))
        return g


def prompt_seed(seed: int, *key: object) -> int:
    """The generator seed of one prompt: a hash of the job's ``seed`` and the prompt's ``key``
    (task, example id, turn), in [0, 2**63).

    Why: with the job's seed for every prompt, every prompt draws the same uniforms at the same
    positions, so the prompts' samples are correlated and an interval over prompts is too narrow.
    Measured at T = 1 on 40 CNN/DailyMail articles: 26 of ``ar``'s summaries began with "The", 6 of
    lookahead's with "Elation", and the paired ROUGE-1 difference read -0.050 [-0.080, -0.023].
    """
    digest = hashlib.sha256(repr((int(seed), *key)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Warped target distribution p(x) from logits ``[..., vocab]`` (float32 in, float64 out).

    Order as in transformers' warpers: temperature, then top-k, then top-p (smallest set whose mass
    reaches top_p; the most likely token always stays).
    """
    scores = logits.double() / params.temperature  # [..., V]
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        cum = sorted_scores.softmax(-1).cumsum(-1)
        drop_sorted = (cum - sorted_scores.softmax(-1)) >= params.top_p  # mass before this token already enough
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(-1)
