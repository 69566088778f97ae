"""Paper tables: reference rows, ablation mapping, sampling table with paired CIs, CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from harness.records import load_records
from harness.analysis.tables import ABLATION_ROWS, ablation_table, paired_t_ci, sampling_table
from harness.tables import main

FIXTURE = Path(__file__).parent / "fixtures" / "results"


@pytest.fixture(scope="module")
def records() -> pd.DataFrame:
    return load_records(FIXTURE)


def test_ablation_rows_follow_the_paper() -> None:
    assert [r.label for r in ABLATION_ROWS] == list("①②③④⑤⑥⑦⑧⑨")
    by = {r.label: r for r in ABLATION_ROWS}
    assert by["⑦"].setting == "(5,30,1)" and dict(by["⑦"].params) == {"W": 30, "N": 5, "G": 1, "pool_from_prompt": False}
    assert dict(by["③"].params) == {"W": 1, "N": 10, "G": 3, "pool_from_prompt": True}
    assert by["②"].decoder == "pld" and by["②"].params is None
    for row in ABLATION_ROWS[2:]:  # (N, W, G) text agrees with the params
        n, w, g = (int(x) for x in row.setting.strip("()").split(","))
        assert (row.params["N"], row.params["W"], row.params["G"]) == (n, w, g)
    assert [(r.paper_speedup, r.paper_S) for r in ABLATION_ROWS] == [
        (1.00, 1.00), (1.44, 1.55), (1.36, 1.45), (1.36, 1.51), (1.04, 1.12),
        (1.46, 1.59), (1.61, 1.79), (1.78, 1.96), (1.88, 2.05)]


def test_ablation_table_on_fixture(records: pd.DataFrame) -> None:
    table = ablation_table(records)
    assert table["task"].unique().tolist() == ["mt_bench"]  # where the ablation was run
    assert len(table) == 9 and (table["status"] == "ok").all()
    assert (table["exact_match"] == 1.0).all()
    row7 = table[table["row"] == "⑦"].iloc[0]
    assert row7["config"] == "lookahead(W=30,N=5,G=1,pool_from_prompt=False)"
    assert row7["paper_S"] == 1.79 and row7["S"] > 1
    assert table.loc[table["row"] == "①", "speedup"].item() == pytest.approx(1.0)


def test_missing_rows_are_kept(records: pd.DataFrame) -> None:
    without = records[(records["decoder"] != "pld") & (records["p_W"] != 30)]
    table = ablation_table(without, task="mt_bench")
    assert len(table) == 9
    missing = table[table["status"] == "missing"]
    assert missing["row"].tolist() == ["②", "⑦"]
    assert missing["S"].isna().all() and missing["paper_S"].notna().all()


def test_ablation_with_no_matching_records_still_lists_rows(records: pd.DataFrame) -> None:
    table = ablation_table(records, task="no-such-task")
    assert len(table) == 9 and (table["status"] == "missing").all()


def test_paired_t_matches_scipy() -> None:
    rng = np.random.default_rng(1)
    d = rng.normal(0.01, 0.05, 30)
    mean, lo, hi = paired_t_ci(d)
    ref = stats.ttest_1samp(d, 0).confidence_interval(0.95)
    assert (lo, hi) == pytest.approx((ref.low, ref.high)) and mean == pytest.approx(d.mean())
    assert paired_t_ci(np.zeros(5)) == (0.0, 0.0, 0.0)
    assert np.isnan(paired_t_ci(np.array([0.3]))[1])


def test_sampling_table_on_fixture(records: pd.DataFrame) -> None:
    table = sampling_table(records)
    assert len(table) == 8  # 2 tasks x 2 temperatures x (ar, lookahead)
    la = table[table["decoder"] == "lookahead"].set_index(["task", "temperature"])
    greedy = la.xs(0.0, level="temperature")
    assert (greedy[["d_rouge1", "d_rouge1_lo", "d_rouge1_hi"]] == 0).all().all()  # identical outputs
    sampled = la.xs(1.0, level="temperature")
    assert (sampled["d_rouge1_lo"] < sampled["d_rouge1_hi"]).all()
    assert sampled.loc["xsum", "paired"] == 5 and sampled.loc["xsum", "skipped"] == 1
    assert (la["S"] > 1).all() and la["speedup"].notna().all()


def test_sampling_ci_by_hand(records: pd.DataFrame) -> None:
    ok = records[(records["status"] == "ok") & (records["task"] == "cnn_dm") & (records["temperature"] == 1.0)]
    ar = ok[ok["decoder"] == "ar"].set_index("example_id")["score_rouge2"]
    la = ok[ok["decoder"] == "lookahead"].set_index("example_id")["score_rouge2"]
    d = (la - ar.reindex(la.index)).to_numpy()
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    row = sampling_table(records).query("task == 'cnn_dm' and temperature == 1.0 and decoder == 'lookahead'").iloc[0]
    assert (row["d_rouge2"], row["d_rouge2_lo"], row["d_rouge2_hi"]) == pytest.approx(
        (d.mean(), d.mean() - half, d.mean() + half))


def test_sampling_table_needs_rouge(records: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match="ROUGE"):
        sampling_table(records[records["task"] == "mt_bench"])


@pytest.mark.parametrize("which", ["ablation", "sampling"])
def test_cli(tmp_path: Path, capsys, which: str) -> None:
    assert main([which, str(FIXTURE), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"## {which}") and "prefill excluded" in out
    assert (tmp_path / f"{which}.csv").exists() and (tmp_path / f"{which}.md").exists()


def test_cli_error(tmp_path: Path, capsys) -> None:
    assert main(["sampling", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: no records found")
