"""The shape oracle: each candidate's steps decoded once and exactly, priced at any curve as perf prices them,
and checked against the perf run it is compared with."""

from __future__ import annotations

import json

import pytest

from decoders import build_decoder
from decoders.autotune import CANDIDATES, CHAIN, choose, dear_curve, predicted_speedup
from decoders.base import token_hash
from decoders.lookahead import SHAPE, shape_label, shape_of
from harness.analysis.perf_names import auto_name
from harness.shape_oracle import AUTO_FLAGS, PLDS, compare_run, decode_steps, oracle_methods, price

PROMPTS = [[5, 9, 11, 7, 5, 9, 11, 20], [8, 8, 14, 30, 22, 8, 14]]
FLAT = {1: 0.010, 4: 0.011, 16: 0.013}  # a memory-bound curve: extra rows nearly free
STEEP = {1: 0.010, 4: 0.020, 16: 0.060}  # a compute-bound one


def test_oracle_methods_are_every_candidate_with_and_without_solo_root_and_the_pld_rows():
    methods = oracle_methods()
    chainless = [c for c in CANDIDATES if shape_of(c)["prompt_lookup"] is None]
    assert len(methods) == 2 * len(CANDIDATES) + 2 * len(chainless) + len(PLDS)
    twin = methods[shape_label({**shape_of(chainless[0]), "prompt_lookup": CHAIN})]  # the tuner's chain twin
    assert twin.prompt_lookup == CHAIN and twin.W == shape_of(chainless[0])["W"]
    only = [shape_label(shape_of(CANDIDATES[0])), shape_label({**shape_of(CANDIDATES[0]), "prompt_lookup": CHAIN})]
    assert list(oracle_methods(only)) == only + [name for name in methods if name.startswith("pld")]
    with pytest.raises(ValueError, match=r"not tuner shapes \(nor their twins\): \(9,9,9\)"):
        oracle_methods(["(9,9,9)"])
    la = methods[shape_label(dict(zip(SHAPE, CANDIDATES[0])))]
    assert all(getattr(la, flag) == value for flag, value in AUTO_FLAGS.items()) and not la.pool_from_corpus
    assert not la.solo_root and methods[shape_label({**dict(zip(SHAPE, CANDIDATES[0])), "solo_root": True})].solo_root


def test_decode_steps_histograms_price_as_perf_prices_the_step_list(tiny):
    shapes = [dict(zip(SHAPE, c)) for c in CANDIDATES[:2]]
    methods = {shape_label(s): build_decoder("lookahead", **s, **AUTO_FLAGS) for s in shapes}
    decoded = decode_steps(tiny, PROMPTS, 24, methods)
    hashes = [token_hash(p) for p in PROMPTS]
    for name, decoder in methods.items():
        runs = [decoder.generate(tiny, p, 24) for p in PROMPTS]
        tokens, fed = sum(len(r.tokens) for r in runs), [k for r in runs for k in r.input_tokens]
        for curve in (FLAT, STEEP):
            got = price(decoded[name], hashes, curve)
            assert got["roofline"] == pytest.approx(predicted_speedup(tokens, fed, curve))
            assert got["S"] == pytest.approx(tokens / len(fed)) and got["k_mean"] == pytest.approx(sum(fed) / len(fed))
        # one prompt alone prices that prompt's steps only
        assert price(decoded[name], hashes[:1], FLAT)["S"] == pytest.approx(len(runs[0].tokens) / runs[0].steps)


def test_decode_steps_refuses_a_method_that_is_not_exact(tiny):
    class Wrong:
        def generate(self, backend, ids, max_new_tokens):
            r = build_decoder("ar").generate(backend, ids, max_new_tokens)
            r.tokens = [(r.tokens[0] + 1) % 48, *r.tokens[1:]]
            return r

    with pytest.raises(RuntimeError, match="differs from ar"):
        decode_steps(tiny, PROMPTS, 8, {"wrong": Wrong()})


def _run(decoded, hashes, pick, curve, tuner_curve, measured=1.5, s_offset=0.0):
    s = price(decoded[shape_label(pick)], hashes, curve)["S"] + s_offset
    table = [{"method": "ar", "speedup": 1.0, "S": 1.0},
             {"method": auto_name(shape_label(pick), corpus=False), "speedup": measured, "S": s},
             {"method": auto_name(shape_label(pick), corpus=True), "speedup": measured + 0.1, "S": s}]
    return {"curve_s": {str(k): v for k, v in curve.items()}, "table": table,
            "tuned": {"params": {**pick, **AUTO_FLAGS}, "curve_s": {str(k): v for k, v in tuner_curve.items()}}}


def test_compare_run_ranks_at_the_rounds_curve_and_scales_the_measured_speedup(tiny):
    shapes = [dict(zip(SHAPE, c)) for c in (CANDIDATES[0], CANDIDATES[-1])]
    methods = {shape_label(s): build_decoder("lookahead", **s, **AUTO_FLAGS) for s in shapes}
    decoded = decode_steps(tiny, PROMPTS, 24, methods)
    hashes = [token_hash(p) for p in PROMPTS]
    rows, summary = compare_run(decoded, hashes, _run(decoded, hashes, shapes[1], STEEP, FLAT))
    assert [r["roofline"] for r in rows] == sorted((r["roofline"] for r in rows), reverse=True)
    pick = next(r for r in rows if r["auto_pick"])
    assert pick["method"] == shape_label(shapes[1]) and pick["estimated_speedup"] == pytest.approx(1.5)
    for r in rows:  # each priced at the rounds' curve, and at the tuner's beside it
        assert r["roofline"] == pytest.approx(price(decoded[r["method"]], hashes, STEEP)["roofline"])
        assert r["roofline_tuner_curve"] == pytest.approx(price(decoded[r["method"]], hashes, FLAT)["roofline"])
        assert r["estimated_speedup"] == pytest.approx(1.5 * r["roofline"] / pick["roofline"])
    assert "measured 1.50x" in summary and rows[0]["method"] in summary
    # the tuner's own rule, applied to every candidate on these prompts at the tuner's curve
    ruled = choose([{"m": n, "predicted": price(decoded[n], hashes, FLAT)["roofline"],
                     "predicted_dear": price(decoded[n], hashes, dear_curve(FLAT))["roofline"]} for n in decoded])
    assert [r["method"] for r in rows if r["tuner_rule_pick"]] == [ruled["m"]]
    assert f"at its curve: {ruled['m']}" in summary


def test_compare_run_prices_the_runs_prefill_into_every_roofline(tiny):
    """A run that recorded its prefill (perf's auto row, ``prefill_s``) has it priced on both sides of every
    roofline, as perf's own column does; the ranking stays the decode's (every method makes the same tokens, so
    (tokens * t(1) + p) / (steps' cost + p) orders them as their steps' cost does)."""
    shapes = [dict(zip(SHAPE, c)) for c in (CANDIDATES[0], CANDIDATES[-1])]
    methods = {shape_label(s): build_decoder("lookahead", **s, **AUTO_FLAGS) for s in shapes}
    decoded = decode_steps(tiny, PROMPTS, 24, methods)
    hashes = [token_hash(p) for p in PROMPTS]
    run = _run(decoded, hashes, shapes[1], STEEP, FLAT)
    plain, plain_summary = compare_run(decoded, hashes, run)
    run["table"][1]["prefill_s"] = 0.5
    rows, summary = compare_run(decoded, hashes, run)
    assert [r["method"] for r in rows] == [r["method"] for r in plain]
    for r in rows:
        assert r["roofline"] == pytest.approx(price(decoded[r["method"]], hashes, STEEP, 0.5)["roofline"])
        decode_only = next(p["roofline"] for p in plain if p["method"] == r["method"])
        assert abs(r["roofline"] - 1) < abs(decode_only - 1)  # prefill, common to both, pulls it toward 1
    assert "the run's prefill, 0.50 s" in summary and "no prefill (the run recorded none)" in plain_summary


def test_compare_run_refuses_other_prompts_or_steps(tiny):
    shape = dict(zip(SHAPE, CANDIDATES[0]))
    decoded = decode_steps(tiny, PROMPTS, 16, {shape_label(shape): build_decoder("lookahead", **shape, **AUTO_FLAGS)})
    hashes = [token_hash(p) for p in PROMPTS]
    with pytest.raises(ValueError, match="not the run's prompts"):
        compare_run(decoded, hashes, _run(decoded, hashes, shape, STEEP, FLAT, s_offset=0.01))
    run = _run(decoded, hashes, shape, STEEP, FLAT)
    run["tuned"]["params"] = {**dict(zip(SHAPE, CANDIDATES[1])), **AUTO_FLAGS}  # a pick this oracle did not decode
    with pytest.raises(ValueError, match="not among the decoded"):
        compare_run(decoded, hashes, run)


def test_cli_refuses_a_perf_file_of_another_task_or_length(tmp_path, capsys):
    from harness.shape_oracle import main

    perf = tmp_path / "perf.json"
    perf.write_text(json.dumps({"args": {"max_new_tokens": 256, "prompts": 4}, "runs": {"float32/mt_bench": {}}}))
    with pytest.raises(SystemExit):
        main(["--task", "humaneval", "--perf", str(perf)])
    assert "holds no float32/humaneval run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--task", "mt_bench", "--perf", str(perf), "--max-new-tokens", "128"])
    assert "ran 256 new tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # before any model is loaded
        main(["--task", "mt_bench", "--perf", str(perf), "--shapes", "(1,3,1)", "(9,9,9)"])
    assert "not tuner shapes (nor their twins): (9,9,9)" in capsys.readouterr().err


def test_calibration_regret_is_the_pick_s_loss_on_the_held_out_prompts():
    """Two shapes on four prompts: the small step wins on three, the large one, by far, on the fourth. A pick
    made on one prompt is judged on the other three, where the small step is best."""
    from itertools import combinations

    from harness.shape_oracle import calibration_regret, rule_pick

    small = {f"p{i}": {"tokens": 12, "fed": {2: 8}} for i in range(4)}
    large = {**{f"p{i}": {"tokens": 12, "fed": {16: 8}} for i in range(3)}, "p3": {"tokens": 12, "fed": {16: 1}}}
    decoded, hashes = {"(small)": small, "(large)": large}, ["p0", "p1", "p2", "p3"]
    curve = {1: 0.010, 2: 0.011, 16: 0.020}
    assert rule_pick(decoded, ["p0"], curve) == "(small)" and rule_pick(decoded, ["p3"], curve) == "(large)"
    exact = []
    for calibration in combinations(hashes, 1):
        rest = [h for h in hashes if h not in calibration]
        truth = {name: price(d, rest, curve)["roofline"] for name, d in decoded.items()}
        exact.append(1 - truth[rule_pick(decoded, list(calibration), curve)] / max(truth.values()))
    assert exact.count(0.0) == 3 and exact[3] > 0.3  # only the draw of p3 picks wrong
    loss, behind = calibration_regret(decoded, hashes, curve, curve, 1, draws=4000)
    assert loss == pytest.approx(sum(exact) / 4, rel=0.1) and behind == {}  # no pld row decoded
    assert calibration_regret(decoded, hashes[:3], curve, curve, 2, draws=50) == (0.0, {})
    # a pld row that beats the large step on p0-p2 but not the small one: behind it only where p3 was drawn
    decoded["pld(3,10)"] = {f"p{i}": {"tokens": 12, "fed": {2: 9}} for i in range(4)}
    loss_with_pld, behind = calibration_regret(decoded, hashes, curve, curve, 1, draws=4000)
    assert loss_with_pld == loss  # the loss is against the best lookahead shape, pld rows aside
    assert behind["pld(3,10)"] == pytest.approx(0.25, abs=0.03)


def test_rule_pick_tries_the_picks_chain_twin_as_the_tuner_does():
    """A chain twin is never ranked among the candidates; it replaces its chainless pick where near-tied at the
    dear curve (``keep_chain``), as the tuner's extra final-round run does."""
    from harness.shape_oracle import rule_pick

    plain = shape_label(shape_of(CANDIDATES[0]))
    twin = shape_label({**shape_of(CANDIDATES[0]), "prompt_lookup": CHAIN})
    curve = {1: 1.0, 4: 1.1, 16: 1.5}
    decoded = {plain: {"p": {"tokens": 12, "fed": {4: 8}}}, twin: {"p": {"tokens": 12, "fed": {4: 6, 11: 1}}}}
    assert rule_pick(decoded, ["p"], curve) == twin
    decoded[twin] = {"p": {"tokens": 12, "fed": {4: 8, 11: 2}}}  # its chain's steps too dear: no tie
    assert rule_pick(decoded, ["p"], curve) == plain
    del decoded[twin]  # not decoded: the pick stands
    assert rule_pick(decoded, ["p"], curve) == plain
