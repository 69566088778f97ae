"""RecordWriter durability/resume and load_records flattening and errors."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.records import (
    RecordWriter,
    RecordsError,
    config_label,
    load_records,
    read_manifest,
    write_manifest,
)


def rec(ex: str = "t/0", turn: int = 0, decoder: str = "lookahead", **over) -> dict:
    base = {
        "task": "t", "example_id": ex, "turn": turn, "model": "m", "dtype": "float32", "device": "cpu",
        "decoder": decoder, "params": {"W": 5, "N": 3, "G": 5, "pool_from_prompt": True} if decoder == "lookahead" else {},
        "seed": 0, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "max_new_tokens": 16,
        "status": "ok", "prompt_tokens": 7, "new_tokens": 4, "steps": 2, "accepted": [1, 3],
        "input_tokens": [20, 20], "flops": 1e9, "prefill_flops": 1e8, "prefill_s": 0.1, "decode_s": 0.5,
        "stop_reason": "eos", "text": "x", "output_hash": "h", "scores": {"pass@1": 1.0},
    }
    return base | over


def test_write_and_load_roundtrip(tmp_path: Path) -> None:
    with RecordWriter(tmp_path / "run") as w:
        assert w.write(rec("t/0"))
        assert w.write(rec("t/1", decode_s=np.float64(0.25), new_tokens=np.int64(4)))
    df = load_records(tmp_path)
    assert len(df) == 2
    assert list(df["p_W"]) == [5, 5] and list(df["p_pool_from_prompt"]) == [True, True]
    assert list(df["score_pass@1"]) == [1.0, 1.0]
    assert set(df["config"]) == {"lookahead(W=5,N=3,G=5,pool_from_prompt=True)"}
    assert set(df["run_dir"]) == {str(tmp_path / "run")}
    assert df["decode_s"].tolist() == [0.5, 0.25]


def test_every_line_ends_with_newline_and_is_strict_json(tmp_path: Path) -> None:
    with RecordWriter(tmp_path) as w:
        w.write(rec(scores={"rouge1": math.nan}))
    data = (tmp_path / "records.jsonl").read_text()
    assert data.endswith("\n") and data.count("\n") == 1
    assert json.loads(data)["scores"]["rouge1"] is None  # NaN became null, not bare NaN


def test_resume_after_crash_mid_line(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    with RecordWriter(tmp_path) as w:
        w.write(rec("t/0"))
        w.write(rec("t/1"))
    full = json.dumps(rec("t/2"))
    with open(path, "a") as fh:  # simulate a kill halfway through the third record
        fh.write(full[: len(full) // 2])
    with pytest.warns(UserWarning, match="partial last line"):
        assert len(load_records(path)) == 2  # the torn line is not counted
    with pytest.warns(UserWarning, match="partial last line"):
        w = RecordWriter(tmp_path)
    assert w.done_keys() == {("t", "t/0", 0), ("t", "t/1", 0)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert w.write(rec("t/2"))  # the interrupted prompt is re-run ...
    with pytest.warns(UserWarning, match="already recorded"):
        assert not w.write(rec("t/0"))  # ... and a done one is not duplicated
    w.close()
    df = load_records(path)
    assert sorted(df["example_id"]) == ["t/0", "t/1", "t/2"]
    assert path.read_text().count("\n") == 3


def test_crash_right_before_newline_is_not_counted(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(rec("t/0")) + "\n" + json.dumps(rec("t/1")))  # complete JSON, no newline
    with pytest.warns(UserWarning):
        assert load_records(path)["example_id"].tolist() == ["t/0"]
    with pytest.warns(UserWarning):
        assert RecordWriter(tmp_path).done_keys() == {("t", "t/0", 0)}


def test_turns_are_distinct_keys(tmp_path: Path) -> None:
    with RecordWriter(tmp_path) as w:
        assert w.write(rec("t/0", turn=0)) and w.write(rec("t/0", turn=1))
        assert w.done_keys() == {("t", "t/0", 0), ("t", "t/0", 1)}


def test_skipped_records_load_with_null_stats(tmp_path: Path) -> None:
    skipped = rec("t/9", status="skipped", new_tokens=None, steps=None, decode_s=None, accepted=None)
    with RecordWriter(tmp_path) as w:
        w.write(skipped)
    df = load_records(tmp_path)
    assert df["status"].tolist() == ["skipped"] and math.isnan(df["new_tokens"].iloc[0])


def test_manifest_is_atomic(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"decoder": "ar", "params": {}})
    write_manifest(tmp_path, {"decoder": "lookahead", "x": float("nan")})
    assert read_manifest(tmp_path) == {"decoder": "lookahead", "x": None}
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # no temp file left behind
    assert read_manifest(tmp_path / "nowhere") == {}


def test_load_globs_nested_run_dirs(tmp_path: Path) -> None:
    for sub in ("a/run1", "b/c/run2"):
        with RecordWriter(tmp_path / sub) as w:
            w.write(rec(decoder="ar"))
    df = load_records(tmp_path)
    assert len(df) == 2 and set(df["config"]) == {"ar"}
    assert "p_W" not in df.columns


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda p: p.mkdir(), "no records found"),
        (lambda p: None, "no such file"),
        (lambda p: (p.mkdir(), (p / "records.jsonl").write_text("")), "empty"),
    ],
)
def test_load_errors_when_nothing_there(tmp_path: Path, setup, message: str) -> None:
    target = tmp_path / "results"
    setup(target)
    with pytest.raises(RecordsError, match=message):
        load_records(target)


def test_bad_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "r" / "records.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps(rec("t/0")) + "\n{not json}\n")
    with pytest.raises(RecordsError, match=r"records\.jsonl:2: unreadable JSON"):
        load_records(tmp_path)


def test_missing_fields_are_named(tmp_path: Path) -> None:
    bad = rec()
    del bad["decoder"]
    (tmp_path / "records.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(RecordsError, match=r":1: record is missing required fields \['decoder'\]"):
        load_records(tmp_path)
    (tmp_path / "records.jsonl").write_text(json.dumps(rec(decode_s=None)) + "\n")
    with pytest.raises(RecordsError, match="decode_s"):
        load_records(tmp_path)


def test_writer_rejects_records_without_identity(tmp_path: Path) -> None:
    with RecordWriter(tmp_path) as w, pytest.raises(RecordsError, match="task"):
        w.write({"example_id": "x"})


def test_config_labels() -> None:
    assert config_label("ar", {}) == "ar"
    assert config_label("pld", {"num_pred": 10, "max_ngram": 3}) == "pld(max_ngram=3,num_pred=10)"
    assert config_label("jacobi", {"window": 8.0}) == "jacobi(window=8)"


@settings(max_examples=50, deadline=None)
@given(st.permutations(["W", "N", "G", "pool_from_prompt", "extra"]))
def test_config_label_ignores_key_order(order: list[str]) -> None:
    values = {"W": 15, "N": 5, "G": 15, "pool_from_prompt": False, "extra": "x"}
    assert config_label("lookahead", {k: values[k] for k in order}) == (
        "lookahead(W=15,N=5,G=15,extra=x,pool_from_prompt=False)"
    )


# ---- one job per run dir, concurrent writers, duplicates ---------------------------------------------
def test_writer_refuses_a_directory_of_another_job(tmp_path: Path) -> None:
    with RecordWriter(tmp_path, job_id="aaa") as w:
        assert w.write(rec("t/0", job_id="aaa"))
        with pytest.raises(RecordsError, match="job 'bbb' given to the writer of job 'aaa'"):
            w.write(rec("t/1", job_id="bbb"))
    with pytest.raises(RecordsError, match=r"records\.jsonl:1: a record of job 'aaa'.*one directory holds one job"):
        RecordWriter(tmp_path, job_id="bbb")
    with RecordWriter(tmp_path, job_id="aaa") as w:  # the same job resumes
        assert w.done_keys() == {("t", "t/0", 0)}


def test_a_writer_sees_what_another_wrote_after_it_opened(tmp_path: Path) -> None:
    first, second = RecordWriter(tmp_path), RecordWriter(tmp_path)
    assert first.write(rec("t/0", text="first"))
    assert second.has(("t", "t/0", 0)) and second.text(("t", "t/0", 0)) == "first"
    with pytest.warns(UserWarning, match="already recorded"):
        assert not second.write(rec("t/0", text="second"))  # was: written twice
    assert second.write(rec("t/1"))
    assert first.done_keys() == {("t", "t/0", 0), ("t", "t/1", 0)}
    first.close(), second.close()
    assert (tmp_path / "records.jsonl").read_text().count("\n") == 2


def test_load_counts_a_duplicated_key_once(tmp_path: Path) -> None:
    lines = [json.dumps(rec("t/0", text="a")), json.dumps(rec("t/1")), json.dumps(rec("t/0", text="b"))]
    (tmp_path / "records.jsonl").write_text("\n".join(lines) + "\n")  # as two unlocked writers left it
    with pytest.warns(UserWarning, match="1 duplicate record"):
        df = load_records(tmp_path)
    assert sorted(df["example_id"]) == ["t/0", "t/1"] and df.set_index("example_id").loc["t/0", "text"] == "a"
    assert list(df["variant"]) == ["", ""]  # records from before variants: one shared variant


def test_update_manifest_is_a_locked_read_modify_write(tmp_path: Path) -> None:
    from harness.records import update_manifest

    for n in range(3):
        update_manifest(tmp_path, lambda m, n=n: {**m, "invocations": [*m.get("invocations", []), n]})
    assert read_manifest(tmp_path)["invocations"] == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "manifest.json"]
