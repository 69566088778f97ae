"""The latency-curve lines ``harness.perf`` prints: pure functions of measured curves ({tokens fed: seconds}),
kept apart from the runner so they are tested without a model."""

from __future__ import annotations


def curve_line(curve: dict[int, float], ks: tuple[int, ...] | None = None) -> str:
    """``t(1)=13ms  t(2)=14ms ...``, every size or only ``ks``."""
    return "  ".join(f"t({k})={v * 1e3:.0f}ms" for k, v in curve.items() if ks is None or k in ks)


def snapshots_line(snapshots: list[dict[int, float]]) -> str:
    """``3 curves (t(1) 11.0-17.2 ms)``: the tuner's snapshots, spread over its calibration (see
    ``decoders.latency.SNAPSHOT_REPS``)."""
    t1 = [c[1] * 1e3 for c in snapshots]
    if not t1:
        return "the caller's curve"
    return f"{len(t1)} curves (t(1) {min(t1):.1f}-{max(t1):.1f} ms)"


def regime_line(tuner: dict[int, float], rounds: dict[int, float], tolerance: float = 1.25) -> str:
    """The tuner's t(1) against the rounds': on these VMs memory speed swings 1.5x within minutes, and a shape
    priced at slow memory (long steps nearly free) can run at fast memory (twenty-eighth run: 3.19x predicted)."""
    ratio = tuner[1] / rounds[1]
    line = f"the tuner priced steps at t(1) {tuner[1] * 1e3:.1f} ms, the rounds ran at {rounds[1] * 1e3:.1f} ms"
    if max(ratio, 1 / ratio) <= tolerance:
        return line
    return f"{line}: memory changed speed between them ({ratio:.2f}x), so its pick was priced for another regime"
