"""Choose lookahead's SHAPE (W, N, G, text_ngram, step_tokens, prompt_lookup, solo_root) for this machine:
maximise predicted speedup.

A lookahead step feeds k = 1 + W(N-1) + (tree nodes: at most G(text_ngram-1) + prompt_lookup, and
within the cap) tokens and costs t(k); autoregressive decoding costs t(1) per token. We measure the
latency curve t(k) (``decoders.latency``) on the backend after as many cache entries as the calibration
runs hold half-way (the median prompt plus half the generation: a step's attention grows with the cache,
so a curve measured on a short cache undercharges large steps on long prompts), in snapshots spread over
the calibration and priced at their mean (see ``decoders.latency.SNAPSHOT_REPS``); run each candidate on
calibration prompts (greedy; a short screening run of every candidate, then a few at the job's length, see
SCREEN_TOKENS), and predict its speedup as ``tokens * t(1) / sum over its steps of t(k_step)``, keeping the
best (of near-ties, the one that loses least when extra rows turn dear: see TIE). Why the sum and not
t(mean k): with a prompt-lookup chain k is bimodal (1-2 tokens without a match, 10+ with one), and on a
CPU t(k) rises in steps, so the cost at the mean k mis-prices both kinds of step. The prediction is
reported beside what the full run then measures. A chosen shape without prompt lookup's chain runs once more
with it, and that twin is kept where it is near-tied (see CHAIN). ``solo_root`` (a no-draft step feeds the root
alone) is decided last, for the chosen shape alone: one more final-round run with it, kept by the same rule. Why last:
it changes a shape's price only through t(2)/t(1)-sized steps, and twinning every candidate would double the
calibration for a 1-2% choice.

With ``pool_from_corpus`` the calibration prompts' greedy answers (``ar``'s, decoded first) become the
corpus: each candidate drafts from the other prompts' answers, as the measured prompts will, and the tuned
decoder keeps them (``Tuned.corpus``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from decoders.ar import AutoregressiveDecoder
from decoders.base import DecodeResult, token_hash
from decoders.latency import SNAPSHOT_REPS, calibration_cache_len, interp_latency, latency_curve, mean_curve
from decoders.lookahead import SHAPE, LookaheadDecoder, shape_of

if TYPE_CHECKING:
    from harness.runtime.backend import Backend

# Calibration is two rounds. Screening: every candidate on the first prompt for SCREEN_TOKENS tokens.
# Final: FINALISTS of them (see SCREEN_MARGIN) on every calibration prompt for the job's own length. Why the
# long final round: S rises over a generation as the pool fills with the answer's own n-grams, and not
# alike for every candidate, so a short run alone mis-ranks them; screening keeps the long runs to a few.
SCREEN_TOKENS = 96
FINALISTS = 4
# The finalists are first the screened shapes on the frontier of predicted speedup against tokens a step
# (none other predicted faster with fewer tokens a step) within SCREEN_MARGIN of the best, then the best
# of the rest. Why: one short prompt ranks long prompt-lookup chains least reliably (how much a prompt's
# text is copied varies most between prompts), and the four best screened can be one chain with four
# caps, leaving the final no smaller step to weigh. Measured 2026-12-05 (Xeon, AVX2 forced, HumanEval,
# the held-out prompts of results/perf/xeon-2026-12-05h): (1,2,1,t7,cap6,pl10) screened 9.7% behind
# (1,2,1,t7,cap11,pl10) and missed the final, where it would have been predicted 0.7% ahead with 7.1
# tokens a step against 9.1; on the 16 measured prompts it priced 1.71x against 1.68x at the same curve.
# Where the frontier holds more than FINALISTS shapes, its smallest step always goes to the final, beside the
# best predicted: measured 2026-12-07 (Xeon model 207, AVX2 forced, HumanEval, results/perf/xeon-2026-12-07):
# the frontier held six shapes, the four best predicted all fed 7.6-9.1 tokens a step, and the tuner took
# (1,3,1,t7,cap11,pl10), 1.57x `ar` (roofline 1.53x), where (1,2,1,t7,cap5,pl5), screened 12% behind at 4.5
# tokens a step, ran 1.72x (roofline 1.74x) in the same rounds.
SCREEN_MARGIN = 0.25
# Finalists predicted within this fraction of the best are a tie, and the tie goes to the one predicted
# best at a dearer curve: each step's cost over t(1) times DEAR. Why: a prediction is S on a few prompts
# times one latency curve, and both move more than that. On the EPYC the cost of a 12-token step
# drifted from 1.27x to 1.63x t(1) between two curves minutes apart (the VM's memory bandwidth swings,
# and extra rows cost compute that a faster memory does not hide), and a shape's S differs between
# calibration and measured prompts. A smaller step loses less when rows turn dear. Measured 2026-12-02
# (AVX-512, 3 rounds): picks made on a 1-3% margin ran HumanEval at 2.66x `ar` (pld 2.78x) with
# (1,2,1,t7,cap12,pl10), 9.1 tokens a step, where the cap-6 shape 1% behind had run 2.11x against pld's
# 2.05x in the run before; GSM8K 1.13x (pld 1.16x) with (1,3,1,t10) where (1,2,3,t7,cap6), 3.5% behind,
# ran 1.51x (pld 1.34x). Until 2026-12-05 the tie went to the fewest tokens a step, which also took
# shapes that save a few rows by drafting less: on the Xeon (AVX-512, MT-Bench,
# results/perf/xeon-2026-12-05i) plain (1,3,1), 4.3 tokens a step and S 1.41, 3.5% behind
# (1,3,1,t7,cap6,pl5) at 4.9 tokens and S 1.50, ran 1.46x `ar` and tied `pld`. The dear curve weighs the
# rows a shape saves against the tokens it gives up.
TIE = 0.05
# 2: the EPYC's 12-token step above went from 0.27 to 0.63 t(1) over a 1-token one (2.3x)
DEAR = 2.0
# The tuner's pick, where it has no prompt-lookup chain, runs once more with pld's draft length as its chain
# (CHAIN), and that twin is kept where it is predicted within TIE of the pick at the dear curve. Why: without the
# chain a shape falls behind `pld` wherever the measured prompts copy more than the held-out ones did; with it its
# draft set holds pld's wherever the text matched two tokens or more (decoders/lookahead.py), so a near-tie goes
# to the shape that proposes what `pld` would on copied text. Measured 2026-12-07 (Xeon model 207, AVX-512, MBPP,
# results/perf/xeon-2026-12-07e): the tuner took (1,2,3,t7,cap6,solo) on its four held-out prompts, and lookahead ran
# 0.96x `pld`(6,10); (1,2,3,t7,cap6,pl10), not a candidate, predicted 0.4% behind it there (1.4% at the dear
# curve), and in the same rounds of a later run the two ran 0.96x and 1.05x `pld`(6,10) (xeon-2026-12-07g).
# `harness.shape_oracle` on 16 MBPP prompts (results/oracle/xeon-2026-12-07), drawing four of them to calibrate on
# and judging the pick on the other twelve at three runs' tuner curves: without the twins the rule fell behind
# `pld`(6,10) in 1.5-4.0% of draws, with them in 0-0.5%. A scratch replay on 12 GSM8K prompts, where a chainless
# shape had been picked before, fell behind in none either way.
CHAIN = 10
# SHAPE tuples, from small steps to large. On a CPU, where t(k) grows early, the small ones win; on a
# GPU, where t(k) is flat up to ~100 tokens, the paper's large windows do. The long text n-grams (7-8)
# pay on code and quoted text; the caps at 6 and 8 tokens sit below the cost steps of the AVX2 kernel's
# 6-row tiles (a cap that is not below a step on some machine simply loses; AVX-512's tiles hold 12).
# The eight after the paper's windows carry prompt lookup's draft (prompt_lookup=10, pld's default) as their
# first chain, so the tuner can pick pld's own draft where it pays (code). In the capped ones a step whose text matched
# feeds pld's draft alone (the window sits out), and one without a match feeds the window and pool
# n-grams (of N=2, one token, or of 7 tokens from the text) where pld would feed the root alone: up to
# 11 tokens (pld's own step), or 6, which keeps those guesses on the cheap side of t(k) (see
# decoders/lookahead.py). The last three carry a 5-token chain instead, so that no step passes 6 tokens:
# where 7+ rows cost a jump (fast memory), that pays. On every fourth HumanEval problem, priced at a Zen 4
# curve with t(7)/t(6) 1.34 (2026-12-04), (1,2,1,t7,cap6,pl5) was predicted 2.00-2.02x against
# 1.85-1.88x for pl10 (S 2.42 against 2.68). (1,2,1,t7,cap5,pl5) caps the steps without a strong match one
# token lower (a matched draft still goes whole, 6 tokens): on perf's four HumanEval prompts (2026-12-06, 256
# tokens) S 2.194 against 2.216 for cap 6, priced 1.539-1.566x against 1.512-1.526x at two Zen 4 AVX2-forced
# rounds' curves and 1.862x against 1.830x at an AVX-512 one; MT-Bench 1.322-1.347x against 1.310-1.326x (AVX2)
# and 1.578x against 1.564x (AVX-512). (1,3,1,t7,cap5,pl5) was no better than (1,3,1,t7,cap6,pl5).
# Until 2026-12-02 prompt-lookup shapes were left out: on Zen 3
# (AVX2, sdpa attention) one screened best on an XSum prompt (S 4.0 at 11 tokens a step) and then ran at
# 0.92x `ar`, priced on a curve measured at 300 cache entries against XSum's ~1000-token prompts; the
# curve is now measured at the calibration's own cache length and our attention costs a third of sdpa's.
CANDIDATES = (
    (1, 3, 1, None, None, None), (1, 4, 1, None, None, None), (1, 5, 1, None, None, None),
    (1, 6, 1, None, None, None), (1, 4, 2, None, None, None), (2, 4, 2, None, None, None),
    (2, 5, 2, None, None, None),
    (1, 3, 1, 7, None, None), (1, 3, 2, 7, None, None), (1, 4, 1, 8, None, None), (1, 3, 1, 10, None, None),
    (1, 2, 3, 7, 6, None), (1, 3, 3, 7, 6, None), (1, 3, 3, 7, 8, None), (1, 4, 3, 8, 8, None),
    (5, 5, 5, None, None, None), (7, 5, 7, None, None, None), (15, 5, 15, None, None, None),
    (1, 2, 1, 7, 12, 10), (1, 2, 1, 7, None, 10), (1, 2, 1, None, 11, 10), (1, 2, 1, None, 12, 10),
    (1, 2, 1, 7, 11, 10), (1, 3, 1, 7, 11, 10), (1, 2, 1, 7, 6, 10), (1, 3, 1, 7, 6, 10),
    (1, 2, 1, 7, 6, 5), (1, 3, 1, 7, 6, 5), (1, 2, 1, 7, 5, 5),
)


@dataclass
class Tuned:
    params: dict[str, Any]
    predicted: float  # predicted wall-clock speedup over autoregressive decoding
    calibration: list[dict[str, Any]] = field(default_factory=list)  # every candidate's S, k and prediction
    curve: dict[int, float] = field(default_factory=dict)  # the latency curve the predictions priced steps on
    snapshots: list[dict[int, float]] = field(default_factory=list)  # the curves it is the mean of (none: the caller's)
    cache_len: int | None = None  # the cache length it was measured at (None: the caller's curve)
    corpus: dict[str, list[int]] = field(default_factory=dict)  # pool_from_corpus: prompt hash -> answer


def _calibrate(backend: Backend, prompts: list[list[int]], max_new_tokens: int, curve: dict[int, float],
               flags: dict[str, bool], shape: dict[str, Any], corpus: dict[str, list[int]]) -> dict[str, Any]:
    """Measured S and mean tokens per step of one candidate (``shape``: SHAPE's values), and its
    predicted speedup (see the module docstring)."""
    dec = LookaheadDecoder(**shape, **flags)
    dec.corpus = corpus
    tokens = steps = 0
    fed: list[int] = []  # tokens fed by each step
    for ids in prompts:
        r = dec.generate(backend, ids, max_new_tokens)
        tokens += len(r.tokens)
        steps += r.steps
        fed += r.input_tokens
    return {**shape, "S": tokens / steps, "k_mean": sum(fed) / steps, "tokens": max_new_tokens,
            "prompts": len(prompts), "new_tokens": tokens, **predictions(tokens, fed, curve),
            # steps by tokens fed: so a result file can price the candidate again at any other curve
            "fed": dict(sorted(Counter(fed).items()))}


def predictions(tokens: int, fed: list[int], curve: dict[int, float]) -> dict[str, float]:
    """What :func:`choose` ranks a candidate by: its predicted speedup at ``curve`` and at the dear curve (see TIE)."""
    return {"predicted": predicted_speedup(tokens, fed, curve),
            "predicted_dear": predicted_speedup(tokens, fed, dear_curve(curve))}


def repriced(rows: list[dict[str, Any]], curve: dict[int, float]) -> list[dict[str, Any]]:
    """Calibration ``rows`` with their predictions made again at ``curve``, from the steps they recorded."""
    return [{**r, **predictions(r["new_tokens"], fed_list(r["fed"]), curve)} for r in rows]


def dear_curve(curve: dict[int, float], factor: float = DEAR) -> dict[int, float]:
    """``curve`` with each step's cost over a 1-token step multiplied by ``factor`` (see TIE)."""
    return {k: curve[1] + factor * (t - curve[1]) for k, t in curve.items()}


def predicted_speedup(tokens: int, fed: list[int], curve: dict[int, float], prefill_s: float = 0.0) -> float:
    """``(tokens * t(1) + prefill_s) / (sum of t(k) over the steps + prefill_s)``: the speedup over `ar` that
    ``fed`` (tokens per step) would give on the latency curve, decoding overheads aside. ``prefill_s``: the
    prompts' prefill time, which every decoder pays alike; a speedup measured on total time (prefill
    included, as perf's) is priced with it, else the roofline overstates it by prefill's share. The tuner
    ranks without it: it is the same for every candidate."""
    cost = {k: interp_latency(curve, k) for k in set(fed)}  # each distinct step size priced once
    return (tokens * curve[1] + prefill_s) / (sum(cost[k] for k in fed) + prefill_s)


def autotune(
    backend: Backend,
    prompts: list[list[int]],
    curve: dict[int, float] | None = None,
    max_new_tokens: int = 256,
    candidates=CANDIDATES,
    pool_from_prompt: bool = True,
    pool_from_output: bool = False,
    pool_context: bool = False,
    pool_from_corpus: bool = False,
    screen_tokens: int = SCREEN_TOKENS,
    finalists: int = FINALISTS,
) -> Tuned:
    """Pick the SHAPE with the best predicted speedup on ``prompts`` (greedy calibration runs, two rounds:
    see SCREEN_TOKENS). ``calibration`` lists every run, screening rows first. ``curve``: None (the
    default) measures it at :func:`calibration_cache_len`, in snapshots spread over the calibration (see
    ``decoders.latency.SNAPSHOT_REPS``); a caller's curve prices every round."""
    if not prompts:
        raise ValueError("autotune needs at least one calibration prompt")
    given, snapshots = curve, []
    cache_len = None if given is not None else calibration_cache_len(prompts, max_new_tokens)

    def snapshot() -> dict[int, float]:
        """The curve to price at now: the caller's, or the mean of the snapshots so far after one more."""
        if given is not None:
            return given
        snapshots.append(latency_curve(backend, cache_len=cache_len, reps=SNAPSHOT_REPS))
        return mean_curve(snapshots)

    flags = {"pool_from_prompt": pool_from_prompt, "pool_from_output": pool_from_output, "pool_context": pool_context,
             "pool_from_corpus": pool_from_corpus}
    corpus = {}
    if pool_from_corpus:  # greedy answers: any exact decoder's, so ar's
        corpus = {token_hash(p): AutoregressiveDecoder().generate(backend, p, max_new_tokens).tokens for p in prompts}
    shapes = [shape_of(c) for c in candidates]
    priced = snapshot()
    screen = [
        {"round": "screen", **_calibrate(backend, prompts[:1], min(screen_tokens, max_new_tokens), priced, flags, c,
                                         corpus)}
        for c in shapes
    ]
    # The screening is priced again at the mean of the snapshot before it and one after, as the final round is at
    # snapshots spread over its minutes. Why: the frontier the finalists come from was priced at one moment's curve;
    # on the Xeon model 207 with AVX2 forced (2026-12-07) two tunings on the same HumanEval prompt priced a 10-token
    # step at 1.23 and 1.39 t(1), and their frontiers held six and four shapes.
    if given is None:
        priced = snapshot()
        screen = repriced(screen, priced)
    final = []
    for r in pick_finalists(screen, finalists):  # a snapshot after each: the curve spans the final round's minutes
        final.append({"round": "final", **_calibrate(backend, prompts, max_new_tokens, priced, flags,
                                                     {k: r[k] for k in SHAPE}, corpus)})
        priced = snapshot()
    curve = priced
    final = repriced(final, curve)  # all at the final mean
    best = choose(final)

    def twin(name: str, **change: Any) -> dict[str, Any]:
        """The chosen shape once more with ``change``, calibrated as the final round was (its row: round ``name``)."""
        shape = {**{k: best[k] for k in SHAPE}, **change}
        final.append({"round": name, **_calibrate(backend, prompts, max_new_tokens, curve, flags, shape, corpus)})
        return final[-1]

    if not best["prompt_lookup"]:  # with pld's chain (see CHAIN)
        best = keep_chain(best, twin("chain", prompt_lookup=CHAIN))
    if not best["solo_root"]:  # its no-draft steps the root alone (see the docstring)
        best = choose([best, twin("solo", solo_root=True)])
    params = {**{k: best[k] for k in SHAPE}, **flags}
    return Tuned(params=params, predicted=best["predicted"], calibration=screen + final, curve=curve,
                 snapshots=snapshots, cache_len=cache_len, corpus=corpus)


def fed_list(counts: dict[Any, int]) -> list[int]:
    """The tokens fed by each step, from ``fed`` counts (steps by tokens fed, as a calibration row or a result
    file keeps them; JSON makes the keys strings)."""
    return [int(k) for k, n in counts.items() for _ in range(n)]


def pick_finalists(screen: list[dict[str, Any]], n: int, margin: float = SCREEN_MARGIN) -> list[dict[str, Any]]:
    """The ``n`` screening rows to run at full length (see SCREEN_MARGIN), best predicted first: the
    frontier rows within ``margin`` of the best (where there are more than ``n``: the best, its smallest step
    and the best of the others), then the best of the rest."""
    ranked = sorted(screen, key=lambda r: -r["predicted"])
    floor = (1 - margin) * ranked[0]["predicted"]

    def dominated(r: dict[str, Any]) -> bool:
        return any(o["predicted"] >= r["predicted"] and o["k_mean"] <= r["k_mean"]
                   and (o["predicted"], o["k_mean"]) != (r["predicted"], r["k_mean"]) for o in screen)

    frontier = [r for r in ranked if r["predicted"] >= floor and not dominated(r)]
    picked = frontier[:n]
    if len(frontier) > n > 1:  # the final always weighs the frontier's smallest step (see SCREEN_MARGIN)
        smallest = min(frontier, key=lambda r: r["k_mean"])
        picked = [r for r in frontier if r is not smallest][:n - 1] + [smallest]
    picked += [r for r in ranked if all(r is not p for p in picked)][:n - len(picked)]
    return sorted(picked, key=lambda r: -r["predicted"])


def keep_chain(plain: dict[str, Any], chained: dict[str, Any], tie: float = TIE) -> dict[str, Any]:
    """Of the chosen shape and its twin with pld's chain, the twin where it is predicted within ``tie`` of the
    shape at the dear curve (see CHAIN)."""
    return chained if chained["predicted_dear"] >= (1 - tie) * plain["predicted_dear"] else plain


def choose(rows: list[dict[str, Any]], tie: float = TIE) -> dict[str, Any]:
    """The calibration row to keep: of those predicted within ``tie`` of the best, the one predicted
    best at the dear curve (then the best predicted)."""
    top = max(r["predicted"] for r in rows)
    near = [r for r in rows if r["predicted"] >= (1 - tie) * top]
    return max(near, key=lambda r: (r["predicted_dear"], r["predicted"]))


class AutoTunedLookahead(LookaheadDecoder):
    """Lookahead with ``auto=true``: tunes its SHAPE on the first prompt it decodes, unless the
    caller tuned it first with :meth:`tune` (the runner does, on the job's own prompts)."""

    def tune(self, backend: Backend, prompts: list[list[int]], max_new_tokens: int) -> None:
        """Set SHAPE to the auto-tuner's choice for this backend, calibrated on ``prompts`` at the
        generation length that will be used."""
        self.tuned = autotune(
            backend, prompts, max_new_tokens=max_new_tokens, pool_from_prompt=self.pool_from_prompt,
            pool_from_output=self.pool_from_output, pool_context=self.pool_context,
            pool_from_corpus=self.pool_from_corpus,
        )
        self.set_shape(self.tuned.params)
        self.corpus = self.tuned.corpus

    def adopt(self, record: dict[str, Any]) -> None:
        """Take a tuning recorded earlier (a manifest's ``tuned``: params, and the corpus if any), so a
        resumed or concurrent run of a job decodes with the same shape and corpus as its first."""
        self.set_shape(record["params"])
        self.corpus = dict(record.get("corpus") or {})
        self.tuned = record

    def generate(self, backend: Backend, prompt_ids: list[int], max_new_tokens: int, **kw: Any) -> DecodeResult:
        if self.tuned is None:
            self.tune(backend, [list(prompt_ids)], max_new_tokens)
        return super().generate(backend, prompt_ids, max_new_tokens, **kw)
