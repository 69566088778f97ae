"""Our one compiled kernel: the float32 matmul of decoding steps, built for few rows (``small_gemm.cpp``).

Built on first use with torch's C++ extension loader (about 25 s, then cached under
``~/.cache/torch_extensions``). Where it cannot apply the backend keeps its library matmuls:
:func:`load_small_gemm` returns None, silently on a CPU without AVX-512, with a one-line note on stderr
when the build fails (no compiler, ninja or headers).
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path
from types import ModuleType

import torch

SOURCE = Path(__file__).with_name("small_gemm.cpp")


@lru_cache(maxsize=1)  # one build per process; the loader also caches across processes
def load_small_gemm() -> ModuleType | None:
    """The compiled module, or None where it cannot be used."""
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return None  # the kernel is written for AVX-512; other CPUs keep the library matmuls
    try:
        from torch.utils.cpp_extension import load

        return load(
            name="lookahead_small_gemm", sources=[str(SOURCE)],
            extra_cflags=["-O3", "-mavx512f", "-mfma", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False,
        )
    except Exception as err:  # no compiler / ninja / headers: fall back, never fail the run
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"note: small-row matmul kernel not built ({first}); using library matmuls", file=sys.stderr)
        return None
