"""The weight arena: packed weights copied into one mapping advised for 2 MB pages, in order, on cache
lines, bitwise unchanged, alive as long as any view; only where the OS offers huge pages."""

from __future__ import annotations

import gc
import mmap
from types import SimpleNamespace

import pytest
import torch

from harness.runtime import arena as arena_mod
from harness.runtime.arena import ALIGN, PAGE, WeightArena, huge_pages_offered
from harness.runtime.backend import Backend
from harness.runtime.matmul import Projection, describe_path
from tiny import tiny_model

needs_madvise = pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE on this OS")


@needs_madvise
def test_take_lays_tensors_out_in_order_on_cache_lines():
    arena = WeightArena(1 << 16)
    a, b = torch.randn(3, 5), torch.randn(7, dtype=torch.float32).to(torch.bfloat16)
    ta, tb = arena.take(a), arena.take(b)
    assert torch.equal(ta, a) and torch.equal(tb, b) and ta.dtype == a.dtype and tb.shape == b.shape
    assert ta.data_ptr() % PAGE == 0  # the first slice starts the mapping's first whole 2 MB page
    assert tb.data_ptr() % ALIGN == 0 and tb.data_ptr() >= ta.data_ptr() + a.numel() * 4
    assert ta.untyped_storage().data_ptr() == tb.untyped_storage().data_ptr()  # one mapping
    big = torch.zeros(1 << 15)  # 128 KB: more than is left
    assert arena.take(big) is big


@needs_madvise
def test_views_outlive_the_arena_object():
    arena = WeightArena(1 << 12)
    w = torch.randn(4, 8)
    view = arena.take(w)
    del arena
    gc.collect()
    assert torch.equal(view, w)


def test_huge_pages_only_where_offered(tmp_path, monkeypatch):
    mode = tmp_path / "enabled"
    monkeypatch.setattr(arena_mod, "THP_MODE", mode)
    assert not huge_pages_offered()  # no such file: not Linux, or no THP
    mode.write_text("always madvise [never]\n")
    assert not huge_pages_offered() and WeightArena.for_model(tiny_model(1)) is None
    mode.write_text("always [madvise] never\n")
    assert huge_pages_offered() == hasattr(mmap, "MADV_HUGEPAGE")


@needs_madvise
@pytest.mark.parametrize("bf16", [False, True])
def test_arena_changes_no_bit(bf16):
    from harness.runtime.kernels import load_small_gemm

    kernel = load_small_gemm()
    model = tiny_model(3)
    linears = (model.model.layers[0].mlp.gate_proj, model.model.layers[0].mlp.up_proj)
    plain = Projection.of(linears, True, kernel, bf16)
    arena = WeightArena(1 << 20)
    moved = Projection.of(linears, True, kernel, bf16, arena)
    assert arena.used > 0 and moved.small.data_ptr() != plain.small.data_ptr()
    for k in (1, 3, 7):
        x = torch.randn(k, linears[0].in_features, generator=torch.Generator().manual_seed(k))
        assert torch.equal(moved(x), plain(x))


@pytest.mark.skipif(not huge_pages_offered(), reason="this OS offers no transparent huge pages")
def test_backend_packs_into_the_arena_in_forward_order(monkeypatch):
    assert WeightArena.for_model(tiny_model(1)) is None  # under MIN_BYTES: torch's pages
    monkeypatch.setattr(arena_mod, "MIN_BYTES", 0)
    be = Backend(tiny_model(1), tokenizer=None, name="tiny")
    assert be._kernel is not None
    ptrs = [p.small.data_ptr() for layer in be._proj for p in layer.all()] + [be._lm_head.small.data_ptr()]
    assert ptrs == sorted(ptrs)  # one mapping, laid out in the order a forward reads them
    assert len({p.small.untyped_storage().data_ptr() for layer in be._proj for p in layer.all()}) == 1
    huge = WeightArena(4 * PAGE)
    huge.take(torch.ones(PAGE // 8))  # 1 MB into the first 2 MB page: one huge page, or 4 KB ones
    assert huge.huge_bytes() in (0, PAGE)


def test_path_says_how_much_sits_in_huge_pages():
    kernel = SimpleNamespace(kernel_info=SimpleNamespace(variant="avx2", isa="AVX2", zen4=False,
                                                            openmp=True))
    assert describe_path(kernel, True, False, torch.float32) == "kernel avx2 (AVX2) float32 weights"
    assert describe_path(kernel, True, True, torch.float32, huge_bytes=270_000_000) == (
        "kernel avx2 (AVX2) bfloat16 weights, 270 MB in 2 MB pages")
    zen4 = SimpleNamespace(kernel_info=SimpleNamespace(variant="avx512", isa="AVX512", zen4=True,
                                                          openmp=True))
    assert describe_path(zen4, True, False, torch.float32) == (
        "kernel avx512 (AVX512, Zen 4: 6x64 tiles at 3-6 rows, no 2-row prefetch) float32 weights")
    assert describe_path(zen4, True, True, torch.float32) == (
        "kernel avx512 (AVX512, Zen 4: no 1- or 2-row prefetch) bfloat16 weights")
    # a Mac whose torch lacks omp.h: the kernel runs on one thread, and the path says so
    serial = SimpleNamespace(kernel_info=SimpleNamespace(variant="baseline", isa="NEON", zen4=False,
                                                            openmp=False))
    assert describe_path(serial, True, False, torch.float32) == (
        "kernel baseline (NEON, one thread: built without OpenMP) float32 weights")
