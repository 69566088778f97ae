"""Every auto-tuner candidate on a task's measured prompts, priced at the latency curves that earlier
``harness.perf`` runs measured: is a missed speedup the tuner's pick, or the machine's curve?

A greedy decode feeds the same tokens per step wherever it runs with the same matmul path, so one decode of
each candidate on perf's measured prompts prices it at any curve. Its roofline is
``(tokens * t(1) + prefill) / (sum of t(k) over its steps + prefill)``, perf's ``roofline`` column, with the
prefill time the run recorded (none for runs from before 2026-12-06's thirty-seventh). For each perf result given, this
prints the auto pick's roofline at the curve its rounds ran at beside every other candidate's. It also prints
the pick's measured speedup scaled by each ratio: an estimate of what that shape would have measured in that
run. The auto pick's S here must equal the S perf measured, which checks that the prompts and steps are the
run's own. It also says which shape the tuner's own rule picks on these prompts at the tuner's curve, and what
calibrating on a few of them loses to prompt variance. Nothing is timed, so its figures do not depend on the
machine's load (it still skews a timing run beside it).

    python -m harness.shape_oracle --task humaneval --prompts 16 \
        --perf results/perf/zen4-2026-12-06d/avx512/perf-float32-humaneval.json
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from decoders import build_decoder
from decoders.autotune import CANDIDATES, CHAIN, choose, fed_list, keep_chain, predicted_speedup, predictions
from decoders.base import token_hash
from decoders.lookahead import SHAPE, shape_label, shape_of
from harness.analysis.io import to_markdown
from harness.analysis.perf_names import AUTO, CORPUS, PLD, pld_name
from harness.cli_args import add_matmul_option, positive_int
from tasks.data import SHARED_DATA_DIR

# the flags of perf's auto row (prompt and output pools, context ranking; no corpus)
AUTO_FLAGS = {"pool_from_prompt": True, "pool_from_output": True, "pool_context": True}
# pld's published setting, the target's pld(6), and pld(6) with lookahead's recency rule (perf's --pld rows)
PLDS = ((3, 10, False), (6, 10, False), (6, 10, True))
CALIBRATION_SIZES = (1, 2, 4, 8)  # calibration sets whose loss to prompt variance is estimated (calibration_regret)


def candidate_shapes() -> list[dict[str, Any]]:
    """Every tuner candidate as a SHAPE dict, each with and without solo_root (the tuner tries that on its pick)."""
    return [{**shape_of(c), "solo_root": solo} for c in CANDIDATES for solo in (False, True)]


def chain_twin(shape: dict[str, Any]) -> dict[str, Any]:
    """``shape`` with pld's chain: what the tuner tries on a chainless pick (see ``decoders.autotune.CHAIN``)."""
    return {**shape, "prompt_lookup": CHAIN}


def chain_twins() -> dict[str, str]:
    """Label of each candidate without a prompt-lookup chain (with and without solo_root) -> its chain twin's."""
    return {shape_label(s): shape_label(chain_twin(s)) for s in candidate_shapes() if not s["prompt_lookup"]}


def oracle_methods(only: list[str] | None = None) -> dict[str, Any]:
    """Name -> decoder: every tuner candidate with perf's auto flags, each also with solo_root (the tuner tries
    that on its pick), the chain twins of those without a chain (the tuner tries one on such a pick), and the
    pld rows to compare with. ``only``: just these lookahead shapes (their labels), and the pld rows."""
    shapes = candidate_shapes()
    shapes += [chain_twin(s) for s in shapes if not s["prompt_lookup"]]
    labels = [shape_label(s) for s in shapes]
    if unknown := sorted(set(only or ()) - set(labels)):
        raise ValueError(f"not tuner shapes (nor their twins): {', '.join(unknown)}; they are: {', '.join(labels)}")
    methods = {label: build_decoder("lookahead", **s, **AUTO_FLAGS) for label, s in zip(labels, shapes)
               if only is None or label in only}
    methods.update({pld_name(m, n, r): build_decoder("pld", max_ngram=m, num_pred=n, recent=r) for m, n, r in PLDS})
    return methods


def decode_steps(backend, prompts: list[list[int]], max_new_tokens: int,
                 methods: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Method -> prompt hash -> {"tokens": new tokens, "fed": {k: steps that fed k tokens}}; every output
    checked against ``ar``'s (a method that differs raises: its steps would price another text)."""
    ar = build_decoder("ar")
    reference = {token_hash(p): ar.generate(backend, p, max_new_tokens).tokens for p in prompts}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, decoder in methods.items():
        out[name] = {}
        for p in prompts:
            r = decoder.generate(backend, p, max_new_tokens)
            if r.tokens != reference[token_hash(p)]:
                raise RuntimeError(f"{name} differs from ar on prompt {token_hash(p)}: not exact, so not priced")
            out[name][token_hash(p)] = {"tokens": len(r.tokens), "fed": dict(Counter(r.input_tokens))}
    return out


def price(per_prompt: dict[str, dict[str, Any]], hashes: list[str], curve: dict[int, float],
          prefill_s: float = 0.0) -> dict[str, float]:
    """S, mean tokens fed per step and roofline speedup over ``ar`` of one method on the prompts ``hashes``
    (summed over them, as perf's table sums a method's prompts) at ``curve`` (seconds by tokens fed), with
    ``prefill_s`` of prefill on both sides (perf's roofline: see ``decoders.autotune.predicted_speedup``)."""
    tokens, fed = steps(per_prompt, hashes)
    return {"S": tokens / len(fed), "k_mean": sum(fed) / len(fed),
            "roofline": predicted_speedup(tokens, fed, curve, prefill_s=prefill_s)}


def steps(per_prompt: dict[str, dict[str, Any]], hashes: list[str]) -> tuple[int, list[int]]:
    """One method's new tokens over the prompts ``hashes``, and the tokens fed by each of its steps there."""
    tokens = sum(per_prompt[h]["tokens"] for h in hashes)
    return tokens, [k for h in hashes for k in fed_list(per_prompt[h]["fed"])]


def auto_row(table: list[dict[str, Any]]) -> dict[str, Any]:
    """perf's auto-tuned row without the corpus (the one the targets read)."""
    rows = [r for r in table if r["method"].startswith(AUTO) and CORPUS not in r["method"]]
    if len(rows) != 1:
        raise ValueError(f"expected one auto-tuned row without the corpus in the perf table, found {len(rows)}")
    return rows[0]


def as_curve(stored: dict[str, float]) -> dict[int, float]:
    """A curve as a result file stores it (JSON keys are strings) -> seconds by tokens fed."""
    return {int(k): v for k, v in stored.items()}


def rule_pick(decoded: dict[str, dict[str, dict[str, Any]]], hashes: list[str], curve: dict[int, float]) -> str:
    """The lookahead candidate the tuner's rule (:func:`decoders.autotune.choose`: near-ties go to the dear
    curve) keeps on the prompts ``hashes`` priced at ``curve``, all candidates and their solo_root twins in its
    final round (the tuner tries solo_root on its pick alone), then the pick's chain twin where it was decoded
    (:func:`decoders.autotune.keep_chain`; the tuner tries it before solo_root, here it is the pick's own twin)."""
    twins = chain_twins()
    rows = {name: {"method": name, **predictions(*steps(d, hashes), curve)}
            for name, d in decoded.items() if not name.startswith(PLD)}
    pick = choose([r for name, r in rows.items() if name not in twins.values()])
    twin = rows.get(twins.get(pick["method"], ""))
    return (keep_chain(pick, twin) if twin else pick)["method"]


def calibration_regret(decoded: dict[str, dict[str, dict[str, Any]]], hashes: list[str], tuner_curve: dict[int, float],
                       curve: dict[int, float], n: int, draws: int = 200,
                       seed: int = 0) -> tuple[float, dict[str, float]]:
    """Over ``draws`` random draws of ``n`` of the prompts ``hashes``, the tuner's rule picks on them at
    ``tuner_curve``, and the pick is judged on the other prompts at ``curve``: the mean of 1 - its roofline over the
    best candidate's, and for each pld row decoded, the share of draws where the pick's roofline falls below
    that row's. What calibrating on ``n`` prompts loses to prompt variance (and to a curve of another moment,
    where the two curves differ); the tuner's screening round aside."""
    rng, lost, behind = random.Random(seed), [], Counter()
    plds = [name for name in decoded if name.startswith(PLD)]
    for _ in range(draws):
        calibration = rng.sample(hashes, n)
        rest = [h for h in hashes if h not in calibration]
        truth = {name: price(d, rest, curve)["roofline"] for name, d in decoded.items()}
        pick = truth[rule_pick(decoded, calibration, tuner_curve)]
        lost.append(1 - pick / max(v for name, v in truth.items() if not name.startswith(PLD)))
        behind.update(name for name in plds if pick < truth[name])
    return sum(lost) / draws, {name: behind[name] / draws for name in plds}


def compare_run(decoded: dict[str, dict[str, dict[str, Any]]], hashes: list[str], run: dict[str, Any],
                ) -> tuple[list[dict[str, Any]], str]:
    """Every decoded method priced at one perf task run's rounds' curve (and at its tuner's), sorted by the
    former; the auto pick's measured speedup scaled by each method's roofline over the pick's. Raises where
    the pick's S differs from the run's (other prompts, another length or another matmul path)."""
    curve, tuner_curve = as_curve(run["curve_s"]), as_curve(run["tuned"]["curve_s"])
    pick = {k: run["tuned"]["params"].get(k) for k in SHAPE}  # a run from before solo_root lacks it
    label, measured = shape_label(pick), auto_row(run["table"])
    if label not in decoded:
        raise ValueError(f"the run's auto pick {label} is not among the decoded methods")
    prefill = measured.get("prefill_s", 0.0)  # the run's prefill, the same work for every method (older runs: none)
    mine = price(decoded[label], hashes, curve, prefill)
    if abs(mine["S"] - measured["S"]) > 1e-9:
        raise ValueError(f"the auto pick {label} has S {mine['S']:.4f} here against {measured['S']:.4f} in the "
                         f"run: not the run's prompts, length or matmul path")
    # the tuner's own rule at its own curve over every candidate on these prompts: where it picks well here, a
    # bad pick came from the held-out prompts, not the pricing
    ruled = rule_pick(decoded, hashes, tuner_curve)
    rows = []
    for name, per_prompt in decoded.items():
        at_round = price(per_prompt, hashes, curve, prefill)
        rows.append({"method": name, "S": at_round["S"], "k_mean": at_round["k_mean"],
                     "roofline": at_round["roofline"],
                     "roofline_tuner_curve": price(per_prompt, hashes, tuner_curve, prefill)["roofline"],
                     "estimated_speedup": measured["speedup"] * at_round["roofline"] / mine["roofline"],
                     "auto_pick": name == label, "tuner_rule_pick": name == ruled})
    rows.sort(key=lambda r: -r["roofline"])
    best = rows[0]
    ruled_row = next(r for r in rows if r["tuner_rule_pick"])
    summary = (f"rounds at t(1) {curve[1] * 1e3:.1f} ms, tuner at {tuner_curve[1] * 1e3:.1f} ms; auto pick {label}: "
               f"measured {measured['speedup']:.2f}x, roofline {mine['roofline']:.2f}x; best roofline "
               f"{best['method']} {best['roofline']:.2f}x, so an estimated {best['estimated_speedup']:.2f}x; "
               f"the tuner's rule on these prompts at its curve: {ruled_row['method']} "
               f"(roofline {ruled_row['roofline']:.2f}x); rooflines with "
               + (f"the run's prefill, {prefill:.2f} s" if prefill else "no prefill (the run recorded none)"))
    return rows, summary


def main(argv: list[str] | None = None) -> None:
    from harness import load_backend
    from harness.perf import free_stem, task_prompts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--perf", type=Path, nargs="+", required=True, metavar="JSON",
                    help="perf results (perf-*.json) whose task runs to price the candidates at")
    ap.add_argument("--task", required=True)
    ap.add_argument("--prompts", type=positive_int, default=16,
                    help="measured prompts to decode (perf's spread): at least as many as each perf run measured")
    ap.add_argument("--max-new-tokens", type=positive_int, default=256)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--dtype", default="float32")
    add_matmul_option(ap)
    ap.add_argument("--data-dir", default=str(SHARED_DATA_DIR))
    ap.add_argument("--shapes", nargs="+", metavar="LABEL",
                    help="decode only these lookahead shapes (labels as printed, e.g. '(1,2,3,t7,cap6)'; default: "
                         "every candidate and twin) beside the pld rows; with --decoded, price only those")
    ap.add_argument("--decoded", type=Path, metavar="JSON",
                    help="an earlier oracle result (oracle-*.json): price its decoded steps again, decoding nothing")
    ap.add_argument("--out", type=Path, default=Path("results/oracle"))
    args = ap.parse_args(argv)
    try:
        methods = oracle_methods(args.shapes)
    except ValueError as e:
        ap.error(str(e))
    runs = []
    for path in args.perf:
        report = json.loads(path.read_text())
        key = f"{args.dtype}/{args.task}"
        if key not in report["runs"]:
            ap.error(f"{path} holds no {key} run; its runs: {', '.join(report['runs'])}")
        if report["args"]["max_new_tokens"] != args.max_new_tokens:
            ap.error(f"{path} ran {report['args']['max_new_tokens']} new tokens; pass --max-new-tokens to match")
        if report["args"]["prompts"] > args.prompts:
            ap.error(f"{path} measured {report['args']['prompts']} prompts; pass --prompts {report['args']['prompts']}")
        runs.append((path, report, report["runs"][key]))

    backend = load_backend(args.model, dtype=args.dtype, matmul=args.matmul)
    if args.decoded:
        earlier = json.loads(args.decoded.read_text())
        same = {"task": args.task, "max_new_tokens": args.max_new_tokens, "dtype": args.dtype}
        other = any(str(earlier["args"][k]) != str(v) for k, v in same.items())
        if other or earlier["matmul_path"] != backend.matmul_path:
            ap.error(f"{args.decoded} decoded another task, length, dtype or matmul path "
                     f"({earlier['matmul_path']}); pass the options it ran with")
        # with --shapes, only those (and the pld rows): e.g. without the chain twins, the rule as it was before them
        decoded = {name: d for name, d in earlier["decoded"].items() if not args.shapes or name in methods}
        decoded_by = earlier.get("decoded_by", earlier["args"])  # the options of the run that decoded them
    else:
        prompts, _ = task_prompts(args.task, args.prompts, 0, args.data_dir, backend.tokenizer)
        print(f"decoding {len(methods)} methods on {len(prompts)} {args.task} prompts ({backend.matmul_path})",
              flush=True)
        decoded = decode_steps(backend, prompts, args.max_new_tokens, methods)
        decoded_by = None
    stored_args = {k: [str(x) for x in v] if isinstance(v, list) else str(v) if isinstance(v, Path) else v
                   for k, v in vars(args).items()}
    result: dict[str, Any] = {"args": stored_args, "decoded_by": decoded_by or stored_args,
                              "matmul_path": backend.matmul_path,
                              "decoded": decoded, "runs": {}}
    text = []
    for path, report, run in runs:
        hashes = [token_hash(p) for p in task_prompts(args.task, report["args"]["prompts"], 0, args.data_dir,
                                                      backend.tokenizer)[0]]
        if missing := [h for h in hashes if h not in next(iter(decoded.values()))]:
            ap.error(f"{len(missing)} of {path}'s prompts were not decoded; decode at least its --prompts")
        rows, summary = compare_run(decoded, hashes, run)
        every = list(next(iter(decoded.values())))  # all the decoded prompts: the variance among them
        if len(every) >= 2 * max(CALIBRATION_SIZES):  # enough prompts to hold some out
            rounds_curve, tuner_curve = as_curve(run["curve_s"]), as_curve(run["tuned"]["curve_s"])
            losses = []
            for name, c in (("tuner's", tuner_curve), ("rounds'", rounds_curve)):
                for n in CALIBRATION_SIZES:
                    loss, behind = calibration_regret(decoded, every, c, rounds_curve, n)
                    losses.append(f"{n} at the {name} curve {loss:.1%} (behind "
                                  + ", ".join(f"{p} in {share:.1%}" for p, share in behind.items()) + " of draws)")
            summary += (f"\ncalibrating on n of the {len(every)} decoded prompts, the pick's mean loss on the others: "
                        + "; ".join(losses))
        result["runs"][str(path)] = {"rows": rows, "summary": summary}
        text += [f"== {path}", summary, to_markdown(pd.DataFrame(rows), floatfmt=".2f"), ""]
        print("\n".join(text[-4:]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = free_stem(args.out, f"oracle-{args.dtype}-{args.task}")
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    (args.out / f"{stem}.md").write_text("\n".join(text))
    print(f"wrote {args.out / stem}.json and .md")


if __name__ == "__main__":
    main()
