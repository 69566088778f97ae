"""Whole decoding steps of our kernel build against builds of edited copies of its sources:
``python -m harness.runtime.kernels.bench_step --against DIR...``.

``kernels.bench`` times a forward's matmuls alone; a change to what a step does around them (``layer.cpp``,
``attention.cpp``, the fused operations, or work that overlaps one call with the next, such as the prefetch of
the next projection) shows only in whole steps. This loads the model once per build (ours, then each DIR's),
checks each build's logits against ours bit for bit, and times a greedy k-token step (``Backend.greedy_forward``,
what a greedy decoder runs) after ``--cache-len`` entries for every build and k in interleaved rounds with a
bandwidth probe, as perf's memory bound does: per k, each build's
median, and each copy's time over ours within a round (median and quartiles), so a drift of the machine's memory
speed falls on both sides of every ratio. An unedited copy among the DIRs shows the noise between identical
builds (``echo "// copy" >> DIR/small_gemm.cpp`` gives it a build of its own).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from decoders.latency import step_inputs
from harness.cli_args import positive_int
from harness.runtime.kernels import available_variants, cpu_identity, cpu_line
from harness.runtime.loading import load_backend
from harness.runtime.matmul import bandwidth_probe, paired_ratio, round_robin_samples


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", type=Path, nargs="+", required=True, metavar="DIR",
                    help="edited copies of harness/runtime/kernels/*.cpp, each built and timed beside ours")
    ap.add_argument("--variant", choices=available_variants(), default=None, help="kernel variant (default: best)")
    ap.add_argument("--dtype", choices=["float32", "bf16w"], default="float32")
    ap.add_argument("--tokens", type=positive_int, nargs="+", default=[1, 6], help="tokens a step feeds (k)")
    ap.add_argument("--cache-len", type=positive_int, default=300)
    ap.add_argument("--reps", type=positive_int, default=201, help="interleaved rounds")
    ap.add_argument("--model", default="smollm2")
    args = ap.parse_args(argv)

    builds = {"ours": None, **{d.name: d for d in args.against}}
    if len(builds) != len(args.against) + 1:
        ap.error("--against directories need distinct names (and none called 'ours')")
    matmul = args.variant or "auto"
    backends = {name: load_backend(args.model, dtype=args.dtype, matmul=matmul, kernel_sources=src)
                for name, src in builds.items()}
    if backends["ours"].matmul_path.startswith("library"):
        ap.error(f"our kernel did not load here ({backends['ours'].matmul_path}); nothing to compare")
    inputs = {name: step_inputs(b, args.tokens, args.cache_len, torch.Generator().manual_seed(0))
              for name, b in backends.items()}
    same = {}  # (build, k) -> whether its logits are bitwise ours
    for k in args.tokens:
        logits = {}
        for name, b in backends.items():
            logits[name] = b.forward(*inputs[name][k])
            b.commit([])
        same.update({(name, k): torch.equal(logits[name], logits["ours"]) for name in builds})

    probe, nbytes = bandwidth_probe()
    fns = {"probe": probe}
    for name, b in backends.items():
        for k in args.tokens:
            def step(b=b, ins=inputs[name][k]) -> None:
                b.greedy_forward(*ins)
                b.commit([])
            fns[name, k] = step
    samples = round_robin_samples(fns, args.reps, warmup=2)
    gbs = sorted(nbytes / t / 1e9 for t in samples.pop("probe"))

    print(f"cpu: {cpu_line(cpu_identity())}")
    print(f"{backends['ours'].matmul_path}; {args.model} {args.dtype}, cache {args.cache_len}, {args.reps} "
          f"interleaved rounds, read bandwidth median {statistics.median(gbs):.1f} GB/s ({gbs[0]:.1f}-{gbs[-1]:.1f})")
    print()
    print("| k | build | ms (median) | over ours within a round: median (quartiles) | logits bitwise ours |")
    print("|---:|---|---:|---|---|")
    for k in args.tokens:
        ours = samples["ours", k]
        for name in builds:
            ts = samples[name, k]
            ratio = "" if name == "ours" else "{:.3f} ({:.3f}-{:.3f})".format(*paired_ratio(ts, ours))
            print(f"| {k} | {name} | {1e3 * statistics.median(ts):.2f} | {ratio} | {'yes' if same[name, k] else 'NO'} |")
    print()
    print("the DIRs: " + ", ".join(f"{name} = {src}" for name, src in builds.items() if src is not None))


if __name__ == "__main__":
    main()
