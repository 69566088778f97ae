"""Run one job (model x decoder x task) and append one record per prompt and turn.

    python -m harness.run decoder=lookahead decoder.W=7 task=humaneval limit=20 max_new_tokens=256
    python -m harness.run -m decoder=ar,lookahead decoder.W=5,10,15 task=humaneval,gsm8k

Everything that can be wrong with the inputs (unknown decoder/task/model option, bad W/N/G, missing
dataset) is checked before the model loads and before the run directory exists, so a bad job leaves
nothing behind. The run directory is a pure function of the job's identity, so re-running an
interrupted job resumes it: finished (example, turn) records are skipped, none is duplicated.
Sweeps in one process reuse the loaded model (``cached_backend``).
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from harness.config import register_configs
from harness.jobs import measure
from harness.records import RecordsError, compression, RecordWriter, config_label, read_manifest, write_manifest

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
PACKAGES = ("torch", "transformers", "hydra-core", "datasets", "pandas", "lookahead-bench")


class UserError(Exception):
    """Bad input: printed as one line, no traceback."""


@functools.lru_cache(maxsize=2)
def cached_backend(name: str, dtype: str, device: str, attn: str):
    """One loaded model per process and setting, so a sweep does not reload it per job."""
    from harness import load_backend

    return load_backend(name, dtype=dtype, device=device, attn=attn)


@dataclass
class Job:
    """A validated job: everything built except the model."""

    cfg: DictConfig
    decoder: Any
    task: Any
    examples: list
    max_new_tokens: int
    run_dir: Path


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=,()" else "-" for c in text)


def prepare(cfg: DictConfig) -> Job:
    """Validate the config and build decoder and task (no model, no files written)."""
    from decoders import build_decoder
    from decoders.sampling import SamplingParams
    from tasks import build_task
    from tasks.data import DatasetUnavailable

    params = {k: v for k, v in OmegaConf.to_container(cfg.decoder, resolve=True).items() if k != "name"}
    try:
        decoder = build_decoder(cfg.decoder.name, **params)
        SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed)
        if cfg.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {cfg.dtype!r}")
        if cfg.limit is not None and cfg.limit < 0:
            raise ValueError(f"limit must be >= 0 or null, got {cfg.limit}")
        task = build_task(cfg.task.name, data_dir=cfg.data_dir, limit=cfg.limit, **cfg.task.options)
        max_new = cfg.max_new_tokens if cfg.max_new_tokens is not None else task.default_max_new_tokens
        if max_new < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new}")
        examples = task.examples()
    except (ValueError, TypeError, DatasetUnavailable) as err:
        raise UserError(str(err)) from None
    sampling = f"T{cfg.temperature:g}-k{cfg.top_k}-p{cfg.top_p:g}-seed{cfg.seed}-max{max_new}"
    run_dir = (
        Path(cfg.results_dir)
        / cfg.task.name
        / _safe(f"{cfg.model.name}-{cfg.dtype}-{cfg.device}")
        / _safe(config_label(decoder.name, decoder.params))
        / sampling
    )
    return Job(cfg, decoder, task, examples, max_new, run_dir)


def manifest(job: Job, backend) -> dict[str, Any]:
    """Resolved config, versions, git commit and hardware, written beside the records."""
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
    except OSError:
        commit = None
    return {
        "config": OmegaConf.to_container(job.cfg, resolve=True),
        "decoder_params": job.decoder.params,
        "max_new_tokens": job.max_new_tokens,
        "versions": versions,
        "git_commit": commit,
        "hardware": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if backend.device.type == "cuda" else None,
        },
        "model_shape": vars(backend.shape),
    }


def _autotune(job: Job, backend) -> dict[str, Any]:
    """Tune lookahead's shape (W, N, G, text_ngram, step_tokens) on the job's first two prompts, or
    reuse the choice of an interrupted run of the same job (so a resumed run keeps one configuration)."""
    from decoders.lookahead import SHAPE
    from tasks import encode_prompt

    try:
        prior = read_manifest(job.run_dir).get("tuned")
    except RecordsError:
        prior = None
    if prior:
        job.decoder.set_shape(prior["params"])
        job.decoder.tuned = prior
        return prior
    prompts = [encode_prompt(job.task.prompt(ex, 0, []), backend.tokenizer) for ex in job.examples[:2]]
    job.decoder.tune(backend, prompts, job.max_new_tokens)
    t = job.decoder.tuned
    shape = ", ".join(f"{k}={t.params[k]}" for k in SHAPE)
    print(f"  auto-tuned {shape}, predicted speedup {t.predicted:.2f}x", flush=True)
    return {"params": t.params, "predicted": t.predicted, "calibration": t.calibration}


def run(cfg: DictConfig) -> dict[str, Any]:
    """Execute one job; returns its summary (also printed)."""
    from tasks import encode_prompt

    job = prepare(cfg)
    backend = cached_backend(cfg.model.name, cfg.dtype, cfg.device, cfg.model.attn)
    tok = backend.tokenizer
    label = config_label(job.decoder.name, job.decoder.params)
    sampling = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, seed=cfg.seed)
    limit_ctx = min(cfg.max_prompt_tokens, backend.shape.max_positions - job.max_new_tokens)

    tuned = _autotune(job, backend) if getattr(job.decoder, "auto", False) else None
    writer = RecordWriter(job.run_dir)
    write_manifest(job.run_dir, {**manifest(job, backend), "tuned": tuned})
    done = writer.done_keys()
    counts = {"done": 0, "resumed": 0, "skipped": 0}
    tokens = steps = 0
    secs = 0.0
    warmed = False
    n = len(job.examples)
    print(f"[{cfg.task.name} | {label}] {n} examples -> {job.run_dir}", flush=True)
    try:
        for i, ex in enumerate(job.examples, 1):
            history: list[str] = []
            for turn in range(job.task.num_turns(ex)):
                key = (cfg.task.name, ex.id, turn)
                if key in done:
                    history.append(writer.text(key) or "")
                    counts["resumed"] += 1
                    continue
                ids = encode_prompt(job.task.prompt(ex, turn, history), tok)
                base = {
                    "task": cfg.task.name, "example_id": ex.id, "turn": turn, "model": cfg.model.name,
                    "dtype": cfg.dtype, "device": cfg.device, "decoder": job.decoder.name,
                    "params": job.decoder.params, **sampling, "max_new_tokens": job.max_new_tokens,
                    "prompt_tokens": len(ids),
                }
                if len(ids) > limit_ctx:
                    writer.write({**base, "status": "skipped", "scores": {}})
                    counts["skipped"] += 1
                    print(f"  {i}/{n} {ex.id} turn {turn}: skipped ({len(ids)} prompt tokens > {limit_ctx})")
                    break  # later turns need this one's answer
                if not warmed:
                    job.decoder.generate(backend, ids, min(cfg.warmup_tokens, job.max_new_tokens), **sampling)
                    warmed = True
                res, measured = measure(job.decoder, backend, ids, job.max_new_tokens, **sampling)
                text = tok.decode(res.tokens, skip_special_tokens=True)
                history.append(text)
                last = turn == job.task.num_turns(ex) - 1
                writer.write({
                    **base, "status": "ok", **measured, "text": text,
                    "scores": job.task.score(ex, history) if last else {},
                })
                counts["done"] += 1
                tokens += len(res.tokens)
                steps += res.steps
                secs += res.decode_s
                print(
                    f"  {i}/{n} {ex.id} turn {turn}: {len(res.tokens)} tok, S {res.compression:.2f}, "
                    f"{len(res.tokens) / max(res.decode_s, 1e-9):.1f} tok/s | running S {tokens / max(steps, 1):.2f}",
                    flush=True,
                )
    finally:
        writer.close()
    summary = {
        "run_dir": str(job.run_dir), **counts, "new_tokens": tokens, "steps": steps,
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
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


def main() -> None:
    """Console-script entry point (``lookahead-run``)."""
    _hydra_main()


if __name__ == "__main__":
    # run through the importable module, not __main__, so launchers that pickle the job function
    # (joblib, submitit) can find it in their worker processes
    from harness.run import main as _importable_main

    _importable_main()
