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


def _flag_ratio(line: str, ratio: float, tolerance: float, flag: str) -> str:
    """``line``, and ``: flag`` with the ratio where two t(1)s differ by more than ``tolerance`` either way."""
    if max(ratio, 1 / ratio) <= tolerance:
        return line
    return f"{line}: {flag.format(ratio=ratio)}"


def regime_line(tuner: dict[int, float], rounds: dict[int, float], tolerance: float = 1.25) -> str:
    """The tuner's t(1) against the rounds': on these VMs memory speed swings 1.5x within minutes, and a shape
    priced at slow memory (long steps nearly free) can run at fast memory (twenty-eighth run: 3.19x predicted)."""
    line = f"the tuner priced steps at t(1) {tuner[1] * 1e3:.1f} ms, the rounds ran at {rounds[1] * 1e3:.1f} ms"
    return _flag_ratio(line, tuner[1] / rounds[1], tolerance,
                       "memory changed speed between them ({ratio:.2f}x), so its pick was priced for another regime")


def ar_steps_line(ar_step: float, rounds: dict[int, float], tolerance: float = 1.10) -> str:
    """``ar``'s own forwards in the rounds (``ar_step``: seconds, its median prompt's mean) against the t(1) of the
    curves measured after them. Why: the roofline prices every step at those curves, and the memory speed of
    the rounds themselves can differ (a slow spell in the rounds, fast curves after them: in the thirty-seventh
    run's HumanEval `ar` took 16.1 ms a token, prefill included, against t(1) 12.1 ms, and every method read
    1.16-1.20 of its roofline, pld and jacobi too: `ar`, all 1-token steps, pays slow memory most)."""
    return _flag_ratio(f"ar's own forwards took {ar_step * 1e3:.1f} ms (t(1) {rounds[1] * 1e3:.1f} ms in the curves "
                       "after the rounds)", ar_step / rounds[1], tolerance,
                       "the rounds ran at another memory speed than those curves ({ratio:.2f}x), so the roofline "
                       "misprices them (of_roofline over 1 where ar ran slower, under 1 where it ran faster)")
