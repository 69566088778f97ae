"""Compile the kernel sources for other CPUs and systems: ``python -m harness.runtime.kernels.cross_compile``.

Why: the sources claim one text for every CPU (at::vec compiles to NEON on aarch64), and most
researchers' machines are not this one (Apple silicon, Graviton). This compiles each source, as the
loader's baseline build would there (OpenMP on, through Apple clang's ``-Xclang -fopenmp`` on macOS), to
assembly with zig's clang (``pip install ziglang``, which carries every target's C and C++ headers) and
checks what came out: the ISA the build names (``info()["isa"]``), the vector FMAs in the matmul and its
OpenMP parallel regions (``at::parallel_for`` compiled to threads, not to one serial call).
Compile only: nothing is linked or run, and torch's headers are this (x86) install's, not an aarch64
wheel's. ``omp.h`` comes from a stub declaring the two OpenMP calls torch's headers make (torch's macOS
wheels ship the real one in ``torch/include``).

    python -m harness.runtime.kernels.cross_compile [--targets aarch64-linux-gnu aarch64-macos] [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.runtime.kernels import SOURCES
from harness.runtime.kernels.flags import COMMON_CFLAGS, OTHER_VARIANTS, openmp_flags

TARGETS = ("aarch64-linux-gnu", "aarch64-macos")
OMP_STUB = "#pragma once\nint omp_get_num_threads(void);\nint omp_get_thread_num(void);\n"
# NEON FMAs on 4 float32 lanes, in GNU (fmla v0.4s, ...) and Apple (fmla.4s v0, ...) assembly syntax
VECTOR_FMA = re.compile(r"^\s*fmla(\s+v\d+\.4s|\.4s\s)", re.MULTILINE)
OPENMP_REGION = "__kmpc_fork_call"  # what clang calls to start a parallel region: at::parallel_for's


def compile_command(target: str, source: Path, out: Path, stub_dir: Path) -> list[str]:
    """zig's clang on ``source`` for ``target`` with the baseline variant's flags, to assembly at ``out``."""
    from torch.utils import cpp_extension

    system = "Darwin" if "macos" in target else "Linux"
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"], str(stub_dir)]
    omp_cflags = openmp_flags(system, [str(stub_dir)], "unused")[0]
    return [sys.executable, "-m", "ziglang", "c++", "-target", target, "-std=c++17", *COMMON_CFLAGS, *omp_cflags,
            *OTHER_VARIANTS["baseline"][0], "-DTORCH_EXTENSION_NAME=cross_check",
            *(f"-I{d}" for d in includes), "-S", str(source), "-o", str(out)]


def check(target: str, out_dir: Path, stub_dir: Path) -> tuple[bool, str]:
    """Compile every source for ``target``; (ok, one line: the ISA named, the matmul's vector FMAs)."""
    for source in SOURCES:
        out = out_dir / f"{source.stem}.{target}.s"
        run = subprocess.run(compile_command(target, source, out, stub_dir), capture_output=True, text=True)
        if run.returncode != 0:
            error = next((ln for ln in run.stderr.splitlines() if "error" in ln), run.stderr.strip()[-300:])
            return False, f"{target}: {source.name} does not compile: {error}"
    asm = (out_dir / f"small_gemm.{target}.s").read_text()
    isa = next((name for name in ("NEON", "SVE", "DEFAULT") if f'"{name}"' in asm), None)
    fmas, regions = len(VECTOR_FMA.findall(asm)), asm.count(OPENMP_REGION)
    ok = isa == "NEON" and fmas > 0 and regions > 0
    return ok, (f"{target}: {len(SOURCES)} sources compile; ISA {isa}; small_gemm: {fmas} NEON vector FMAs, "
                f"{regions} OpenMP parallel-region calls")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    ap.add_argument("--out", type=Path, default=None, help="keep the assembly here (default: a temporary folder)")
    args = ap.parse_args(argv)
    if importlib.util.find_spec("ziglang") is None:
        print("cross_compile needs zig's clang: pip install ziglang", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.out or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        stub_dir = Path(tmp) / "omp"
        stub_dir.mkdir()
        (stub_dir / "omp.h").write_text(OMP_STUB)
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(lambda t: check(t, out_dir, stub_dir), args.targets))
    for _, line in results:
        print(line)
    return 0 if all(ok for ok, _ in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
