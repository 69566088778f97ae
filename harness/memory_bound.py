"""The memory bound of a decoding step: how long one step takes against the time to read its matmul weights
once at this machine's measured read bandwidth (``perf``'s first section). The bandwidth, t(1) of every
weight mode and their matmuls alone are timed in the same interleaved rounds, so a bound and a time come
from the same moment, and the bf16w / float32 ratio can be taken within each round."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

from decoders.latency import one_step
from harness.runtime.matmul import bandwidth_probe, forward_matmuls, paired_ratio, round_robin_samples


@dataclass
class MemoryRounds:
    """What ``memory_rounds`` measured: read bandwidth (bytes/s); per backend key, its 1-row matmuls alone
    (s, median) and t(1) of every round (entry i: round i, for paired ratios): a greedy step's; and per backend
    whose greedy steps screen the LM head, the t(1) of a step that reads the whole head (s, median)."""

    bandwidth: float
    matmuls: dict[str, float]
    t1_rounds: dict[str, list[float]]
    t1_whole_head: dict[str, float]

    @property
    def t1(self) -> dict[str, float]:
        """t(1) per backend key: the median of its rounds."""
        return {key: statistics.median(ts) for key, ts in self.t1_rounds.items()}

    def t1_ratio(self, key: str, base: str) -> tuple[float, float, float]:
        """t(1) of ``key`` over ``base`` within each round: (median, lower quartile, upper quartile)."""
        return paired_ratio(self.t1_rounds[key], self.t1_rounds[base])


def memory_rounds(backends: dict[str, Any], cache_len: int, reps: int = 41) -> MemoryRounds:
    """Read bandwidth, and each backend's t(1) and 1-row matmuls alone, from the same interleaved rounds (a
    probe, then every backend's 1-token step and matmuls). Why: on a VM whose bandwidth swings 2x in
    minutes, a probe taken once before the curves put t(1) at 0.95-2.07x of the bound (Zen 5, 2026-12-03):
    a bound and a time of different moments do not compare. A round takes ~0.1 s, so 41 are cheap."""
    probe, nbytes = bandwidth_probe(device=next(iter(backends.values())).device)
    fns: dict[Any, Callable[[], object]] = {"probe": probe}
    for key, backend in backends.items():
        fns["t1", key] = one_step(backend, cache_len)
        if backend.head_screen is not None:  # what the screen saves, in the same rounds
            fns["whole", key] = one_step(backend, cache_len, greedy=False)
        fns["matmuls", key] = forward_matmuls(backend)
    samples = round_robin_samples(fns, reps)
    times = {name: statistics.median(ts) for name, ts in samples.items()}
    return MemoryRounds(nbytes / times["probe"], {key: times["matmuls", key] for key in backends},
                        {key: samples["t1", key] for key in backends},
                        {key: times["whole", key] for key in backends if ("whole", key) in times})


def memory_floor_line(backend, t1: float, bandwidth: float, matmul_s: float, whole_head: float | None = None) -> str:
    """t(1) of a greedy step, and its matmuls alone, against the time to read the step's weights once at the
    bandwidth measured in the same rounds; ``whole_head``: t(1) of a step that reads the whole float32 LM
    head, where greedy steps screen it (its own bound beside it)."""
    weight = backend.step_weight_bytes()
    floor = weight / bandwidth
    line = (f"memory bound: {weight / 1e6:.0f} MB of matmul weights per step / {bandwidth / 1e9:.1f} GB/s read = "
            f"{floor * 1e3:.1f} ms; t(1) = {t1 * 1e3:.1f} ms = {t1 / floor:.2f}x the bound: its matmuls "
            f"alone {matmul_s * 1e3:.1f} ms ({matmul_s / floor:.2f}x), the rest {(t1 - matmul_s) * 1e3:.1f} ms "
            f"(medians of interleaved rounds)")
    if whole_head is not None and backend.head_screen is not None:
        whole = weight - backend.head_screen.weight_bytes + backend.whole_head_bytes()
        line += (f"; the LM head screened in bfloat16 (greedy steps): a step reading the whole float32 head "
                 f"({whole / 1e6:.0f} MB, bound {whole / bandwidth * 1e3:.1f} ms) took {whole_head * 1e3:.1f} ms, "
                 f"{t1 / whole_head:.3f}x")
    return line


#: the operations of a layer's matmuls among the whole forward's clocks (``layer.cpp``'s Clocks)
LAYER_MATMULS = ("qkv", "o", "gate_up", "down")


def op_rounds(backends: dict[str, Any], cache_len: int, reps: int = 41) -> dict[str, dict[str, float]]:
    """Where a greedy 1-token step's time goes, per backend whose forward is one kernel call: seconds per step
    in each operation (clocks inside the step, means over ``reps`` interleaved rounds; ``layer_loop``: between the
    layers), ``unclocked`` (the step's wall time outside the kernel's clocks: the Python around the call, its
    arguments' conversion) and ``step`` (the whole).
    Why: t(1) minus the matmuls timed alone does not show what a mode shares with another (the bytes of a
    screened LM head, the KV cache, the norms), and that bounds how far the mode's own weights can take it."""
    clocked = {key: b for key, b in backends.items() if b.op_clocks}
    fns = {key: one_step(b, cache_len) for key, b in clocked.items()}
    for b in clocked.values():
        b.clock_ops(True)
    try:
        samples = round_robin_samples(fns, reps, warmup=0)
        out = {}
        for key, b in clocked.items():
            seconds = b.op_seconds()
            steps = seconds.pop("steps")
            ops = {name: s / steps for name, s in seconds.items()}
            step = statistics.fmean(samples[key])
            out[key] = {**ops, "unclocked": step - sum(ops.values()), "step": step}
        return out
    finally:
        for b in clocked.values():
            b.clock_ops(False)


def op_line(ops: dict[str, float], base: dict[str, float] | None = None, base_name: str = "") -> str:
    """``op_rounds``' split of one backend's step as a line (ms); with ``base`` (another mode's, measured in the
    same rounds), each part against it and the t(1) ratio the mode would reach were its layers' matmuls exactly
    half the base's, the rest as measured."""
    ms = {name: 1e3 * s for name, s in ops.items()}
    matmuls = sum(ms[name] for name in LAYER_MATMULS)
    rest = ms["step"] - matmuls
    line = (f"t(1) by operation (clocks inside the step, means of interleaved rounds): the layers' matmuls "
            f"{matmuls:.1f} ms (" + ", ".join(f"{name} {ms[name]:.2f}" for name in LAYER_MATMULS) + f"), LM head "
            f"{ms['head']:.2f}, attention {ms['attention']:.2f}, norms {ms['norms']:.2f}, RoPE and cache writes "
            f"{ms['rope']:.2f}, embedding {ms['embedding']:.2f}, between the layers {ms['layer_loop']:.2f}, outside "
            f"the kernel's clocks (Python, the call) {ms['unclocked']:.2f}; step {ms['step']:.1f} ms")
    if base is not None:
        base_matmuls = 1e3 * sum(base[name] for name in LAYER_MATMULS)
        base_step = 1e3 * base["step"]
        line += (f"\n  against {base_name}: the layers' matmuls {matmuls / base_matmuls:.3f}x, the rest "
                 f"{rest / (base_step - base_matmuls):.3f}x, the step {ms['step'] / base_step:.3f}x; with the "
                 f"layers' matmuls at exactly 0.5x of {base_name}'s and the rest as measured, the step would be "
                 f"{(0.5 * base_matmuls + rest) / base_step:.3f}x")
    return line
