"""harness.perf_summary: saved perf results recomputed against the CPU targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import perf_summary
from harness.analysis.perf_targets import figures, meets, render, summary

ROOT = Path(__file__).resolve().parents[1]


def table(*rows: tuple[str, float]) -> list[dict]:
    return [{"method": m, "prompts": 4, "speedup": s} for m, s in rows]


def report(bandwidth: float = 2.75e10) -> dict:
    """A perf JSON as harness.perf writes it: memory runs of both modes and two float32 tasks."""
    return {
        "read_bandwidth_Bps": bandwidth,
        "runs": {
            "float32/memory": {"t1_s": 0.022, "step_weight_bytes": 5.5e8, "matmul_path": "kernel"},
            "bf16w/memory": {"t1_s": 0.012, "step_weight_bytes": 2.75e8, "matmul_path": "kernel"},
            "float32/humaneval": {"table": table(
                ("ar", 1.0), ("transformers greedy", 0.5), ("pld(max_ngram=3,num_pred=10)", 1.5),
                ("pld(max_ngram=6,num_pred=10)", 1.6), ("pld(max_ngram=6,num_pred=10,recent=True)", 1.75),
                ("lookahead auto(1,2,1,t7,cap6,pl5)+pools", 1.7),
                ("lookahead auto(1,2,1,t7,cap6,pl5)+pools+corpus", 1.9),
                ("lookahead window pool only(1,2,1,t7,cap6)", 1.2))},
            "float32/mt_bench": {"table": table(
                ("ar", 1.0), ("transformers greedy", 0.4), ("pld(max_ngram=3,num_pred=10)", 1.3),
                ("lookahead auto(1,2,3,t7,cap6)+pools", 1.4), ("lookahead auto(1,2,3,t7,cap6)+pools+corpus", 1.45))},
        },
    }


def test_figures_are_recomputed_from_the_report():
    f = figures(report(), "float32")
    assert f["GB/s"] == pytest.approx(27.5)
    assert f["t1/floor"] == pytest.approx(0.022 / 0.02)
    assert f["humaneval la/ar"] == 1.7 and f["humaneval +corpus"] == 1.9
    assert f["mt_bench la/ar"] == 1.4 and f["mt_bench +corpus"] == 1.45
    # the smallest over tasks and pld settings, of the lookahead without the corpus
    assert f["la/pld"] == pytest.approx(1.7 / 1.6) and f["la/pld task"] == "humaneval"
    # the recency rule's pld is shown apart (no target): the published rule's is the one the target names
    assert f["la/pld recent"] == pytest.approx(1.7 / 1.75) and f["la/pld recent task"] == "humaneval"
    assert f["ar/generate"] == pytest.approx(2.0) and f["ar/generate task"] == "humaneval"
    assert f["prompts"] == "4"
    b = figures(report(), "bf16w")
    assert b["bf16w/fp32"] == pytest.approx(0.012 / 0.022)
    assert b["t1/floor"] == pytest.approx(0.012 / 0.01)
    assert "humaneval la/ar" not in b and "la/pld" not in b and "la/pld recent" not in b
    assert "screen" not in f and "screen" not in b  # a file from before the LM head's screen


def test_screened_head_is_shown_against_the_whole_head():
    """float32's greedy t(1) over its whole-head step, and bf16w's t(1) over that step: no target."""
    r = report()
    r["runs"]["float32/memory"]["t1_whole_head_s"] = 0.024
    assert figures(r, "float32")["screen"] == pytest.approx(0.022 / 0.024)
    assert figures(r, "bf16w")["screen"] == pytest.approx(0.012 / 0.024)
    assert figures(r, "bf16w")["bf16w/fp32"] == pytest.approx(0.012 / 0.022)  # the greedy steps: the target's


def test_the_names_perf_writes_are_the_stored_ones_and_the_targets_find_them():
    """perf builds its row names and perf_targets matches them from one module (harness.analysis.perf_names); the
    stored results hold the names as they were written, so the builders must keep writing exactly those."""
    from harness.analysis.compare import REFERENCE
    from harness.analysis.perf_names import GENERATE, auto_name, pld_name

    assert pld_name(6, 10, False) == "pld(max_ngram=6,num_pred=10)"
    assert pld_name(6, 10, True) == "pld(max_ngram=6,num_pred=10,recent=True)"
    assert auto_name("(1,2,1,t7,cap6,pl5)", corpus=False) == "lookahead auto(1,2,1,t7,cap6,pl5)+pools"
    assert auto_name("(1,2,1,t7,cap6,pl5)", corpus=True) == "lookahead auto(1,2,1,t7,cap6,pl5)+pools+corpus"
    built = {"read_bandwidth_Bps": 2.75e10, "runs": {"float32/humaneval": {"table": table(
        (REFERENCE, 1.0), (GENERATE, 0.5), (pld_name(3, 10, False), 1.5), (pld_name(6, 10, True), 1.8),
        (auto_name("(1,2,1,t7)", corpus=False), 1.7), (auto_name("(1,2,1,t7)", corpus=True), 1.9))}}}
    f = figures(built, "float32")
    assert (f["humaneval la/ar"], f["humaneval +corpus"]) == (1.7, 1.9)
    assert f["la/pld"] == pytest.approx(1.7 / 1.5) and f["la/pld recent"] == pytest.approx(1.7 / 1.8)
    assert f["ar/generate"] == pytest.approx(2.0)


def test_old_reports_take_t1_from_the_curve_and_lack_what_they_lack():
    old = {"runs": {"float32/memory": {"curve_s": {"1": 0.03, "2": 0.031}, "step_weight_bytes": 5.5e8}}}
    assert figures(old, "float32") == {}  # no bandwidth: no floor
    old["read_bandwidth_Bps"] = 2.75e10
    assert figures(old, "float32")["t1/floor"] == pytest.approx(1.5)


def write(folder: Path, name: str, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data))
    return folder / name


def test_verdicts_follow_the_isa_of_the_results_folder(tmp_path):
    write(tmp_path / "m" / "avx512", "perf-float32-bf16w.json", report())
    write(tmp_path / "m" / "avx2", "perf-float32-bf16w.json", report())
    write(tmp_path / "m" / "library", "perf-float32-bf16w.json", report())
    (tmp_path / "m" / "avx2" / "notes.json").write_text("{}")  # not a perf file: skipped
    df = summary([tmp_path], base=tmp_path)
    assert list(df["run"].unique()) == [f"m/{p}/perf-float32-bf16w.json" for p in ("avx2", "avx512", "library")]
    rows = {(r["path"], r["dtype"]): r for _, r in df.iterrows()}
    # HumanEval 1.7x: short of AVX-512's 1.8, past AVX2's 1.6
    assert not meets(rows["avx512", "float32"], "humaneval la/ar")
    assert meets(rows["avx2", "float32"], "humaneval la/ar")
    assert meets(rows["avx512", "float32"], "humaneval +corpus")
    assert meets(rows["avx512", "float32"], "t1/floor") and meets(rows["avx512", "float32"], "ar/generate")
    # bf16w: its t(1) ratio is judged, its speedups and floor are not (the targets are float32's)
    assert meets(rows["avx2", "bf16w"], "bf16w/fp32") and not meets(rows["avx2", "bf16w"], "t1/floor")
    # a library path gets no verdict at all
    assert not any(meets(rows["library", "float32"], c) for c in ("t1/floor", "humaneval +corpus"))
    text = render(df)
    assert "| m/avx2/perf-float32-bf16w.json | avx2 | float32 | 27.5 | 4 | **1.10** |" in text
    assert "| m/avx512/perf-float32-bf16w.json | avx512 | float32 | 27.5 | 4 | **1.10** | — | 1.70 | **1.90** |" in text
    assert "| **2.00** | 0.971 |" in text  # ar/generate, then la/pld recent: never bold, it has no target


def test_cli_writes_the_table_and_refuses_missing_input(tmp_path, capsys):
    write(tmp_path / "r" / "avx2", "perf-float32.json", report())
    out = tmp_path / "SUMMARY.md"
    assert perf_summary.main([str(tmp_path / "r"), "--out", str(out)]) == 0
    assert out.read_text().strip() == capsys.readouterr().out.strip()
    assert "| avx2/perf-float32.json | avx2 | float32 |" in out.read_text()
    assert perf_summary.main([str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert perf_summary.main([str(tmp_path / "empty")]) == 2
    assert "run `python -m harness.perf` first" in capsys.readouterr().err


def test_stored_summary_is_the_commands_output(capsys):
    """results/perf/SUMMARY.md must be regenerated when a perf result is added (every stored file parses)."""
    stored = ROOT / "results" / "perf" / "SUMMARY.md"
    assert perf_summary.main([str(ROOT / "results" / "perf")]) == 0
    printed = capsys.readouterr().out.replace(str(ROOT / "results" / "perf"), "results/perf")
    expected = stored.read_text(encoding="utf-8").strip().replace("--out results/perf/SUMMARY.md", "--out FILE")
    assert printed.strip() == expected
