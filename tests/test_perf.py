"""The benchmark's arithmetic (speedups, S, roofline, overhead) on hand-made rows, and its options."""

from __future__ import annotations

import argparse

import pytest

from decoders.autotune import predicted_speedup
from decoders.base import token_hash
from decoders.latency import median_curve
from decoders.lookahead import shape_label
from harness.analysis.curves import ar_steps_line, curve_line, regime_line, snapshots_line
from harness.cli_args import parse_pld, parse_shape, positive_int
from harness.perf import format_table, free_stem, median_rounds, summarize

CURVE = {1: 0.010, 4: 0.020, 8: 0.030}  # seconds per forward of k tokens


def _ours(prompt, tokens, total_s, inputs, forward_s, prefill_s=0.0):
    return {"prompt": prompt, "new_tokens": len(tokens), "output_hash": token_hash(tokens), "total_s": total_s,
            "decode_s": total_s - prefill_s, "prefill_s": prefill_s, "steps": len(inputs), "input_tokens": inputs,
            "forward_s": forward_s}


def test_summarize_speedup_S_roofline_and_overhead():
    toks = list(range(8))
    rows = [
        {"method": "ar", **_ours(0, toks, 0.080, [1] * 8, 0.080)},
        # 8 tokens in 2 steps of 4 fed tokens each: S 4, roofline 8 * t(1) / (2 * t(4)) = 2
        {"method": "la", **_ours(0, toks, 0.050, [4, 4], 0.045)},
        {"method": "hf", "prompt": 0, "new_tokens": 8, "output_hash": token_hash(toks[:7] + [99]),
         "total_s": 0.160},  # no step counts
    ]
    table = {r["method"]: r for r in summarize(rows, CURVE)}
    la = table["la"]
    assert la["speedup"] == pytest.approx(0.080 / 0.050) and la["S"] == 4 and la["k_mean"] == 4
    assert la["roofline"] == pytest.approx(2.0) and la["of_roofline"] == pytest.approx(1.6 / 2.0)
    assert la["overhead"] == pytest.approx(0.1) and la["exact"] == 1
    assert table["hf"]["speedup"] == pytest.approx(0.5) and table["hf"]["exact"] == 0 and "S" not in table["hf"]
    assert "| la |" in format_table(list(table.values()))


def test_roofline_counts_prefill_on_both_sides_as_the_speedup_does():
    """The speedup is on total time, prefill included, so the roofline prices the same prefill into both
    decoders: a decode at its curve then reads 1.0 of it, not less by prefill's share."""
    toks = list(range(8))
    rows = [  # prefill 0.04 s each; la's 2 steps at t(4) = 0.02 s cost exactly the curve
        {"method": "ar", **_ours(0, toks, 0.080 + 0.040, [1] * 8, 0.080, prefill_s=0.040)},
        {"method": "la", **_ours(0, toks, 0.040 + 0.040, [4, 4], 0.040, prefill_s=0.040)},
    ]
    table = {r["method"]: r for r in summarize(rows, CURVE)}
    la = table["la"]
    assert la["speedup"] == pytest.approx(0.120 / 0.080)
    assert la["roofline"] == pytest.approx((0.080 + 0.040) / (0.040 + 0.040))
    assert la["of_roofline"] == pytest.approx(1.0)
    assert la["prefill"] == pytest.approx(0.5) and la["prefill_s"] == pytest.approx(0.040)
    assert table["ar"]["roofline"] == pytest.approx(1.0) and table["ar"]["prefill"] == pytest.approx(0.040 / 0.120)
    # decode-only pricing would have put this decode at 0.75 of a 2x roofline
    assert la["speedup"] / predicted_speedup(8, [4, 4], CURVE) == pytest.approx(0.75)


def test_roofline_curve_is_each_sizes_median_over_the_rounds():
    """The curve perf prices steps at: per step size, the median of the curves measured after each round."""
    rounds = [{1: 0.010, 4: 0.030}, {1: 0.014, 4: 0.020}, {1: 0.012, 4: 0.024}]
    assert median_curve(rounds) == {1: 0.012, 4: 0.024}
    assert curve_line(median_curve(rounds)) == "t(1)=12ms  t(4)=24ms"
    assert curve_line(CURVE, (1, 8)) == "t(1)=10ms  t(8)=30ms"


def test_median_rounds_takes_each_timing_median_per_method_and_prompt():
    toks = list(range(8))
    rows = [{"method": m, "round": r, **_ours(p, toks, t, [1] * 8, t * 0.9)}
            for m, p, r, t in [("ar", 0, 0, 0.08), ("ar", 0, 1, 0.20), ("ar", 0, 2, 0.10),
                               ("la", 0, 0, 0.05), ("la", 0, 1, 0.04), ("la", 0, 2, 0.30),
                               ("ar", 1, 0, 0.07)]]
    merged = {(r["method"], r["prompt"]): r for r in median_rounds(rows)}
    assert len(merged) == 3 and "round" not in merged[("ar", 0)]
    assert merged[("ar", 0)]["total_s"] == 0.10 and merged[("ar", 0)]["forward_s"] == pytest.approx(0.09)
    assert merged[("la", 0)]["total_s"] == 0.05 and merged[("la", 0)]["rounds"] == 3
    assert merged[("ar", 1)]["total_s"] == 0.07 and merged[("ar", 1)]["rounds"] == 1
    table = {r["method"]: r for r in summarize(median_rounds(rows), CURVE)}
    assert table["la"]["speedup"] == pytest.approx(0.10 / 0.05)  # against ar's median on the same prompt


def test_parse_shape_and_label():
    assert parse_shape("1,5,1") == {"W": 1, "N": 5, "G": 1, "text_ngram": None, "step_tokens": None,
                                    "prompt_lookup": None, "solo_root": False}
    full = parse_shape("1,3,3,7,6")
    assert full == {"W": 1, "N": 3, "G": 3, "text_ngram": 7, "step_tokens": 6, "prompt_lookup": None,
                    "solo_root": False}
    assert shape_label(full) == "(1,3,3,t7,cap6)" and shape_label(parse_shape("1,5,1")) == "(1,5,1)"
    lookup = parse_shape("1,2,1,7,0,10")  # 0: unset
    assert (lookup["step_tokens"], lookup["prompt_lookup"]) == (None, 10) and shape_label(lookup) == "(1,2,1,t7,pl10)"
    assert shape_label({**lookup, "solo_root": True}) == "(1,2,1,t7,pl10,solo)"
    for bad in ("1,5", "a,b,c", "1,5,1,2,3,4,5", "1,-5,1"):
        with pytest.raises(argparse.ArgumentTypeError, match="W,N,G"):
            parse_shape(bad)
    assert parse_pld("6,10") == (6, 10, False) and parse_pld("6,10,recent") == (6, 10, True)
    assert positive_int("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match=">= 1"):
        positive_int("0")
    for bad in ("6", "6,10,1", "0,10", "a,10", "6,10,latest", "6,recent"):
        with pytest.raises(argparse.ArgumentTypeError, match="MAX_NGRAM,NUM_PRED"):
            parse_pld(bad)


@pytest.mark.parametrize("argv", [["--pld", "3,10"], ["--pld", "6,10", "6,10"], ["--pld", "6,10,recent", "6,10,recent"],
                                  ["--lookahead", "1,2,1", "1,2,1,0"],
                                  ["--dtype", "float32", "float32"]])
def test_repeated_settings_are_refused_before_any_work(argv, capsys):
    from harness.perf import main

    with pytest.raises(SystemExit) as exc:
        main([*argv, "--tasks"])
    assert exc.value.code == 2 and "given twice" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--prompts", "--max-new-tokens", "--calibration-prompts", "--rounds"])
def test_zero_counts_are_refused_before_any_work(option, capsys):
    from harness.perf import main

    with pytest.raises(SystemExit) as exc:
        main([option, "0", "--tasks"])
    assert exc.value.code == 2 and "expected an integer >= 1, got '0'" in capsys.readouterr().err


def test_memory_rounds_time_the_probe_t1_and_matmuls_together():
    """Bandwidth, t(1) and the forward's 1-row matmuls alone come from the same interleaved rounds, per
    backend, and the memory line splits t(1) with them."""
    from harness.memory_bound import memory_floor_line, memory_rounds
    from tests.tiny import tiny_backend

    backends = {"a": tiny_backend(0), "b": tiny_backend(1)}
    assert len(backends["a"].projections()) == backends["a"].shape.n_layers * 4 + 1
    mem = memory_rounds(backends, cache_len=8, reps=5)
    t1s, matmuls = mem.t1, mem.matmuls
    assert mem.bandwidth > 1e8 and set(t1s) == set(matmuls) == set(mem.t1_rounds) == {"a", "b"}
    assert all(0 < matmuls[k] < t1s[k] < 1 for k in backends)  # a forward is its matmuls and more
    assert all(len(mem.t1_rounds[k]) == 5 and sorted(mem.t1_rounds[k])[2] == t1s[k] for k in backends)
    line = memory_floor_line(backends["a"], t1s["a"], bandwidth=1e10, matmul_s=matmuls["a"])
    assert "its matmuls alone" in line and f"the rest {(t1s['a'] - matmuls['a']) * 1e3:.1f} ms" in line
    # where greedy steps screen the LM head, a step reading the whole head is timed in the same rounds
    assert set(mem.t1_whole_head) == {k for k, b in backends.items() if b.head_screen is not None}
    if "a" in mem.t1_whole_head:
        line = memory_floor_line(backends["a"], t1s["a"], 1e10, matmuls["a"], mem.t1_whole_head["a"])
        assert "a step reading the whole float32 head" in line


def test_t1_ratio_pairs_the_rounds():
    """The bf16w / float32 ratio is taken within each round, then summarised: a slow round slows both of
    its pair, so the ratio of medians (here 1.0) is not what the rounds say (1.5, quartiles 1/3-2)."""
    from harness.memory_bound import MemoryRounds

    mem = MemoryRounds(1e9, {}, {"a": [1.0, 2.0, 3.0], "b": [3.0, 1.0, 2.0]}, {})
    median, q1, q3 = mem.t1_ratio("a", "b")
    assert median == pytest.approx(1.5) and q1 == pytest.approx(1 / 3) and q3 == pytest.approx(2.0)
    assert mem.t1_ratio("a", "a") == (1.0, 1.0, 1.0)


def test_round_robin_interleaves_calls_and_skips_the_warm_up():
    """The one interleaved timer (perf's matmul split, kernels.bench, bench_attention)."""
    from harness.runtime.matmul import round_robin

    order: list[str] = []
    times = round_robin({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, reps=3, warmup=2)
    assert order == ["a", "b"] * 5  # every round calls each once, in turn
    assert set(times) == {"a", "b"} and all(0 <= t < 1 for t in times.values())


def test_steps_by_size_groups_steps_and_adds_up_to_the_roofline():
    """Each step size's yield per t(1), and the groups' totals give back the roofline perf prints
    (tokens x t(1) / sum of t(k)), so the table explains that figure rather than a different one."""
    from decoders.autotune import predicted_speedup
    from harness.analysis.steps import steps_by_size

    runs = [{"accepted": [1, 1, 3], "input_tokens": [3, 3, 11]}, {"accepted": [2], "input_tokens": [6]}]
    curve = {1: 1.0, 3: 1.1, 6: 1.3, 11: 1.6}
    table = steps_by_size(runs, lambda k: curve[k] / curve[1]).set_index("k")
    assert list(table.index) == [3, 6, 11] and list(table["steps"]) == [2, 1, 1]
    assert table.loc[3, "tokens_per_step"] == 1.0 and table.loc[3, "tokens_per_t1"] == pytest.approx(1 / 1.1)
    assert table.loc[11, "tokens_per_t1"] == pytest.approx(3 / 1.6) and table.loc[6, "cost"] == pytest.approx(1.3)
    assert table["step_share"].sum() == pytest.approx(1) and table["time_share"].sum() == pytest.approx(1)
    assert table.loc[11, "token_share"] == pytest.approx(3 / 7)
    tokens, time = (table["tokens_per_step"] * table["steps"]).sum(), (table["cost"] * table["steps"]).sum()
    assert tokens / time == pytest.approx(predicted_speedup(7, [3, 3, 11, 6], curve))
    with pytest.raises(ValueError):  # a step's accepted count without its size
        steps_by_size([{"accepted": [1, 2], "input_tokens": [3]}], lambda k: 1.0)
    with pytest.raises(ValueError, match="no steps"):
        steps_by_size([], lambda k: 1.0)


def test_task_prompts_spread_over_the_task_and_hold_out_neighbours():
    """MT-Bench lists its questions ten per category: four measured prompts come from four categories, and
    each held-out prompt is the question after a measured one; a prompt over the length limit gives way."""
    from harness.perf import task_prompts
    from tasks import build_task
    from tasks.data import SHARED_DATA_DIR

    docs = [ex.doc for ex in build_task("mt_bench", data_dir=str(SHARED_DATA_DIR), limit=None).examples()]

    class ByQuestion:  # a tokenizer stand-in: as many ids as characters, each the question's id
        chat_template = None

        def __call__(self, text, **kw):
            return {"input_ids": [next(d["question_id"] for d in docs if d["turns"][0] in text)] * len(text)}

    category = {d["question_id"]: d["category"] for d in docs}
    measured, held = task_prompts("mt_bench", 4, 3, str(SHARED_DATA_DIR), ByQuestion(), max_prompt=10**6)
    assert [p[0] for p in measured] == [81, 101, 121, 141] and len({category[p[0]] for p in measured}) == 4
    assert [p[0] for p in held] == [82, 102, 122]
    limit = len(measured[1]) - 1  # question 101 is one token too long
    measured, held = task_prompts("mt_bench", 4, 0, str(SHARED_DATA_DIR), ByQuestion(), max_prompt=limit)
    assert measured[1][0] > 101 and all(len(p) <= limit for p in measured) and len(measured) == 4 and not held


def test_generate_full_length_runs_past_eos_and_takes_the_model_given():
    """bf16w's extra baseline: transformers on a bfloat16 copy, timed over max_new tokens even where its
    text ends sooner; the copy leaves the backend's float32 model as it was."""
    from types import SimpleNamespace

    import torch

    from harness.perf_methods import hf_bfloat16, transformers_generate
    from tiny import TINY_EOS, tiny_model

    backend = SimpleNamespace(model=tiny_model(), device="cpu", tokenizer=SimpleNamespace(eos_token_id=TINY_EOS),
                              sync=lambda: None)
    ids = [32, 6, 34]  # the tiny model's greedy text ends (EOS) after 2 tokens
    assert transformers_generate(backend)(ids, 32)["new_tokens"] < 32
    assert transformers_generate(backend, full_length=True)(ids, 32)["new_tokens"] == 32
    copy16 = hf_bfloat16(backend)
    assert copy16.dtype == torch.bfloat16 and backend.model.dtype == torch.float32
    assert transformers_generate(backend, copy16, full_length=True)(ids, 32)["new_tokens"] == 32


def test_a_second_run_into_one_folder_never_overwrites_the_first(tmp_path):
    assert free_stem(tmp_path, "perf-float32-humaneval") == "perf-float32-humaneval"
    (tmp_path / "perf-float32-humaneval.json").write_text("{}")
    assert free_stem(tmp_path, "perf-float32-humaneval") == "perf-float32-humaneval-2"
    (tmp_path / "perf-float32-humaneval-2.md").write_text("")  # either file of a run holds its name
    assert free_stem(tmp_path, "perf-float32-humaneval") == "perf-float32-humaneval-3"
    assert free_stem(tmp_path, "perf-bf16w-humaneval") == "perf-bf16w-humaneval"


def test_regime_line_flags_a_tuner_curve_from_another_memory_speed():
    """The twenty-eighth run's 16 HumanEval prompts: priced at t(1) 17.6 ms, run at 11.6 ms."""
    slow, fast = {1: 0.0176, 6: 0.020}, {1: 0.0116, 6: 0.0152}
    assert regime_line(slow, fast) == ("the tuner priced steps at t(1) 17.6 ms, the rounds ran at 11.6 ms: memory "
                                       "changed speed between them (1.52x), so its pick was priced for another regime")
    assert "another regime" in regime_line(fast, slow)  # either way round
    assert regime_line({1: 0.012}, {1: 0.0116}) == "the tuner priced steps at t(1) 12.0 ms, the rounds ran at 11.6 ms"


def test_ar_steps_line_flags_rounds_at_another_memory_speed_than_the_curves_after_them():
    assert ar_steps_line(0.0123, {1: 0.0121}) == ("ar's own forwards took 12.3 ms (t(1) 12.1 ms in the curves after "
                                                  "the rounds)")
    slow = ar_steps_line(0.0161, {1: 0.0121})
    assert "another memory speed than those curves (1.33x)" in slow and "over 1 where ar ran slower" in slow
    assert "another memory speed" in ar_steps_line(0.0100, {1: 0.0121})  # either way round


def test_snapshots_line_gives_the_spread_of_the_tuners_curves():
    snaps = [{1: 0.0172, 8: 0.02}, {1: 0.011, 8: 0.02}, {1: 0.0115, 8: 0.021}]
    assert snapshots_line(snaps) == "3 curves (t(1) 11.0-17.2 ms)"
    assert snapshots_line([]) == "the caller's curve"


def test_op_rounds_split_each_step_and_compare_modes():
    """op_rounds: per backend, seconds a step spends in each operation (clocks inside the kernel), the unclocked
    rest and the whole, which they add up to; the clocks are off afterwards. op_line prints them and, against
    another mode, the ratio the step would reach were its layers' matmuls exactly half of that mode's."""
    from harness.memory_bound import LAYER_MATMULS, op_line, op_rounds
    from tests.tiny import tiny_backend

    backends = {"a": tiny_backend(0), "b": tiny_backend(1), "torch": tiny_backend(2, attn="sdpa")}
    ops = op_rounds(backends, cache_len=8, reps=5)
    assert set(ops) == {"a", "b"}  # no clocks where the forward is not one kernel call
    for key in ops:
        assert all(ops[key][name] > 0 for name in (*LAYER_MATMULS, "head", "attention", "unclocked"))
        parts = sum(s for name, s in ops[key].items() if name != "step")
        assert parts == pytest.approx(ops[key]["step"], rel=1e-9)
        assert set(backends[key].op_seconds().values()) == {0}  # off again
    line = op_line(ops["b"], ops["a"], "a")
    a, b = ops["a"], ops["b"]
    half = (0.5 * sum(a[n] for n in LAYER_MATMULS) + b["step"] - sum(b[n] for n in LAYER_MATMULS)) / a["step"]
    assert line.startswith("t(1) by operation") and f"the step would be {half:.3f}x" in line
    assert "against" not in op_line(ops["a"])
