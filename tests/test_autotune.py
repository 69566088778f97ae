"""The auto-tuner picks the candidate with the best predicted speedup from measured S and t(k), near-ties
going to the smaller step."""

from __future__ import annotations

import pytest

from decoders import build_decoder
from decoders.autotune import (CANDIDATES, CHAIN, TIE, autotune, choose, dear_curve, fed_list, keep_chain,
                               pick_finalists, predicted_speedup)
from decoders.latency import (
    LATENCY_KS, calibration_cache_len, interp_latency, latency_curve, latency_curves, mean_curve,
)
from decoders.lookahead import SHAPE
from tiny import tiny_backend


def test_latency_curve_shape(tiny):
    curve = latency_curve(tiny, ks=(1, 4, 16), cache_len=20, reps=2)
    assert sorted(curve) == [1, 4, 16] and all(v > 0 for v in curve.values())
    assert tiny.length == 20  # the probe forwards left no entries behind
    assert interp_latency({1: 1.0, 3: 3.0}, 2) == pytest.approx(2.0)


class Recording:
    """A backend that logs which of several backends each forward ran on, and its size."""

    def __init__(self, backend, name: str, log: list) -> None:
        self.backend, self.name, self.log = backend, name, log

    def forward(self, input_ids, *args, **kw):
        self.log.append((self.name, int(input_ids.shape[0])))
        return self.backend.forward(input_ids, *args, **kw)

    def greedy_forward(self, input_ids, *args, **kw):  # the steps the curves time
        self.log.append((self.name, int(input_ids.shape[0])))
        return self.backend.greedy_forward(input_ids, *args, **kw)

    def __getattr__(self, attr):
        return getattr(self.backend, attr)


def test_latency_curves_interleave_the_backends(tiny):
    """Each size runs on every backend in turn (untimed then timed), so a drifting machine moves all
    curves alike and their ratio (bf16w against float32) is of one time window."""
    log: list[tuple[str, int]] = []
    a, b = Recording(tiny, "a", log), Recording(tiny_backend(1), "b", log)
    curves = latency_curves([a, b], ks=(1, 4), cache_len=10, reps=2)
    assert [sorted(c) for c in curves] == [[1, 4], [1, 4]] and all(v > 0 for c in curves for v in c.values())
    assert log[:2] == [("a", 10), ("b", 10)]  # the prefixes
    rounds = [("a", 1), ("a", 1), ("b", 1), ("b", 1), ("a", 4), ("a", 4), ("b", 4), ("b", 4)]
    assert log[2:] == rounds * 3  # the warm-up round and two timed ones
    assert tiny.length == 10 and b.length == 10


def test_autotune_maximises_predicted_speedup(tiny):
    prompts = [[7, 8, 9, 10, 11] * 5, [5, 6, 5, 6, 20, 21]]
    # a synthetic curve: a step costs 1 + k/8 units, so big windows are penalised; on a linear curve the
    # sum of t(k) over the steps is steps x t(mean k)
    curve = {k: 1.0 + k / 8 for k in (1, 2, 4, 8, 16, 32, 64, 256)}  # linear over every k fed
    tuned = autotune(tiny, prompts, curve, max_new_tokens=24, screen_tokens=12, finalists=3)
    screen = [r for r in tuned.calibration if r["round"] == "screen"]
    final = [r for r in tuned.calibration if r["round"] == "final"]
    solo = [r for r in tuned.calibration if r["round"] == "solo"]
    chain = [r for r in tuned.calibration if r["round"] == "chain"]
    assert [tuple(r[k] for k in SHAPE[:6]) for r in screen] == list(CANDIDATES) and len(final) == 3
    assert not any(r["solo_root"] for r in screen + final + chain)
    assert len(tuned.calibration) == len(screen) + 3 + len(chain) + 1
    assert {(r["tokens"], r["prompts"]) for r in screen} == {(12, 1)}
    assert {(r["tokens"], r["prompts"]) for r in final + chain + solo} == {(24, 2)}
    dear = dear_curve(curve)  # 1 + (2/8)(k-1) + 1/8: linear too
    assert dear[1] == curve[1] and dear[8] == pytest.approx(curve[1] + 2 * (curve[8] - curve[1]))
    for row in tuned.calibration:
        assert row["predicted"] == pytest.approx(row["S"] * curve[1] / interp_latency(curve, row["k_mean"]))
        assert row["predicted_dear"] == pytest.approx(row["S"] * dear[1] / interp_latency(dear, row["k_mean"]))
        # the steps by tokens fed, kept to price the candidate again: they give back S, k and the prediction
        fed = fed_list(row["fed"])
        assert sum(fed) / len(fed) == pytest.approx(row["k_mean"]) and row["new_tokens"] == round(row["S"] * len(fed))
        assert predicted_speedup(row["new_tokens"], fed, curve) == pytest.approx(row["predicted"])
    # the finalists are picked from the screening rows (see test_finalists_...), and the choice is the best finalist
    assert [tuple(r[k] for k in SHAPE) for r in final] == [tuple(r[k] for k in SHAPE) for r in pick_finalists(screen, 3)]
    best = choose(final)
    assert best["predicted"] >= (1 - TIE) * max(r["predicted"] for r in final)
    # a pick without pld's chain is tried with it, and the twin kept where near-tied at the dear curve
    assert len(chain) == (0 if best["prompt_lookup"] else 1)
    if chain:
        assert chain[0]["prompt_lookup"] == CHAIN and all(chain[0][k] == best[k] for k in SHAPE if k != "prompt_lookup")
        best = keep_chain(best, chain[0])
    # solo_root is tried last, on the chosen shape alone, and kept by the same rule
    assert solo[0]["solo_root"] and all(solo[0][k] == best[k] for k in SHAPE if k != "solo_root")
    kept = choose([best, solo[0]])
    assert all(tuned.params[k] == kept[k] for k in SHAPE) and tuned.predicted == kept["predicted"]


def test_finalists_keep_a_smaller_step_that_screened_close_behind():
    # -05h's screening, rounded: one prompt-lookup chain with three caps led, a 7-token shape 10% behind
    rows = [{"name": n, "predicted": p, "k_mean": k} for n, p, k in (
        ("cap11", 3.57, 8.4), ("cap12", 3.49, 9.0), ("t10", 3.43, 9.4), ("nocap", 3.33, 9.7),
        ("cap6", 3.22, 7.0), ("t7", 3.13, 7.8), ("pl5", 2.78, 5.3), ("tiny", 1.97, 4.8))]
    names = [r["name"] for r in pick_finalists(rows, 4)]
    # the frontier within 25% of the best (cap11, cap6, pl5; tiny is 45% behind), then the best of the rest
    assert names == ["cap11", "cap12", "cap6", "pl5"]
    # a frontier larger than the final: the best, its smallest step, then the best of the others
    assert [r["name"] for r in pick_finalists(rows, 2)] == ["cap11", "pl5"]
    assert [r["name"] for r in pick_finalists(rows, 1)] == ["cap11"]
    assert [r["name"] for r in pick_finalists(rows, 4, margin=0.6)] == ["cap11", "cap6", "pl5", "tiny"]
    assert [r["name"] for r in pick_finalists(rows, 4, margin=0.0)] == ["cap11", "cap12", "t10", "nocap"]
    assert [r["name"] for r in pick_finalists(rows[:1], 4)] == ["cap11"]


def test_finalists_keep_the_frontiers_smallest_step_where_it_holds_more_shapes_than_the_final():
    # xeon-2026-12-07's AVX2 HumanEval screening, rounded: six frontier shapes within 25%, the four best all
    # 7.6-9.1 tokens a step; the smallest (cap5, 12% behind) ran 1.72x `ar` in the rounds, the pick 1.57x
    rows = [{"name": n, "predicted": p, "k_mean": k} for n, p, k in (
        ("t8", 2.700, 9.07), ("n3cap11", 2.688, 8.31), ("t10", 2.662, 8.07), ("n2cap11", 2.594, 7.59),
        ("cap6", 2.569, 5.21), ("cap5", 2.380, 4.53), ("plain", 2.131, 4.70), ("paper", 1.044, 30.25))]
    assert [r["name"] for r in pick_finalists(rows, 4)] == ["t8", "n3cap11", "t10", "cap5"]
    assert [r["name"] for r in pick_finalists(rows, 6)] == ["t8", "n3cap11", "t10", "n2cap11", "cap6", "cap5"]
    # "plain" is dominated (cap5 is predicted faster with fewer tokens a step): only the rest's best fills
    assert [r["name"] for r in pick_finalists(rows, 7)][-1] == "plain"


def test_choose_gives_near_ties_to_the_one_best_at_the_dear_curve():
    rows = [{"predicted": 3.07, "predicted_dear": 2.2}, {"predicted": 3.04, "predicted_dear": 2.5},
            {"predicted": 2.5, "predicted_dear": 2.6}]
    assert choose(rows) is rows[1]  # 1% behind and better when rows turn dear; 19% behind is no tie
    assert choose(rows, tie=0.0) is rows[0]  # no tolerance: the best predicted
    assert choose(rows, tie=0.5) is rows[2]
    same = [{"predicted": 2.0, "predicted_dear": 1.5}, {"predicted": 2.05, "predicted_dear": 1.5}]
    assert choose(same) is same[1]  # equal at the dear curve: the better predicted
    # the Xeon's MT-Bench final (results/perf/xeon-2026-12-05i, AVX-512): fewer rows a step (4.3 against
    # 4.9) but fewer tokens too (S 1.41 against 1.50); at twice the extra cost per row it still falls behind
    curve = {1: 21.4, 4: 22.6, 5: 23.5, 6: 24.6}  # ms, that run's
    lean_steps, rich_steps = [4] * 47 + [5] * 24, [4] * 6 + [5] * 61  # 100 tokens: 4.34 and 4.91 tokens a step
    lean, rich = ({"predicted": predicted_speedup(100, fed, curve),
                   "predicted_dear": predicted_speedup(100, fed, dear_curve(curve))} for fed in (lean_steps, rich_steps))
    assert rich["predicted"] > lean["predicted"] > (1 - TIE) * rich["predicted"]  # a near-tie
    assert choose([rich, lean]) is rich


def test_keep_chain_takes_the_twin_with_pld_s_chain_where_near_tied_at_the_dear_curve():
    # xeon-2026-12-07e's MBPP held-out prompts, rounded: (1,2,3,t7,cap6) and its twin with a 10-token chain
    plain, chained = {"predicted": 1.288, "predicted_dear": 1.175}, {"predicted": 1.283, "predicted_dear": 1.159}
    assert keep_chain(plain, chained) is chained  # 1.4% behind at the dear curve: a tie
    assert keep_chain(plain, {**chained, "predicted_dear": 1.10}) is plain  # 6.4% behind: none
    assert keep_chain(plain, chained, tie=0.01) is plain


def test_autotune_tries_pld_s_chain_on_a_pick_without_one(tiny):
    """A pick without a chain is decoded once more with CHAIN tokens of it, in the final round's rows."""
    prompts = [[7, 8, 9, 10, 11] * 4, [5, 6, 5, 6, 20, 21]]
    tuned = autotune(tiny, prompts, {1: 1.0, 64: 2.0}, max_new_tokens=12, candidates=CANDIDATES[:1],
                     screen_tokens=6, finalists=1)
    final, chain = ([r for r in tuned.calibration if r["round"] == name] for name in ("final", "chain"))
    assert final[0]["prompt_lookup"] is None and len(chain) == 1
    assert {k: chain[0][k] for k in SHAPE} == {**{k: final[0][k] for k in SHAPE}, "prompt_lookup": CHAIN}
    assert tuned.params["prompt_lookup"] == keep_chain(final[0], chain[0])["prompt_lookup"]


def test_auto_decoder_tunes_once_and_stays_exact(tiny):
    prompt = [7, 8, 9, 10, 11] * 5
    dec = build_decoder("lookahead", auto=True)
    res = dec.generate(tiny, prompt, 20)
    assert dec.tuned is not None and tuple(getattr(dec, k) for k in SHAPE[:6]) in set(CANDIDATES)
    assert res.tokens == build_decoder("ar").generate(tiny, prompt, 20).tokens
    first = dec.tuned
    dec.generate(tiny, prompt, 5)
    assert dec.tuned is first  # not re-tuned per generation


def test_set_shape_takes_tuned_values_and_tolerates_older_records():
    dec = build_decoder("lookahead", pool_from_output=True)
    dec.set_shape({"W": 1, "N": 3, "G": 3, "text_ngram": 7, "step_tokens": 6, "pool_from_output": False})
    assert (dec.W, dec.N, dec.G, dec.text_ngram, dec.step_tokens) == (1, 3, 3, 7, 6)
    assert dec.pool_from_output  # the pool flags are the caller's
    dec.set_shape({"W": 2, "N": 4, "G": 2})  # a manifest written before text_ngram/step_tokens
    assert (dec.W, dec.N, dec.G, dec.text_ngram, dec.step_tokens, dec.prompt_lookup) == (2, 4, 2, None, None, None)
    assert dec.solo_root is False  # a record from before solo_root
    dec.set_shape({"W": 1, "N": 2, "G": 1, "text_ngram": 7, "step_tokens": 12, "prompt_lookup": 10})
    assert (dec.step_tokens, dec.prompt_lookup) == (12, 10)
    with pytest.raises(ValueError, match="step_tokens"):
        dec.set_shape({"W": 5, "N": 5, "G": 1, "text_ngram": None, "step_tokens": 6})  # W=5, N=5 need 22


def test_prediction_prices_every_step_on_the_curve():
    """Bimodal steps (1-2 tokens without a prompt-lookup match, 12 with one) are priced one by one:
    on a stepped curve the cost at the mean k would be far off."""
    curve = {1: 1.0, 2: 1.1, 10: 1.2, 12: 3.0}
    fed = [2, 2, 12, 12]
    assert predicted_speedup(10, fed, curve) == pytest.approx(10 * 1.0 / (1.1 + 1.1 + 3.0 + 3.0))
    assert predicted_speedup(10, fed, curve) != pytest.approx(10 / (4 * interp_latency(curve, 7)))


def test_autotune_prices_steps_at_the_calibration_cache_length(tiny):
    """Without a caller's curve the tuner measures one after as many cache entries as its calibration runs
    hold half-way (a step's attention grows with the cache: a short-cache curve undercharges large steps)."""
    prompts = [[7, 8, 9, 10, 11] * 5, [5, 6, 5, 6, 20, 21], [1, 2, 3]]
    assert calibration_cache_len(prompts, 16) == 6 + 8
    tuned = autotune(tiny, prompts, max_new_tokens=16, candidates=CANDIDATES[:3], screen_tokens=8, finalists=2)
    assert tuned.cache_len == 14 and sorted(tuned.curve) == sorted(LATENCY_KS)
    # its curve is the mean of snapshots spread over the calibration: one before screening, one after it, one after
    # each finalist
    assert len(tuned.snapshots) == 2 + 2 and tuned.curve == pytest.approx(mean_curve(tuned.snapshots))
    assert tuned.snapshots[0] != tuned.snapshots[1]  # measured apart, not one curve copied
    for row in tuned.calibration:  # screening priced at the mean of the first two, the final round at the mean of all
        at = mean_curve(tuned.snapshots[:2]) if row["round"] == "screen" else tuned.curve
        assert row["predicted"] == pytest.approx(predicted_speedup(row["new_tokens"], fed_list(row["fed"]), at))
    assert autotune(tiny, prompts, {1: 1.0, 64: 2.0}, max_new_tokens=8, candidates=CANDIDATES[:1],
                    screen_tokens=4, finalists=1).cache_len is None  # the caller's curve, as given


def test_autotune_with_a_corpus_keeps_the_calibration_answers(tiny):
    """pool_from_corpus: the calibration prompts' greedy answers become the corpus (each candidate drafts
    from the others'), and the tuned decoder keeps them."""
    from decoders.base import token_hash

    prompts = [[7, 8, 9, 10, 11] * 4, [5, 6, 5, 6, 20, 21], [30, 31, 32]]
    ar = build_decoder("ar")
    tuned = autotune(tiny, prompts, {1: 1.0, 64: 2.0}, max_new_tokens=12, candidates=CANDIDATES[-4:],
                     screen_tokens=6, finalists=2, pool_from_output=True, pool_context=True, pool_from_corpus=True)
    assert tuned.params["pool_from_corpus"] is True
    assert tuned.corpus == {token_hash(p): ar.generate(tiny, p, 12).tokens for p in prompts}
    dec = build_decoder("lookahead", auto=True, pool_from_corpus=True)
    dec.tune(tiny, prompts[:2], 12)
    assert dec.corpus == {token_hash(p): tuned.corpus[token_hash(p)] for p in prompts[:2]}
    assert dec.generate(tiny, prompts[2], 12).tokens == ar.generate(tiny, prompts[2], 12).tokens
    plain = autotune(tiny, prompts[:1], {1: 1.0, 64: 2.0}, max_new_tokens=6, candidates=CANDIDATES[-1:])
    assert plain.corpus == {} and plain.params["pool_from_corpus"] is False
