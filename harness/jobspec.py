"""A job's specification: every check on its config, its identity (``job_id``, ``variant``), its run dir.

Every bad input is found before the model loads and before any file is written:

* :func:`prepare` checks the resolved config and builds the decoder and the task (data included);
* :func:`check_context` checks what needs the model: ``max_new_tokens`` against its context and
  the auto-tuner's prompts against what is left of it. The runner calls it right after loading;
  :class:`ValidateJobs`, a Hydra callback (``conf/config.yaml``), runs both on every job of a run
  or a whole sweep, from the model's config file alone, before Hydra writes anything.

Identity: :func:`identity` holds everything that can change a record (model, dtype, device, attention
path, task and its options with their defaults filled in, data source, max_new_tokens,
max_prompt_tokens, sampling, decoder and its parameters; at T > 0 also how each prompt's draws are seeded,
so records of an older seeding are never resumed into one job) and nothing that cannot (``results_dir``,
``warmup_tokens``, ``limit``: a record of an example is the same whatever the limit, so raising the
limit resumes and extends a job). ``job_id`` is its hash and the last part of the run directory;
``variant`` is the hash of the identity without the decoder, the key that pairs a decoder with ``ar``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import re
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from harness.config import ModelConfig, RunConfig, TaskConfig
from harness.records import config_label

#: Config keys that cannot change a record (see module docstring).
NOT_IDENTITY = ("results_dir", "warmup_tokens", "limit")


class UserError(Exception):
    """Bad input: printed as one ``error:`` line, exit status 2, no traceback, nothing written."""


def fail(message: str) -> None:
    """Print the one line and exit 2 (SystemExit passes through Hydra's and the launchers' handlers)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


@dataclass
class Job:
    """A validated job: everything built except the model."""

    cfg: DictConfig
    decoder: Any
    task: Any
    examples: list
    max_new_tokens: int
    identity: dict[str, Any]
    job_id: str
    variant: str
    run_dir: Path


def digest(value: Any) -> str:
    """12 hex digits of the SHA-256 of ``value``'s canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.=,()" else "-" for c in text)


def task_options(task: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The task's keyword options with defaults filled in, so an explicit default is the same job."""
    out: dict[str, Any] = {}
    for cls in reversed(type(task).__mro__):
        if "__init__" in vars(cls):
            for p in inspect.signature(cls.__init__).parameters.values():
                if p.kind is p.KEYWORD_ONLY and p.default is not p.empty:
                    out[p.name] = p.default
    return {**out, **given}


def identity(cfg: DictConfig, decoder: Any, task: Any, options: dict[str, Any], max_new: int) -> dict[str, Any]:
    """What a record depends on (see module docstring); paths are made absolute."""
    from harness.runtime.loading import EMBEDDED_MODELS
    from tasks.data import resolve_data_dir

    name = cfg.model.name
    path = Path(name).expanduser()
    model = name if name in EMBEDDED_MODELS or not path.exists() else str(path.resolve())
    local = resolve_data_dir(cfg.data_dir)
    data = str(local.resolve()) if local is not None else f"hf:{task.hf_id}:{task.hf_config}:{task.hf_split}"
    sampled = {"seeding": "prompt_seed"} if cfg.temperature > 0 else {}  # how a prompt's draws are seeded
    return {
        **sampled,
        "model": model, "dtype": cfg.dtype, "device": cfg.device, "attn": cfg.model.attn, "matmul": cfg.matmul,
        "task": cfg.task.name, "task_options": task_options(task, options), "data": data,
        "max_new_tokens": max_new, "max_prompt_tokens": cfg.max_prompt_tokens,
        "temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p, "seed": cfg.seed,
        "decoder": {"name": decoder.name, "params": decoder.params},
    }


@functools.lru_cache(maxsize=32)
def _task(name: str, data_dir: str | None, limit: int | None, options: str) -> Any:
    """A task, built once per process: it loads its examples once (a sweep checks, then runs, each job)."""
    from tasks import build_task

    return build_task(name, data_dir=data_dir, limit=limit, **json.loads(options))


def _check_keys(cfg: DictConfig) -> None:
    """Keys added with ``+key=...`` that nothing reads (Hydra lets ``+`` add anything)."""
    known = {"": RunConfig, "model.": ModelConfig, "task.": TaskConfig}
    for prefix, schema in known.items():
        node = cfg if not prefix else cfg.get(prefix[:-1])
        names = {f.name for f in fields(schema)} | ({"hydra"} if not prefix else set())
        extra = [f"{prefix}{k}" for k in (node or {}) if k not in names]
        if extra:
            raise ValueError(f"unknown option(s) {extra}; `python -m harness.run --cfg job` lists every option")


def _check_setup(cfg: DictConfig) -> None:
    import torch

    from harness.runtime.layer_ops import ATTN_CHOICES
    from harness.runtime.loading import DTYPES
    from harness.runtime.matmul import MATMUL_CHOICES

    if cfg.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
    if cfg.matmul not in MATMUL_CHOICES:
        raise ValueError(f"matmul must be one of {', '.join(MATMUL_CHOICES)}, got {cfg.matmul!r}")
    if cfg.matmul not in ("auto", "library"):
        from harness.runtime.kernels import available_variants

        if cfg.device != "cpu" or cfg.dtype not in ("float32", "bf16w"):
            raise ValueError(f"matmul={cfg.matmul} is a CPU kernel for float32/bf16w; use matmul=auto")
        if cfg.matmul not in available_variants():
            raise ValueError(f"this CPU cannot run the {cfg.matmul} kernel; it can run: "
                             f"{', '.join(available_variants())} (or matmul=auto)")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", cfg.device):
        raise ValueError(f"device must be cpu or cuda[:N], got {cfg.device!r}")
    if cfg.device.startswith("cuda"):
        index = int(cfg.device.partition(":")[2] or 0)
        if not torch.cuda.is_available():
            raise ValueError(f"device={cfg.device} but CUDA is not available on this machine; use device=cpu")
        if index >= torch.cuda.device_count():
            raise ValueError(f"device={cfg.device} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    if cfg.model.attn not in ATTN_CHOICES:
        raise ValueError(f"model.attn must be one of {', '.join(ATTN_CHOICES)}, got {cfg.model.attn!r}")
    if cfg.model.attn == "kernel" and (cfg.device != "cpu" or cfg.dtype not in ("float32", "bf16w")
                                       or cfg.matmul == "library"):
        raise ValueError("model.attn=kernel is our CPU kernel's attention: it needs device=cpu, dtype float32 or "
                         "bf16w and matmul other than library; use model.attn=auto")
    for key, low in (("warmup_tokens", 1), ("max_prompt_tokens", 1)):
        if cfg[key] < low:
            raise ValueError(f"{key} must be an integer >= {low}, got {cfg[key]}")
    if cfg.limit is not None and cfg.limit < 0:
        raise ValueError(f"limit must be >= 0 or null (all examples), got {cfg.limit}")
    where = Path(cfg.results_dir).expanduser().absolute()
    while not where.exists():
        where = where.parent
    if not where.is_dir() or not os.access(where, os.W_OK | os.X_OK):
        what = "a file" if not where.is_dir() else "not writable"
        raise ValueError(f"results_dir={cfg.results_dir} cannot be created: {where} is {what}; choose a writable directory")


def prepare(cfg: DictConfig) -> Job:
    """Validate the config and build decoder and task (no model, no files written)."""
    from decoders import build_decoder
    from decoders.sampling import SamplingParams
    from tasks.data import DatasetUnavailable

    try:
        _check_keys(cfg)
        params = {k: v for k, v in OmegaConf.to_container(cfg.decoder, resolve=True).items() if k != "name"}
        decoder = build_decoder(cfg.decoder.name, **params)
        SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed)
        _check_setup(cfg)
        options = OmegaConf.to_container(cfg.task.options, resolve=True)
        task = _task(cfg.task.name, cfg.data_dir, cfg.limit, json.dumps(options, sort_keys=True))
        max_new = cfg.max_new_tokens if cfg.max_new_tokens is not None else task.default_max_new_tokens
        if max_new < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new}")
        auto = getattr(decoder, "auto", False)
        if getattr(decoder, "pool_from_corpus", False) and not auto:
            raise ValueError("decoder.pool_from_corpus=true drafts from the auto-tuner's calibration answers; "
                             "set decoder.auto=true with it")
        no_prompts = (f"decoder.auto=true tunes on the job's first prompts, but limit={cfg.limit} selects none; "
                      "use limit >= 1")
        if auto and cfg.limit is not None and cfg.limit < 1:  # a config error: say so before loading any data
            raise ValueError(no_prompts)
        examples = task.examples()
        if auto and not examples:
            raise ValueError(no_prompts)
    except (ValueError, TypeError, DatasetUnavailable) as err:
        raise UserError(str(err)) from None
    ident = identity(cfg, decoder, task, options, max_new)
    job_id = digest(ident)
    variant = digest({k: v for k, v in ident.items() if k != "decoder"})
    sampling = f"T{cfg.temperature:g}-k{cfg.top_k}-p{cfg.top_p:g}-seed{cfg.seed}-max{max_new}"
    run_dir = (
        Path(cfg.results_dir)
        / cfg.task.name
        / _safe(f"{cfg.model.name}-{cfg.dtype}-{cfg.device}")
        / _safe(config_label(decoder.name, decoder.params))
        / f"{sampling}-{job_id}"
    )
    return Job(cfg, decoder, task, examples, max_new, ident, job_id, variant, run_dir)


def check_context(job: Job, max_positions: int, tokenizer: Callable[[], Any]) -> None:
    """What needs the model: room for the answer, and the tuner's prompts (``tokenizer`` is called
    only when the decoder auto-tunes). Raises UserError."""
    from tasks import encode_prompt

    cfg, max_new = job.cfg, job.max_new_tokens
    if max_new >= max_positions:
        raise UserError(f"max_new_tokens={max_new} leaves no room for a prompt in the model's context of "
                        f"{max_positions} positions; use max_new_tokens < {max_positions}")
    room = min(cfg.max_prompt_tokens, max_positions - max_new)
    if getattr(job.decoder, "auto", False):
        tok = tokenizer()
        for ex in job.examples[:2]:
            n = len(encode_prompt(job.task.prompt(ex, 0, []), tok))
            if n > room:
                raise UserError(
                    f"decoder.auto=true tunes on prompt {ex.id}, which has {n} tokens, more than the {room} "
                    f"that fit (context {max_positions} - max_new_tokens {max_new}, max_prompt_tokens "
                    f"{cfg.max_prompt_tokens}); lower max_new_tokens or use a fixed shape (decoder.auto=false)")


@functools.lru_cache(maxsize=4)
def model_context(name: str) -> tuple[int, Callable[[], Any]]:
    """The model's context length from its config file, and a tokenizer loader (no weights read)."""
    from transformers import AutoConfig, AutoTokenizer

    from harness.runtime.backend import ModelLoadError
    from harness.runtime.loading import EMBEDDED_MODELS, embedded_checkpoint

    try:
        source = embedded_checkpoint(name) if name in EMBEDDED_MODELS else name
        config = AutoConfig.from_pretrained(source)
    except ModelLoadError as err:
        raise UserError(str(err)) from None
    except (OSError, ValueError) as err:
        raise UserError(
            f"cannot load model {name!r}: {str(err).splitlines()[0]}; use the embedded 'smollm2', a local "
            "checkpoint directory, or a Hugging Face id that is in your local cache") from None
    return config.max_position_embeddings, functools.cache(lambda: AutoTokenizer.from_pretrained(source))


def sweep_configs(config: DictConfig) -> list[DictConfig] | None:
    """Every job config of a BasicSweeper sweep, composed as the sweeper will compose them; None for
    other sweepers (their jobs are checked as they start)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if config.hydra.sweeper.get("_target_") != f"{BasicSweeper.__module__}.{BasicSweeper.__name__}":
        return None
    loader = GlobalHydra.instance().config_loader()
    params = config.hydra.sweeper.get("params") or {}
    args = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    overrides = OverridesParser.create(config_loader=loader).parse_overrides(args)
    return [loader.load_sweep_config(config, list(job)) for batch in BasicSweeper.split_arguments(overrides, None)
            for job in batch]


def validate(configs: list[DictConfig]) -> None:
    """Run every check on every config; the first bad one fails (one line, exit 2)."""
    for i, cfg in enumerate(configs):
        try:
            job = prepare(cfg)
            check_context(job, *model_context(cfg.model.name))
        except UserError as err:
            where = f"job #{i} ({' '.join(cfg.hydra.overrides.task)}): " if len(configs) > 1 else ""
            fail(f"{where}{err}")


def hydra_message(err: BaseException) -> str:
    """One line from Hydra's multi-line composition errors, with what to do."""
    from hydra.errors import MissingConfigException

    if isinstance(err, MissingConfigException) and err.options:
        what = str(err).splitlines()[0].split(": ", 1)[-1]
        options = ", ".join(o for o in err.options if not o.startswith("base_"))
        return f"{what}; choose one of: {options}"
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip() and not ln.strip().startswith("To append")]
    cause = str(err.__cause__).splitlines()[0] if err.__cause__ is not None else ""
    text = "; ".join(lines).rstrip(".") + (f": {cause}" if cause else "")
    return f"{text} (`python -m harness.run --cfg job` shows every option, its type and value)"


class ValidateJobs(Callback):
    """Checks a run, or every job of a sweep, before Hydra creates a directory or starts a job.

    Hydra turns a callback's exceptions into warnings, so a bad job ends the process here (``fail``).
    """

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        validate([config])

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        try:
            configs = sweep_configs(config)
        except (HydraException, OmegaConfBaseException) as err:  # a sweep value that does not compose
            fail(hydra_message(err))
        validate(configs or [])
