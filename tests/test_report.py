"""Report numbers against values worked out by hand from a tiny records set."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.records import RecordWriter, load_records
from harness.analysis.report import build_report, missing_baseline_note, render_report
from harness.analysis.uncertainty import add_report_cis, resample_weights
from harness.report import main

FIXTURE = Path(__file__).parent / "fixtures" / "results"
LA = {"W": 5, "N": 3, "G": 5, "pool_from_prompt": False}
LA_LABEL = "lookahead(W=5,N=3,G=5,pool_from_prompt=False)"


def rec(decoder: str, ex: str, new: int | None, accepted: list[int] | None, decode_s: float | None,
        out_hash: str | None, model: str = "m", temperature: float = 0.0, status: str = "ok", **over) -> dict:
    return {
        "task": "t", "example_id": ex, "turn": 0, "model": model, "dtype": "float32", "device": "cpu",
        "decoder": decoder, "params": LA if decoder == "lookahead" else {}, "seed": 0,
        "temperature": temperature, "top_k": 0, "top_p": 1.0, "max_new_tokens": 32, "status": status,
        "prompt_tokens": 5, "new_tokens": new, "steps": None if accepted is None else len(accepted),
        "accepted": accepted, "input_tokens": None if accepted is None else [1] * len(accepted),
        "flops": None, "prefill_flops": None, "prefill_s": 0.01, "decode_s": decode_s,
        "stop_reason": "eos", "text": "", "output_hash": out_hash, "scores": {"acc": 1.0}, **over,
    }


def write(root: Path, name: str, records: list[dict]) -> None:
    with RecordWriter(root / name) as w:
        for r in records:
            w.write(r)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """ar on p0, p1; lookahead on p0, p1 (hash differs on p1), p3 (no ar), p2 skipped."""
    write(tmp_path, "ar", [
        rec("ar", "p0", 10, [1] * 10, 1.0, "a0"),
        rec("ar", "p1", 20, [1] * 20, 2.0, "a1"),
    ])
    write(tmp_path, "la", [
        rec("lookahead", "p0", 10, [2] * 5, 0.5, "a0"),
        rec("lookahead", "p1", 20, [4, 3, 3, 2, 2, 2, 2, 2], 1.6, "DIFFERENT"),
        rec("lookahead", "p2", None, None, None, None, status="skipped"),
        rec("lookahead", "p3", 6, [2, 2, 2], 0.3, "a3"),
    ])
    return tmp_path


def row(report: pd.DataFrame, config: str, **where) -> pd.Series:
    sel = report["config"] == config
    for k, v in where.items():
        sel &= report[k] == v
    assert sel.sum() == 1
    return report[sel].iloc[0]


def test_numbers_by_hand(tiny: Path) -> None:
    r = row(build_report(load_records(tiny)), LA_LABEL)
    assert r["prompts"] == 3 and r["skipped"] == 1 and r["matched"] == 2
    assert r["S"] == pytest.approx(36 / 16)               # (10+20+6) tokens / (5+8+3) steps
    assert r["tau"] == pytest.approx((2 + 2.5 + 2) / 3)   # per-prompt means, averaged
    assert r["mean_new_tokens"] == pytest.approx(12)
    assert r["tok_per_s"] == pytest.approx(36 / 2.4)
    assert r["speedup_mean"] == pytest.approx((1.0 / 0.5 + 2.0 / 1.6) / 2)  # 1.625, matched prompts only
    assert r["speedup_agg"] == pytest.approx((1.0 + 2.0) / (0.5 + 1.6))     # 1.4286, matched prompts only
    assert r["exact_match"] == pytest.approx(0.5)
    assert r["score_acc"] == pytest.approx(1.0)


def test_cis_by_hand(tiny: Path) -> None:
    """S's CI resamples the 3 prompts and recomputes sum tokens / sum steps; speedup's, the 2 matched ones."""
    df = load_records(tiny)
    r = row(add_report_cis(df, build_report(df), n_resamples=400, seed=5), LA_LABEL)
    w = resample_weights(3, 400, seed=5)  # examples p0, p1, p3 in sorted order
    s = (w @ np.array([10.0, 20.0, 6.0])) / (w @ np.array([5.0, 8.0, 3.0]))
    assert (r["S_lo"], r["S_hi"]) == pytest.approx(tuple(np.percentile(s, [2.5, 97.5])))
    w = resample_weights(2, 400, seed=5)  # p0, p1 have an ar record
    sp = (w @ np.array([1.0, 2.0])) / (w @ np.array([0.5, 1.6]))
    assert (r["speedup_agg_lo"], r["speedup_agg_hi"]) == pytest.approx(tuple(np.percentile(sp, [2.5, 97.5])))
    assert r["S_lo"] <= r["S"] <= r["S_hi"] and r["speedup_agg_lo"] <= r["speedup_agg"] <= r["speedup_agg_hi"]


def test_turns_are_resampled_with_their_example(tiny: Path) -> None:
    """Two turns of one example are one unit: S's CI is that of the per-example sums."""
    write(tiny, "turns", [rec("lookahead", "q", 10, [2] * 5, 0.5, "x", turn=t, task="u") for t in (0, 1)]
          + [rec("lookahead", "r", 9, [3] * 3, 0.5, "y", turn=t, task="u") for t in (0, 1)])
    df = load_records(tiny)
    r = row(add_report_cis(df, build_report(df), n_resamples=400), LA_LABEL, task="u")
    w = resample_weights(2, 400)
    s = (w @ np.array([20.0, 18.0])) / (w @ np.array([10.0, 6.0]))
    assert (r["S_lo"], r["S_hi"]) == pytest.approx(tuple(np.percentile(s, [2.5, 97.5])))


def test_ar_row_is_its_own_baseline(tiny: Path) -> None:
    r = row(build_report(load_records(tiny)), "ar")
    assert (r["S"], r["tau"], r["speedup_mean"], r["speedup_agg"], r["exact_match"]) == (1, 1, 1, 1, 1)


def test_sampling_runs_do_not_match_greedy_ar(tiny: Path) -> None:
    write(tiny, "la_t1", [rec("lookahead", "p0", 10, [2] * 5, 0.5, "a0", temperature=1.0)])
    report = build_report(load_records(tiny))
    r = row(report, LA_LABEL, temperature=1.0)
    assert r["matched"] == 0 and math.isnan(r["speedup_agg"]) and math.isnan(r["exact_match"])
    assert "decoder=ar" in missing_baseline_note(report)


def test_missing_baseline_is_nan_with_one_note(tmp_path: Path, capsys) -> None:
    write(tmp_path, "la", [rec("lookahead", "p0", 10, [2] * 5, 0.5, "a0")])
    report = build_report(load_records(tmp_path))
    assert report["speedup_mean"].isna().all() and report["exact_match"].isna().all()
    assert main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out.count("no matching ar baseline") == 1 and "run decoder=ar on the same task" in out


def test_mixed_models_get_separate_tables(tiny: Path) -> None:
    write(tiny, "other_model", [rec("lookahead", "p0", 10, [2] * 5, 0.25, "a0", model="m2")])
    report = build_report(load_records(tiny))
    other = row(report, LA_LABEL, model="m2")
    assert math.isnan(other["speedup_mean"])  # never compared with model m's ar
    text = render_report(report)
    assert "## model=m dtype=float32 device=cpu" in text and "## model=m2 dtype=float32 device=cpu" in text


def test_cli_writes_csv_and_markdown(tiny: Path, capsys) -> None:
    out = tiny / "out"
    assert main([str(tiny), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "prefill excluded" in printed and "95% percentile bootstrap CI" in printed
    csv = pd.read_csv(out / "report.csv")
    assert set(csv["config"]) == {"ar", LA_LABEL}
    assert {"S_lo", "S_hi", "speedup_agg_lo", "speedup_agg_hi", "score_acc_lo"} <= set(csv.columns)
    la = csv[csv["config"] == LA_LABEL].iloc[0]
    assert f"{la['S']:.3f} [{la['S_lo']:.3f}, {la['S_hi']:.3f}]" in printed  # S [lo, hi]
    assert f"{la['speedup_agg']:.3f} [{la['speedup_agg_lo']:.3f}, {la['speedup_agg_hi']:.3f}]" in printed
    assert (out / "report.md").read_text().startswith("## model=m")


@pytest.mark.parametrize(("content", "message"), [(None, "no records found"), ("{oops\n", "records.jsonl:1")])
def test_cli_errors_are_messages_not_tracebacks(tmp_path: Path, capsys, content: str | None, message: str) -> None:
    if content is not None:
        (tmp_path / "records.jsonl").write_text(content)
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and "Traceback" not in err


def test_fixture_greedy_outputs_all_match_ar() -> None:
    report = build_report(load_records(FIXTURE))
    greedy = report[report["temperature"] == 0]
    assert (greedy["exact_match"] == 1.0).all()
    assert (greedy.loc[greedy["decoder"] != "ar", "S"] > 1).all()
    assert report.loc[report["task"] == "xsum", "skipped"].eq(1).all()
