"""Bad inputs to ``python -m harness.run``: one ``error:`` line naming the problem and the fix, exit
status 2, and nothing written: no results, no Hydra ``outputs/`` or ``multirun/`` directory.

The table runs ``harness.run.main`` in-process (seconds for all of it) in an empty working directory;
two cases run the real command line as a subprocess. In-process, Hydra's own logging set-up is off
(``hydra/hydra_logging=none``): it closes every log handler, and absl's (rouge-score imports absl) then
closes the stderr pytest captured when it was imported; a real process is unaffected.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.run import main
from tasks.data import SHARED_DATA_DIR as DATA

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"offline datasets not found at {DATA}")

# (overrides on top of a valid gsm8k job on the tiny model, fragments the one line must contain)
CASES: list[tuple[list[str], list[str]]] = [
    # rejected by Hydra while composing (before any of our code runs)
    (["task=nope"], ["Could not find 'task/nope'", "choose one of: classeval, cnn_dm, gsm8k"]),
    (["decoder=beam"], ["Could not find 'decoder/beam'", "ar, jacobi, lookahead, pld"]),
    (["model=gpt2"], ["Could not find 'model/gpt2'", "llama2_7b_chat, smollm2"]),
    (["hydra/launcher=nope"], ["Could not find 'hydra/launcher/nope'", "joblib", "submitit_slurm"]),
    (["decoder=lookahead", "decoder.WW=3"], ["Key 'WW' not in", "--cfg job"]),
    (["decoder=lookahead", "decoder.W=abc"], ["decoder.W=abc", "could not be converted to Integer"]),
    (["limitt=3"], ["Key 'limitt' not in 'RunConfig'"]),
    (["seed=1.5"], ["seed=1.5", "could not be converted to Integer"]),
    (["limit=[1"], ["no viable alternative at input '[1'", "override_grammar"]),
    # options Hydra lets `+` add but nothing reads
    (["+foo=1"], ["unknown option(s) ['foo']", "--cfg job"]),
    (["+model.revision=main"], ["unknown option(s) ['model.revision']"]),
    # decoder and sampling values
    (["decoder=lookahead", "decoder.W=0"], ["W (lookahead window width) must be an integer >= 1, got 0"]),
    (["decoder=lookahead", "decoder.N=1"], ["N (n-gram size) must be an integer >= 2, got 1"]),
    (["decoder=lookahead", "decoder.step_tokens=3"], ["step_tokens", "must be an integer >= 12"]),
    (["decoder=lookahead", "decoder.pool_from_prompt=maybe"], ["pool_from_prompt"]),
    (["decoder=jacobi", "decoder.window=0"], ["window", ">= 1"]),
    (["decoder=pld", "decoder.num_pred=0"], ["num_pred (draft tokens per step) must be an integer >= 1"]),
    (["temperature=-1"], ["temperature must be >= 0"]),
    (["top_p=0"], ["top_p must be in (0, 1]"]),
    (["top_k=-1"], ["top_k must be an integer >= 0"]),
    # the run's settings
    (["max_new_tokens=0"], ["max_new_tokens must be >= 1, got 0"]),
    (["model.attn=flash"], ["model.attn must be one of auto, kernel, sdpa, eager, got 'flash'"]),
    (["model.attn=kernel", "matmul=library"], ["model.attn=kernel is our CPU kernel's attention"]),
    (["device=tpu"], ["device must be cpu or cuda[:N], got 'tpu'"]),
    (["dtype=float64"], ["dtype must be one of float32, bf16w, bfloat16, float16, got 'float64'"]),
    (["matmul=mkl"], ["matmul must be one of auto, library, avx512, avx2, baseline, got 'mkl'"]),
    (["matmul=avx2", "dtype=bfloat16"], ["matmul=avx2 is a CPU kernel for float32/bf16w; use matmul=auto"]),
    (["warmup_tokens=0"], ["warmup_tokens must be an integer >= 1, got 0"]),
    (["max_prompt_tokens=0"], ["max_prompt_tokens must be an integer >= 1"]),
    (["limit=-1"], ["limit must be >= 0 or null"]),
    (["results_dir={tmp}/afile/res"], ["cannot be created", "afile is a file", "writable directory"]),
    (["decoder=lookahead", "decoder.auto=true", "limit=0"], ["decoder.auto=true", "use limit >= 1"]),
    (["decoder=lookahead", "decoder.pool_from_corpus=true"], ["pool_from_corpus=true", "set decoder.auto=true"]),
    # the task and its data
    (["+task.options.num_shots=3"], ["unknown option", "num_shots"]),
    (["+task.options.num_fewshot=99"], ["num_fewshot must be in 0..8, got 99"]),
    (["data_dir={tmp}/nowhere"], ["'openai/gsm8k' not found locally", "data_dir=<dir>"]),
    # what needs the model (from its config file, before the weights load)
    (["model.name={tmp}/no-such-checkpoint"], ["cannot load model", "local checkpoint directory"]),
    (["max_new_tokens=100000"], ["max_new_tokens=100000 leaves no room", "use max_new_tokens < 4096"]),
    (["model.name={ckpt64}", "decoder=lookahead", "decoder.auto=true", "max_new_tokens=16"],
     ["decoder.auto=true tunes on prompt 0", "more than the 48 that fit", "lower max_new_tokens"]),
    # a sweep is checked whole before any job runs
    (["-m", "decoder=lookahead", "decoder.W=1,0"], ["job #1", "decoder.W=0", "W (lookahead window width)"]),
    (["-m", "decoder=ar,pld", "max_new_tokens=8,100000"], ["job #1", "max_new_tokens=100000 leaves no room"]),
    (["-m", "decoder=ar,beam"], ["Could not find 'decoder/beam'", "choose one of: ar, jacobi"]),
]
if __import__("torch").cuda.is_available():
    CASES.append((["device=cuda:9"], ["CUDA device(s)"]))
else:
    CASES.append((["device=cuda"], ["CUDA is not available on this machine; use device=cpu"]))


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, str]:
    from test_run import save_tiny_checkpoint

    return {"ckpt": save_tiny_checkpoint(tmp_path_factory.mktemp("ctx4096")),
            "ckpt64": save_tiny_checkpoint(tmp_path_factory.mktemp("ctx64"), max_positions=64)}


def _argv(overrides: list[str], tmp: Path, ckpts: dict[str, str], logging: str = "none") -> list[str]:
    """A valid job's overrides, replaced key by key with the case's."""
    args = {"hydra/hydra_logging": logging, "model.name": "{ckpt}", "task": "gsm8k", "data_dir": str(DATA), "limit": "2", "results_dir": "{tmp}/res"}
    flags = [o for o in overrides if o.startswith("-")]
    for o in overrides:
        if not o.startswith("-"):
            key, _, value = o.partition("=")
            args[key] = value
    return flags + [f"{k}={v}".format(tmp=tmp, **ckpts) for k, v in args.items()]


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def test_there_are_enough_cases():
    assert len(CASES) >= 25


@pytest.mark.parametrize("overrides, fragments", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_bad_input_one_line_exit_2_nothing_written(overrides, fragments, ckpts, tmp_path, monkeypatch, capsys):
    (tmp_path / "afile").write_text("not a directory")
    before = _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(_argv(overrides, tmp_path, ckpts))
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert exit_info.value.code == 2, out.err
    assert len(lines) == 1 and lines[0].startswith("error: "), out.err
    for fragment in fragments:
        assert fragment.format(tmp=tmp_path) in lines[0]
    assert "Traceback" not in out.err and "HYDRA_FULL_ERROR" not in out.err and out.out == ""
    assert _files(tmp_path) == before  # no results, no outputs/ or multirun/


@pytest.mark.parametrize("overrides, fragment", [
    (["task=nope"], "error: Could not find 'task/nope'; choose one of: classeval"),
    (["max_new_tokens=100000"], "error: max_new_tokens=100000 leaves no room for a prompt"),
])
def test_command_line(overrides, fragment, ckpts, tmp_path):
    argv = _argv(overrides, tmp_path, ckpts, logging="default")
    out = subprocess.run([sys.executable, "-m", "harness.run", *argv], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [out.stderr.strip()], out.stderr
    assert out.stderr.startswith(fragment)
    assert not any(tmp_path.iterdir())
