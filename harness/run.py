"""Run one job (model x decoder x task) and append one record per prompt and turn.

    python -m harness.run decoder=lookahead decoder.W=7 task=humaneval limit=20 max_new_tokens=256
    python -m harness.run -m decoder=ar,lookahead decoder.W=5,10,15 task=humaneval,gsm8k

Every check (:mod:`harness.jobspec`) runs before the model loads and before any file is written, on
every job of a sweep; a bad input prints one ``error:`` line and exits 2. The run directory ends in
the job's ``job_id`` (a hash of everything that can change a record), so re-running a job resumes
it (finished (example, turn) records are skipped), a different job never reuses its records, and
any number of processes can run one job or many into one results tree: records are written under
the run dir's lock and examples are claimed before decoding (:mod:`harness.records_dir`).
``manifest.json`` keeps one entry per invocation. Sweeps in one process reuse the loaded model.
A terminal gets a progress bar (prompts, ETA, running S); a log file gets one line per prompt.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
import time
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from harness.config import register_configs
from harness.jobs import measure
from harness.jobspec import Job, UserError, check_context, fail, hydra_message, prepare  # noqa: F401  (API)
from harness.records import RecordsError, RecordWriter, compression, config_label, read_manifest, update_manifest
from harness.runtime.kernels import cpu_identity

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
PACKAGES = ("torch", "transformers", "hydra-core", "datasets", "pandas", "lookahead-bench")


@functools.lru_cache(maxsize=2)
def cached_backend(name: str, dtype: str, device: str, attn: str, matmul: str = "auto"):
    """One loaded model per process and setting, so a sweep does not reload it per job."""
    from harness import load_backend

    return load_backend(name, dtype=dtype, device=device, attn=attn, matmul=matmul)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def invocation(job: Job, backend) -> dict[str, Any]:
    """This invocation's entry in the manifest: config, versions, git commit, hardware, matmul path and,
    for code tasks, which sandbox runs the generated programs."""
    import torch

    versions = {}
    for pkg in PACKAGES:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=5
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "id": uuid.uuid4().hex[:12], "started": _now(), "ended": None, "host": platform.node(), "pid": os.getpid(),
        "argv": sys.argv, "config": OmegaConf.to_container(job.cfg, resolve=True), "git_commit": commit,
        "versions": versions, "matmul_path": getattr(backend, "matmul_path", None),
        "attention_path": getattr(backend, "attention_path", None),
        "code_sandbox": job.task.sandbox_kind() if hasattr(job.task, "sandbox_kind") else None,
        "hardware": {
            "platform": platform.platform(),
            "cpu": cpu_identity(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": backend.gpu_name,
        },
    }


def _begin(job: Job, backend, tuned: dict[str, Any] | None, inv: dict[str, Any]) -> None:
    """Append this invocation to the manifest (under the lock). An auto-tuned shape already recorded by
    another process of the same job wins, so the job's records all use one shape."""

    def change(m: dict[str, Any]) -> dict[str, Any]:
        if m.get("job_id", job.job_id) != job.job_id:
            raise RecordsError(f"{job.run_dir}/manifest.json belongs to job {m['job_id']!r}, not {job.job_id!r}")
        return {
            **m, "job_id": job.job_id, "variant": job.variant, "identity": job.identity, "config": inv["config"],
            "max_new_tokens": job.max_new_tokens, "model_shape": vars(backend.shape),
            "tuned": m.get("tuned") or tuned, "invocations": [*m.get("invocations", []), inv],
        }

    recorded = update_manifest(job.run_dir, change)["tuned"]
    if recorded and recorded != tuned:
        job.decoder.adopt(recorded)


def _end(job: Job, inv_id: str, counts: dict[str, int]) -> None:
    def change(m: dict[str, Any]) -> dict[str, Any]:
        for entry in m.get("invocations", []):
            if entry.get("id") == inv_id:
                entry.update(ended=_now(), counts=counts)
        return m

    update_manifest(job.run_dir, change)


def _autotune(job: Job, backend) -> dict[str, Any]:
    """Tune lookahead's shape (W, N, G, text_ngram, step_tokens) on the job's first two prompts, or
    reuse the choice of an earlier run of the same job (so a resumed run keeps one configuration). With
    pool_from_corpus their answers are the corpus: each prompt drafts from the other's, never its own."""
    from decoders.lookahead import SHAPE
    from tasks import encode_prompt

    prior = read_manifest(job.run_dir).get("tuned")
    if prior:
        job.decoder.adopt(prior)
        return prior
    prompts = [encode_prompt(job.task.prompt(ex, 0, []), backend.tokenizer) for ex in job.examples[:2]]
    job.decoder.tune(backend, prompts, job.max_new_tokens)
    t = job.decoder.tuned
    shape = ", ".join(f"{k}={t.params[k]}" for k in SHAPE)
    print(f"  auto-tuned {shape}, predicted speedup {t.predicted:.2f}x", flush=True)
    return {"params": t.params, "predicted": t.predicted, "calibration": t.calibration, "corpus": t.corpus}


class _Loop:
    """Decodes the job's examples into the writer; counts and reports progress."""

    def __init__(self, job: Job, backend, writer: RecordWriter) -> None:
        from tqdm import tqdm

        self.job, self.backend, self.writer = job, backend, writer
        cfg = job.cfg
        self.sampling = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=cfg.seed)
        self.room = min(cfg.max_prompt_tokens, backend.shape.max_positions - job.max_new_tokens)
        self.counts = {"done": 0, "resumed": 0, "skipped": 0}
        self.tokens = self.steps = 0
        self.secs = 0.0
        self.warmed = False
        self.bar = tqdm(total=len(job.examples), unit="ex", desc=cfg.task.name, file=sys.stderr,
                        disable=not sys.stderr.isatty())

    def say(self, line: str, always: bool = False) -> None:
        """Per-prompt lines go to a log (not a terminal, which has the bar); ``always``: to both."""
        if self.bar.disable:
            print(line, flush=True)
        elif always:
            self.bar.write(line)

    def example(self, i: int, ex, wait: bool) -> bool:
        """Decode every turn of ``ex`` not yet on disk; False if another process holds its claim."""
        job = self.job
        with self.writer.claim(f"{job.cfg.task.name}\x00{ex.id}", wait=wait) as mine:
            if not mine:
                return False
            history: list[str] = []
            for turn in range(job.task.num_turns(ex)):
                if not self.turn(i, ex, turn, history):
                    break
        self.bar.update(1)
        return True

    def turn(self, i: int, ex, turn: int, history: list[str]) -> bool:
        """One prompt; False when it was skipped (the later turns need its answer)."""
        from decoders.sampling import prompt_seed
        from tasks import encode_prompt

        job, cfg, writer = self.job, self.job.cfg, self.writer
        key = (cfg.task.name, ex.id, turn)
        if writer.has(key):  # by an earlier run or, just now, by another process
            history.append(writer.text(key) or "")
            self.counts["resumed"] += 1
            return True
        n = len(job.examples)
        ids = encode_prompt(job.task.prompt(ex, turn, history), self.backend.tokenizer)
        base = {
            "task": cfg.task.name, "example_id": ex.id, "turn": turn, "model": cfg.model.name, "dtype": cfg.dtype,
            "device": cfg.device, "decoder": job.decoder.name, "params": job.decoder.params, **self.sampling,
            "max_new_tokens": job.max_new_tokens, "prompt_tokens": len(ids), "job_id": job.job_id,
            "variant": job.variant, "matmul_path": self.backend.matmul_path,
            "attention_path": self.backend.attention_path,
        }
        if len(ids) > self.room:
            writer.write({**base, "status": "skipped", "scores": {}})
            self.counts["skipped"] += 1
            self.say(f"  {i}/{n} {ex.id} turn {turn}: skipped ({len(ids)} prompt tokens > {self.room})", always=True)
            return False
        if not self.warmed:
            job.decoder.generate(self.backend, ids, min(cfg.warmup_tokens, job.max_new_tokens), **self.sampling)
            self.warmed = True
        sampling = {**self.sampling, "seed": prompt_seed(cfg.seed, *key)}  # independent draws per prompt
        res, measured = measure(job.decoder, self.backend, ids, job.max_new_tokens, **sampling)
        text = self.backend.tokenizer.decode(res.tokens, skip_special_tokens=True)
        history.append(text)
        last = turn == job.task.num_turns(ex) - 1
        record = {**base, "status": "ok", "sample_seed": sampling["seed"], **measured, "text": text,
                  "scores": job.task.score(ex, history) if last else {}}
        if not writer.write(record):  # another process wrote it first (wasted work, no duplicate)
            self.counts["resumed"] += 1
            return True
        self.counts["done"] += 1
        self.tokens += len(res.tokens)
        self.steps += res.steps
        self.secs += res.decode_s
        running = self.tokens / max(self.steps, 1)
        self.bar.set_postfix_str(f"S {running:.2f}, {self.tokens / max(self.secs, 1e-9):.1f} tok/s", refresh=False)
        self.say(
            f"  {i}/{n} {ex.id} turn {turn}: {len(res.tokens)} tok, S {res.compression:.2f}, "
            f"{len(res.tokens) / max(res.decode_s, 1e-9):.1f} tok/s | running S {running:.2f}"
        )
        return True

    def run(self) -> None:
        """Every example once: those another process holds are retried at the end, waiting for it."""
        deferred = [(i, ex) for i, ex in enumerate(self.job.examples, 1) if not self.example(i, ex, wait=False)]
        for i, ex in deferred:
            self.example(i, ex, wait=True)
        self.bar.close()


def run(cfg: DictConfig) -> dict[str, Any]:
    """Execute one job; returns its summary (also printed)."""
    job = prepare(cfg)
    backend = cached_backend(cfg.model.name, cfg.dtype, cfg.device, cfg.model.attn, cfg.matmul)
    check_context(job, backend.shape.max_positions, lambda: backend.tokenizer)
    label = config_label(job.decoder.name, job.decoder.params)
    tuned = _autotune(job, backend) if getattr(job.decoder, "auto", False) else None
    inv = invocation(job, backend)
    with RecordWriter(job.run_dir, job_id=job.job_id) as writer:
        _begin(job, backend, tuned, inv)
        print(f"[{cfg.task.name} | {label}] {len(job.examples)} examples -> {job.run_dir}", flush=True)
        loop = _Loop(job, backend, writer)
        try:
            loop.run()
        finally:
            _end(job, inv["id"], loop.counts)
    counts, tokens, steps, secs = loop.counts, loop.tokens, loop.steps, loop.secs
    summary = {
        "run_dir": str(job.run_dir), "job_id": job.job_id, **counts, "new_tokens": tokens, "steps": steps,
        "S": compression(tokens, steps) if steps else None, "tokens_per_s": tokens / secs if secs else None,
    }
    s_txt = f"{summary['S']:.3f}" if steps else "n/a"
    tps = f"{summary['tokens_per_s']:.1f}" if secs else "n/a"
    print(
        f"[{cfg.task.name} | {label}] done {counts['done']}, resumed {counts['resumed']}, skipped "
        f"{counts['skipped']}; S = {s_txt} (tokens/steps, prefill not counted), {tps} tok/s "
        f"({cfg.device}, {cfg.dtype})",
        flush=True,
    )
    return summary


register_configs()


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    from harness.runtime.backend import ModelLoadError

    try:
        run(cfg)
    except (UserError, ModelLoadError, RecordsError) as err:
        fail(str(err))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``lookahead-run``); ``argv`` replaces ``sys.argv[1:]`` (tests)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    saved_argv, saved_env = sys.argv, os.environ.get("HYDRA_FULL_ERROR")
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises its own errors (bad override, unknown option) to us
    try:
        _hydra_main()
    except (HydraException, OmegaConfBaseException) as err:
        fail(hydra_message(err))
    finally:
        sys.argv = saved_argv
        if saved_env is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved_env


if __name__ == "__main__":
    # run through the importable module, not __main__, so launchers that pickle the job function
    # (joblib, submitit) can find it in their worker processes
    from harness.run import main as _importable_main

    _importable_main()
