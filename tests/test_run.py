"""The Hydra runner: config composition and rejection, job identity, sweeps, records, resume, the
manifest's invocations, progress output, the joblib launcher.

A tiny random LLaMA with the embedded model's tokenizer is saved to a temp dir and run by path, so
these tests exercise the real loading path in seconds (``save_tiny_checkpoint``, also used by the
bad-input, concurrency and launcher tests).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from harness.records import load_records
from harness.run import CONF_DIR, UserError, prepare, run
from tasks import TASKS
from tasks.data import SHARED_DATA_DIR as DATA

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"offline datasets not found at {DATA}")


def save_tiny_checkpoint(out: Path, max_positions: int = 4096) -> str:
    """A random 2-layer LLaMA with SmolLM2's tokenizer, saved to ``out`` (a checkpoint path for model.name)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from harness.runtime.loading import embedded_checkpoint

    tok = AutoTokenizer.from_pretrained(embedded_checkpoint("smollm2"))
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_positions, initializer_range=0.3,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> str:
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("decoder", ["ar", "jacobi", "pld", "lookahead"])
def test_every_decoder_task_composes(decoder, task):
    cfg = _compose([f"decoder={decoder}", f"task={task}"])
    assert cfg.decoder.name == decoder and cfg.task.name == task
    job = prepare(_compose([f"decoder={decoder}", f"task={task}", f"data_dir={DATA}", "limit=1"])) if task != "cnn_dm" else None
    if job is not None:
        assert job.decoder.name == decoder and len(job.examples) == 1


def test_decoder_defaults_come_from_the_decoder_class():
    from decoders import LookaheadDecoder

    cfg = _compose(["decoder=lookahead"])
    assert (cfg.decoder.W, cfg.decoder.N, cfg.decoder.G) == (LookaheadDecoder.W, LookaheadDecoder.N, LookaheadDecoder.G)


@pytest.mark.parametrize(
    "overrides, error",
    [
        (["decoder=lookahead", "decoder.WW=3"], ConfigCompositionException),  # typo
        (["decoder=lookahead", "decoder.W=abc"], ConfigCompositionException),  # wrong type
        (["decoder=beam"], ConfigCompositionException),  # unknown decoder
        (["task=squad"], ConfigCompositionException),  # unknown task
        (["limitt=3"], ConfigCompositionException),
    ],
)
def test_composition_rejects_typos(overrides, error):
    with pytest.raises(error):
        _compose(overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["decoder=lookahead", "decoder.W=0"], "W"),
        (["decoder=lookahead", "decoder.N=1"], "N"),
        (["decoder=lookahead", "decoder.G=-2"], "G"),
        (["decoder=jacobi", "decoder.window=0"], "window"),
        (["temperature=-1"], "temperature"),
        (["max_new_tokens=0"], "max_new_tokens"),
        (["task=gsm8k", "+task.options.num_shots=3"], "unknown option"),
        (["task=gsm8k", "data_dir=/nonexistent"], "openai/gsm8k"),
    ],
)
def test_bad_values_rejected_before_model_loads(overrides, message, tmp_path):
    cfg = _compose(overrides + [f"results_dir={tmp_path}"])
    with pytest.raises(UserError, match=message):
        prepare(cfg)
    assert not any(tmp_path.iterdir())  # nothing left behind


def _run_cli(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "harness.run", *args], cwd=cwd, capture_output=True, text=True, timeout=600, **kw
    )


def test_cli_bad_input_prints_one_line(tmp_path):
    out = _run_cli(["decoder=lookahead", "decoder.N=1", f"results_dir={tmp_path}"], cwd=ROOT)
    assert out.returncode == 2
    assert "error: N (n-gram size) must be an integer >= 2, got 1" in out.stderr
    assert "Traceback" not in out.stderr


def test_multirun_sweep_records_and_report(tiny_ckpt, tmp_path):
    res = tmp_path / "res"
    out = _run_cli(
        ["-m", f"model.name={tiny_ckpt}", "decoder=ar,lookahead,pld", "task=gsm8k,humaneval", "limit=2",
         "max_new_tokens=12", f"data_dir={DATA}", f"results_dir={res}", f"hydra.sweep.dir={tmp_path / 'mr'}"],
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    df = load_records(res)
    assert len(df) == 3 * 2 * 2 and (df["status"] == "ok").all()
    for _, r in df.iterrows():
        assert sum(r["accepted"]) == r["new_tokens"] and len(r["accepted"]) == r["steps"]
    # greedy fp32: every decoder's output equals ar's on the same prompt
    ar = df[df.decoder == "ar"].set_index(["task", "example_id"])["output_hash"]
    for _, r in df[df.decoder != "ar"].iterrows():
        assert r["output_hash"] == ar[(r["task"], r["example_id"])]
    manifest = json.loads(next(res.rglob("manifest.json")).read_text())
    assert manifest["config"]["model"]["name"] == tiny_ckpt
    (inv,) = manifest["invocations"]
    assert "torch" in inv["versions"] and inv["ended"] and inv["counts"]["done"] == 2

    from harness.report import build_report

    rep = build_report(df)
    row = rep[(rep["task"] == "gsm8k") & (rep["decoder"] == "lookahead")].iloc[0]
    sub = df[(df.task == "gsm8k") & (df.decoder == "lookahead")]
    assert row["S"] == pytest.approx(sub["new_tokens"].sum() / sub["steps"].sum())
    assert row["exact_match"] == pytest.approx(1.0)


def test_resume_after_kill(tiny_ckpt, tmp_path):
    args = [f"model.name={tiny_ckpt}", "decoder=lookahead", "task=gsm8k", "limit=40", "max_new_tokens=48",
            f"data_dir={DATA}", f"results_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'hy'}"]
    proc = subprocess.Popen([sys.executable, "-m", "harness.run", *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    records = None
    while time.time() < deadline:
        found = list(tmp_path.rglob("records.jsonl"))
        if found and found[0].read_text().count("\n") >= 3:
            records = found[0]
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert records is not None
    n_before = records.read_text().count("\n")
    assert n_before < 40, "job finished before it could be killed; make it longer"
    with open(records, "a") as fh:  # a torn write as a kill mid-line would leave
        fh.write('{"task": "gsm8k", "example_id": "99", "tu')
    out = _run_cli(args, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"resumed {n_before}" in out.stdout
    lines = records.read_text().splitlines()
    keys = [(json.loads(l)["example_id"], json.loads(l)["turn"]) for l in lines]
    assert len(keys) == len(set(keys)) == 40


def test_joblib_launcher(tiny_ckpt, tmp_path):
    out = _run_cli(
        ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"model.name={tiny_ckpt}",
         "decoder=ar,jacobi", "task=gsm8k", "limit=1", "max_new_tokens=6", f"data_dir={DATA}",
         f"results_dir={tmp_path / 'res'}", f"hydra.sweep.dir={tmp_path / 'mr'}"],
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Joblib" in out.stdout + out.stderr
    df = load_records(tmp_path / "res")
    assert sorted(df["decoder"]) == ["ar", "jacobi"]


def test_auto_tuned_job_records_choice_and_keeps_it_on_resume(tiny_ckpt, tmp_path):
    from harness.records import read_manifest
    from harness.run import cached_backend

    base = [f"model.name={tiny_ckpt}", "decoder=lookahead", "decoder.auto=true", "task=gsm8k",
            "max_new_tokens=8", f"data_dir={DATA}", f"results_dir={tmp_path}"]
    run(_compose(base + ["limit=2"]))
    df = load_records(tmp_path)
    run_dir = Path(df["run_dir"].iloc[0])
    tuned = read_manifest(run_dir)["tuned"]
    assert tuned["predicted"] > 0 and len(tuned["calibration"]) > 1
    assert df["p_W"].iloc[0] == tuned["params"]["W"] and df["p_N"].iloc[0] == tuned["params"]["N"]
    cached_backend.cache_clear()
    run(_compose(base + ["limit=3"]))  # resumes: reuses the recorded choice instead of re-tuning
    df = load_records(tmp_path)
    assert len(df) == 3
    for col in ("p_W", "p_N", "p_G", "p_text_ngram", "p_step_tokens"):
        assert df[col].nunique(dropna=False) == 1, col


def test_auto_tuned_corpus_is_recorded_and_restored_on_resume(tiny_ckpt, tmp_path):
    """pool_from_corpus: the tuning prompts' answers go into the manifest with the shape, and a resumed
    run drafts from the same corpus instead of re-tuning."""
    from decoders.base import token_hash
    from harness.records import read_manifest
    from harness.run import _autotune, cached_backend
    from tasks import encode_prompt

    base = [f"model.name={tiny_ckpt}", "decoder=lookahead", "decoder.auto=true", "decoder.pool_from_corpus=true",
            "task=gsm8k", "max_new_tokens=8", f"data_dir={DATA}", f"results_dir={tmp_path}"]
    run(_compose(base + ["limit=2"]))
    df = load_records(tmp_path)
    assert df["p_pool_from_corpus"].all()
    tuned = read_manifest(Path(df["run_dir"].iloc[0]))["tuned"]
    job = prepare(_compose(base + ["limit=3"]))
    backend = cached_backend(job.cfg.model.name, job.cfg.dtype, job.cfg.device, job.cfg.model.attn, job.cfg.matmul)
    prompts = [encode_prompt(job.task.prompt(ex, 0, []), backend.tokenizer) for ex in job.examples[:2]]
    assert sorted(tuned["corpus"]) == sorted(token_hash(p) for p in prompts) and all(tuned["corpus"].values())
    assert _autotune(job, backend) == tuned and job.decoder.corpus == tuned["corpus"]  # adopted, not re-tuned
    assert run(_compose(base + ["limit=3"]))["done"] == 1


# ---- job identity, invocations, progress ---------------------------------------------------------------
def _job(*over: str):
    return prepare(_compose(["task=gsm8k", f"data_dir={DATA}", "limit=1", *over]))


def test_job_identity_covers_what_changes_records_and_nothing_else(tmp_path):
    base = _job()
    assert len(base.job_id) == 12 and base.run_dir.name.endswith(f"-{base.job_id}")
    assert base.identity["task_options"] == {"num_fewshot": 0} and base.identity["data"] == str(DATA.resolve())
    # where results go, the warm-up, the limit and an explicit default leave the job as it is
    for over in (["limit=3"], ["warmup_tokens=4"], ["+task.options.num_fewshot=0"], [f"data_dir={DATA}/."]):
        assert _job(*over).job_id == base.job_id, over
    assert _job(f"results_dir={tmp_path}").job_id == base.job_id
    changed = [["+task.options.num_fewshot=8"], ["model.attn=eager"], ["max_prompt_tokens=100"],
               ["max_new_tokens=7"], ["seed=1"], ["temperature=0.5"], ["top_k=3"], ["dtype=bfloat16"],
               ["model.name=other"], ["decoder=pld"], ["decoder=lookahead"], ["decoder=lookahead", "decoder.W=6"]]
    jobs = [_job(*over) for over in changed]
    assert len({base.job_id, *(j.job_id for j in jobs)}) == len(changed) + 1
    assert len({base.run_dir, *(j.run_dir for j in jobs)}) == len(changed) + 1
    # the prompt variant is the identity without the decoder: ar, pld and lookahead runs pair up
    assert {j.variant for j in jobs[-3:]} == {base.variant}
    assert base.variant not in {j.variant for j in jobs[:-3]}


def test_a_changed_task_option_is_a_new_job_and_a_raised_limit_extends_one(tiny_ckpt, tmp_path):
    from harness.records import read_manifest

    base = [f"model.name={tiny_ckpt}", "task=gsm8k", "max_new_tokens=4", f"data_dir={DATA}", f"results_dir={tmp_path}"]
    first = run(_compose(base + ["limit=2"]))
    fewshot = run(_compose(base + ["limit=2", "+task.options.num_fewshot=8"]))  # was: 2 skipped as "done"
    assert (first["done"], fewshot["done"], fewshot["resumed"]) == (2, 2, 0)
    assert fewshot["run_dir"] != first["run_dir"]
    more = run(_compose(base + ["limit=3", "warmup_tokens=2"]))
    assert more["run_dir"] == first["run_dir"] and (more["resumed"], more["done"]) == (2, 1)

    manifest = read_manifest(first["run_dir"])
    assert manifest["job_id"] == first["job_id"] and manifest["tuned"] is None
    assert [inv["counts"]["done"] for inv in manifest["invocations"]] == [2, 1]  # one entry per invocation
    for inv in manifest["invocations"]:
        assert inv["started"] <= inv["ended"] and "matmul_path" in inv and inv["versions"]["torch"]
        assert inv["hardware"]["cpu"]["name"] and inv["hardware"]["cpu"]["torch_capability"]
    assert read_manifest(fewshot["run_dir"])["identity"]["task_options"] == {"num_fewshot": 8}
    df = load_records(tmp_path)
    assert len(df) == 5 and set(df["job_id"]) == {first["job_id"], fewshot["job_id"]}
    assert df.groupby("job_id")["variant"].nunique().eq(1).all() and df["variant"].nunique() == 2


def test_report_pairs_with_ar_of_the_same_prompt_variant_only(tiny_ckpt, tmp_path):
    from harness.report import build_report, render_report

    base = [f"model.name={tiny_ckpt}", "task=gsm8k", "limit=2", "max_new_tokens=4", f"data_dir={DATA}",
            f"results_dir={tmp_path}"]
    for over in (["decoder=ar"], ["decoder=pld"], ["decoder=pld", "+task.options.num_fewshot=2"]):
        run(_compose(base + over))
    df = load_records(tmp_path)
    rep = build_report(df)
    rows = rep[rep["decoder"] == "pld"].set_index("variant")
    assert len(rows) == 2 and (rows["prompts"] == 2).all()  # one row per prompt variant, never pooled
    zero_shot = df.loc[df["decoder"] == "ar", "variant"].iloc[0]
    assert rows.loc[zero_shot, "matched"] == 2
    assert rows.drop(zero_shot)["matched"].tolist() == [0]  # the 2-shot prompts have no ar of their own
    text = render_report(rep)
    assert text.count(zero_shot) == 2 and "variant" in text  # ar and 0-shot pld name their variant


def test_progress_bar_on_a_terminal_one_line_per_prompt_in_a_log(tiny_ckpt, tmp_path, capsys, monkeypatch):
    import io

    base = [f"model.name={tiny_ckpt}", "task=gsm8k", "limit=2", "max_new_tokens=4", f"data_dir={DATA}"]
    run(_compose(base + [f"results_dir={tmp_path / 'log'}"]))
    out = capsys.readouterr()
    assert out.out.count(" turn 0: ") == 2 and "running S" in out.out and "ex/s" not in out.err

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    run(_compose(base + [f"results_dir={tmp_path / 'tty'}"]))
    assert " turn 0: " not in capsys.readouterr().out
    bar = term.getvalue()
    assert "2/2" in bar and "<" in bar and "S " in bar and "tok/s" in bar  # count, ETA, running S


def test_sampled_prompts_draw_independently_and_reproducibly(tiny_ckpt, tmp_path):
    """At T > 0 each prompt is seeded from (seed, task, id, turn): two copies of one question sample
    differently (one seed for all prompts made them equal), and a rerun gives the same outputs."""
    from decoders.sampling import prompt_seed

    question = json.loads((DATA / "gsm8k" / "test.jsonl").read_text().splitlines()[0])
    data = tmp_path / "data"
    (data / "gsm8k").mkdir(parents=True)
    (data / "gsm8k" / "test.jsonl").write_text((json.dumps(question) + "\n") * 2)
    base = [f"model.name={tiny_ckpt}", "task=gsm8k", "limit=2", "max_new_tokens=12", "temperature=1.0",
            f"data_dir={data}"]
    runs = []
    for name in ("a", "b"):
        run(_compose(base + [f"results_dir={tmp_path / name}"]))
        runs.append(load_records(tmp_path / name).sort_values("example_id").reset_index(drop=True))
    a, b = runs
    assert a["text"].nunique() == 2, "identical prompts drew the same sample"
    assert a["output_hash"].tolist() == b["output_hash"].tolist()
    assert a["sample_seed"].tolist() == [prompt_seed(0, "gsm8k", i, 0) for i in a["example_id"]]
    assert _job("temperature=1.0").identity["seeding"] == "prompt_seed" and "seeding" not in _job().identity
