"""lookahead-bench harness: the shared model backend, the runner, records and analysis.

``load_backend`` is imported lazily so that analysis modules (records, report, fit, tables, plots)
import without torch: a notebook can redraw every figure from a results folder on a laptop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.backend import Backend


def load_backend(name_or_path: str = "smollm2", dtype: str = "float32", device: str = "cpu", attn: str = "sdpa") -> Backend:
    """Load a LLaMA-family model into the shared backend (see :func:`harness.backend.load_backend`)."""
    from harness.backend import load_backend as _load

    return _load(name_or_path, dtype=dtype, device=device, attn=attn)


__all__ = ["load_backend"]
