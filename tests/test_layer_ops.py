"""The fused layer operations (harness/runtime/layer_ops.py, kernels/layer_ops.cpp, kernels/attention.cpp):
each equals the transformers modules (or torch's attention) it replaces to float32 rounding, is bitwise
row-invariant, and is chosen only where it applies; the backend's logits agree with either set of
operations and either attention."""

from __future__ import annotations

import time

import pytest
import torch

from harness.runtime import kernels as K
from harness.runtime.backend import Backend
from harness.runtime.layer_ops import KEY_BLOCK, FusedOps, TorchOps, block_keys, layer_ops
from tiny import tiny_backend, tiny_model

VARIANTS = K.available_variants()  # every variant this CPU runs; baseline everywhere


@pytest.fixture(scope="module", params=VARIANTS)
def fused(request) -> FusedOps:
    kernel = K.load_small_gemm(request.param)
    assert kernel is not None, f"{request.param} did not build"
    return FusedOps(kernel, n_heads=4, n_kv_heads=2, head_dim=16, attn="sdpa")  # keys as torch reads them


def _inputs(k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    model = tiny_model(seed)
    layer = model.model.layers[0]
    torch.nn.init.normal_(layer.input_layernorm.weight, 1.0, 0.3, generator=g)
    x = torch.randn(k, 64, generator=g)
    r = torch.randn(k, 64, generator=g)
    qkv = torch.randn(k, (4 + 2 * 2) * 16, generator=g)
    cos, sin = (t[0] for t in model.model.rotary_emb(x[None], torch.arange(5, 5 + k)[None]))  # [k, 16] each
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


@pytest.mark.parametrize("variant", VARIANTS)
@torch.inference_mode()
def test_blocked_key_cache_holds_the_same_keys(variant):
    """Our attention's key layout (blocks of KEY_BLOCK keys, transposed within a block) gets the bits the
    plain layout gets, at entries that cross a block, and committing kept entries moves them alike."""
    k, L, cap = 7, 12, 21
    _, _, _, _, qkv, cos, sin, _ = _inputs(k)
    kernel = K.load_small_gemm(variant)
    plain, ours = FusedOps(kernel, 4, 2, 16, attn="sdpa"), FusedOps(kernel, 4, 2, 16, attn="kernel")
    assert ours.key_cache_size(1, cap) == (1, 2, -(-cap // KEY_BLOCK), 16, KEY_BLOCK) and plain.key_block == 0
    kc, vc = torch.zeros(2, cap, 16), torch.zeros(2, cap, 16)
    kb, vb = torch.zeros(ours.key_cache_size(1, cap)[1:]), torch.zeros(2, cap, 16)
    q = plain.rope_to_cache(qkv, cos, sin, kc, vc, L)
    assert torch.equal(ours.rope_to_cache(qkv, cos, sin, kb, vb, L), q) and torch.equal(vb, vc)
    assert kc[:, L : L + k].any() and torch.equal(kb, block_keys(kc))
    src = torch.tensor([1, 3, 4, 6]) + L  # across the block boundary at 16
    kept = kc[:, src]
    plain.keep_keys(kc[None], src, L)
    ours.keep_keys(kb[None], src, L)
    assert torch.equal(kc[:, L : L + 4], kept) and torch.equal(kb, block_keys(kc))


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
        q1 = fused.rope_to_cache(qkv[row].clone(), cos[row].contiguous(), sin[row].contiguous(), kc1, vc1, i)
        assert torch.equal(q1[0, :, 0], q_full[0, :, i]) and torch.equal(kc1[:, i], kc[:, i])
        assert torch.equal(fused.act(gate_up[row].clone(), layer.mlp)[0], act_full[i])


@pytest.mark.parametrize("h", [64, 40, 576])
@torch.inference_mode()
def test_norm_and_rope_give_the_same_bits_on_every_variant(h):
    """RMSNorm (its sum of squares in 16 fixed lanes, a width that is not whole vectors included) and RoPE
    (elementwise) compute the same bits in every build this CPU runs, and RMSNorm matches float64 to
    float32 rounding."""
    g = torch.Generator().manual_seed(h)
    x, r = torch.randn(5, h, generator=g), torch.randn(5, h, generator=g)
    w = torch.rand(h, generator=g) + 0.5
    d, H, Hkv = 32, 2, 1
    qkv = torch.randn(5, (H + 2 * Hkv) * d, generator=g)
    angles = torch.rand(5, d, generator=g) * 6
    norms, ropes = [], []
    for variant in VARIANTS:
        kernel = K.load_small_gemm(variant)
        xv = x.clone()
        norms.append(kernel.add_rms_norm(xv, r, w, 1e-5))
        assert torch.equal(xv, x + r)  # the residual added in place
        kt, vc = block_keys(torch.zeros(Hkv, 8, d)), torch.zeros(Hkv, 8, d)
        ropes.append((kernel.rope_to_cache(qkv, angles.cos(), angles.sin(), kt, vc, 1, H, Hkv, True), kt))
    s = (x + r).double()
    want = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    torch.testing.assert_close(norms[0].double(), want, atol=1e-5, rtol=1e-5)
    for other, (q, kt) in zip(norms[1:], ropes[1:]):
        assert torch.equal(other, norms[0])
        assert torch.equal(q, ropes[0][0]) and torch.equal(kt, ropes[0][1])


def _attention_inputs(H: int, Hkv: int, d: int, k: int, L: int, seed: int):
    """Rotated queries [1, H, k, d], a cache [Hkv, cap, d] x 2 holding L + k entries, a random tree mask
    [k, k] (each token sees itself and a random subset of the earlier ones)."""
    g = torch.Generator().manual_seed(seed)
    cap = L + k + 5
    q = torch.randn(1, H, k, d, generator=g)
    kc, vc = torch.randn(Hkv, cap, d, generator=g), torch.randn(Hkv, cap, d, generator=g)
    mask = (torch.rand(k, k, generator=g) < 0.5).tril_() | torch.eye(k, dtype=torch.bool)
    return q, kc, vc, mask


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("H,Hkv,d", [(4, 2, 16), (9, 3, 64), (6, 6, 48), (4, 1, 128)])
@torch.inference_mode()
def test_kernel_attention_matches_torch(variant, H, Hkv, d):
    """Our attention equals sdpa (and eager) to float32 rounding: grouped heads, head sizes that are 1-8
    vectors or not whole vectors, causal and tree masks, an empty and a long committed cache."""
    ours = FusedOps(K.load_small_gemm(variant), H, Hkv, d, attn="kernel")
    for k, L in [(1, 0), (1, 37), (5, 0), (7, 70), (12, 9)]:
        q, kc, vc, tree = _attention_inputs(H, Hkv, d, k, L, seed=k + L)
        for mask in (None, tree):
            additive = TorchOps(H, Hkv, d).step_mask(k, L, mask, q.dtype, q.device)
            want = [TorchOps(H, Hkv, d, attn).attend(q, kc, vc, L, additive, d**-0.5) for attn in ("sdpa", "eager")]
            got = ours.attend(q, block_keys(kc), vc, L, ours.step_mask(k, L, mask, q.dtype, q.device),
                              d**-0.5)  # [k, H * d]
            for ref in want:
                torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
@torch.inference_mode()
def test_kernel_attention_is_row_invariant(variant):
    """A row's output is bitwise the same in a many-token step as alone at the end of a cache that holds
    just the keys it sees, in order: an `ar` step and a lookahead branch that agree on the tokens agree on
    the bits. Masked keys are skipped, not added as zeros."""
    ours = FusedOps(K.load_small_gemm(variant), 9, 3, 64, attn="kernel")
    for k, L in [(6, 0), (11, 45), (20, 130)]:
        q, kc, vc, tree = _attention_inputs(9, 3, 64, k, L, seed=k)
        step = ours.attend(q, block_keys(kc), vc, L, tree, 0.125)
        for i in range(k):
            seen = torch.cat([torch.arange(L), L + tree[i].nonzero()[:, 0]])  # ends with i itself
            kc1, vc1 = kc[:, seen].contiguous(), vc[:, seen].contiguous()
            alone = ours.attend(q[:, :, i : i + 1].contiguous(), block_keys(kc1), vc1,
                                len(seen) - 1, None, 0.125)
            assert torch.equal(alone[0], step[i]), (k, L, i)
    # the o-projection's weight as ``next`` (a thread done with its items prefetches its start): the same bits
    q, kc, vc, tree = _attention_inputs(9, 3, 64, 6, 45, seed=3)
    o_weight = ours.kernel.pack(torch.randn(576, 576))
    for mask in (tree, None):
        want = ours.kernel.attend(q, block_keys(kc), vc, 45, mask, 0.125)
        assert torch.equal(ours.kernel.attend(q, block_keys(kc), vc, 45, mask, 0.125, next=o_weight), want)
    # causal (mask None), as a prefill: each tile of rows scores only the keys its rows reach, and every row
    # still has the bits of an `ar` step at its position; a long one, so tiles reach very different lengths
    for k, L in [(45, 0), (19, 33)]:
        q, kc, vc, _ = _attention_inputs(9, 3, 64, k, L, seed=k)
        step = ours.attend(q, block_keys(kc), vc, L, None, 0.125)
        for i in range(k):
            alone = ours.attend(q[:, :, i : i + 1].contiguous(), block_keys(kc), vc, L + i, None, 0.125)
            assert torch.equal(alone[0], step[i]), (k, L, i)


def test_fused_ops_only_where_they_apply():
    model = tiny_model(0)
    kernel = K.load_small_gemm(VARIANTS[0])
    assert type(layer_ops(model, kernel, 4, 2, 16)) is FusedOps
    assert layer_ops(model, kernel, 4, 2, 16).attn == "kernel"  # auto: our attention with our ops
    assert layer_ops(model, kernel, 4, 2, 16, attn="sdpa").attn == "sdpa"
    assert type(layer_ops(model, None, 4, 2, 16)) is TorchOps  # library matmuls: the modules themselves
    assert layer_ops(model, None, 4, 2, 16).attn == "sdpa"
    with pytest.raises(ValueError, match="attn=kernel needs our kernel"):
        layer_ops(model, None, 4, 2, 16, attn="kernel")
    with pytest.raises(ValueError, match="attn must be one of auto, kernel, sdpa, eager, got 'flash'"):
        layer_ops(model, kernel, 4, 2, 16, attn="flash")
    model.config.hidden_act = "gelu"  # an activation the fused op does not implement
    assert type(layer_ops(model, kernel, 4, 2, 16)) is TorchOps
    library = Backend(tiny_model(0), tokenizer=None, name="t", matmul="library")
    assert type(library._ops) is TorchOps and library.attention_path == "sdpa"
    ours = Backend(tiny_model(0), tokenizer=None, name="t", matmul=VARIANTS[0])
    assert type(ours._ops) is FusedOps and ours.attention_path == "kernel"


@pytest.mark.parametrize("k", [1, 4, 20])
def test_backend_logits_agree_with_either_ops(k):
    """Library ops + sdpa, our ops + sdpa, eager and our attention (its keys cached transposed): the same
    logits to float32 rounding, also after a commit that keeps a non-contiguous subset of a tree step."""
    ids = torch.randint(0, 48, (40,), generator=torch.Generator().manual_seed(5))
    tree = (torch.rand(6, 6, generator=torch.Generator().manual_seed(1)) < 0.5).tril_() | torch.eye(6, dtype=torch.bool)
    out = []
    for matmul, attn in (("library", "sdpa"), (VARIANTS[0], "sdpa"), (VARIANTS[0], "eager"), (VARIANTS[0], "kernel")):
        be = Backend(tiny_model(2), tokenizer=None, name="t", matmul=matmul, attn=attn)
        assert be.attention_path == attn
        be.reset(64)
        be.forward(ids[:12], torch.arange(12))
        be.commit()
        be.forward(ids[12:18], torch.tensor([12, 13, 13, 14, 14, 15]), tree)
        be.commit([0, 2, 4])
        out.append(be.forward(ids[18 : 18 + k], torch.arange(15, 15 + k)))
    for other in out[1:]:
        torch.testing.assert_close(other, out[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("bias", [False, True])
def test_whole_layer_call_equals_the_separate_calls(bias):
    """layer.cpp's one call for all layers (Stack) runs the same operations in the same order as the
    separate fused calls: bitwise the same logits (with and without projection biases), and close to the
    library path."""
    ids = torch.randint(0, 48, (30,), generator=torch.Generator().manual_seed(3))
    tree = (torch.rand(6, 6, generator=torch.Generator().manual_seed(4)) < 0.5).tril_() | torch.eye(6, dtype=torch.bool)
    out = []
    for matmul, calls in (("library", ""), (VARIANTS[0], "operation"), (VARIANTS[0], "stack")):
        be = Backend(tiny_model(2, bias=bias), tokenizer=None, name="t", matmul=matmul)
        if matmul != "library":
            assert be._ops._stack is not None and be.attention_path == "kernel"
            if calls == "operation":
                be._ops._stack = None  # back to one call per operation
        be.reset(64)
        be.forward(ids[:12], torch.arange(12))
        be.commit()
        be.forward(ids[12:18], torch.tensor([12, 13, 13, 14, 14, 15]), tree)
        be.commit([0, 2, 4])
        out.append(be.forward(ids[18:], torch.arange(15, 27)))
    assert torch.equal(out[2], out[1])
    torch.testing.assert_close(out[1], out[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("bf16", [False, True])
def test_whole_forward_in_one_call_is_the_python_paths_bitwise(bf16):
    """Where our kernel runs every piece, Backend.forward is one call from token ids to logits (layer.cpp's
    Stack.logits): the same operations as the Python path, so bitwise its logits, for prefill, 1-token and
    masked many-token steps, all rows or a few; a token id out of range is an IndexError."""
    from harness.runtime.backend import Backend
    from harness.runtime.loading import round_weights_to_bf16

    model = tiny_model(4)
    if bf16:
        round_weights_to_bf16(model)
    be = Backend(model, tokenizer=None, name="tiny", bf16_weights=bf16)
    assert be._ops.whole_forward
    g = torch.Generator().manual_seed(6)
    be.reset(80)
    prompt = torch.randint(0, 48, (21,), generator=g)
    tree = torch.ones(6, 6, dtype=torch.bool).tril()
    tree[3:, 1:3] = False  # a second branch after token 0
    steps = [(prompt, None, torch.arange(20, 21)), (prompt[:1], None, None), (prompt[:6], tree, None),
             (prompt[:6], tree, torch.tensor([0, 2, 5])), (prompt[:3], None, prompt.new_empty(0))]
    for i, (ids, mask, rows) in enumerate(steps):
        L = be.length
        pos = torch.arange(L, L + len(ids))
        out = {}
        for whole in (True, False):
            be._ops._ends = whole  # False: the Python path around the same stack
            out[whole] = be.forward(ids, pos, mask, logit_rows=rows)
            be.commit([])
        be._ops._ends = True
        assert out[True].shape == out[False].shape and torch.equal(out[True], out[False]), i
        if i == 0:
            be.forward(ids, pos, mask)
            be.commit()
    with pytest.raises(IndexError, match="token id 48 is out of range"):
        be.forward(torch.tensor([48]), torch.tensor([be.length]))


@pytest.mark.parametrize("bf16", [False, True])
@torch.inference_mode()
def test_op_clocks_split_a_step_and_change_no_result(bf16):
    """Clocks around each operation of the whole forward (layer.cpp's Clocks, read through Backend.op_seconds):
    on, the logits and greedy ids are bitwise those with them off; every operation gets time, their sum stays
    inside the wall time of the steps, ``steps`` counts the forwards; off, they read zero and count nothing."""
    from harness.runtime.loading import round_weights_to_bf16

    model = tiny_model(5)
    if bf16:
        round_weights_to_bf16(model)
    be = Backend(model, tokenizer=None, name="tiny", bf16_weights=bf16)
    assert be.op_clocks
    g = torch.Generator().manual_seed(2)
    be.reset(40)
    prompt = torch.randint(0, 48, (12,), generator=g)
    be.forward(prompt, torch.arange(12))
    be.commit()
    tree = torch.ones(4, 4, dtype=torch.bool).tril()

    def steps() -> tuple[list[torch.Tensor], list[list[int]], float]:
        t0 = time.perf_counter()
        logits = [be.forward(prompt[:1], torch.arange(12, 13)), be.forward(prompt[:4], torch.arange(12, 16), tree)]
        ids = [be.greedy_forward(prompt[:1], torch.arange(12, 13)), be.greedy_forward(prompt[:4], torch.arange(12, 16))]
        be.commit([])
        return logits, ids, time.perf_counter() - t0

    off = steps()
    be.clock_ops(True)
    on = steps()
    readings = be.op_seconds()
    assert readings.pop("steps") == 4
    assert set(readings) == {"embedding", "norms", "qkv", "rope", "attention", "o", "gate_up", "down", "layer_loop",
                             "head"}
    assert all(s > 0 for s in readings.values()) and sum(readings.values()) < on[2]
    assert all(torch.equal(a, b) for a, b in zip(on[0], off[0])) and on[1] == off[1]
    be.clock_ops(False)
    steps()
    assert set(be.op_seconds().values()) == {0}


def test_op_clocks_need_the_whole_forward():
    """Where the forward is not one kernel call (torch's attention here), the clocks are refused by name."""
    be = tiny_backend(0, attn="sdpa")
    assert not be.op_clocks
    with pytest.raises(ValueError, match="per-operation clocks need our whole-forward kernel"):
        be.clock_ops(True)


@torch.inference_mode()
def test_cache_views_follow_a_new_cache():
    """The stack keeps each layer's cache views between steps (layer.cpp's cache_views); a reset to another
    capacity brings new caches, and the next steps see them: the same logits as a fresh backend's."""
    be, fresh = tiny_backend(3), tiny_backend(3)
    assert be.op_clocks  # the whole forward runs
    prompt = torch.arange(1, 11)
    be.reset(20)
    be.forward(prompt, torch.arange(10))
    be.commit()
    be.forward(prompt[:1], torch.arange(10, 11))
    other = torch.randint(0, 48, (32,), generator=torch.Generator().manual_seed(1))  # past the old capacity
    for b in (be, fresh):
        b.reset(64)
        b.forward(other[:30], torch.arange(30))
        b.commit()
        b.forward(other[30:], torch.arange(30, 32))
        b.commit([1])  # the second new entry moved to position 30 (keep_keys), in the caches the stack reads
    step = other[:1], torch.arange(31, 32)
    assert torch.equal(be.forward(*step), fresh.forward(*step))
