"""Time one SmolLM2-135M forward's matmuls per path: ``python -m harness.runtime.kernels.bench``.

The 30 layers' fused projections (q/k/v 576->960, o 576->576, gate/up 576->3072, down 1536->576) and
the LM head 576->49152, each layer with its own random weights (so nothing stays in cache between
layers: ~538 MB in float32, as in the model), at several row counts, for plain ``F.linear`` and for
each kernel variant this CPU can execute with float32 and with bfloat16 packed weights. Prints the
median of ``--reps`` timed forwards after a warm-up, as a markdown table in milliseconds, with a read
bandwidth probe (a sum over a large float32 tensor, timed in the same interleaved reps with the same
statistic) and the weight bytes / bandwidth floor.

The reps are interleaved: each rep times every column at every row count once, so a slow spell of a
shared machine (memory bandwidth here swings by 2x within minutes) falls on all columns alike and
their ratios stay comparable. ``--against DIR...`` adds a column per variant and weight type built from
an edited copy of the kernel sources in each DIR (``cp harness/runtime/kernels/*.cpp DIR``, edit, run): an
A/B of a kernel change in one command, instead of a throwaway script. ``--bins 36 46`` prints one table per
bandwidth range instead (each round placed by the probe timed in it): on a VM whose bandwidth swings between
~30 and ~55 GB/s within minutes, a change that matters only when memory is fast shows there, and a few
thousand short rounds (``--reps 2000 --rows 1``) fill every range. Each column's packed weights sit in a
huge-page arena of their own, as the model's do (see :func:`in_arena`).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from harness.cli_args import positive_int
from harness.runtime.arena import ALIGN, WeightArena, huge_pages_offered
from harness.runtime.kernels import available_variants, cpu_identity, cpu_line, load_small_gemm
from harness.runtime.matmul import bandwidth_probe, round_robin_samples

HIDDEN, INTER, KV, LAYERS, VOCAB = 576, 1536, 192, 30, 49152
LAYER_SHAPES = [(HIDDEN + 2 * KV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]  # [out, in]
ROWS = [1, 2, 3, 4, 6, 8, 12, 16, 32, 64]


def weights(layers: int) -> list[torch.Tensor]:
    """Every matmul of one forward, [out, in] float32, scaled like trained weights (values ~0.04)."""
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(n, k, generator=g) * k ** -0.5 for _ in range(layers) for n, k in LAYER_SHAPES]
    ws.append(torch.randn(VOCAB, HIDDEN, generator=g) * HIDDEN ** -0.5)
    return ws


def in_arena(packed: list[torch.Tensor]) -> list[torch.Tensor]:
    """One column's packed weights moved into a huge-page arena of their own, as the backend holds a model's
    (harness.runtime.arena), where the OS offers huge pages. Why: left in torch's 4 KB pages, two builds of the
    same code (one with a comment added) differed by 8-10% at 6 rows for a whole run (Zen 4, 2026-12-06), more
    than most kernel changes an A/B looks for."""
    if not huge_pages_offered():
        return packed
    arena = WeightArena(sum(p.numel() * p.element_size() + ALIGN for p in packed))
    return [arena.take(p) for p in packed]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=positive_int, nargs="+", default=ROWS)
    ap.add_argument("--reps", type=positive_int, default=7)
    ap.add_argument("--layers", type=positive_int, default=LAYERS)
    ap.add_argument("--variants", nargs="+", default=None, help="kernel variants (default: all this CPU runs)")
    ap.add_argument("--no-torch", action="store_true", help="skip F.linear")
    ap.add_argument("--stat", choices=["median", "min"], default="median",
                    help="median (default) or min of the reps (min: the least disturbed by other processes)")
    ap.add_argument("--against", type=Path, nargs="+", default=[], metavar="DIR",
                    help="also time the variants built from the kernel sources in each DIR (an edited copy), "
                         "interleaved; an unedited copy beside them shows the noise between identical builds")
    ap.add_argument("--dtypes", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                    help="packed weight types to time")
    ap.add_argument("--bins", type=float, nargs="+", default=[], metavar="GBPS",
                    help="bandwidth edges (GB/s): one table per range, of the rounds whose probe fell in it")
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    ws = weights(args.layers)
    fp32_bytes = sum(w.numel() for w in ws) * 4
    probe, probe_bytes = bandwidth_probe()
    inputs = {r: {k: torch.randn(r, k) for k in (HIDDEN, INTER)} for r in args.rows}

    # (column, rows) -> one forward's matmuls; ("probe", 0) -> the bandwidth probe, timed among them: on a VM
    # whose bandwidth swings 2x within minutes, a probe taken once put 1-row matmuls at 0.65x its floor
    fns: dict[tuple[str, int], Callable[[], object]] = {("probe", 0): probe}
    builds = [("", None)] + [(f" {d.name}", d) for d in args.against]
    with torch.inference_mode():
        if not args.no_torch:
            for r in args.rows:
                fns["F.linear", r] = lambda r=r: [F.linear(inputs[r][w.shape[1]], w) for w in ws]
        for variant in args.variants or available_variants():
            for suffix, source_dir in builds:
                mod = load_small_gemm(variant, source_dir=source_dir)
                if mod is None:
                    continue
                for dtype in args.dtypes:
                    packs = in_arena([mod.pack(w, dtype == "bf16") for w in ws])
                    packed = [(p, w.shape[0], w.shape[1]) for p, w in zip(packs, ws)]
                    for r in args.rows:
                        fns[f"{variant} {dtype}{suffix}", r] = (
                            lambda r=r, mod=mod, packed=packed: [mod.linear(inputs[r][k], p, n) for p, n, k in packed])
        samples = round_robin_samples(fns, args.reps, warmup=2)
    pick = min if args.stat == "min" else statistics.median
    probe_s = samples.pop(("probe", 0))  # round i's probe: its bandwidth places the round in a range
    print(f"cpu: {cpu_line(cpu_identity())}")
    pages = "a huge-page arena per column" if huge_pages_offered() else "torch's pages (no huge pages offered)"
    print(f"packed weights: {pages}")
    edges = [0.0, *sorted(args.bins), float("inf")]
    for lo, hi in zip(edges, edges[1:]):
        rounds = [i for i, t in enumerate(probe_s) if lo <= probe_bytes / t / 1e9 < hi]
        if not rounds:
            continue
        if args.bins:
            print(f"\n### probe {lo:g}-{hi:g} GB/s: {len(rounds)} of {len(probe_s)} rounds\n")
        columns: dict[str, dict[int, float]] = {}
        for (name, r), ts in samples.items():
            columns.setdefault(name, {})[r] = 1e3 * pick(ts[i] for i in rounds)
        print_table(args, columns, probe_bytes / pick(probe_s[i] for i in rounds) / 1e9, fp32_bytes, len(rounds))


def print_table(args: argparse.Namespace, columns: dict[str, dict[int, float]], gbs: float, fp32_bytes: int,
                rounds: int) -> None:
    """One markdown table of ``rounds`` rounds: milliseconds per column and row count, 1 row against its
    bandwidth floor."""
    print(f"threads {torch.get_num_threads()}, read bandwidth {gbs:.1f} GB/s (sum over 512 MB, {args.stat} of the "
          f"same {rounds} rounds), {args.layers} "
          f"layers + LM head: {fp32_bytes / 1e6:.0f} MB float32 -> floor {fp32_bytes / gbs / 1e6:.1f} ms, "
          f"{fp32_bytes / 2e6:.0f} MB bfloat16 -> floor {fp32_bytes / 2 / gbs / 1e6:.1f} ms")
    print()
    names = list(columns)
    print("| rows | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for r in args.rows:
        print(f"| {r} | " + " | ".join(f"{columns[n][r]:.1f}" for n in names) + " |")
    if 1 in args.rows:  # 1 row against the bandwidth floor of the bytes it reads
        floors = {n: fp32_bytes / (2 if "bf16" in n else 1) / gbs / 1e6 for n in names}
        print("| 1 row / floor | " + " | ".join(f"{columns[n][1] / floors[n]:.2f}x" for n in names) + " |")
        print("| 1 row GB/s | " + " | ".join(f"{floors[n] * gbs / columns[n][1]:.1f}" for n in names) + " |")
    print()
    print(f"milliseconds per forward's matmuls ({args.stat} of {rounds} interleaved reps after warm-up); floor = "
          "weight bytes / read bandwidth (bf16 columns: half the bytes)"
          + "".join(f"; columns ending in {d.name}: built from the sources in {d}" for d in args.against))


if __name__ == "__main__":
    main()
