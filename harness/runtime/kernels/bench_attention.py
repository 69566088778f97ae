"""Our attention and one-call layers against torch's, interleaved in one run:
``python -m harness.runtime.kernels.bench_attention``.

Two tables, medians of ``--reps`` after a warm-up, every path timed round-robin so that a slow spell of a
shared machine hits all of them alike:

- one attention call with SmolLM2-135M's shapes (9 query heads, 3 kv heads, head size 64): our kernel's
  ``attend`` (keys cached in blocks) against ``F.scaled_dot_product_attention`` with the additive mask
  the backend gives it, at several cache lengths and query rows;
- a whole SmolLM2 forward of k tokens after ``--cache-len`` entries, per weight mode: ``attn=sdpa`` (our
  matmuls and fused operations, one call each, torch's attention) against ``attn=kernel`` (our attention,
  each layer one call), with the two paths' logits compared.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from harness.cli_args import positive_int
from harness.runtime.kernels import load_small_gemm
from harness.runtime.layer_ops import block_keys
from harness.runtime.matmul import round_robin

H, HKV, D = 9, 3, 64  # SmolLM2-135M's attention


def attention_table(lengths: list[int], rows: list[int], reps: int) -> list[str]:
    kernel = load_small_gemm()
    g = torch.Generator().manual_seed(0)
    cap = max(lengths) + max(rows)
    kc, vc = torch.randn(HKV, cap, D, generator=g), torch.randn(HKV, cap, D, generator=g)
    kt = block_keys(kc)
    lines = ["| cache | rows | kernel us | sdpa us | sdpa / kernel |", "|---:|---:|---:|---:|---:|"]
    for L in lengths:
        for k in rows:
            q = torch.randn(1, H, k, D, generator=g)
            additive = torch.zeros(1, 1, k, L + k)
            additive[..., L:] = torch.full((k, k), float("-inf")).triu(1)
            keys, values = kc[None, :, : L + k], vc[None, :, : L + k]
            mask = None if k == 1 else additive
            t = round_robin({
                "kernel": lambda q=q, L=L: kernel.attend(q, kt, vc, L, None, D**-0.5),
                "sdpa": lambda q=q, keys=keys, values=values, mask=mask: F.scaled_dot_product_attention(
                    q, keys, values, attn_mask=mask, scale=D**-0.5, enable_gqa=True),
            }, reps)
            lines.append(f"| {L} | {k} | {1e6 * t['kernel']:.1f} | {1e6 * t['sdpa']:.1f} | "
                         f"{t['sdpa'] / t['kernel']:.2f}x |")
    return lines


def forward_table(model: str, dtypes: list[str], rows: list[int], cache_len: int, reps: int) -> list[str]:
    from harness.runtime.loading import load_backend

    lines = ["| weights | rows | attn=sdpa ms | attn=kernel ms | kernel / sdpa | max logit diff |",
             "|---|---:|---:|---:|---:|---:|"]
    g = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        backends = {attn: load_backend(model, dtype=dtype, attn=attn) for attn in ("sdpa", "kernel")}
        prefix = torch.randint(0, backends["sdpa"].shape.vocab, (cache_len,), generator=g)
        for be in backends.values():
            be.reset(cache_len + max(rows))
            be.forward(prefix, torch.arange(cache_len), logit_rows=prefix.new_empty(0))
            be.commit()
        for k in rows:
            ids = torch.randint(0, backends["sdpa"].shape.vocab, (k,), generator=g)
            pos = torch.arange(cache_len, cache_len + k)
            causal = torch.ones(k, k, dtype=torch.bool).tril()
            out: dict[str, torch.Tensor] = {}

            def step(be, attn: str) -> None:
                out[attn] = be.forward(ids, pos, causal)
                be.commit([])

            t = round_robin({attn: (lambda be=be, attn=attn: step(be, attn)) for attn, be in backends.items()}, reps)
            diff = (out["sdpa"] - out["kernel"]).abs().max().item()
            lines.append(f"| {dtype} | {k} | {1e3 * t['sdpa']:.1f} | {1e3 * t['kernel']:.1f} | {t['kernel'] / t['sdpa']:.2f}x | "
                         f"{diff:.1e} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bf16w"])
    ap.add_argument("--lengths", type=positive_int, nargs="+", default=[300, 1000],
                    help="cache entries (attention table)")
    ap.add_argument("--rows", type=positive_int, nargs="+", default=[1, 6, 12, 24])
    ap.add_argument("--cache-len", type=positive_int, default=300, help="cache entries before the timed forwards")
    ap.add_argument("--reps", type=positive_int, default=30)
    args = ap.parse_args(argv)
    with torch.inference_mode():
        attention = attention_table(args.lengths, args.rows, args.reps * 5)
        forward = forward_table(args.model, args.dtypes, args.rows, args.cache_len, args.reps)
    print(f"threads {torch.get_num_threads()}; one attention call, SmolLM2 shapes (medians, interleaved):\n")
    print("\n".join(attention))
    print(f"\none {args.model} forward of k rows after {args.cache_len} cache entries (medians, interleaved):\n")
    print("\n".join(forward))


if __name__ == "__main__":
    main()
