"""The greedy LM head's screen: a greedy step's argmax of the float32 logits, read from the head rounded to
bfloat16 plus the few float32 rows that can still hold the maximum (the proof is in ``head_screen.cpp``).

Why: a greedy step needs each row's argmax, not its logits, and the float32 head is a fifth of the bytes a
SmolLM2 step streams (113 of 538 MB). Reading its bfloat16 rounding instead (57 MB) and recomputing the 1-4
candidates that the error bound leaves (as the kernel computes them) gives the same token, every step, from
10% fewer bytes. The float32 head stays for the steps that need logits (sampling, :meth:`Backend.forward`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.runtime.arena import WeightArena
from harness.runtime.matmul import Projection

CHUNK_ROWS = 4096  # head rows per float64 pass of :func:`bounds` (a 49152-row head in float64 is 226 MB)


def bounds(w: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Per column j of the float32 head ``w`` [vocab, hidden]: c_j >= ||w_j - bf16(w_j)|| + gamma (||w_j|| +
    ||bf16(w_j)||), gamma = 2K u / (1 - 2K u) (u = 2^-24, K = hidden), as float32 [vocab] rounded up; and the
    spread, >= 2 max_j (max(||w_j||, ||bf16(w_j)||) (1 + gamma) + c_j), which scales the screen's slack."""
    u, K = 2.0**-24, w.shape[1]
    gamma = 2 * K * u / (1 - 2 * K * u)
    margin = 1 + 2.0**-10  # float64 norms err by ~K 2^-53; the float32 cast by 2^-24
    cs, top = [], 0.0
    with torch.inference_mode():
        for chunk in w.detach().split(CHUNK_ROWS):
            wd, bd = chunk.double(), chunk.to(torch.bfloat16).double()  # pack()'s rounding (round to nearest even)
            nw, nb = wd.norm(dim=1), bd.norm(dim=1)
            c = ((wd - bd).norm(dim=1) + gamma * (nw + nb)) * margin
            cs.append(c.float())
            top = max(top, float((torch.maximum(nw, nb) * (1 + gamma) + c).max()))
    return torch.cat(cs), 2 * top * margin


@dataclass(frozen=True)
class HeadScreen:
    """The bfloat16 head packed for our kernel, its per-column bounds and spread, and the float32 head whose
    argmax it gives (``layer.cpp``'s ``Stack.set_screen`` holds them)."""

    projection: Projection  # the head's weights rounded to bfloat16, packed
    bound: torch.Tensor  # [vocab] float32
    spread: float
    exact: torch.Tensor  # [vocab, hidden] float32, the head itself

    @classmethod
    def of(cls, lm_head: torch.nn.Linear, kernel: Any, arena: WeightArena | None) -> HeadScreen | None:
        """The screen of a float32 head without bias on our kernel, or None (another head is read whole)."""
        w = lm_head.weight
        if kernel is None or lm_head.bias is not None or w.dtype != torch.float32 or w.device.type != "cpu":
            return None
        if not bool(torch.isfinite(w).all()):  # the bound assumes finite weights
            return None
        bound, spread = bounds(w)
        return cls(Projection.of((lm_head,), False, kernel, True, arena), bound, spread, w.detach().contiguous())

    @property
    def weight_bytes(self) -> int:
        """Bytes a greedy step reads from the head: the bfloat16 rows (the candidates' rows are a few KB)."""
        return self.projection.weight_bytes
