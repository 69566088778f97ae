"""The few-row matmul kernel (harness/runtime/kernels): every variant this CPU can execute is built and
checked: against torch, bitwise row invariance (alone vs among 2..32 and among 300 rows), bfloat16
weights, and the loader's robustness (stale torch lock, corrupt cached build, failed build, timeout).

Builds go to the normal cache (``$XDG_CACHE_HOME`` or ``~/.cache``), shared across runs; the first run
builds each variant (~30-80 s each). The corrupt-build test rebuilds once in a temporary cache.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.runtime import kernels as K
from harness.runtime.kernels import cache

ROOT = Path(__file__).resolve().parents[1]
KNOWN = list(K._variants())  # avx512, avx2, baseline on x86; baseline elsewhere
AVAILABLE = K.available_variants()
EXPECTED_ISA = {"avx512": "AVX512", "avx2": "AVX2"}


def test_variants_this_cpu_can_execute():
    assert AVAILABLE and AVAILABLE[-1] == "baseline" and K.best_variant() == AVAILABLE[0]
    flags = K._cpu_flags() or set()
    if {"avx2", "fma"} <= flags:  # an AVX2 machine builds and tests avx2: never skipped
        assert "avx2" in AVAILABLE
    if "avx512" in KNOWN:  # x86: skipped only where the CPU lacks AVX-512
        assert ("avx512" in AVAILABLE) == (K.X86_VARIANTS["avx512"][1] <= flags)


def test_cpu_identity_names_family_model_and_isa(tmp_path, monkeypatch):
    """Perf results and manifests say which CPU timed them: a VM's "AMD EPYC" is Zen 4 or Zen 5 only by
    its family and model. The first processor's block of /proc/cpuinfo is read."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                    "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 fma avx512f\n\n"
                    "processor\t: 1\ncpu family\t: 99\nmodel name\t: other\nflags\t\t: sse2\n")
    assert K._cpuinfo(tmp_path / "missing") is None
    fields = K._cpuinfo(info, machine="x86_64")  # an x86 cpuinfo, whichever machine runs the test
    monkeypatch.setattr(K, "_cpuinfo", lambda: fields)
    cpu = K.cpu_identity()
    assert (cpu["name"], cpu["family"], cpu["model"]) == ("AMD EPYC", "25", "17")
    assert cpu["isa"] == ["avx2", "fma", "avx512f"]  # in ISA_FLAGS order, only those the CPU has
    assert K._cpu_flags() == {"fpu", "sse2", "avx2", "fma", "avx512f"}
    line = K.cpu_line(cpu)
    assert line.startswith("AMD EPYC (family 25 model 17; avx2 fma avx512f; torch ") and line.endswith(" CPUs)")


def test_cpuinfo_of_another_architecture_is_not_read(tmp_path):
    """Under qemu-user an aarch64 process reads its x86 host's /proc/cpuinfo: that name and those flags are
    not its CPU, so a manifest must not record them (nor an x86 process an ARM host's)."""
    x86, arm = tmp_path / "x86", tmp_path / "arm"
    x86.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel name\t: Xeon\n"
                   "flags\t\t: sse2 avx2 fma avx512f\n")
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve\nCPU implementer\t: 0x41\n")
    assert K._cpuinfo(x86, machine="x86_64")["model name"] == "Xeon"
    assert K._cpuinfo(x86, machine="aarch64") is None
    assert K._flags_of(K._cpuinfo(arm, machine="aarch64")) == {"fp", "asimd", "sve"}
    assert K._cpuinfo(arm, machine="x86_64") is None
    ppc = tmp_path / "ppc"  # neither kind of fields: read as it is on its own architecture
    ppc.write_text("processor\t: 0\ncpu\t\t: POWER9\n")
    assert K._cpuinfo(ppc, machine="ppc64le") == {"processor": "0", "cpu": "POWER9"}


# every variant as this CPU builds it, and avx512's other build too (Zen 4's, or the one for every other CPU)
BUILDS = [(v, None) for v in KNOWN] + ([("avx512", not K.prefers_zen4_build())] if "avx512" in KNOWN else [])


@pytest.fixture(scope="module", params=BUILDS, ids=[v if t is None else f"{v}-zen4={t}" for v, t in BUILDS])
def mod(request):
    """The built module of each variant (module-scoped: one load per variant and test run)."""
    variant, zen4 = request.param
    if variant not in AVAILABLE:
        pytest.skip(f"this CPU cannot execute {variant}")
    m = K.load_small_gemm(variant, zen4=zen4)
    assert m is not None, f"{variant} did not build"
    assert m.kernel_info.variant == variant
    # only avx512 has a Zen 4 build: on Zen 4 the other variants must still build without its choices
    zen4 = variant == "avx512" and (K.prefers_zen4_build() if zen4 is None else zen4)
    info = m.info()
    assert m.kernel_info.zen4 == zen4 == info["zen4"] == ("float32_tile" in info) == (not info["prefetch_2row"])
    # the L2 stream prefetch (beside the L1 ones, alone in 1-row float32 tiles): where it was measured to help
    l2 = {"avx512": (4096, 4096), "avx2": (0, 4096)}.get(variant, (0, 0))
    assert tuple(info["prefetch_l2_bytes"]) == ((0, 0) if zen4 else l2)
    return m


def _ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.double() @ w.double().T).float()


# odd shapes: K not a multiple of 8 or 16, N not a multiple of the 64-column block (and below it)
SHAPES = [(100, 37), (1, 3), (64, 64), (130, 577), (960, 576), (576, 1536), (200, 13)]


@pytest.mark.parametrize("n,k", SHAPES)
def test_matches_torch(mod, n, k):
    g = torch.Generator().manual_seed(n * 1000 + k)
    w = torch.randn(n, k, generator=g) * k ** -0.5
    packed = mod.pack(w)
    assert packed.dtype == torch.float32 and packed.shape[1:] == (k, 16) and packed.shape[0] * 16 >= n
    for rows in (1, 2, 3, 5, 6, 7, 13, 40):
        x = torch.randn(rows, k, generator=g)
        y = mod.linear(x, packed, n)
        assert y.shape == (rows, n) and y.dtype == torch.float32 and y.is_contiguous()
        torch.testing.assert_close(y, _ref(x, w), rtol=1e-5, atol=1e-5)
    # fewer outputs than packed: the leading columns
    x = torch.randn(3, k, generator=g)
    torch.testing.assert_close(mod.linear(x, packed, max(n - 5, 0)), _ref(x, w)[:, : max(n - 5, 0)],
                               rtol=1e-5, atol=1e-5)


def test_edges(mod):
    w = torch.randn(70, 9)
    packed = mod.pack(w)
    assert mod.linear(torch.empty(0, 9), packed, 70).shape == (0, 70)
    with pytest.raises(RuntimeError):
        mod.linear(torch.randn(2, 9), packed, 129)  # more outputs than packed columns
    with pytest.raises(RuntimeError):
        mod.linear(torch.randn(2, 8), packed, 70)  # wrong input width
    with pytest.raises(RuntimeError):
        mod.linear(torch.randn(9, 2).t(), packed, 70)  # not contiguous


def _row_invariance(mod, packed: torch.Tensor, n: int, x: torch.Tensor) -> None:
    """Row i of any call equals row i of the 300-row call bitwise, wherever it sits in the call."""
    full = mod.linear(x, packed, n)
    for rows in [*range(1, 33), 47, 64, 299]:
        assert torch.equal(mod.linear(x[:rows].contiguous(), packed, n), full[:rows]), rows
    for i in (0, 1, 5, 6, 7, 11, 150, 299):  # alone, and in every position of a shifted window
        assert torch.equal(mod.linear(x[i : i + 1].contiguous(), packed, n)[0], full[i]), i
        for lo in range(max(0, i - 7), i + 1):
            got = mod.linear(x[lo : lo + 8].contiguous(), packed, n)
            assert torch.equal(got[i - lo], full[i]), (i, lo)


@pytest.mark.parametrize("n,k", [(130, 577), (960, 576)])
def test_row_invariance(mod, n, k):
    g = torch.Generator().manual_seed(7)
    w = torch.randn(n, k, generator=g) * k ** -0.5
    _row_invariance(mod, mod.pack(w), n, torch.randn(300, k, generator=g))


# odd and even K, and the shortest; N: a partial 5th block, one of 8 columns after 3 whole ones (a 1-row tile
# spanning two blocks must not take it), 15 whole blocks (runs of 2 and 1 block)
@pytest.mark.parametrize("n,k", [(300, 583), (300, 576), (300, 1), (300, 2), (200, 576), (960, 576)])
def test_bf16_weights(mod, n, k):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(n, k, generator=g) * k ** -0.5
    packed = mod.pack(w, bf16=True)
    assert packed.dtype == torch.bfloat16
    rounded = w.to(torch.bfloat16).float()  # round to nearest even, as pack does
    x = torch.randn(300, k, generator=g)
    y = mod.linear(x, packed, n)
    torch.testing.assert_close(y, _ref(x, rounded), rtol=1e-5, atol=1e-5)
    # bitwise the float32 kernel on the same weights rounded to bfloat16 (the widening is exact)
    assert torch.equal(y, mod.linear(x, mod.pack(rounded), n))
    # a bfloat16 weight packs the same, either way
    assert torch.equal(mod.pack(w.to(torch.bfloat16), bf16=True), packed)
    assert torch.equal(mod.linear(x, mod.pack(w.to(torch.bfloat16)), n), y)
    _row_invariance(mod, packed, n, x)


@pytest.mark.parametrize("bf16", [False, True])
def test_thread_count_never_changes_a_result(mod, bf16):
    """Which thread computes which blocks (own runs, blocks taken from another's back: more threads than
    cores makes the OS deschedule some) must not change a bit."""
    g = torch.Generator().manual_seed(11)
    shapes = [(960, 576), (576, 1536), (200, 64), (64 * 31 + 5, 96)]  # 15, 9, 4 and 32 (last partial) blocks
    cases = [(mod.pack(torch.randn(n, k, generator=g) * k ** -0.5, bf16=bf16), n, torch.randn(13, k, generator=g))
             for n, k in shapes]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = [[mod.linear(x[:m].contiguous(), p, n) for m in (1, 2, 3, 13)] for p, n, x in cases]
        for threads in (2, 3, 5):
            torch.set_num_threads(threads)
            for _ in range(3):
                got = [[mod.linear(x[:m].contiguous(), p, n) for m in (1, 2, 3, 13)] for p, n, x in cases]
                assert all(torch.equal(a, b) for ws, gs in zip(want, got) for a, b in zip(ws, gs)), threads
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bf16", [False, True])
def test_next_weight_prefetch_never_changes_a_result(mod, bf16):
    """``next=`` (the weight the caller multiplies after this one, whose start an idle thread prefetches)
    changes no bit of linear's or swiglu's result at any row or thread count, and a foreign tensor is refused."""
    g = torch.Generator().manual_seed(12)
    k, inter = 576, 96
    x = torch.randn(13, k, generator=g)
    plain = mod.pack(torch.randn(960, k, generator=g) * k ** -0.5, bf16=bf16)
    glu = mod.pack(torch.randn(2 * inter, k, generator=g) * k ** -0.5, bf16=bf16, glu=True)
    nexts = [mod.pack(torch.randn(n, kk, generator=g), bf16=b) for n, kk, b in ((576, 1536, bf16), (130, 7, not bf16))]
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for m in (1, 2, 6, 13):
                xm = x[:m].contiguous()
                want, want_glu = mod.linear(xm, plain, 960), mod.swiglu(xm, glu, 2 * inter)
                for nxt in nexts:
                    assert torch.equal(mod.linear(xm, plain, 960, next=nxt), want), (threads, m)
                    assert torch.equal(mod.swiglu(xm, glu, 2 * inter, next=nxt), want_glu), (threads, m)
    finally:
        torch.set_num_threads(before)
    with pytest.raises(RuntimeError, match="next must be a weight from this build's pack"):
        mod.linear(x, plain, 960, next=torch.randn(64, 576))


def test_describe(mod):
    info = mod.kernel_info
    expected = EXPECTED_ISA.get(info.variant) or ("NEON" if platform.machine().lower() in ("aarch64", "arm64")
                                                  else "DEFAULT")
    assert info.isa == expected
    assert info.openmp == bool(K.openmp_flags()[0])  # built with OpenMP exactly where its flags ask for it
    assert str(info) == K.describe(mod) == f"kernel {info.variant}"
    assert K.describe(mod, torch.bfloat16) == f"kernel {info.variant} bfloat16"
    assert K.describe(None) == "library matmuls" and K.kernel_info(None) is None
    assert Path(info.build_dir) == K.build_dir(info.variant, zen4=info.zen4)
    if info.zen4 == K.prefers_zen4_build() or info.variant != "avx512":  # this CPU's own build
        assert Path(info.build_dir) == K.build_dir(info.variant)


def test_prefers_zen4_build_on_zen4_only():
    """avx512's Zen 4 build (6 x 64 float32 tiles, no 2-row or 1-row bf16 prefetch) paid on Zen 4 (AMD family
    25) and its tile cost on a Xeon and on Zen 5."""
    amd = {"vendor_id": "AuthenticAMD", "cpu family": "25", "model": "17"}
    assert K.prefers_zen4_build(amd)
    assert not K.prefers_zen4_build({**amd, "cpu family": "26"})  # Zen 5
    assert not K.prefers_zen4_build({"vendor_id": "GenuineIntel", "cpu family": "6", "model": "167"})
    assert not K.prefers_zen4_build({})  # nothing read: no cpuinfo
    assert K._zen4("avx2", True) is False and K._zen4("avx512", True) is True
    if "avx512" in KNOWN:  # x86's variants: elsewhere there is only the baseline build
        assert "-DSG_ZEN4" in K.build_flags("avx512", True)
        assert "-DSG_ZEN4" not in K.build_flags("avx512", False) + K.build_flags("avx2", True)
        assert K.build_key("avx512", zen4=True) != K.build_key("avx512", zen4=False)


@pytest.mark.skipif("avx512" not in AVAILABLE, reason="this CPU cannot execute avx512")
def test_both_avx512_builds_agree_bitwise():
    """Which tile a row falls in, and whether its tile prefetched, never change its sum: both builds (the Zen
    4 one and the other) give the same bits."""
    a, b = (K.load_small_gemm("avx512", zen4=t) for t in (False, True))
    assert not a.kernel_info.zen4 and b.kernel_info.zen4
    g = torch.Generator().manual_seed(11)
    for n, k in [(960, 576), (130, 577)]:
        w = torch.randn(n, k, generator=g) * k ** -0.5
        x = torch.randn(13, k, generator=g)
        for bf16 in (False, True):  # the 2-row prefetch differs in both weight types
            pa, pb = a.pack(w, bf16=bf16), b.pack(w, bf16=bf16)
            assert torch.equal(pa, pb)  # one packed layout
            for rows in range(1, 14):
                assert torch.equal(a.linear(x[:rows].contiguous(), pa, n),
                                   b.linear(x[:rows].contiguous(), pb, n)), (rows, bf16)


def test_unknown_or_unsupported_variant_raises(monkeypatch):
    with pytest.raises(ValueError, match="unknown"):
        K.load_small_gemm("sse9")
    if platform.machine().lower() in ("x86_64", "amd64"):
        if "avx512" not in AVAILABLE:
            with pytest.raises(ValueError, match="cannot execute"):
                K.load_small_gemm("avx512")
        monkeypatch.setattr(K, "_cpu_flags", lambda: {"sse2"})  # a CPU without AVX2
        assert K.available_variants() == ["baseline"]
        with pytest.raises(ValueError, match="cannot execute.*avx2"):
            K.load_small_gemm("avx2")


# -- the loader's robustness, in a temporary cache ---------------------------------------------------

_PROBE = """
import sys, torch
from harness.runtime.kernels import load_small_gemm
m = load_small_gemm(sys.argv[1], timeout_s=float(sys.argv[2]))
assert m is not None, "no module"
w, x = torch.randn(70, 9), torch.randn(3, 9)
assert torch.allclose(m.linear(x, m.pack(w), 70), x @ w.T, atol=1e-5)
print("OK", m.kernel_info.build_dir)
"""


def _probe(variant: str, timeout_s: float, limit_s: float) -> subprocess.CompletedProcess:
    """Load ``variant`` in a fresh process (inheriting XDG_CACHE_HOME); ``limit_s`` guards against a hang."""
    return subprocess.run([sys.executable, "-c", _PROBE, variant, str(timeout_s)], cwd=ROOT, capture_output=True,
                          text=True, timeout=limit_s)


@pytest.fixture(scope="module")
def tmp_cache(tmp_path_factory):
    """A temporary cache holding a copy of the normal cache's baseline build (copied: no build here)."""
    built = K.load_small_gemm("baseline")
    assert built is not None
    root = tmp_path_factory.mktemp("xdg")
    shutil.copytree(built.kernel_info.build_dir, root / "lookahead-bench" / "kernels" / K.build_key("baseline"))
    return root


def test_stale_torch_lock_does_not_hang(tmp_cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_cache))
    lock = K.build_dir("baseline") / "lock"
    lock.touch()  # what a killed build leaves: torch alone would wait on it forever
    run = _probe("baseline", timeout_s=5, limit_s=300)
    assert run.returncode == 0, run.stderr
    assert "OK" in run.stdout and "stale torch build lock" in run.stderr
    assert not lock.exists()


def test_corrupt_build_is_rebuilt(tmp_cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_cache))
    (so,) = K.build_dir("baseline").glob("*.so")
    so.with_name(so.name + ".sha256").unlink(missing_ok=True)  # as if killed before recording it
    # truncated, and newer than its inputs: ninja sees it as built, dlopen accepts it, and its first use
    # would die of SIGBUS
    so.write_bytes(so.read_bytes()[:4096])
    run = _probe("baseline", timeout_s=600, limit_s=900)  # one real build
    assert run.returncode == 0, run.stderr
    assert "OK" in run.stdout and "corrupt" in run.stderr and "rebuilding" in run.stderr
    assert so.stat().st_size > 4096 and cache.elf_intact(so)
    assert so.with_name(so.name + ".sha256").read_text().strip() == cache._digest(so)


def test_cached_build_checks(mod, tmp_path):
    """Without a build: the checksum recorded after a load and the structural ELF check."""
    directory = tmp_path / Path(mod.kernel_info.build_dir).name
    shutil.copytree(mod.kernel_info.build_dir, directory)
    (so,) = directory.glob("*.so")
    recorded = so.with_name(so.name + ".sha256")
    assert recorded.exists() and cache.cached_build_ok(directory) == (True, "")
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 1  # one bit flipped: only the checksum can tell
    so.write_bytes(bytes(data))
    ok, why = cache.cached_build_ok(directory)
    assert not ok and "checksum" in why
    recorded.unlink()
    assert cache.cached_build_ok(directory) == (True, "")  # structurally fine: left to the import
    so.write_bytes(bytes(data[: len(data) // 3]))
    ok, why = cache.cached_build_ok(directory)
    assert not ok and "truncated" in why
    assert not cache.elf_intact(Path(__file__))


def test_import_error_rebuilds_once(tmp_path, monkeypatch, capsys):
    """A cached library that fails to import is deleted and built once more; a second failure falls back."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []

    class Fake:
        @staticmethod
        def info():
            return {"isa": "DEFAULT", "vector_floats": 8, "block": 64, "openmp": True, "zen4": False}

    def fake_load(variant, directory, source_dir=None, zen4=False):
        calls.append(directory.exists())
        directory.mkdir(parents=True, exist_ok=True)
        if len(calls) == 1:
            raise ImportError("undefined symbol: nonsense")
        return Fake()

    monkeypatch.setattr(K, "_torch_load", fake_load)
    assert isinstance(K._build("baseline", timeout_s=5), Fake)
    assert calls == [False, False]  # the directory was deleted between the two tries
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not load" in err[0] and "rebuilding" in err[0]

    def always_bad(variant, directory, source_dir=None, zen4=False):
        raise ImportError("undefined symbol: nonsense")

    monkeypatch.setattr(K, "_torch_load", always_bad)
    assert K._build("baseline", timeout_s=5) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "not built" in err[1] and "library matmuls" in err[1]


def test_failed_build_returns_none_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    broken = _copy_sources(tmp_path / "src")
    (broken / "small_gemm.cpp").write_text("#error deliberately broken\n")
    assert K.load_small_gemm("baseline", timeout_s=5, source_dir=broken) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not built" in err[0] and "library matmuls" in err[0], err


def test_lock_timeout_returns_none_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = K.build_dir("baseline")
    flock = path.with_name(path.name + ".flock")
    flock.parent.mkdir(parents=True)
    fd = os.open(flock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process's build in progress
        assert K._build("baseline", timeout_s=0.5) is None
    finally:
        os.close(fd)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "held" in err[0] and "library matmuls" in err[0], err
    assert not path.exists()  # nothing was built


def _copy_sources(directory: Path) -> Path:
    directory.mkdir(parents=True)
    for src in K.SOURCES:
        shutil.copy(src, directory / src.name)
    return directory


def test_sources_from_an_edited_copy(tmp_path):
    """``source_dir`` (``kernels.bench --against``): a copy's build is keyed by its text, a missing file is
    named, and an identical copy is our own build (no rebuild)."""
    copy = _copy_sources(tmp_path / "copy")
    assert K.sources(copy) == tuple(copy / src.name for src in K.SOURCES)
    assert K.build_key("baseline", copy) == K.build_key("baseline")
    with open(copy / "small_gemm.cpp", "a") as f:
        f.write("// an edit\n")
    assert K.build_key("baseline", copy) != K.build_key("baseline")
    (copy / "layer.cpp").unlink()
    with pytest.raises(FileNotFoundError, match="layer.cpp"):
        K.load_small_gemm("baseline", source_dir=copy)


@pytest.mark.parametrize("script, option", [("bench", "--reps"), ("bench", "--rows"), ("bench", "--layers"),
                                            ("bench_attention", "--reps"), ("bench_attention", "--lengths"),
                                            ("bench_attention", "--cache-len"), ("bench_attention", "--rows"),
                                            ("bench_step", "--reps"), ("bench_step", "--tokens"),
                                            ("bench_step", "--cache-len")])
def test_bench_counts_refuse_zero(script, option, capsys):
    """The developer benches' counts take positive_int like perf's: 0 stops at parsing with the expected
    form, before any weights are made or a model loads."""
    import importlib

    main = importlib.import_module(f"harness.runtime.kernels.{script}").main
    with pytest.raises(SystemExit) as stop:
        main([option, "0"])
    assert stop.value.code == 2 and "expected an integer >= 1, got '0'" in capsys.readouterr().err


def test_bench_times_copies_beside_ours(tmp_path, capsys):
    """``kernels.bench --against DIR...``: one column per build, timed interleaved (identical copies: the
    cached build, loaded under each directory's name)."""
    from harness.runtime.kernels import bench

    copies = [_copy_sources(tmp_path / "edited"), _copy_sources(tmp_path / "control")]
    bench.main(["--rows", "1", "2", "--reps", "1", "--layers", "1", "--variants", "baseline", "--no-torch",
                "--dtypes", "bf16", "--against", *map(str, copies)])
    out = capsys.readouterr().out
    assert "| rows | baseline bf16 | baseline bf16 edited | baseline bf16 control |" in out
    rows = [line for line in out.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert len(rows) == 2 and all(len(r.split("|")) == 6 for r in rows)


def test_bench_step_times_whole_steps_of_copies_beside_ours(tmp_path, capsys):
    """``kernels.bench_step --against DIR...``: a whole SmolLM2 step per build and k, interleaved, each copy's
    time over ours within a round, and whether its logits are bitwise ours (an identical copy: the cached build)."""
    from harness.runtime.kernels import bench_step

    copy = _copy_sources(tmp_path / "control")
    bench_step.main(["--against", str(copy), "--tokens", "1", "2", "--reps", "2", "--cache-len", "20"])
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith(("| 1 |", "| 2 |"))]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("1", "ours"), ("1", "control"), ("2", "ours"),
                                                              ("2", "control")]
    assert all(r[4].strip() == "yes" for r in rows) and all(float(r[2]) > 0 for r in rows)
    assert rows[0][3].strip() == "" and "(" in rows[1][3]
    with pytest.raises(SystemExit):
        bench_step.main(["--against", str(copy), str(copy)])  # two builds of one name


def test_bench_packs_each_column_into_an_arena(monkeypatch):
    """``kernels.bench`` holds a column's packed weights as the backend does: the same values, consecutive
    and cache-line aligned in one huge-page arena where the OS offers huge pages; torch's tensors otherwise."""
    from harness.runtime.arena import PAGE
    from harness.runtime.kernels import bench

    ts = [torch.randn(5, 7), torch.randn(3, 2).to(torch.bfloat16)]
    out = bench.in_arena(ts)
    assert [t.dtype for t in out] == [t.dtype for t in ts] and all(torch.equal(a, b) for a, b in zip(out, ts))
    if bench.huge_pages_offered():
        assert out[0].data_ptr() % PAGE == 0 and out[1].data_ptr() == out[0].data_ptr() + 192  # 140 B -> 3 lines
    monkeypatch.setattr(bench, "huge_pages_offered", lambda: False)
    assert all(a is b for a, b in zip(bench.in_arena(ts), ts))


def test_bench_bins_rounds_by_bandwidth(capsys):
    """``kernels.bench --bins``: one table per bandwidth range that holds rounds, their counts adding up to
    every round; edges far above any machine's bandwidth put all rounds in the first range."""
    from harness.runtime.kernels import bench

    bench.main(["--rows", "1", "--reps", "3", "--layers", "1", "--variants", "baseline", "--no-torch",
                "--dtypes", "fp32", "--bins", "1e6", "2e6"])
    out = capsys.readouterr().out
    assert "### probe 0-1e+06 GB/s: 3 of 3 rounds" in out and "1e+06-2e+06" not in out
    assert out.count("| rows | baseline fp32 |") == 1 and "| 1 row GB/s |" in out and "of 3 interleaved reps" in out
    bench.main(["--rows", "1", "--reps", "4", "--layers", "1", "--variants", "baseline", "--no-torch",
                "--dtypes", "fp32", "--bins", "1e-9"])  # every round above the edge
    out = capsys.readouterr().out
    assert "### probe 1e-09-inf GB/s: 4 of 4 rounds" in out and "### probe 0-" not in out
    assert "median of the same 4 rounds" in out


@pytest.mark.parametrize("n", [1, 3, 8, 17, 64, 1000, 49152])
def test_argmax_rows_is_torchs(mod, n):
    """argmax_rows gives torch.argmax's index: the first maximum, ties, -0.0 / 0.0, -inf rows, NaN first."""
    g = torch.Generator().manual_seed(n)
    rows = [torch.randn(n, generator=g), torch.full((n,), float("-inf")), torch.zeros(n),
            torch.randint(0, 3, (n,), generator=g).float()]  # many ties
    signed = torch.zeros(n)
    signed[::2] = -0.0
    rows.append(signed)
    for at in {0, n // 2, n - 1}:  # a NaN at the start, middle or end; a second one later
        r = torch.randn(n, generator=g)
        r[at] = float("nan")
        if at + 3 < n:
            r[at + 3] = float("nan")
        rows.append(r)
    x = torch.stack(rows)  # [rows, n]
    assert mod.argmax_rows(x) == x.argmax(-1).tolist()
    for i in range(len(rows)):
        assert mod.argmax_rows(x[i : i + 1].contiguous()) == [int(x[i].argmax())]


# intermediate sizes of one half-block, a few blocks and SmolLM2's; K odd, short and SmolLM2's
@pytest.mark.parametrize("inter,k", [(32, 37), (96, 1), (128, 64), (1536, 576)])
@pytest.mark.parametrize("bf16", [False, True])
def test_swiglu_is_silu_mul_of_linear_bitwise(mod, inter, k, bf16):
    """swiglu (gate_up packed with glu=True, SiLU * up applied per block by the thread that computed it) gives
    bitwise silu_mul(linear(...)) on the plainly packed weight, at every row count, alone or among other
    rows, with any number of threads; a weight or width that is not whole blocks is refused."""
    g = torch.Generator().manual_seed(inter + k)
    w = torch.randn(2 * inter, k, generator=g) * k ** -0.5
    x = torch.randn(40, k, generator=g) * 3
    plain, glu = mod.pack(w, bf16=bf16), mod.pack(w, bf16=bf16, glu=True)
    want = mod.silu_mul(mod.linear(x, plain, 2 * inter))  # [40, inter]
    before = torch.get_num_threads()
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            for rows in (1, 2, 3, 5, 6, 7, 12, 13, 40):
                got = mod.swiglu(x[:rows].contiguous(), glu, 2 * inter)
                assert got.shape == (rows, inter) and torch.equal(got, want[:rows]), (threads, rows)
            for i in (0, 6, 39):
                assert torch.equal(mod.swiglu(x[i : i + 1].contiguous(), glu, 2 * inter)[0], want[i]), i
    finally:
        torch.set_num_threads(before)
    assert mod.swiglu(torch.empty(0, k), glu, 2 * inter).shape == (0, inter)
    with pytest.raises(RuntimeError, match="multiple of 64"):
        mod.pack(torch.randn(2 * inter + 32, k), glu=True)
    with pytest.raises(RuntimeError, match="whole blocks of gates and ups"):
        mod.swiglu(x, glu, 2 * inter - 64)
