"""Wall-clock benchmark on the current machine: latency curve, peers, roofline and overhead.

    python -m harness.perf [--dtype float32 bf16w] [--matmul auto|library|avx512|avx2|baseline]
                           [--tasks humaneval mt_bench gsm8k xsum]   (a bare --tasks: steps 0-1 only)
                           [--prompts 5] [--max-new-tokens 256] [--rounds 1] [--out results/perf]
                           [--calibration-prompts 4] [--lookahead W,N,G[,text_ngram[,step_tokens[,prompt_lookup]]] ...]
                           [--pld MAX_NGRAM,NUM_PRED[,recent] ...]
                           [--no-hf]

0. The memory bound: the matmul weight bytes one step reads against this machine's read bandwidth (a sum
   over a 512 MB buffer), and t(1) against bytes / bandwidth, split into the forward's matmuls alone (its
   1-row projections called back to back) and the rest (norms, RoPE, attention, the Python and thread
   hand-offs between them), all medians of the same interleaved rounds (``harness.memory_bound``); then t(1)
   split by operation, clocks inside the step (``op_rounds``). Results go to ``<out>/<kernel variant or
   library>``, so figures of different matmul paths (AVX-512, forced AVX2, libraries) sit side by side.
1. t(k): median latency of one forward with k new tokens on a cache of ``--cache-len`` entries, for
   every ``--dtype`` at once, interleaved (all are loaded together), so t(1) of bf16w against float32
   is a ratio of one time window (one after the other, drift moved it 0.58-0.77x on one EPYC).
2. On real task prompts, interleaved per prompt (so machine drift hits every method alike), with one untimed
   warm-up each: our `ar`, transformers' ``generate`` (greedy, and with ``prompt_lookup_num_tokens``; for
   bf16w also greedy on a bfloat16 copy of the model, transformers' own way to run bf16 weights, whose text
   is its own: compare its tok/s), our `pld` (and any ``--pld`` settings), `jacobi` and `lookahead`: the
   auto-tuned setting (with prompt and output pools; and again drafting, where the text has no draft, from
   the held-out prompts' greedy answers, ``pool_from_corpus``), the same shape fed only by its own window's
   n-grams, and any ``--lookahead`` settings. ``--rounds`` repeats the interleaved pass (each starting at
   the next method) and takes each method x prompt timing as the median over the rounds: a shared machine's
   drift of 5-10% over seconds otherwise decides closer comparisons. The ``--prompts`` measured prompts are
   spread evenly over the task (all of MT-Bench's categories, not its first one). The tuner calibrates on
   held-out prompts (the ``--calibration-prompts`` examples after measured ones), so its prediction is
   tested on unseen text; their greedy answers are the ``+corpus`` row's corpus (4 by default: on every
   other HumanEval problem a corpus of 2 answers raised S 5%, of 4 answers 8%).
3. One table per task and dtype: tokens/s, speedup over our `ar` (total generation time, prefill
   included, medians of per-prompt ratios and aggregate), S, mean tokens fed per step, the roofline
   bound ((tokens x t(1) + prefill) / (sum over steps of t(k_step) + prefill): the speedup if every step
   cost only its forward as measured in isolation, with the method's measured prefill on both sides, as
   the speedup has it; t(k) re-measured after each round, median over the rounds, so the steps are
   priced at the memory bandwidth of the rounds they were timed in, on a cache of the measured prompts'
   median length plus half the generation), the achieved fraction of it, prefill's share of the method's
   total time, the share of decode time spent outside the model forward (decoder overhead), and whether the output
   equals our `ar`'s. Under it, the auto-tuned lookahead's steps grouped by tokens fed
   (``harness.analysis.steps``): which kind of step pays.

Timings are of this machine only; the header says which (CPU figures are labelled CPU)."""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from decoders.autotune import autotune, predicted_speedup
from decoders.latency import calibration_cache_len, interp_latency, latency_curves, median_curve
from decoders.lookahead import SHAPE, shape_label
from harness.analysis.compare import REFERENCE, against_reference
from harness.analysis.curves import ar_steps_line, curve_line, regime_line, snapshots_line
from harness.analysis.io import to_markdown
from harness.analysis.perf_names import GENERATE, auto_name, pld_name
from harness.analysis.steps import steps_by_size
from harness.cli_args import add_matmul_option, parse_pld, parse_shape, positive_int
from harness.memory_bound import memory_floor_line, memory_rounds, op_line, op_rounds
from harness.perf_methods import Method, hf_bfloat16, ours, transformers_generate
from harness.records import compression
from harness.runtime.kernels import cpu_identity, cpu_line
from harness.runtime.layer_ops import ATTN_CHOICES
from harness.runtime.loading import DTYPES
from harness.runtime.matmul import rotated
from tasks.data import SHARED_DATA_DIR


def task_prompts(task_name: str, n: int, held_out: int, data_dir: str | None, tokenizer,
                 max_prompt: int = 1536) -> tuple[list[list[int]], list[list[int]]]:
    """``n`` measured prompts spread evenly over the task's N examples (example i * N // n), and ``held_out``
    calibration prompts, each the example after a measured one; a prompt over ``max_prompt`` tokens, or one
    already taken, gives way to the next example. Why spread: MT-Bench lists its 80 questions ten per
    category, and the first six, measured and held out until 2026-12-04, were all 'writing'."""
    from tasks import build_task, encode_prompt

    task = build_task(task_name, data_dir=data_dir, limit=None)
    examples, taken = task.examples(), set()

    def take(start: int) -> list[int] | None:
        for i in (i for i in range(start, len(examples)) if i not in taken):
            taken.add(i)
            if len(ids := encode_prompt(task.prompt(examples[i], 0, []), tokenizer)) <= max_prompt:
                return ids
        return None

    starts = [i * len(examples) // n for i in range(n)]
    measured = [take(at) for at in starts]
    held = [take(starts[i % n] + 1 + i // n) for i in range(held_out)]
    return [p for p in measured if p is not None], [p for p in held if p is not None]


def free_stem(out_dir: Path, stem: str) -> str:
    """``stem``, or ``stem-2``, ``stem-3``, ... where an earlier run's results already hold the name: a second
    run into the same folder (a repeat at another moment of the machine's drift) must not overwrite the first."""
    n, name = 1, stem
    while (out_dir / f"{name}.json").exists() or (out_dir / f"{name}.md").exists():
        n += 1
        name = f"{stem}-{n}"
    return name


TIMINGS = ("total_s", "prefill_s", "decode_s", "forward_s")
BASE_PLD = (3, 10, False)  # (max_ngram, num_pred, recent): pld's and transformers' defaults, always run


def median_rounds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (method, prompt): the median of each timing over the rounds; the rest (tokens, steps,
    output) is the same every round for greedy decoding, and the first round's is kept."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["method"], row["prompt"]), []).append(row)
    out = []
    for runs in groups.values():
        merged = {k: v for k, v in runs[0].items() if k != "round"}
        for col in TIMINGS:
            if col in merged:
                merged[col] = statistics.median(run[col] for run in runs)
        merged["rounds"] = len(runs)
        out.append(merged)
    return out


def summarize(rows: list[dict[str, Any]], curve: dict[int, float]) -> list[dict[str, Any]]:
    """Per method: aggregate and per-prompt figures against our `ar` on the same prompts."""
    paired = against_reference(pd.DataFrame(rows), ["prompt"], time_col="total_s", by="method")
    table = []
    for name, rs in paired.groupby("method", sort=False):
        toks = rs["new_tokens"].sum()
        row: dict[str, Any] = {
            "method": name, "prompts": len(rs), "tokens": int(toks), "tok_per_s": toks / rs["total_s"].sum(),
            "speedup": rs["ref_total_s"].sum() / rs["total_s"].sum(),
            "speedup_median": statistics.median(rs["speedup"]), "exact": rs["exact"].mean(),
        }
        if "steps" in rs and rs["steps"].notna().all():
            fed = [k for ks in rs["input_tokens"] for k in ks]
            # prefill on both sides: without it the roofline read 5-8% over lookahead's measured speedup on HumanEval
            # (Zen 4, AVX2, 2026-12-06), where prefill was ~11% of lookahead's total time
            prefill = rs["prefill_s"].sum()
            row.update({
                "S": compression(toks, rs["steps"].sum()), "k_mean": sum(fed) / len(fed),
                "roofline": predicted_speedup(toks, fed, curve, prefill_s=prefill),
                "prefill_s": prefill, "prefill": prefill / rs["total_s"].sum(),
                "overhead": 1 - rs["forward_s"].sum() / rs["decode_s"].sum(),
            })
            row["of_roofline"] = row["speedup"] / row["roofline"]
        table.append(row)
    return table


def format_table(table: list[dict[str, Any]]) -> str:
    """Markdown, ratios rounded to 2 decimals (the report's renderer)."""
    cols = ["method", "prompts", "tok_per_s", "speedup", "speedup_median", "S", "k_mean", "roofline",
            "of_roofline", "prefill", "overhead", "exact"]
    return to_markdown(pd.DataFrame(table).reindex(columns=cols), floatfmt=".2f")


def matmul_key(path: str) -> str:
    """Folder name for a matmul path: the kernel variant (``avx2``) or ``library``."""
    return path.split()[1] if path.startswith("kernel ") else "library"


def main(argv: list[str] | None = None) -> None:
    from decoders import build_decoder
    from harness import load_backend

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", nargs="+", default=["float32", "bf16w"], choices=sorted(DTYPES),
                    help="weight modes, all loaded at once (their latency curves are measured interleaved)")
    add_matmul_option(ap)
    ap.add_argument("--attn", default="auto", choices=ATTN_CHOICES,
                    help="attention: auto (our kernel's where it runs), kernel, sdpa or eager")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tasks", nargs="*", default=["humaneval", "mt_bench", "gsm8k", "xsum"],
                    help="tasks to decode; none (a bare --tasks): only the memory bound and latency curve per dtype")
    ap.add_argument("--prompts", type=positive_int, default=4, help="measured prompts, spread evenly over the task")
    ap.add_argument("--max-new-tokens", type=positive_int, default=256)
    ap.add_argument("--rounds", type=positive_int, default=1,
                    help="interleaved passes over the prompts; each method x prompt timing is the median over them")
    ap.add_argument("--cache-len", type=int, default=300,
                    help="cache entries behind the memory bound's and step 1's t(k) (a task's roofline: its prompts')")
    ap.add_argument("--data-dir", default=str(SHARED_DATA_DIR))
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' generate (faster)")
    ap.add_argument("--calibration-prompts", type=positive_int, default=4,
                    help="held-out prompts the auto-tuner calibrates on (each the example after a measured one); their "
                         "greedy answers are the corpus of the +corpus row")
    ap.add_argument("--lookahead", nargs="*", default=[], metavar="W,N,G[,T[,CAP[,PL]]]", type=parse_shape,
                    help="fixed lookahead settings to run beside the auto-tuned one (prompt+output pool, context)")
    ap.add_argument("--pld", nargs="*", default=[], metavar="MAX_NGRAM,NUM_PRED[,recent]", type=parse_pld,
                    help="more pld settings to run beside pld(3,10) (e.g. 6,10: the suffix length lookahead's chain "
                         "matches; 6,10,recent: with the recency rule lookahead's chain uses)")
    ap.add_argument("--out", default="results/perf", help="results go to <out>/<kernel variant or library>/perf-<dtypes>-<tasks>.{json,md} "
                         "(-2, -3, ... added where an earlier run holds the name: never overwritten)")
    args = ap.parse_args(argv)
    # rows are grouped by method name, so a repeated setting would merge two methods' timings
    shapes = [tuple(sorted(x.items())) for x in args.lookahead]
    plds = [BASE_PLD, *args.pld]
    if len(set(plds)) < len(plds) or len(set(shapes)) < len(shapes):
        ap.error("a --pld or --lookahead setting is given twice (pld %d,%d always runs); drop the repeat" % BASE_PLD[:2])
    if len(set(args.dtype)) < len(args.dtype):
        ap.error("a --dtype is given twice; drop the repeat")

    cpu = cpu_identity()
    report: dict[str, Any] = {"machine": platform.platform(), "cpu": cpu, "device": args.device, "args": vars(args),
                              "runs": {}}
    text = [f"cpu: {cpu_line(cpu)}"]
    print(text[0], flush=True)
    out_dir = None
    # every dtype loaded at once, so their latency curves are measured interleaved (see latency_curves)
    backends = {dtype: load_backend(args.model, dtype=dtype, device=args.device, matmul=args.matmul, attn=args.attn)
                for dtype in args.dtype}
    if gpu := next(iter(backends.values())).gpu_name:  # the figures are the GPU's
        import torch

        report["gpu"] = f"{gpu}, torch {torch.__version__}"
        text.append(f"gpu: {report['gpu']}")
        print(text[-1], flush=True)
    curves = dict(zip(backends, latency_curves(list(backends.values()), cache_len=args.cache_len)))
    # after the curves: one_step refills each backend's cache
    mem = memory_rounds(backends, args.cache_len)
    bandwidth, t1, matmuls = mem.bandwidth, mem.t1, mem.matmuls
    ops = op_rounds(backends, args.cache_len)  # where a 1-token step's time goes, in rounds of their own
    report["read_bandwidth_Bps"] = bandwidth
    for dtype, backend in backends.items():
        out_dir = out_dir or Path(args.out) / matmul_key(backend.matmul_path)
        curve = curves[dtype]
        line = curve_line(curve)
        head = (f"== {args.device.upper()} {dtype}, matmuls: {backend.matmul_path}, attention: "
                f"{backend.attention_path}; {args.model}, cache "
                f"{args.cache_len}: {line}\n"
                f"{memory_floor_line(backend, t1[dtype], bandwidth, matmuls[dtype], mem.t1_whole_head.get(dtype))}")
        first = args.dtype[0]
        if dtype != first:
            ratio = mem.t1_ratio(dtype, first)
            head += (f"\nt(1) {dtype} / t(1) {first} = {t1[dtype] / t1[first]:.3f}x (medians of interleaved "
                     f"rounds); within a round {ratio[0]:.3f}x, quartiles {ratio[1]:.3f}-{ratio[2]:.3f} over "
                     f"{len(mem.t1_rounds[dtype])} rounds; matmuls alone {matmuls[dtype] / matmuls[first]:.3f}x")
        if dtype in ops:
            head += "\n" + op_line(ops[dtype], ops.get(first) if dtype != first else None, first)
        print(head, flush=True)
        text.append(head)
        report["runs"][f"{dtype}/memory"] = {"matmul_path": backend.matmul_path,
                                             "attention_path": backend.attention_path, "curve_s": curve,
                                             "t1_s": t1[dtype], "matmuls_s": matmuls[dtype],
                                             "t1_rounds_s": mem.t1_rounds[dtype],
                                             "step_weight_bytes": backend.step_weight_bytes(),
                                             **({"t1_ops_s": ops[dtype]} if dtype in ops else {}),
                                             **({"t1_whole_head_s": mem.t1_whole_head[dtype]}
                                                if dtype in mem.t1_whole_head else {})}
        hf16 = hf_bfloat16(backend) if dtype == "bf16w" and args.tasks and not args.no_hf else None
        for task in args.tasks:
            prompts, held_out = task_prompts(task, args.prompts, args.calibration_prompts, args.data_dir,
                                             backend.tokenizer)
            if not held_out:
                raise SystemExit(f"{task}: no prompts left after the {args.prompts} measured ones to calibrate "
                                 f"the auto-tuner on; lower --prompts")
            # the tuner measures its own curve at the calibration's cache length (see autotune)
            tuned = autotune(backend, held_out, max_new_tokens=args.max_new_tokens, pool_from_output=True,
                             pool_context=True, pool_from_corpus=True)
            shape = {k: tuned.params[k] for k in SHAPE}
            with_corpus = build_decoder("lookahead", **tuned.params)
            with_corpus.corpus = tuned.corpus  # the held-out prompts' answers
            window_only = {**shape, "prompt_lookup": None, "solo_root": False}  # a window that never waits
            methods = [Method(REFERENCE, ours(backend, build_decoder("ar")))]  # the row speedups pair with
            if not args.no_hf:
                methods += [
                    Method(GENERATE, transformers_generate(backend)),
                    Method("transformers prompt lookup (10)", transformers_generate(backend, prompt_lookup_num_tokens=10)),
                ]
                if hf16 is not None:  # the bf16w model holds bf16 values in float32; transformers' own bf16 way too
                    methods.append(Method("transformers greedy, bfloat16 model (own text, full length)",
                                          transformers_generate(backend, hf16, full_length=True)))
            methods += [
                *[Method(pld_name(m, n, r), ours(backend, build_decoder("pld", max_ngram=m, num_pred=n, recent=r)))
                  for m, n, r in plds],
                Method("jacobi(window=5)", ours(backend, build_decoder("jacobi", window=5))),
                Method(auto := auto_name(shape_label(shape), corpus=False),
                       ours(backend, build_decoder("lookahead", **{**tuned.params, "pool_from_corpus": False}))),
                # the same, drafting from the held-out prompts' greedy answers where the text has no draft
                Method(auto_name(shape_label(shape), corpus=True), ours(backend, with_corpus)),
                # the same shape fed by its lookahead branch alone (no prompt/output n-grams, no prompt
                # lookup chain): what the Jacobi n-grams contribute
                Method(f"lookahead window pool only{shape_label(window_only)}",
                       ours(backend, build_decoder("lookahead", **window_only, pool_from_prompt=False))),
            ]
            methods += [
                Method(f"lookahead{shape_label(fixed)}+pools", ours(backend, build_decoder(
                    "lookahead", **fixed, pool_from_output=True, pool_context=True)))
                for fixed in args.lookahead
            ]
            for m in methods:  # warm-up, untimed
                m.run(prompts[0], 16)
            rows, round_curves = [], []
            # steps are priced at the measured prompts' half-way cache, as the tuner prices its own: at --cache-len
            # a 1000-token CNN/DM prompt's steps cost less than they did, and the roofline was too high
            roofline_cache = calibration_cache_len(prompts, args.max_new_tokens)
            for r in range(args.rounds):
                for p_i, ids in enumerate(prompts):
                    for m in (methods[i] for i in rotated(len(methods), p_i + r)):  # drift cancels
                        rows.append({"method": m.name, "prompt": p_i, "round": r, **m.run(ids, args.max_new_tokens)})
                # the roofline prices steps at this round's t(k), not at the curve from before the tasks: a
                # VM's bandwidth swings 1.5x within minutes, and the extra rows weigh more when it is fast
                round_curves.append(latency_curves([backend], cache_len=roofline_cache)[0])
            task_curve = median_curve(round_curves)
            table = summarize(merged := median_rounds(rows), task_curve)
            ar_step = statistics.median(r["forward_s"] / r["steps"] for r in merged if r["method"] == REFERENCE)
            by_size = steps_by_size([r for r in merged if r["method"] == auto],
                                    lambda k: interp_latency(task_curve, k) / task_curve[1])
            block = (f"\n-- {task}: {len(prompts)} prompts x {args.rounds} round(s), max_new_tokens {args.max_new_tokens}, {dtype}, "
                     f"{args.device.upper()}; speedups over our ar on total time (prefill included); "
                     f"auto-tuner predicted {tuned.predicted:.2f}x, decoding only "
                     f"(calibrated on {len(held_out)} held-out prompts, "
                     f"steps priced at cache {tuned.cache_len}, at the mean of {snapshots_line(tuned.snapshots)}; "
                     f"{regime_line(tuned.curve, task_curve)}); "
                     f"(W,N,G,tT = prompt/output n-gram length,capC = tokens per step,plL = prompt-lookup chain); "
                     "+pools = prompt and output n-grams, context-ranked; +corpus = and drafts from the "
                     f"{len(held_out)} held-out prompts' answers where the text has none; roofline (prefill "
                     f"included, at its measured time; prefill = its share of the total) at t(k) measured after each "
                     f"round at cache {roofline_cache} (median over {len(round_curves)}): "
                     f"{curve_line(task_curve, (1, 2, 4, 6, 8, 16))}; "
                     f"{ar_steps_line(ar_step, task_curve)}\n"
                     + format_table(table) + "\nlookahead "
                     "auto's steps by tokens fed k (cost t(k)/t(1)):\n" + to_markdown(by_size, floatfmt=".2f"))
            print(block, flush=True)
            text.append(block)
            report["runs"][f"{dtype}/{task}"] = {
                "curve_s": task_curve, "curve_rounds_s": round_curves, "curve_cache_len": roofline_cache, "table": table,
                "ar_step_s": ar_step,  # and every round's timings, to see drift within the run
                "timings": [{k: r[k] for k in ("method", "prompt", "round", "steps", *TIMINGS) if k in r}
                            for r in rows],
                "tuned": {"params": tuned.params, "predicted_speedup": tuned.predicted,
                          "calibration": tuned.calibration, "curve_s": tuned.curve, "cache_len": tuned.cache_len,
                          "curve_snapshots_s": tuned.snapshots},
                "auto_steps_by_size": by_size.to_dict("records")}
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = free_stem(out_dir, "perf-" + "-".join(args.dtype + (args.tasks or ["memory"])))  # one file per run
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=1, default=str))
    (out_dir / f"{stem}.md").write_text("\n".join(text) + "\n")
    print(f"\nwrote {out_dir / stem}.json and .md")


if __name__ == "__main__":
    main()
