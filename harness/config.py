"""Structured configs behind ``conf/``: typos and wrong types are rejected by Hydra before anything loads.

Decoder schemas are *derived* from the decoder dataclasses, so each default lives in exactly one place
(the decoder's own field). ``conf/decoder/<name>.yaml`` extends ``base_<name>`` registered here.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING as DC_MISSING
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from decoders import DECODERS


@dataclass
class ModelConfig:
    name: str = "smollm2"  # embedded name, local checkpoint path, or Hugging Face id
    attn: str = "auto"  # attention: auto (our kernel where it runs, else sdpa), kernel, sdpa or eager


@dataclass
class TaskConfig:
    name: str = MISSING
    options: dict[str, Any] = field(default_factory=dict)  # task-specific (e.g. num_fewshot for gsm8k)


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    decoder: Any = MISSING
    task: TaskConfig = field(default_factory=TaskConfig)
    limit: Optional[int] = 5  # examples per task (None = all)
    max_new_tokens: Optional[int] = None  # None = the task's default (paper settings)
    max_prompt_tokens: int = 4096  # longer prompts are skipped and counted, never truncated
    seed: int = 0
    dtype: str = "float32"  # float32, bf16w (bfloat16 weights, float32 compute: exact), bfloat16, float16
    matmul: str = "auto"  # auto, library, or a kernel variant to force: avx512, avx2, baseline
    device: str = "cpu"
    data_dir: Optional[str] = None  # local copies of the datasets (else LOOKAHEAD_DATA_DIR, else the hub)
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    warmup_tokens: int = 16  # one untimed generation per job before timing
    results_dir: str = "results/runs"


def decoder_schema(name: str) -> type:
    """A Hydra schema with the decoder's fields and defaults, plus its ``name``."""
    cls = DECODERS[name]
    hints = typing.get_type_hints(cls)
    spec: list[tuple[str, Any, Any]] = [("name", str, field(default=name))]
    for f in fields(cls):
        if not f.init:  # per-run state, not a parameter
            continue
        default = f.default if f.default is not DC_MISSING else MISSING
        spec.append((f.name, hints[f.name], field(default=default)))
    return make_dataclass(f"{cls.__name__}Config", spec)


def register_configs() -> None:
    """Register the schemas (idempotent; Hydra's ConfigStore is its own process-wide registry)."""
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="task", name="base_task", node=TaskConfig)
    for name in DECODERS:
        cs.store(group="decoder", name=f"base_{name}", node=decoder_schema(name))
