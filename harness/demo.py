"""The main job on the embedded default: all four decoders on a few built-in prompts.

Prints one table per run: tokens, steps, S = tokens / steps (prefill not counted), tokens/s, speedup
over `ar` and whether each decoder reproduced `ar`'s tokens exactly. Every decoder gets one untimed
warm-up generation first; the timed figures are medians over ``--repeats`` runs in this one process.

    python -m harness.demo [--model smollm2] [--dtype float32] [--max-new-tokens 96] [--repeats 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

from decoders import build_decoder

BUILTIN_PROMPTS = {
    "chat": "Give me three tips for staying focused while studying, with one sentence each.",
    "code": "Rewrite this function with type hints and a docstring:\n\n"
    "def moving_average(values, window):\n"
    "    result = []\n"
    "    for i in range(len(values) - window + 1):\n"
    "        chunk = values[i:i + window]\n"
    "        result.append(sum(chunk) / window)\n"
    "    return result\n",
    "summarization": "Summarize in two sentences: The city council voted on Tuesday to extend the riverside "
    "bike path by four miles, connecting two parks and the central train station. Construction will begin "
    "next spring and take eighteen months. Council members said the path would cut traffic and give "
    "commuters a safer route to work, while some residents worried about the loss of trees.",
}
CONFIGS: list[tuple[str, dict]] = [
    ("ar", {}),
    ("jacobi", {"window": 5}),
    ("pld", {"max_ngram": 3, "num_pred": 10}),
    ("lookahead", {"W": 5, "N": 4, "G": 5, "pool_from_prompt": True}),
    # the shape the auto-tuner picks most on a 2-core CPU: a small window, long prompt/output n-grams
    ("lookahead", {"W": 1, "N": 3, "G": 1, "text_ngram": 7, "pool_from_prompt": True, "pool_from_output": True,
                   "pool_context": True}),
]


def main(argv: list[str] | None = None) -> None:
    from harness import load_backend
    from tasks import Prompt, encode_prompt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    backend = load_backend(args.model, dtype=args.dtype, device=args.device)
    print(f"model {args.model} ({args.dtype}, {args.device}) loaded in {time.perf_counter() - t0:.1f}s")
    prompts = {
        k: encode_prompt(Prompt(messages=[{"role": "user", "content": v}]), backend.tokenizer)
        for k, v in BUILTIN_PROMPTS.items()
    }
    labels = [name + ("" if not params else "(" + ",".join(f"{k}={v}" for k, v in params.items()) + ")")
              for name, params in CONFIGS]
    width = max(len(x) for x in labels) + 2
    header = f"{'prompt':<14}{'decoder':<{width}}{'tokens':>7}{'steps':>7}{'S':>7}{'tok/s':>8}{'speedup':>9}  exact"
    print(f"\n{args.device.upper()} timings, {args.dtype}, max_new_tokens={args.max_new_tokens}; "
          f"S = new tokens / decoding steps (prefill not counted)\n" + header + "\n" + "-" * len(header))
    for kind, ids in prompts.items():
        ref_tokens, ref_time = None, None
        for (name, params), label in zip(CONFIGS, labels):
            dec = build_decoder(name, **params)
            dec.generate(backend, ids, min(16, args.max_new_tokens))  # warm-up, untimed
            runs = [dec.generate(backend, ids, args.max_new_tokens) for _ in range(args.repeats)]
            res = runs[0]
            secs = statistics.median(r.decode_s for r in runs)
            if name == "ar":
                ref_tokens, ref_time = res.tokens, secs
            print(
                f"{kind:<14}{label:<{width}}{len(res.tokens):>7}{res.steps:>7}{res.compression:>7.2f}"
                f"{len(res.tokens) / secs:>8.1f}{ref_time / secs:>8.2f}x  {'yes' if res.tokens == ref_tokens else 'NO'}"
            )


if __name__ == "__main__":
    main()
