"""The kernel's compiler and linker flags: per variant, and OpenMP's per platform.

Why OpenMP's are a function: the kernel spreads its blocks over torch's threads with ``at::parallel_for``,
which torch's OpenMP builds (Linux, macOS) define in a header under ``#pragma omp parallel``; compiled
without OpenMP it runs the whole range on the calling thread, correct (each output is still one
accumulator summed in k order) but on one core. GCC and LLVM's clang take ``-fopenmp``. Apple's clang
rejects it ("unsupported option '-fopenmp'", which failed the whole build), so there the flag goes to
the front end (``-Xclang -fopenmp``) and links the ``libomp.dylib`` that torch's macOS wheels ship
beside ``omp.h`` (``torch/lib``, ``torch/include``, since torch 2.3), as ``torch.compile`` does: one
OpenMP runtime in the process, torch's own. Where that torch has no ``omp.h`` the kernel is built
without OpenMP, and ``KernelInfo.openmp`` (and the manifests' matmul path) say it runs on one thread.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from pathlib import Path

# flags common to every variant: no -ffast-math, and no contraction of a * b + c behind our back (the
# explicit fmadd is an intrinsic where the ISA has FMA; the generic fallback stays mul-then-add)
COMMON_CFLAGS = ("-O3", "-ffp-contract=off", "-fno-fast-math")

# variant -> (compiler flags, /proc/cpuinfo flags the CPU needs); preference order on x86
X86_VARIANTS: dict[str, tuple[list[str], set[str]]] = {
    "avx512": (["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
                "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
               {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"}),
    "avx2": (["-mavx2", "-mfma", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"], {"avx2", "fma"}),
    "baseline": (["-DCPU_CAPABILITY=DEFAULT", "-DCPU_CAPABILITY_DEFAULT"], set()),
}
# elsewhere only the default build: NEON on aarch64, the generic arrays (or the compiler's default
# target) on other architectures
OTHER_VARIANTS: dict[str, tuple[list[str], set[str]]] = {
    "baseline": (["-DCPU_CAPABILITY=DEFAULT", "-DCPU_CAPABILITY_DEFAULT"], set()),
}


def openmp_flags(system: str | None = None, include_dirs: Sequence[str] | None = None,
                 lib_dir: str | None = None) -> tuple[list[str], list[str]]:
    """``(compiler flags, linker flags)`` for OpenMP on ``system`` (``platform.system()``), given torch's
    include directories and library directory (default: this torch's); ``([], [])`` where it cannot be had."""
    system = platform.system() if system is None else system
    if system != "Darwin":
        return ["-fopenmp"], ["-fopenmp"]
    if include_dirs is None or lib_dir is None:
        from torch.utils import cpp_extension

        include_dirs = cpp_extension.include_paths() if include_dirs is None else include_dirs
        lib_dir = cpp_extension.library_paths()[0] if lib_dir is None else lib_dir
    if any((Path(d) / "omp.h").is_file() for d in include_dirs):
        return ["-Xclang", "-fopenmp"], [f"-L{lib_dir}", "-lomp", f"-Wl,-rpath,{lib_dir}"]
    return [], []
