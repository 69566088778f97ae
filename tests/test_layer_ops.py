"""The fused layer operations (harness/runtime/layer_ops.py, kernels/layer_ops.cpp): each equals the
transformers modules it replaces to float32 rounding, is bitwise row-invariant, and is chosen only where
it applies; the backend's logits agree with either set of operations."""

from __future__ import annotations

import pytest
import torch

from harness.runtime import kernels as K
from harness.runtime.backend import Backend
from harness.runtime.layer_ops import FusedOps, TorchOps, layer_ops
from tiny import tiny_model

VARIANTS = K.available_variants()  # every variant this CPU runs; baseline everywhere


@pytest.fixture(scope="module", params=VARIANTS)
def fused(request) -> FusedOps:
    kernel = K.load_small_gemm(request.param)
    assert kernel is not None, f"{request.param} did not build"
    return FusedOps(kernel, n_heads=4, n_kv_heads=2, head_dim=16)


def _inputs(k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    model = tiny_model(seed)
    layer = model.model.layers[0]
    torch.nn.init.normal_(layer.input_layernorm.weight, 1.0, 0.3, generator=g)
    x = torch.randn(k, 64, generator=g)
    r = torch.randn(k, 64, generator=g)
    qkv = torch.randn(k, (4 + 2 * 2) * 16, generator=g)
    cos, sin = model.model.rotary_emb(x[None], torch.arange(5, 5 + k)[None])  # [1, k, 16] each
    gate_up = torch.randn(k, 2 * 128, generator=g) * 4
    return model, layer, x, r, qkv, cos, sin, gate_up


@torch.inference_mode()
def test_fused_ops_equal_the_transformers_modules(fused):
    k, L = 7, 3
    model, layer, x, r, qkv, cos, sin, gate_up = _inputs(k)
    plain = TorchOps(4, 2, 16)
    x1, h1 = plain.add_norm(x.clone(), r, layer.input_layernorm)
    x2, h2 = fused.add_norm(x.clone(), r, layer.input_layernorm)
    torch.testing.assert_close(x2, x1, atol=0, rtol=0)  # one float addition either way
    torch.testing.assert_close(h2, h1, atol=1e-5, rtol=1e-5)
    _, h3 = fused.add_norm(x.clone(), None, layer.input_layernorm)  # no residual: norm only
    torch.testing.assert_close(h3, layer.input_layernorm(x), atol=1e-5, rtol=1e-5)
    caches = [torch.zeros(2, 16, 16) for _ in range(4)]
    q1 = plain.rope_to_cache(qkv, cos, sin, caches[0], caches[1], L)
    q2 = fused.rope_to_cache(qkv, cos, sin, caches[2], caches[3], L)
    torch.testing.assert_close(q2, q1, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(caches[2], caches[0], atol=1e-6, rtol=1e-6)
    assert torch.equal(caches[3], caches[1])  # values are copied
    assert not caches[2][:, :L].any() and not caches[2][:, L + k :].any()  # only entries L..L+k written
    torch.testing.assert_close(fused.act(gate_up, layer.mlp), plain.act(gate_up, layer.mlp), atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_fused_ops_are_row_invariant(fused):
    """A row's result is bitwise the same alone and among other rows (what keeps decoders exact)."""
    k = 9
    _, layer, x, r, qkv, cos, sin, gate_up = _inputs(k, seed=1)
    _, full = fused.add_norm(x.clone(), r, layer.input_layernorm)
    kc, vc = torch.zeros(2, 32, 16), torch.zeros(2, 32, 16)
    q_full = fused.rope_to_cache(qkv, cos, sin, kc, vc, 0)
    act_full = fused.act(gate_up, layer.mlp)
    for i in range(k):
        row = slice(i, i + 1)
        _, alone = fused.add_norm(x[row].clone(), r[row].clone(), layer.input_layernorm)
        assert torch.equal(alone[0], full[i])
        kc1, vc1 = torch.zeros(2, 32, 16), torch.zeros(2, 32, 16)
        q1 = fused.rope_to_cache(qkv[row].clone(), cos[:, row].contiguous(), sin[:, row].contiguous(), kc1, vc1, i)
        assert torch.equal(q1[0, :, 0], q_full[0, :, i]) and torch.equal(kc1[:, i], kc[:, i])
        assert torch.equal(fused.act(gate_up[row].clone(), layer.mlp)[0], act_full[i])


def test_fused_ops_only_where_they_apply():
    model = tiny_model(0)
    kernel = K.load_small_gemm(VARIANTS[0])
    assert type(layer_ops(model, kernel, 4, 2, 16)) is FusedOps
    assert type(layer_ops(model, None, 4, 2, 16)) is TorchOps  # library matmuls: the modules themselves
    model.config.hidden_act = "gelu"  # an activation the fused op does not implement
    assert type(layer_ops(model, kernel, 4, 2, 16)) is TorchOps
    assert type(Backend(tiny_model(0), tokenizer=None, name="t", matmul="library")._ops) is TorchOps
    assert type(Backend(tiny_model(0), tokenizer=None, name="t", matmul=VARIANTS[0])._ops) is FusedOps


@pytest.mark.parametrize("k", [1, 4, 20])
def test_backend_logits_agree_with_either_ops(k):
    ids = torch.randint(0, 48, (40,), generator=torch.Generator().manual_seed(5))
    out = []
    for matmul in ("library", VARIANTS[0]):
        be = Backend(tiny_model(2), tokenizer=None, name="t", matmul=matmul)
        be.reset(64)
        be.forward(ids[:12], torch.arange(12))
        be.commit()
        out.append(be.forward(ids[12 : 12 + k], torch.arange(12, 12 + k)))
    torch.testing.assert_close(out[1], out[0], atol=1e-4, rtol=0)
