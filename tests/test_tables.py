"""Paper tables: reference rows, ablation mapping with CIs, rank agreement, separated pairs, sampling table, CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from harness.records import load_records
from harness.analysis.tables import (
    ABLATION_ROWS, ablation_table, rank_agreement, render_ablation, sampling_table, separated_pairs,
)
from harness.analysis.uncertainty import resample_weights
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


def test_ablation_cis(records: pd.DataFrame) -> None:
    table = ablation_table(records)
    cols = list(table.columns)
    assert cols[cols.index("S"):cols.index("S") + 4] == ["S", "S_lo", "S_hi", "paper_S"]
    assert cols[cols.index("speedup"):cols.index("speedup") + 4] == ["speedup", "speedup_lo", "speedup_hi", "paper_speedup"]
    la = table[table["decoder"] != "ar"]
    assert ((la["S_lo"] < la["S"]) & (la["S"] < la["S_hi"])).all()
    assert ((la["speedup_lo"] < la["speedup"]) & (la["speedup"] < la["speedup_hi"])).all()
    assert table.loc[table["row"] == "①", ["S_lo", "S_hi", "speedup_lo", "speedup_hi"]].eq(1.0).all(axis=None)
    assert table.equals(ablation_table(records))  # seeded: the same CIs every time


def test_rank_agreement_is_scipys_kendall_tau(records: pd.DataFrame) -> None:
    table = ablation_table(records)
    paper = table["paper_S"].to_numpy()
    perm = np.array([0, 2, 1, 3, 4, 6, 5, 8, 7])
    fake = table.assign(S=paper[perm], speedup=table["paper_speedup"])  # a fixed permutation of the paper's S
    agree = rank_agreement(fake).set_index("metric")
    ref = stats.kendalltau(paper[perm], paper)
    assert agree.loc["S", "tau"] == pytest.approx(ref.statistic) and agree.loc["S", "p_value"] == pytest.approx(ref.pvalue)
    assert agree.loc["S", "rows"] == 9 and agree.loc["speedup", "tau"] == pytest.approx(1.0)
    # the paper's own S ordering (no ties) gives tau = 1; missing rows are left out
    partial = fake.assign(S=np.where(table["row"].isin(["②", "⑦"]), np.nan, paper))
    assert rank_agreement(partial).set_index("metric").loc["S", ["rows", "tau"]].tolist() == [7, pytest.approx(1.0)]


def test_separated_pairs(records: pd.DataFrame) -> None:
    greedy = records[records["temperature"] == 0]
    table = ablation_table(greedy)
    pairs = separated_pairs(greedy, table).set_index(["row_a", "row_b"])
    assert len(pairs) == 36 and (pairs["examples"] == 4).all()
    assert ((pairs["diff_lo"] <= pairs["diff"]) & (pairs["diff"] <= pairs["diff_hi"])).all()
    assert pairs.loc[("①", "⑨"), "separated"] and pairs.loc[("①", "⑨"), "direction"] == "as paper"  # S 1 vs 2.5
    assert pairs.loc[("①", "⑨"), "diff"] == pytest.approx(1 - table.loc[table["row"] == "⑨", "S"].item())
    # the separation rule is "the CI excludes 0", both ways
    assert (pairs["separated"] == ((pairs["diff_lo"] > 0) | (pairs["diff_hi"] < 0))).all()
    assert (~pairs["separated"]).any() and (pairs.loc[~pairs["separated"], "direction"] == "—").all()


def test_a_pair_that_only_differs_by_noise_is_not_separated(records: pd.DataFrame) -> None:
    """Row ⑧'s records copied as row ⑨'s with S jittered per prompt: not separated; shifted: separated."""
    greedy = records[(records["temperature"] == 0) & (records["task"] == "mt_bench")]
    r8 = greedy[greedy["config"] == "lookahead(W=15,N=5,G=15,pool_from_prompt=False)"]
    rest = greedy[~greedy["config"].str.contains("W=15,N=5,G=15")]
    rng = np.random.default_rng(0)
    for shift, expect in ((0.0, False), (0.5, True)):
        r9 = r8.assign(config="lookahead(W=15,N=5,G=15,pool_from_prompt=True)", p_pool_from_prompt=True,
                       new_tokens=r8["new_tokens"] + r8["steps"] * (shift + rng.normal(0, 0.05, len(r8))))
        df = pd.concat([rest, r8, r9], ignore_index=True)
        pairs = separated_pairs(df, ablation_table(df)).set_index(["row_a", "row_b"])
        assert bool(pairs.loc[("⑧", "⑨"), "separated"]) is expect


def test_render_ablation_lists_separated_and_not(records: pd.DataFrame) -> None:
    table = ablation_table(records)
    pairs = separated_pairs(records, table)
    text = render_ablation(table, rank_agreement(table), pairs)
    n = int(pairs["separated"].sum())
    assert f"{n} of 36 pairs separated" in text and "not separated:" in text and "Kendall" in text
    assert "1.000 [1.000, 1.000]" in text  # ar's S with its CI


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
    """The paired bootstrap of the ROUGE-2 difference, recomputed from the same seeded counts."""
    ok = records[(records["status"] == "ok") & (records["task"] == "cnn_dm") & (records["temperature"] == 1.0)]
    ar = ok[ok["decoder"] == "ar"].set_index("example_id")["score_rouge2"].sort_index()
    la = ok[ok["decoder"] == "lookahead"].set_index("example_id")["score_rouge2"]
    d = (la.reindex(ar.index) - ar).to_numpy()
    w = resample_weights(len(d), 2000, seed=0)
    lo, hi = np.percentile(w @ d / len(d), [2.5, 97.5])
    row = sampling_table(records).query("task == 'cnn_dm' and temperature == 1.0 and decoder == 'lookahead'").iloc[0]
    assert (row["d_rouge2"], row["d_rouge2_lo"], row["d_rouge2_hi"]) == pytest.approx((d.mean(), lo, hi))
    assert d.min() <= lo < d.mean() < hi <= d.max()
    # about as wide as the paired t interval it replaced (6 pairs: the bootstrap is a little narrower)
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
    assert 0.5 * 2 * half < hi - lo < 2 * half


def test_sampling_table_cis_and_verdicts(records: pd.DataFrame) -> None:
    table = sampling_table(records)
    for name in ("rouge1", "S", "speedup"):
        ok = table.dropna(subset=[f"{name}_lo"])
        assert ((ok[f"{name}_lo"] <= ok[name]) & (ok[name] <= ok[f"{name}_hi"])).all()
    la = table[table["decoder"] == "lookahead"].set_index(["task", "temperature"])
    assert la.loc[("cnn_dm", 0.0), "verdict"].startswith("cnn_dm, T=0: the CI of the ROUGE difference includes 0")
    assert "identical outputs" in la.loc[("xsum", 0.0), "verdict"]
    assert "includes 0 for rouge1" in la.loc[("xsum", 1.0), "verdict"]
    assert table.loc[table["decoder"] == "ar", "verdict"].isna().all()


def test_verdict_says_excludes_when_lookahead_scores_higher(records: pd.DataFrame) -> None:
    shifted = records.copy()
    hot = (shifted["decoder"] == "lookahead") & (shifted["temperature"] == 1.0)
    shifted.loc[hot, "score_rouge1"] += 0.2
    row = sampling_table(shifted).query("task == 'xsum' and temperature == 1.0 and decoder == 'lookahead'").iloc[0]
    assert row["d_rouge1_lo"] > 0
    assert "excludes 0 for rouge1" in row["verdict"] and "includes 0 for rouge2" in row["verdict"]


def test_sampling_table_needs_rouge(records: pd.DataFrame) -> None:
    with pytest.raises(ValueError, match="ROUGE"):
        sampling_table(records[records["task"] == "mt_bench"])


@pytest.mark.parametrize("which", ["ablation", "sampling"])
def test_cli(tmp_path: Path, capsys, which: str) -> None:
    assert main([which, str(FIXTURE), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"## {which}") and "prefill excluded" in out and "bootstrap CI" in out
    assert (tmp_path / f"{which}.csv").exists() and (tmp_path / f"{which}.md").exists()
    csv = pd.read_csv(tmp_path / f"{which}.csv")
    assert {"S_lo", "S_hi", "speedup_lo", "speedup_hi"} <= set(csv.columns)
    if which == "ablation":
        assert {"tau", "p_value"} <= set(pd.read_csv(tmp_path / "ablation_agreement.csv").columns)
        assert "separated" in pd.read_csv(tmp_path / "ablation_pairs.csv").columns
        assert "Kendall" in out and "pairs separated" in out
    else:
        assert out.count("the CI of the ROUGE difference") == 4  # one verdict per dataset and temperature


def test_cli_seed_and_resamples(tmp_path: Path, capsys) -> None:
    assert main(["ablation", str(FIXTURE), "--out", str(tmp_path / "a"), "--resamples", "300", "--seed", "1"]) == 0
    assert main(["ablation", str(FIXTURE), "--out", str(tmp_path / "b"), "--resamples", "300", "--seed", "1"]) == 0
    assert (tmp_path / "a" / "ablation.csv").read_text() == (tmp_path / "b" / "ablation.csv").read_text()
    assert "300 resamples, seed 1" in capsys.readouterr().out


def test_cli_error(tmp_path: Path, capsys) -> None:
    assert main(["sampling", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: no records found")
