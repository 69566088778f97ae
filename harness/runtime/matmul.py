"""The forward's matmuls: which path each one takes on this machine, decided once per model.

A decoding step multiplies a few rows (1 for `ar`, a handful for a lookahead step) by every weight
matrix, so its cost is reading the weights once. Library GEMMs are tuned for many rows: at a few rows
they re-lay the weights out per call or take slower paths. So on CPU:

- our kernel (``harness/runtime/kernels``) where it builds: weights packed once, every row multiplied
  while a weight block sits in registers, and one accumulator per output summed in k order, so a row's
  result is bitwise the same at every row count (an `ar` step, a lookahead step and the prefill agree
  exactly);
- else the oneDNN-prepacked weights (float32 1-2 rows as MKL ``W @ x^T``, which streams them once);
- elsewhere (CUDA, float16, builds without oneDNN, models too big for a second copy) ``F.linear``.

``python -m harness.perf`` measures the resulting latency curve; ``results/perf/`` holds the figures.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from harness.runtime.arena import WeightArena

MIN_GEMM_ROWS = 6  # fewest rows the oneDNN path runs with: fewer cost more than 6, so they are padded
#: ``matmul=`` choices: ``auto`` (the best kernel variant this CPU runs, else the libraries), ``library``
#: (never our kernel), or one kernel variant by name, to force it (e.g. ``avx2`` on an AVX-512 machine).
MATMUL_CHOICES = ("auto", "library", "avx512", "avx2", "baseline")


@dataclass(frozen=True)
class Projection:
    """One matmul of the forward, ``x [k, in] -> [k, out]``: the concatenated outputs of ``linears``.

    Linears that read the same input (q/k/v; gate/up) are fused into one weight, so the step reads
    one matrix instead of three. Padding rows of the oneDNN path repeat the last row and are dropped.
    """

    linears: tuple[torch.nn.Linear, ...]
    weight: torch.Tensor | None = None  # [out, in], the linears' weights concatenated (oneDNN float32)
    packed: torch.Tensor | None = None  # the same, oneDNN-packed
    bias: torch.Tensor | None = None  # [out], with the packed and kernel paths
    small: torch.Tensor | None = None  # column stripes packed for our kernel (float32 [ceil(out/64)*4, in, 16])
    kernel: Any = None  # the compiled module that reads ``small``
    # gate/up packed in the kernel's glu layout: a call returns silu(gate) * up [k, out / 2] (its swiglu)
    glu: bool = False

    @classmethod
    def of(cls, linears: tuple[torch.nn.Linear, ...], pack: bool, kernel: Any = None,
           bf16_weights: bool = False, arena: WeightArena | None = None, glu: bool = False) -> Projection:
        """``pack``: use the oneDNN/MKL CPU paths; ``kernel``: our few-row kernel, which then replaces
        them, with its packed weights stored in bfloat16 when ``bf16_weights`` (half the bytes a step reads)
        and, given an ``arena``, moved into it (2 MB pages: see harness.runtime.arena). ``glu``: the linears
        are (gate, up) without biases, and the kernel's call applies SiLU (see layer_ops.glu_fits)."""
        if kernel is None and not pack:
            return cls(linears)
        with torch.inference_mode():
            weights = [m.weight.detach() for m in linears]
            weight = weights[0] if len(weights) == 1 else torch.cat(weights)  # [out, in]
            bias = None
            if any(m.bias is not None for m in linears):
                bias = torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features)
                                  for m in linears])
            if kernel is not None:
                small = kernel.pack(weight, bf16_weights, glu)
                return cls(linears, bias=bias, small=small if arena is None else arena.take(small), kernel=kernel,
                           glu=glu)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        # only float32 runs 1-2 rows as W @ x^T
        return cls(linears, weight if weight.dtype == torch.float32 else None, packed, bias)

    @cached_property  # read on every kernel call: summed once
    def out_features(self) -> int:
        return sum(m.out_features for m in self.linears)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one call reads (the memory floor of a step is their sum over the forward)."""
        if self.small is not None:
            return self.small.numel() * self.small.element_size()
        return sum(m.weight.numel() * m.weight.element_size() for m in self.linears)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        k = x.shape[0]
        if self.glu:
            return self.kernel.swiglu(x.contiguous(), self.small, self.out_features)  # [k, out / 2]
        if self.small is not None:
            y = self.kernel.linear(x.contiguous(), self.small, self.out_features)  # [k, out]
            return y if self.bias is None else y + self.bias
        if self.packed is None:
            ys = [F.linear(x, m.weight, m.bias) for m in self.linears]
            return ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        if k == 0:
            return x.new_empty(0, self.packed.shape[0])
        if k <= 2 and self.weight is not None:
            xp = x.contiguous() if k == 2 else torch.cat([x, x])  # [2, in]
            # [k, out], made row-major: a transposed view would send sdpa (last-dim stride 2) to its slow path
            y = torch.mm(self.weight, xp.t()).t()[:k].contiguous()
            return y if self.bias is None else y + self.bias
        rows = max(k, MIN_GEMM_ROWS)
        xp = x.contiguous() if rows == k else torch.cat([x, x[-1:].expand(rows - k, -1)])
        y = torch.ops.mkldnn._linear_pointwise(xp, self.packed, self.bias, "none", [], "")  # [rows, out]
        return y if rows == k else y[:k]


def bandwidth_probe(megabytes: int = 512, device: torch.device | str = "cpu") -> tuple[Callable[[], object], int]:
    """A call that reads a float32 buffer far larger than the caches once (a sum on all torch threads, as a
    decoding step uses them), and the bytes it reads: bytes / its seconds is the read bandwidth of the memory
    that holds ``device``'s weights (on a GPU its own; the call then waits for the sum)."""
    x = torch.ones(megabytes * (1 << 20) // 4, device=device)
    x.sum()  # touch every page first
    return (x.sum if x.device.type == "cpu" else lambda: x.sum().item()), x.numel() * 4


def round_robin_samples(fns: dict[Any, Callable[[], object]], reps: int, warmup: int = 1) -> dict[Any, list[float]]:
    """Seconds of each of ``reps`` timed calls per function, the calls interleaved: each round calls every
    function once in turn, so a slow spell of a shared machine falls on all of them alike and their ratios
    stay comparable (entry i of every list is round i); the first ``warmup`` rounds are untimed."""
    times: dict[Any, list[float]] = {name: [] for name in fns}
    for rep in range(warmup + reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if rep >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def paired_ratio(times: list[float], base: list[float]) -> tuple[float, float, float]:
    """times[i] / base[i] over the rounds of ``round_robin_samples``: (median, lower quartile, upper quartile).
    Why: the ratio of two medians hides how far a round's pair swings (0.60 could be 0.58-0.62 or 0.55-0.65)."""
    ratios = [a / b for a, b in zip(times, base)]
    q1, q2, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return q2, q1, q3


def rotated(n: int, turn: int) -> list[int]:
    """0..n-1 starting at ``turn`` (mod n): the order of one round of timed runs. Why: in a fixed order the
    first (often the reference) alone pays whatever a round's start costs; rotating spreads it."""
    return [(turn + i) % n for i in range(n)]


def round_robin(fns: dict[Any, Callable[[], object]], reps: int, warmup: int = 1,
                stat: str = "median") -> dict[Any, float]:
    """Seconds per function: the median or min (``stat``) of ``round_robin_samples``' interleaved calls."""
    pick = min if stat == "min" else statistics.median
    return {name: pick(ts) for name, ts in round_robin_samples(fns, reps, warmup).items()}


def forward_matmuls(backend: Any, seed: int = 0) -> Callable[[], None]:
    """A call that runs a greedy step's matmuls alone at 1 row (its projections back to back, on random
    inputs): t(1) minus its time is what the forward spends outside its matmuls."""
    g = torch.Generator().manual_seed(seed)
    projections = backend.projections()
    widths = {p.linears[0].in_features for p in projections}
    xs = {w: torch.randn(1, w, generator=g).to(device=backend.device, dtype=backend.dtype) for w in widths}
    calls = [(p, xs[p.linears[0].in_features]) for p in projections]

    def run() -> None:
        with torch.inference_mode():
            for p, x in calls:
                p(x)
        backend.sync()

    return run


def physical_memory() -> int | None:
    """Bytes of RAM on this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def can_pack(model: torch.nn.Module, memory_bytes: int | None = None) -> bool:
    """Whether the packed CPU matmuls apply (see :class:`Projection`).

    They hold a second copy of the weights, so they are skipped when the model, that copy and headroom
    (3x the weights) would not fit in ``memory_bytes`` (default: this machine's RAM): a 7B model in
    bfloat16 (13.5 GB) on a 24 GB machine keeps plain ``F.linear``.
    """
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype not in (torch.float32, torch.bfloat16):
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    memory_bytes = physical_memory() if memory_bytes is None else memory_bytes
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if memory_bytes is not None and 3 * weight_bytes > memory_bytes:
        return False
    try:  # a build without the op stays on F.linear
        w = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=param.dtype), None)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(2, 8, dtype=param.dtype), w, None, "none", [], "")
    except (RuntimeError, AttributeError):
        return False
    return True


@dataclass(frozen=True)
class LayerProjections:
    qkv: Projection  # -> [k, (H + 2 Hkv) d]
    o: Projection
    gate_up: Projection  # -> [k, 2 * intermediate]
    down: Projection

    def all(self) -> tuple[Projection, ...]:
        """The four in the forward's order."""
        return self.qkv, self.o, self.gate_up, self.down


def layer_projections(layer: torch.nn.Module, pack: bool, kernel: Any = None, bf16_weights: bool = False,
                      arena: WeightArena | None = None, glu: bool = False) -> LayerProjections:
    """The layer's four matmuls; with ``glu``, gate_up applies SiLU * up in our kernel (see layer_ops.glu_fits)."""
    att, mlp = layer.self_attn, layer.mlp
    return LayerProjections(  # packed in the forward's order: the arena lays them out in it
        qkv=Projection.of((att.q_proj, att.k_proj, att.v_proj), pack, kernel, bf16_weights, arena),
        o=Projection.of((att.o_proj,), pack, kernel, bf16_weights, arena),
        gate_up=Projection.of((mlp.gate_proj, mlp.up_proj), pack, kernel, bf16_weights, arena, glu),
        down=Projection.of((mlp.down_proj,), pack, kernel, bf16_weights, arena),
    )


def select_kernel(matmul: str, model: torch.nn.Module, kernel_sources: Path | None = None) -> Any:
    """Our kernel module for ``model`` per ``matmul`` (see MATMUL_CHOICES), or None for the libraries;
    ``kernel_sources``: built from an edited copy of the kernel sources (an A/B: ``kernels.bench_step``).

    The kernel takes float32 activations on CPU, and like the packed path it holds a second copy of the
    weights, so it applies where :func:`can_pack` does. ``auto`` falls back to the libraries silently where
    the kernel does not apply and with one line on stderr where it fails to build; a forced variant that
    cannot be had is an error.
    """
    if matmul not in MATMUL_CHOICES:
        raise ValueError(f"matmul must be one of {', '.join(MATMUL_CHOICES)}, got {matmul!r}")
    if matmul == "library":
        return None
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.float32 or not can_pack(model):
        if matmul == "auto":
            return None
        raise ValueError(f"matmul={matmul} needs a float32 (or bf16w) model on CPU that fits twice in memory; "
                         f"use matmul=auto or matmul=library")
    from harness.runtime.kernels import load_small_gemm

    kernel = load_small_gemm(None if matmul == "auto" else matmul,  # ValueError: a variant this CPU lacks
                             source_dir=kernel_sources)
    if kernel is None and matmul != "auto":
        raise RuntimeError(f"the {matmul} matmul kernel could not be built (see the note above); use matmul=auto")
    return kernel


def describe_path(kernel: Any, pack: bool, bf16_weights: bool, dtype: torch.dtype, huge_bytes: int = 0) -> str:
    """What the manifests, perf results and the demo print: ``kernel avx2 (AVX2) bfloat16 weights``
    (``..., 512 MB in 2 MB pages`` where the OS backs that much of them with huge pages; ``kernel avx512
    (AVX512, Zen 4: 6x64 tiles at 3-6 rows, no 2-row prefetch) float32 weights`` on Zen 4), ``oneDNN packed
    float32`` or ``F.linear bfloat16``."""
    name = str(dtype).removeprefix("torch.")
    if kernel is not None:
        info = kernel.kernel_info
        pages = f", {huge_bytes / 1e6:.0f} MB in 2 MB pages" if huge_bytes else ""
        # see prefers_zen4_build
        zen4 = "no 1- or 2-row prefetch" if bf16_weights else "6x64 tiles at 3-6 rows, no 2-row prefetch"
        tiles = f", Zen 4: {zen4}" if info.zen4 else ""
        threads = "" if info.openmp else ", one thread: built without OpenMP"
        return (f"kernel {info.variant} ({info.isa}{tiles}{threads}) {'bfloat16' if bf16_weights else 'float32'} "
                f"weights{pages}")
    return f"{'oneDNN packed' if pack else 'F.linear'} {name}{' (weights rounded to bfloat16)' if bf16_weights else ''}"
