"""The backend: our forward equals transformers' forward, custom masks mean what they say for every
attention implementation, cache commit/rollback keep the right entries, FLOPs follow the formula."""

from __future__ import annotations

import pytest
import torch

from harness.runtime.backend import Backend
from harness.runtime.flops import forward_flops
from tiny import tiny_model

ATOL = 1e-4


def _fresh(attn: str, seed: int = 1) -> Backend:
    """``attn``: sdpa or eager (transformers' reference runs the same), or kernel (ours; against sdpa)."""
    model = tiny_model(seed, attn_implementation="sdpa" if attn == "kernel" else attn)
    return Backend(model, tokenizer=None, name="tiny", attn=attn)


@pytest.mark.parametrize("matmul", ["library", "auto"])
def test_argmax_is_torchs(matmul):
    """Backend.argmax (our kernel's loop where it runs) gives logits.argmax(-1): ties and NaN included."""
    be = Backend(tiny_model(1), tokenizer=None, name="tiny", matmul=matmul)
    assert (be._kernel is None) == (matmul == "library")
    x = torch.randn(5, 300, generator=torch.Generator().manual_seed(2))
    x[1, 7] = x[1, 200] = 9.0
    x[3, 150] = float("nan")
    assert be.argmax(x) == x.argmax(-1).tolist() and be.argmax(x[:1]) == [int(x[0].argmax())]


@pytest.mark.parametrize("attn", ["sdpa", "eager", "kernel"])
def test_forward_matches_transformers(attn):
    be = _fresh(attn)
    ids = torch.randint(0, 48, (20,), generator=torch.Generator().manual_seed(0))
    be.reset(64)
    ours = be.forward(ids, torch.arange(20))
    ref = be.model(ids[None]).logits[0].float()
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)


ROPES = {
    "default": None,
    "llama3": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
}


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_rope_table_is_the_modules_values(rope):
    """cos/sin come from a table made once per cache size, bitwise the rotary module's per-forward values,
    except for RoPE types whose frequencies follow the positions seen (dynamic): those call the module."""
    model = tiny_model(1, rope=ROPES[rope])
    be = Backend(model, tokenizer=None, name="tiny", attn="sdpa")
    be.reset(200)
    if rope == "dynamic":
        assert be._rope is None
    else:
        cos, sin = be._rope
        assert cos.shape == sin.shape == (200, be.shape.head_dim)
        for pos in ([0], [7, 8, 9], [3, 150, 151, 199]):
            p = torch.tensor(pos)
            ref = model.model.rotary_emb(torch.zeros(1, 1, 1), p[None])
            assert torch.equal(cos[p], ref[0][0]) and torch.equal(sin[p], ref[1][0])
    ids = torch.randint(0, 48, (90,), generator=torch.Generator().manual_seed(5))  # past llama3's original 32
    ours = be.forward(ids, torch.arange(90))
    torch.testing.assert_close(ours, model(ids[None]).logits[0].float(), atol=ATOL, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager", "kernel"])
def test_incremental_equals_full(attn):
    """Prefill + one token at a time over the cache gives the full forward's logits."""
    be = _fresh(attn)
    ids = torch.randint(0, 48, (12,), generator=torch.Generator().manual_seed(1))
    be.reset(64)
    full = be.forward(ids, torch.arange(12))
    be.reset(64)
    be.forward(ids[:5], torch.arange(5))
    be.commit()
    steps = []
    for i in range(5, 12):
        steps.append(be.forward(ids[i : i + 1], torch.tensor([i]))[0])
        be.commit()
    torch.testing.assert_close(torch.stack(steps), full[5:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager", "kernel"])
def test_tree_mask_equals_causal_forwards(attn):
    """Two branches in one forward under a custom mask = each branch as a plain causal forward."""
    be = _fresh(attn)
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, 48, (7,), generator=g)
    a = torch.randint(0, 48, (3,), generator=g)
    b = torch.randint(0, 48, (4,), generator=g)
    root = torch.tensor([5])
    # layout: [root, a0 a1 a2, b0 b1 b2 b3]; a and b both hang off the root, mutually invisible
    ids = torch.cat([root, a, b])
    pos = torch.tensor([7, 8, 9, 10, 8, 9, 10, 11])
    mask = torch.zeros(8, 8, dtype=torch.bool)
    mask[:, 0] = True
    for i in range(1, 4):
        mask[i, 1 : i + 1] = True
    for i in range(4, 8):
        mask[i, 4 : i + 1] = True
    be.reset(64)
    be.forward(prefix, torch.arange(7))
    be.commit()
    tree_logits = be.forward(ids, pos, mask)
    for branch, rows in ((a, [0, 1, 2, 3]), (b, [0, 4, 5, 6, 7])):
        be.reset(64)
        seq = torch.cat([prefix, root, branch])
        ref = be.forward(seq, torch.arange(len(seq)))[7:]
        torch.testing.assert_close(tree_logits[rows], ref, atol=ATOL, rtol=0)


def test_rollback_then_continue_equals_fresh_sequence():
    be = _fresh("sdpa")
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 48, (6,), generator=g)
    junk = torch.randint(0, 48, (5,), generator=g)
    be.reset(64)
    be.forward(prefix, torch.arange(6))
    be.commit()
    be.forward(junk, torch.arange(6, 11))
    be.commit()
    be.rollback(6)  # forget the junk
    after = be.forward(torch.tensor([9]), torch.tensor([6]))
    be.reset(64)
    ref = be.forward(torch.cat([prefix, torch.tensor([9])]), torch.arange(7))[-1:]
    torch.testing.assert_close(after, ref, atol=ATOL, rtol=0)


def test_commit_non_contiguous_moves_entries():
    be = _fresh("sdpa")
    g = torch.Generator().manual_seed(4)
    prefix = torch.randint(0, 48, (6,), generator=g)
    new = torch.randint(0, 48, (4,), generator=g)
    be.reset(64)
    be.forward(prefix, torch.arange(6))
    be.commit()
    # [x0, y, x1, z]: x0 -> x1 is a chain at positions 6, 7; y and z are siblings to be dropped
    mask = torch.tensor(
        [[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool
    )
    be.forward(new, torch.tensor([6, 6, 7, 6]), mask)
    be.commit([0, 2])
    assert be.length == 8
    nxt = be.forward(torch.tensor([11]), torch.tensor([8]))
    be.reset(64)
    ref = be.forward(torch.cat([prefix, new[[0, 2]], torch.tensor([11])]), torch.arange(9))[-1:]
    torch.testing.assert_close(nxt, ref, atol=ATOL, rtol=0)


def test_logit_rows_and_flops_formula():
    be = _fresh("sdpa")
    s = be.shape
    be.reset(64)
    be.forward(torch.arange(10), torch.arange(10))
    be.commit()
    out = be.forward(torch.arange(4), torch.arange(10, 14), None, torch.tensor([0, 3]))
    assert out.shape == (2, s.vocab)
    linear = 2 * s.layer_params * 4
    attn = 4 * s.n_layers * s.n_heads * s.head_dim * 4 * (10 + 4)
    head = 2 * s.vocab * s.hidden * 2
    assert be.counters.flops[-1] == pytest.approx(linear + attn + head)
    assert forward_flops(s, 4, 10, 2) == pytest.approx(linear + attn + head)
    # layer params of a LLaMA layer: q, o (h*h), k, v (h*kv_dim), three MLP matrices
    h, kv = s.hidden, s.n_kv_heads * s.head_dim
    assert s.layer_params == s.n_layers * (2 * h * h + 2 * h * kv + 3 * h * 128)


def test_rollback_bounds():
    be = _fresh("sdpa")
    be.reset(16)
    with pytest.raises(ValueError, match="rollback"):
        be.rollback(3)


def test_packed_matmuls_only_where_they_fit():
    """The packed CPU path holds a second copy of the weights: used when 3x the weights fit in memory,
    skipped otherwise (the forward then runs plain F.linear and still matches transformers)."""
    from harness.runtime.matmul import can_pack

    model = tiny_model(1, attn_implementation="sdpa")
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if not can_pack(model, memory_bytes=1 << 40):
        pytest.skip("oneDNN-packed matmuls are not available on this machine")
    assert not can_pack(model, memory_bytes=3 * weight_bytes - 1)
    assert can_pack(model, memory_bytes=3 * weight_bytes)
    be = Backend(model, tokenizer=None, name="tiny", matmul="library")
    assert be._proj[0].qkv.packed is not None  # the tiny model fits: the tests exercise the packed path


def _with_projections(be: Backend, pack: bool, kernel) -> None:
    from harness.runtime.matmul import Projection, layer_projections

    be._proj = [layer_projections(layer, pack, kernel) for layer in be.model.model.layers]
    be._lm_head = Projection.of((be.model.lm_head,), pack, kernel)


@pytest.mark.parametrize("k", [1, 2, 3, 7, 20, 40])
def test_every_matmul_path_gives_the_same_logits(k):
    """Plain F.linear (GPU, big models), the oneDNN/MKL CPU paths and every variant of our kernel this
    CPU runs agree for every step size."""
    from harness.runtime.kernels import available_variants, load_small_gemm
    from harness.runtime.matmul import can_pack

    be = _fresh("sdpa")
    paths = {"plain": (False, None)}
    if can_pack(be.model):
        paths["packed"] = (True, None)
    for variant in available_variants():
        kernel = load_small_gemm(variant)
        assert kernel is not None, f"the {variant} kernel did not build"
        paths[variant] = (True, kernel)
    ids = torch.randint(0, 48, (50,), generator=torch.Generator().manual_seed(3))
    out = {}
    for name, (pack, kernel) in paths.items():
        _with_projections(be, pack, kernel)
        be.reset(64)
        be.forward(ids[:10], torch.arange(10))
        be.commit()
        out[name] = be.forward(ids[10 : 10 + k], torch.arange(10, 10 + k))
    for name in paths:
        torch.testing.assert_close(out[name], out["plain"], atol=ATOL, rtol=0)


def test_matmul_choice_is_checked_and_described():
    from harness.runtime.kernels import available_variants

    with pytest.raises(ValueError, match="matmul must be one of"):
        Backend(tiny_model(1), tokenizer=None, name="tiny", matmul="mkl")
    assert Backend(tiny_model(1), tokenizer=None, name="tiny", matmul="library").matmul_path.startswith(
        ("oneDNN packed", "F.linear"))
    best = available_variants()[0]
    assert Backend(tiny_model(1), tokenizer=None, name="tiny").matmul_path.startswith(f"kernel {best} ")
    for variant in available_variants():
        be = Backend(tiny_model(1), tokenizer=None, name="tiny", matmul=variant, bf16_weights=True)
        assert be.matmul_path.startswith(f"kernel {variant} ") and "bfloat16 weights" in be.matmul_path
        assert be._proj[0].qkv.small.dtype == torch.bfloat16


def test_bf16w_is_exact_and_equals_its_float32_twin():
    """dtype=bf16w: weights rounded to bfloat16 once, float32 everything else. Our kernel reads them as
    bfloat16 and gives bitwise the float32 kernel's logits on the same rounded weights, and every decoder
    stays equal to `ar` in that mode."""
    from decoders import build_decoder
    from harness.runtime.loading import round_weights_to_bf16

    model = tiny_model(2)
    round_weights_to_bf16(model)
    for p in (model.lm_head.weight, model.model.layers[0].mlp.down_proj.weight):
        assert torch.equal(p, p.to(torch.bfloat16).float())
    narrow = Backend(model, tokenizer=None, name="tiny-bf16w", bf16_weights=True)
    wide = Backend(model, tokenizer=None, name="tiny-rounded-f32")
    ids = torch.randint(4, 48, (30,), generator=torch.Generator().manual_seed(5))
    for be in (narrow, wide):
        be.reset(64)
    assert torch.equal(narrow.forward(ids, torch.arange(30)), wide.forward(ids, torch.arange(30)))
    prompt = [7, 8, 9, 10, 11, 7, 8, 9, 10, 11, 7, 8]
    ref = build_decoder("ar").generate(narrow, prompt, 30).tokens
    for name, params in [("jacobi", {"window": 4}), ("pld", {}), ("lookahead", {"W": 3, "N": 3, "G": 3}),
                         ("lookahead", {"W": 1, "N": 3, "G": 2, "pool_from_output": True, "text_ngram": 5})]:
        assert build_decoder(name, **params).generate(narrow, prompt, 30).tokens == ref, (name, params)

def test_silu_in_the_gate_up_matmul_changes_no_bit(monkeypatch):
    """Where our kernel runs a plain SiLU MLP, gate_up applies SiLU * up itself (Projection.glu, the kernel's
    swiglu): the logits are bitwise those of the separate silu_mul. Not with MLP biases, nor with an
    intermediate size that is not whole 32-column half-blocks, nor on the library path."""
    import harness.runtime.backend as backend_module

    model = tiny_model(3)
    glu = Backend(model, tokenizer=None, name="tiny")
    assert all(p.gate_up.glu for p in glu._proj)
    monkeypatch.setattr(backend_module, "glu_fits", lambda model, kernel: False)
    plain = Backend(model, tokenizer=None, name="tiny")
    assert not any(p.gate_up.glu for p in plain._proj)
    ids = torch.randint(4, 48, (30,), generator=torch.Generator().manual_seed(8))
    tree = torch.ones(6, 6, dtype=torch.bool).tril()
    tree[3:, 1:3] = False
    for be in (glu, plain):
        be.reset(64)
    for ids_, pos, mask in ((ids[:20], torch.arange(20), None), (ids[20:21], torch.arange(20, 21), None),
                            (ids[21:27], torch.arange(21, 27), tree)):
        assert torch.equal(glu.forward(ids_, pos, mask), plain.forward(ids_, pos, mask))
        glu.commit()
        plain.commit()
    monkeypatch.undo()
    from harness.runtime.layer_ops import glu_fits
    kernel = glu._kernel
    assert glu_fits(model, kernel) and not glu_fits(model, None)
    assert not glu_fits(tiny_model(3, bias=True), kernel)  # MLP biases
    odd = tiny_model(3)
    for layer in odd.model.layers:  # an intermediate size of 48: one and a half half-blocks
        layer.mlp.gate_proj = torch.nn.Linear(64, 48, bias=False)
    assert not glu_fits(odd, kernel)
    assert not any(p.gate_up.glu for p in Backend(model, tokenizer=None, name="t", matmul="library")._proj)
