"""The greedy LM head's screen: a greedy step's argmax of the head's logits, read from the head quantized to
8 bits plus the few rows that can still hold the maximum (the proof is in ``head_screen.cpp``).

Why: a greedy step needs each row's argmax, not its logits, and the head is a fifth of the bytes a SmolLM2
step streams (113 of 538 MB in float32, 57 of 269 in bf16w). Reading its int8 copy instead (28 MB) and
recomputing the 1-19 candidates that the error bound leaves (as the kernel computes them) gives the same token,
every step. The head itself stays for the steps that need logits (sampling, :meth:`Backend.forward`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.runtime.arena import WeightArena

CHUNK_ROWS = 4096  # head rows per float64 pass of :func:`bounds` (a 49152-row head in float64 is 226 MB)
UNPACKED = 2.0**24  # the kernel unpacks q as q 2^24 (head_screen.cpp's load_q); its scales carry 2^-24
SMALLEST_SCALE = 2.0**-100  # smaller column scales would underflow once divided by 2^24: no screen


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each column j of the head ``w`` [vocab, hidden] (a row of the tensor) as int8 q_j with its scale s_j =
    max |w_j| / 127 (1 for a zero column): (q [vocab, hidden] int8, s [vocab] float32)."""
    scale = w.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def bounds(w: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """Per column j of the head ``w`` [vocab, hidden] and its screen W''_j = s_j q_j: c_j >= ||w_j - W''_j|| +
    gamma (||w_j|| + ||W''_j||), gamma = 2K u / (1 - 2K u) (u = 2^-24, K = hidden), as float32 [vocab] rounded
    up; the spread, >= 2 max_j (max(||w_j||, ||W''_j||) (1 + gamma) + c_j), which scales the screen's slack; and
    the magnitude, >= the largest factor of ||h|| that a float32 sum of the head or of the unpacked screen
    (q 2^24) can reach, against which the kernel checks for overflow."""
    u, K = 2.0**-24, w.shape[1]
    gamma = 2 * K * u / (1 - 2 * K * u)
    margin = 1 + 2.0**-10  # float64 norms err by ~K 2^-53; the float32 cast by 2^-24
    cs, top, big = [], 0.0, 0.0
    with torch.inference_mode():
        for wc, qc, sc in zip(w.detach().split(CHUNK_ROWS), q.split(CHUNK_ROWS), scale.split(CHUNK_ROWS)):
            wd, qd = wc.double(), qc.double()
            sd = qd * sc.double()[:, None]  # W'' exactly: 8 bits times 24
            nw, ns = wd.norm(dim=1), sd.norm(dim=1)
            c = ((wd - sd).norm(dim=1) + gamma * (nw + ns)) * margin
            cs.append(c.float())
            top = max(top, float((torch.maximum(nw, ns) * (1 + gamma) + c).max()))
            big = max(big, float(nw.max()), float(qd.norm(dim=1).max()) * UNPACKED)
    return torch.cat(cs), 2 * top * margin, 2 * big * margin


@dataclass(frozen=True)
class ScreenWeights:
    """The LM head's int8 copy packed for ``screen_logits``, as a step's last matmul (``perf``'s matmuls alone
    call it, and the memory bound counts its bytes)."""

    lm_head: torch.nn.Linear
    packed: torch.Tensor  # int32 [stripes, hidden, lanes] (head_screen.cpp's pack_screen)
    scale: torch.Tensor  # [vocab] float32: s_j 2^-24
    kernel: Any

    @property
    def linears(self) -> tuple[torch.nn.Linear, ...]:
        return (self.lm_head,)

    @property
    def weight_bytes(self) -> int:
        """Bytes a greedy step reads from the head: the int8 stripes and the scales (the candidates' rows are a
        few KB)."""
        return self.packed.numel() * self.packed.element_size() + self.scale.numel() * self.scale.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The screen's logits of ``x`` [r, hidden]: [r, vocab]."""
        return self.kernel.screen_logits(x.contiguous(), self.packed, self.scale)


@dataclass(frozen=True)
class HeadScreen:
    """The int8 head packed, its per-column bounds, spread and magnitude, and the head whose argmax it gives
    (``layer.cpp``'s ``Stack.set_screen`` holds them)."""

    weights: ScreenWeights
    bound: torch.Tensor  # [vocab] float32
    spread: float
    magnitude: float
    exact: torch.Tensor  # [vocab, hidden] float32, the head itself (bf16w: its bfloat16 values)

    @classmethod
    def of(cls, lm_head: torch.nn.Linear, kernel: Any, arena: WeightArena | None) -> HeadScreen | None:
        """The screen of a head without bias stored in float32 (bf16w's holds bfloat16 values) on our kernel, or
        None (another head is read whole)."""
        w = lm_head.weight
        if kernel is None or lm_head.bias is not None or w.dtype != torch.float32 or w.device.type != "cpu":
            return None
        if not bool(torch.isfinite(w).all()):  # the bound assumes finite weights
            return None
        with torch.inference_mode():
            q, scale = quantize(w.detach())
            if float(scale.min()) < SMALLEST_SCALE:
                return None
            scale = scale / UNPACKED  # exact: a power of two, far from underflow
            bound, spread, magnitude = bounds(w, q, scale * UNPACKED)
            packed = kernel.pack_screen(q)
        weights = ScreenWeights(lm_head, packed if arena is None else arena.take(packed), scale, kernel)
        return cls(weights, bound, spread, magnitude, w.detach().contiguous())

    @property
    def weight_bytes(self) -> int:
        """Bytes a greedy step reads from the head (see :class:`ScreenWeights`)."""
        return self.weights.weight_bytes
