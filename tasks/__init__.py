"""Benchmark task adapters: one :class:`~tasks.base.Task` subclass per benchmark, looked up by name."""

from __future__ import annotations

from typing import Any

from tasks.base import Example, Prompt, Task, encode_prompt
from tasks.classeval import ClassEval
from tasks.cnn_dm import CNNDailyMail
from tasks.data import DATA_DIR_ENV, DatasetUnavailable
from tasks.gsm8k import GSM8K
from tasks.humaneval import HumanEval
from tasks.mbpp import MBPP
from tasks.mt_bench import MTBench
from tasks.xsum import XSum

TASKS: dict[str, type[Task]] = {
    cls.name: cls for cls in (MTBench, GSM8K, HumanEval, MBPP, ClassEval, CNNDailyMail, XSum)
}


def build_task(name: str, **kwargs: Any) -> Task:
    """Instantiate the task registered as ``name`` (kwargs: data_dir, limit, task options)."""
    try:
        cls = TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; valid names: {', '.join(sorted(TASKS))}") from None
    return cls(**kwargs)


__all__ = [
    "DATA_DIR_ENV",
    "TASKS",
    "DatasetUnavailable",
    "Example",
    "Prompt",
    "Task",
    "build_task",
    "encode_prompt",
]
