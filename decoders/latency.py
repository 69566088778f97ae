"""The latency curve t(k): seconds of one forward that feeds k new tokens, measured on a backend.

The auto-tuner prices lookahead's steps on it (``decoders.autotune``), perf prices its roofline on it, and
perf's memory bound times its 1-token step. Measured, not modelled: on a CPU t(k) rises in steps where the
matmul needs another tile of rows, and it moves with the machine's memory speed (see SNAPSHOT_REPS).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from harness.runtime.backend import Backend

# fine steps up to 12: on a CPU the cost can jump between neighbouring sizes (where the matmul needs
# another tile of rows), and interpolating across a jump would hide it
LATENCY_KS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 24, 32, 48, 64)
# The tuner's own curve is the mean of snapshots of SNAPSHOT_REPS repetitions each: one before screening, one after it
# and one after each finalist's run. Why: on a VM the memory speed swings between regimes lasting seconds to minutes,
# and only t(1) swings with it; a large step is compute-bound and costs about the same in both. Measured 2026-12-06
# (Zen 4, AVX-512; a scratch script alternating, for 10 minutes, a 64-token `ar` decode with the curve's own forwards
# at cache 264): 258 of 312 pairs fast (medians t(1) 11.6 ms, t(11) 21.7 ms, probe 51 GB/s), 44 slow (t(1) 17.2 ms,
# t(11) 21.0 ms, probe 33 GB/s), so t(11)/t(1) 1.88 or 1.21; `ar`'s own steps matched the curve's t(1) within 3%
# (median) in both. One curve taken in a slow spell priced (1,2,1,t7,cap11,pl10) at 2.89x; the rounds that followed,
# mostly fast, ran it at 1.49x and the cap-5 shape at 1.80x (results/perf/zen4-2026-12-06s). A speedup is a ratio of
# total times over whatever mix of regimes a run meets, so steps are priced at the mean t(k) over the tuning's
# minutes, not at one moment's.
SNAPSHOT_REPS = 3


def latency_curve(backend: Backend, ks=LATENCY_KS, cache_len: int = 300, reps: int = 7) -> dict[int, float]:
    """Median seconds of one greedy step's forward (:meth:`Backend.greedy_forward`) with k new tokens (causal among
    them) after ``cache_len`` entries."""
    return latency_curves([backend], ks, cache_len, reps)[0]


def latency_curves(backends: Sequence[Backend], ks=LATENCY_KS, cache_len: int = 300,
                   reps: int = 7) -> list[dict[int, float]]:
    """:func:`latency_curve` of each backend, measured interleaved: so ratios between them (bf16
    weights against float32) are of one time window, not of two a minute apart on a drifting machine.

    The sizes are measured round-robin (every k of every backend once per repetition, after one untimed
    round), so a slow spell of the machine raises all of them alike instead of bending a curve; each
    timed forward follows an untimed one of the same size on the same backend.
    """
    g = torch.Generator().manual_seed(0)
    inputs = [step_inputs(backend, ks, cache_len, g) for backend in backends]
    times: list[dict[int, list[float]]] = [{k: [] for k in ks} for _ in backends]
    for rep in range(reps + 1):
        for k in ks:
            for backend, ins, ts in zip(backends, inputs, times):
                # an untimed forward of the same size first: decoding runs like-sized forwards back to
                # back, while here the previous forward was another size (after k=64, k=1 read cold caches)
                for timed in (False, True):
                    t0 = time.perf_counter()
                    backend.greedy_forward(*ins[k])
                    backend.sync()
                    if rep and timed:  # round 0 is the warm-up
                        ts[k].append(time.perf_counter() - t0)
                    backend.commit([])  # forget the new entries
    return [{k: statistics.median(v) for k, v in ts.items()} for ts in times]


def step_inputs(backend: Backend, ks: Sequence[int], cache_len: int,
                g: torch.Generator) -> dict[int, tuple[torch.Tensor, ...]]:
    """Fill the backend's cache with ``cache_len`` random tokens and draw a forward's inputs for each k
    new tokens after them (ids [k], positions [k], causal mask [k, k]); run one, then ``commit([])``."""
    vocab = backend.shape.vocab
    backend.reset(cache_len + max(ks) + 1)
    prefix = torch.randint(0, vocab, (cache_len,), generator=g, device="cpu").to(backend.device)
    backend.forward(prefix, torch.arange(cache_len, device=backend.device), logit_rows=prefix.new_empty(0))
    backend.commit()
    inputs = {}
    for k in ks:
        ids = torch.randint(0, vocab, (k,), generator=g).to(backend.device)
        pos = torch.arange(cache_len, cache_len + k, device=backend.device)
        inputs[k] = (ids, pos, torch.ones(k, k, dtype=torch.bool, device=backend.device).tril())
    return inputs


def one_step(backend: Backend, cache_len: int = 300, greedy: bool = True) -> Callable[[], None]:
    """A call that runs one 1-token step after ``cache_len`` random entries and forgets it (the state
    :func:`latency_curves` measures t(1) in, without its untimed forward before each), to interleave with
    other timings (perf's memory bound): a greedy step's (:meth:`Backend.greedy_forward`), or with ``greedy``
    False one that returns the logits (:meth:`Backend.forward`: the whole LM head, as a sampling step)."""
    ins = step_inputs(backend, [1], cache_len, torch.Generator().manual_seed(0))[1]
    step = backend.greedy_forward if greedy else backend.forward

    def run() -> None:
        step(*ins)
        backend.sync()
        backend.commit([])

    return run


def calibration_cache_len(prompts: list[list[int]], max_new_tokens: int) -> int:
    """Cache entries half-way through a calibration run: the median prompt plus half the generation."""
    return int(statistics.median(len(p) for p in prompts)) + max_new_tokens // 2


def mean_curve(curves: Sequence[dict[int, float]]) -> dict[int, float]:
    """Each size's mean over ``curves``: the cost of a step at a moment drawn from them (see SNAPSHOT_REPS)."""
    return {k: statistics.fmean(c[k] for c in curves) for k in curves[0]}


def median_curve(curves: Sequence[dict[int, float]]) -> dict[int, float]:
    """Each size's median over ``curves`` (perf's roofline, over the curves measured after its rounds)."""
    return {k: statistics.median(c[k] for c in curves) for k in curves[0]}


def interp_latency(curve: dict[int, float], k: float) -> float:
    ks = sorted(curve)
    return float(np.interp(k, ks, [curve[x] for x in ks]))
