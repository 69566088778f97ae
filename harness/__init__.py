"""lookahead-bench harness: the model runtime, the job pipeline, records and analysis.

Layout (who may import whom, top to bottom):

- ``runtime/``: the one LLaMA backend, its matmul paths and kernels, FLOPs, loading (torch).
- ``jobs.py``: the one decode-and-record step that run, perf and regression share.
- ``jobspec.py``: a job's identity and every input check, before anything loads or is written.
- ``records.py`` (+ ``records_dir.py``): storage (records, manifests, locks, claims); no torch.
- ``analysis/``: report, fit, tables, plots, uncertainty; records in, figures out; no torch.
- entry points: ``run`` (+ ``config``), ``demo``, ``perf``, ``regression``, ``report``, ``fit``, ``tables``.

``load_backend`` is resolved lazily so that ``import harness`` (and every analysis module) works
without torch: a notebook can redraw every figure from a results folder on a laptop.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_backend"]


def __getattr__(name: str) -> Any:
    if name == "load_backend":  # harness.runtime.loading.load_backend, imported on first use
        from harness.runtime.loading import load_backend

        return load_backend
    raise AttributeError(f"module 'harness' has no attribute {name!r}")
