"""The kernel off this machine's beaten path: OpenMP's flags per platform (Apple's clang rejects
``-fopenmp``), a build without OpenMP (bitwise the same results), and the sources compiled for aarch64
Linux and macOS (NEON), which no test machine here runs."""

from __future__ import annotations

import pytest
import torch

from harness.runtime import kernels as K
from harness.runtime.kernels.flags import COMMON_CFLAGS

AVAILABLE = K.available_variants()


def test_openmp_flags_per_platform(tmp_path):
    """GCC and LLVM clang take -fopenmp. Apple's clang rejects it (the whole build failed), so on macOS
    it goes through -Xclang with the omp.h and libomp.dylib torch's wheels ship; a torch without omp.h
    gets a build without OpenMP (one thread, which info() and the matmul path report), not a failed one."""
    assert K.openmp_flags("Linux", [], "/torch/lib") == (["-fopenmp"], ["-fopenmp"])
    include = tmp_path / "include"
    include.mkdir()
    assert K.openmp_flags("Darwin", [str(tmp_path), str(include)], "/torch/lib") == ([], [])
    (include / "omp.h").write_text("")
    assert K.openmp_flags("Darwin", [str(tmp_path), str(include)], "/torch/lib") == (
        ["-Xclang", "-fopenmp"], ["-L/torch/lib", "-lomp", "-Wl,-rpath,/torch/lib"])
    flags = K.build_flags("baseline")
    assert all(f in flags for f in K.openmp_flags()[0]) and K.link_flags() == K.openmp_flags()[1]


def test_a_build_without_openmp_gives_the_same_bits(tmp_path):
    """The one-thread build (a Mac whose torch lacks omp.h) runs every block on the calling thread, where
    at::parallel_for hands it the whole range: bitwise the results of the OpenMP build, at any thread count."""
    from torch.utils import cpp_extension

    variant = AVAILABLE[0]
    serial = cpp_extension.load(name="small_gemm_no_openmp", sources=[str(s) for s in K.SOURCES],
                                extra_cflags=[*COMMON_CFLAGS, *K._variants()[variant][0]], extra_ldflags=[],
                                build_directory=str(tmp_path), verbose=False)
    ours = K.load_small_gemm(variant)
    assert serial.info()["openmp"] is False and ours.kernel_info.openmp
    g = torch.Generator().manual_seed(3)
    before = torch.get_num_threads()
    try:
        for n, k in [(960, 576), (130, 577)]:
            w = torch.randn(n, k, generator=g) * k ** -0.5
            x = torch.randn(13, k, generator=g)
            for bf16 in (False, True):
                p = ours.pack(w, bf16)
                assert torch.equal(serial.pack(w, bf16), p)
                for threads in (1, 2, 3):
                    torch.set_num_threads(threads)
                    for rows in (1, 2, 3, 6, 7, 13):
                        xs = x[:rows].contiguous()
                        assert torch.equal(serial.linear(xs, p, n), ours.linear(xs, p, n)), (n, bf16, threads, rows)
    finally:
        torch.set_num_threads(before)


def test_sources_compile_for_aarch64_linux_and_macos():
    """Compile only (zig's clang carries both targets' headers): every source builds as the loader's
    baseline would there, to NEON vector FMAs, with at::parallel_for's OpenMP regions compiled in."""
    pytest.importorskip("ziglang")
    from harness.runtime.kernels import cross_compile

    assert cross_compile.main([]) == 0
