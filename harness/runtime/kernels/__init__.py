"""Our one compiled kernel: the few-row matmul of decoding steps (``small_gemm.cpp``), in per-CPU variants.

One portable C++ source, written against torch's ``at::vec::Vectorized<float>``, is compiled into
separately named extensions, one per variant:

- ``avx512``: AVX-512 F/BW/VL/DQ + FMA (x86 CPUs with ``avx512f``);
- ``avx2``: AVX2 + FMA;
- ``baseline``: no SIMD flags: at::vec's generic arrays, which the compiler vectorizes for plain
  x86-64 (SSE2); on aarch64 the default build, which is NEON.

The avx512 build is tuned per CPU at build time (:func:`prefers_zen4_build`): on Zen 4 its float32 3-6-row
tile is 6 x 64 columns (12 x 32 elsewhere) and its 2-row tiles do not prefetch (they do elsewhere); either
build gives bitwise the same results.

Every variant sums each output element in one float32 accumulator over k in order with the same
operation at every row count, so a row's result does not depend on the other rows of the call (bitwise,
within one variant; across variants the last bits may differ: the baseline has no FMA on x86).

Module API (each variant): ``pack(w, bf16=False)`` once per weight [out, in] (float32 or bfloat16),
then ``linear(x, packed, n_out)`` per call on contiguous float32 ``x`` [rows, in]; bfloat16 packed
weights are widened to float32 in registers. ``info()`` says what the build compiled to.

Building: on first use with torch's C++ extension loader (~30-60 s per variant), cached under
``$XDG_CACHE_HOME/lookahead-bench/kernels/<variant>-<hash>`` (default ``~/.cache``), the hash covering the
source text, the flags (OpenMP's per platform: :mod:`.flags`), torch's and Python's versions. Builds are
serialized by an ``fcntl.flock`` lock (released by the OS when a process dies, so never stale) with a
timeout; under it a leftover torch ``lock`` file (a killed build's, on which torch would wait forever) is
removed. A corrupt cached build is deleted and rebuilt once: one whose library differs from the sha256
recorded after it last imported, or (none recorded) whose ELF headers reach past its end (a truncated
library passes dlopen and dies of SIGBUS later), or that fails to import. Where no kernel can be had (no
compiler, a timeout), :func:`load_small_gemm` returns None after one line on stderr, and the backend keeps
library matmuls. :func:`describe` gives the manifests' ``kernel avx2`` (or ``library matmuls``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from harness.runtime.kernels.cache import Flock, FlockTimeout, cached_build_ok, module_name, record_good_build
from harness.runtime.kernels.flags import COMMON_CFLAGS, OTHER_VARIANTS, X86_VARIANTS, openmp_flags

#: The extension's sources: the matmul kernel (which holds the module definition), the fused layer ops,
#: the decoding steps' attention, the whole layer in one call and the greedy LM head's screen.
SOURCES = tuple(Path(__file__).with_name(f"{name}.cpp")
                for name in ("small_gemm", "layer_ops", "attention", "layer", "head_screen"))


def sources(source_dir: Path | None = None) -> tuple[Path, ...]:
    """The extension's source files: ours, or the same file names in ``source_dir`` (an edited copy to
    A/B against ours, as ``kernels.bench --against`` does)."""
    if source_dir is None:
        return SOURCES
    found = tuple(Path(source_dir) / src.name for src in SOURCES)
    missing = [str(p) for p in found if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"kernel sources missing: {', '.join(missing)} (copy them from {SOURCES[0].parent})")
    return found


@dataclass(frozen=True)
class KernelInfo:
    """What :func:`load_small_gemm` loaded; ``str()`` is the manifests' ``kernel <variant>``."""

    variant: str  # avx512 | avx2 | baseline
    isa: str  # what at::vec compiled to: AVX512, AVX2, NEON, SVE or DEFAULT (generic arrays)
    vector_floats: int  # floats per vector register
    block: int  # output columns per block (a thread's unit of work)
    build_dir: str
    zen4: bool = False  # avx512 built for Zen 4: 6 x 64 float32 3-6-row tiles, fewer prefetches (prefers_zen4_build)
    openmp: bool = True  # built with OpenMP: blocks spread over torch's threads (else one thread; see flags)

    def describe(self, weights: torch.dtype | str | None = None) -> str:
        """``kernel avx2`` or, given the packed weights' dtype, ``kernel avx2 bfloat16``."""
        if weights is None:
            return f"kernel {self.variant}"
        name = str(weights).removeprefix("torch.")
        return f"kernel {self.variant} {name}"

    def __str__(self) -> str:
        return self.describe()


def _is_x86(machine: str | None = None) -> bool:
    """Whether this process (or ``machine``, a ``platform.machine()`` name) is x86."""
    return (machine or platform.machine()).lower() in ("x86_64", "amd64", "i386", "i686", "x86")


def _variants() -> dict[str, tuple[list[str], set[str]]]:
    return X86_VARIANTS if _is_x86() else OTHER_VARIANTS


def _cpuinfo(path: Path = Path("/proc/cpuinfo"), machine: str | None = None) -> dict[str, str] | None:
    """The first processor's fields in /proc/cpuinfo; None where there is none (not Linux) or where they
    describe another architecture than this process's (``machine``: ``platform.machine()``'s). Why: under
    user-mode emulation (qemu-user, as in results/arm_emulated.sh) an aarch64 process reads its x86 host's
    cpuinfo, and the host's name and flags are not the CPU this process runs on."""
    try:
        text = path.read_text()
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() and fields:  # the blank line after the first processor
            break
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    x86_info = "flags" in fields and "vendor_id" in fields  # aarch64's has "Features", "CPU implementer"
    if x86_info != _is_x86(machine) and (x86_info or "Features" in fields):
        return None
    return fields


def _flags_of(fields: dict[str, str] | None) -> set[str] | None:
    """The feature flags among a processor's cpuinfo fields (x86 ``flags``, aarch64 ``Features``)."""
    if not fields:
        return None
    flags = fields.get("flags", fields.get("Features"))
    return set(flags.split()) if flags is not None else None


def _cpu_flags() -> set[str] | None:
    """The CPU's feature flags from /proc/cpuinfo, None where there is none (not Linux)."""
    return _flags_of(_cpuinfo())


# the features that decide which kernel variant and library paths a CPU runs
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "asimd", "sve")


def cpu_identity() -> dict[str, object]:
    """Which CPU a timing came from, for manifests and perf results. Why the family and model: a VM may
    name its CPU only "AMD EPYC", and family 25 model 17 (Zen 4) and family 26 (Zen 5) time differently."""
    fields = _cpuinfo() or {}  # read once: the flags come from the same fields
    flags = _flags_of(fields) or set()
    return {
        "name": fields.get("model name") or platform.processor() or platform.machine(),
        "family": fields.get("cpu family"), "model": fields.get("model"),
        "isa": [f for f in ISA_FLAGS if f in flags], "logical_cpus": os.cpu_count(),
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
    }


def cpu_line(cpu: dict[str, object]) -> str:
    """``cpu_identity`` in one line: ``AMD EPYC (family 25 model 17; avx2 fma avx512f; torch AVX512; 2 CPUs)``."""
    where = f"family {cpu['family']} model {cpu['model']}; " if cpu.get("family") else ""
    return (f"{cpu['name']} ({where}{' '.join(cpu['isa']) or 'no SIMD flags read'}; torch "
            f"{cpu['torch_capability']}; {cpu['logical_cpus']} CPUs)")


def available_variants() -> list[str]:
    """The variants this CPU can execute, best first (``avx512`` > ``avx2`` > ``baseline`` on x86)."""
    variants = _variants()
    if not _is_x86():
        return list(variants)
    flags = _cpu_flags()
    if flags is None:  # no /proc/cpuinfo: ask torch what its own dispatch found
        capability = torch.backends.cpu.get_cpu_capability()
        ok = {"AVX512": ["avx512", "avx2"], "AVX2": ["avx2"]}.get(capability, [])
        return [*ok, "baseline"]
    return [name for name, (_, needs) in variants.items() if needs <= flags]


def best_variant() -> str:
    """The fastest variant this CPU can execute."""
    return available_variants()[0]


def _check_variant(variant: str) -> None:
    variants = _variants()
    if variant not in variants:
        raise ValueError(f"unknown small_gemm kernel variant {variant!r}; this platform builds: {', '.join(variants)}")
    available = available_variants()
    if variant not in available:
        flags = _cpu_flags() or set()
        missing = sorted(variants[variant][1] - flags)
        lacks = f" (it lacks {', '.join(missing)})" if missing else ""
        raise ValueError(f"this CPU cannot execute the {variant!r} small_gemm kernel{lacks}; "
                         f"it can run: {', '.join(available)}")


def cache_root() -> Path:
    """Where the builds go: ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/lookahead-bench/kernels``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lookahead-bench" / "kernels"


def prefers_zen4_build(fields: dict[str, str] | None = None) -> bool:
    """Whether this CPU takes the avx512 variant's Zen 4 build (AMD family 25 with AVX-512, which runs 512-bit
    operations as two 256-bit halves). Three choices differ there (see small_gemm.cpp):
    - 3-6 float32 rows in 6-row x 64-column tiles, not 12 x 32 (as bfloat16 and 7-12 rows): 0.82-0.95x on
      Zen 4; on a Xeon 1.04-1.10x, on Zen 5 1.025x;
    - no software prefetch in 2-row tiles (it cost 1.3x at fast memory on Zen 4, paid 0.85-0.97x on the Xeon)
      nor in 1-row bfloat16 ones (1.06x at fast memory on Zen 4, 1.02-1.03x at slow)."""
    fields = _cpuinfo() if fields is None else fields
    if not fields:
        return False
    return fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == "25"


def _zen4(variant: str, zen4: bool | None) -> bool:
    """Whether ``variant`` is built for Zen 4: only avx512 has such a build; None: this CPU's choice."""
    if variant != "avx512":
        return False
    return prefers_zen4_build() if zen4 is None else zen4


def build_flags(variant: str, zen4: bool | None = None) -> list[str]:
    """The compiler flags of ``variant`` (besides torch's own); ``zen4``: see :func:`prefers_zen4_build`."""
    return [*COMMON_CFLAGS, *openmp_flags()[0], *_variants()[variant][0],
            *(["-DSG_ZEN4"] if _zen4(variant, zen4) else [])]


def link_flags() -> list[str]:
    """The linker flags of every variant (besides torch's own): OpenMP's, see :mod:`.flags`."""
    return openmp_flags()[1]


def build_key(variant: str, source_dir: Path | None = None, zen4: bool | None = None) -> str:
    """``<variant>-<hash>``: the build directory's name, the hash over everything the binary depends on."""
    h = hashlib.sha256()
    texts = [src.read_bytes() for src in sources(source_dir)]
    for part in (*texts, "\0".join(build_flags(variant, zen4)).encode(), "\0".join(link_flags()).encode(),
                 torch.__version__.encode(), sys.version.encode(), platform.machine().encode()):
        h.update(part)
        h.update(b"\1")
    return f"{variant}-{h.hexdigest()[:16]}"


def build_dir(variant: str, source_dir: Path | None = None, zen4: bool | None = None) -> Path:
    """The build directory of ``variant`` (from ``source_dir``'s sources, default ours) under :func:`cache_root`."""
    return cache_root() / build_key(variant, source_dir, zen4)


def _note(msg: str) -> None:
    print(f"note: {msg}", file=sys.stderr, flush=True)


def _one_line(err: BaseException) -> str:
    """The error's first line, and its first compiler ``error:`` line if it has one further down."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    first = lines[0]
    if first.startswith("Error building extension") and ": " in first:
        first = first.split(": ", 1)[0]  # not the compiler's command line that follows
    detail = next((ln for ln in lines[1:] if "error" in ln.lower()), None)
    return f"{first} [{detail}]" if detail else first


def _torch_load(variant: str, directory: Path, source_dir: Path | None = None, zen4: bool = False) -> ModuleType:
    from torch.utils import cpp_extension

    name = module_name(directory)
    # torch's in-process versioner skips the build step for a name it has seen (even after we deleted a
    # corrupt build) and renames a rebuild in another directory to name_v1: forget the name, so ninja
    # always checks the directory (a no-op when it is up to date)
    getattr(cpp_extension.JIT_EXTENSION_VERSIONER, "entries", {}).pop(name, None)
    directory.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(
        name=name, sources=[str(src) for src in sources(source_dir)], extra_cflags=build_flags(variant, zen4),
        extra_ldflags=link_flags(),  # a new list: torch appends to it
        build_directory=str(directory), verbose=False,
    )


def _build(variant: str, timeout_s: float, source_dir: Path | None = None, zen4: bool = False) -> ModuleType | None:
    """Build (or load the cached build of) ``variant``; None after one stderr line when it cannot."""
    directory = build_dir(variant, source_dir, zen4)
    fallback = "using library matmuls"
    try:
        with Flock(directory.with_name(directory.name + ".flock"), timeout_s):
            # under our flock no build of ours is running, so torch's baton is a killed build's
            stale = directory / "lock"
            if stale.exists():
                stale.unlink()
                _note(f"removed a stale torch build lock {stale} (left by a killed build)")
            ok, why = cached_build_ok(directory)
            if not ok:
                _note(f"small_gemm {variant}: cached build in {directory} is corrupt ({why}); "
                      "deleting it and rebuilding")
                shutil.rmtree(directory, ignore_errors=True)
            for attempt in (0, 1):
                try:
                    module = _torch_load(variant, directory, source_dir, zen4)
                    break
                except ImportError as err:  # built, or found built, but does not import
                    if attempt:
                        raise
                    _note(f"small_gemm {variant}: cached build in {directory} does not load "
                          f"({_one_line(err)}); deleting it and rebuilding")
                    shutil.rmtree(directory, ignore_errors=True)
            record_good_build(directory)
    except FlockTimeout as err:
        _note(f"small_gemm kernel {variant} not loaded ({err}); {fallback}")
        return None
    except Exception as err:  # no compiler / ninja / headers, a failed compile: fall back, never fail the run
        _note(f"small_gemm kernel {variant} not built ({_one_line(err)}); {fallback}")
        return None
    info = module.info()
    module.kernel_info = KernelInfo(variant=variant, isa=str(info["isa"]), vector_floats=int(info["vector_floats"]),
                                    block=int(info["block"]), build_dir=str(directory),
                                    zen4=bool(info["zen4"]), openmp=bool(info["openmp"]))
    return module


def load_small_gemm(variant: str | None = None, timeout_s: float = 600,
                    source_dir: Path | None = None, zen4: bool | None = None) -> ModuleType | None:
    """The compiled kernel module of ``variant`` (default: :func:`best_variant`), or None where it cannot
    be built (one line on stderr says why; the caller keeps library matmuls).

    Raises ValueError for an unknown variant or one this CPU cannot execute. ``timeout_s`` bounds the
    wait for another process's build of the same variant. ``source_dir``: build from an edited copy of
    the sources instead of ours (an A/B; see :func:`sources`). ``zen4``: avx512's Zen 4 build
    (its tiles and prefetches), None for this CPU's choice (:func:`prefers_zen4_build`); the results are
    bitwise the same either way. One build or load per variant, sources, tuning and process; the loaded module carries
    ``kernel_info`` (:class:`KernelInfo`).
    """
    if variant is None:
        variant = best_variant()
    _check_variant(variant)
    if source_dir is not None:
        source_dir = Path(source_dir).resolve()
        sources(source_dir)  # FileNotFoundError naming what is missing, not a fallback to library matmuls
    return _build_once(variant, timeout_s, source_dir, _zen4(variant, zen4))


@functools.cache  # one build or load per variant, sources, Zen 4 build or not, and process
def _build_once(variant: str, timeout_s: float, source_dir: Path | None, zen4: bool) -> ModuleType | None:
    return _build(variant, timeout_s, source_dir, zen4)


def kernel_info(module: ModuleType | None) -> KernelInfo | None:
    """What a module from :func:`load_small_gemm` is (None for None)."""
    return None if module is None else module.kernel_info


def describe(module: ModuleType | None, weights: torch.dtype | str | None = None) -> str:
    """For manifests: ``kernel avx2`` (``kernel avx2 bfloat16`` given the packed weights' dtype), or
    ``library matmuls`` where no kernel was loaded."""
    return "library matmuls" if module is None else module.kernel_info.describe(weights)
