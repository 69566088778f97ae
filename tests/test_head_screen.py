"""The greedy LM head's screen (``head_screen.cpp``, ``harness.runtime.head_screen``): each row's argmax from the
bfloat16 head and a few float32 rows is the float32 logits' argmax, ties, near-ties and NaN included, on every
kernel variant this CPU runs; the backend's greedy steps and every decoder's tokens are those of the whole head."""

from __future__ import annotations

import pytest
import torch

from decoders import build_decoder
from harness.runtime import kernels as K
from harness.runtime.backend import Backend
from harness.runtime.head_screen import bounds
from harness.runtime.layer_ops import FusedOps
from tiny import tiny_model

VARIANTS = K.available_variants()


@pytest.fixture(scope="module", params=VARIANTS)
def mod(request):
    m = K.load_small_gemm(request.param)
    assert m is not None, f"{request.param} did not build"
    return m


@pytest.mark.parametrize("n,k", [(130, 577), (300, 576), (70, 13), (64, 1)])
def test_recomputed_logits_are_the_kernels_bits(mod, n, k):
    """The proof's premise: a candidate's logit recomputed alone is bitwise the kernel's on the packed head."""
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g) * k**-0.5
    h = torch.randn(7, k, generator=g) * 3
    assert torch.equal(mod.kernel_logits(h, w), mod.linear(h, mod.pack(w), n))


def test_bounds_hold_where_the_rounding_errors_add_up(mod):
    """|s_j - t_j| <= c_j ||h|| even for h aligned with the signs of column j's rounding errors."""
    g = torch.Generator().manual_seed(5)
    w = torch.randn(200, 576, generator=g) * 0.05
    bound, spread = bounds(w)
    delta = w - w.to(torch.bfloat16).float()
    h = torch.cat([torch.sign(delta[:50]) * torch.rand(50, 576, generator=g) * 10,
                   torch.randn(20, 576, generator=g) * 40])
    s = mod.linear(h, mod.pack(w), 200)
    t = mod.linear(h, mod.pack(w, bf16=True), 200)
    assert ((s - t).abs().double() <= bound.double() * h.double().norm(dim=1, keepdim=True)).all()
    assert spread >= 2 * w.norm(dim=1).max().item()


def _adversarial_head(g: torch.Generator, n: int = 500, k: int = 576) -> torch.Tensor:
    """Random columns, with exact duplicates (ties: the first wins), columns one to a few float32 steps from
    column 0 (their order is decided by the float32 sums, far inside the bfloat16 error), and columns 20-59
    within bfloat16's rounding of column 0 (the bfloat16 logits order them otherwise than the float32 ones)."""
    w = torch.randn(n, k, generator=g) * 0.05
    w[20:60] = w[0] * (1 + torch.randn(40, k, generator=g) * 2**-8)
    w[300] = w[100]
    w[7] = w[400] = w[0]
    for j, steps in zip((9, 10, 11, 450), (1, -1, 3, 2)):
        w[j] = w[0]
        w[j, : 4 * abs(steps)] = torch.nextafter(w[0, : 4 * abs(steps)], torch.full((4 * abs(steps),), steps * 1e9))
    return w


def test_screened_argmax_is_the_float32_argmax(mod):
    g = torch.Generator().manual_seed(11)
    w = _adversarial_head(g)
    n, k = w.shape
    bound, spread = bounds(w)
    packed, screen = mod.pack(w), mod.pack(w, bf16=True)
    h = torch.randn(140, k, generator=g) * 2
    h[:100] = w[0] * 50 + torch.randn(100, k, generator=g)  # columns 0, 7, 9-11, 20-59, 400, 450 on top
    h[100:104] = w[100] * 30  # 100 and 300 tied exactly
    h[104] = 0  # every logit 0: the first column
    h[105, 3] = float("nan")  # NaN logits: the first NaN, as argmax_rows
    h[106, 0] = float("inf")
    h[107] = 1e25  # so large that a float32 sum might overflow: every column recomputed
    s, t = mod.linear(h, packed, n), mod.linear(h, screen, n)
    want = mod.argmax_rows(s)
    assert mod.screened_argmax(h, t, bound, spread, w) == want
    assert want[104] == 0 and {want[i] for i in range(100, 104)} == {100}
    # the screen had work to do: the bfloat16 logits' argmax is another column on many rows
    assert sum(a != b for a, b in zip(mod.argmax_rows(t[:100].contiguous()), want[:100])) >= 10
    finite = torch.isfinite(s).all(dim=1)
    assert [want[i] for i in range(140) if finite[i]] == [int(s[i].argmax()) for i in range(140) if finite[i]]


def test_screened_argmax_checks_its_input(mod):
    w = torch.randn(70, 13)
    bound, spread = bounds(w)
    h = torch.randn(2, 13)
    t = mod.linear(h, mod.pack(w, bf16=True), 70)
    with pytest.raises(RuntimeError, match="shapes"):
        mod.screened_argmax(h, t[:, :60].contiguous(), bound, spread, w)
    with pytest.raises(RuntimeError, match="float32"):
        mod.screened_argmax(h.double(), t, bound, spread, w)


def _steps(be: Backend, g: torch.Generator):
    """Random causal and tree-masked steps of 1-12 tokens, with and without a selection of logit rows."""
    be.reset(200)
    prefix = torch.randint(0, be.shape.vocab, (30,), generator=g)
    be.forward(prefix, torch.arange(30), logit_rows=prefix.new_empty(0))
    be.commit()
    for k in (1, 2, 3, 5, 6, 9, 12):
        ids = torch.randint(0, be.shape.vocab, (k,), generator=g)
        mask = (torch.rand(k, k, generator=g) < 0.5).tril() | torch.eye(k, dtype=torch.bool)
        rows = None if k % 2 else torch.arange(0, k, 2)
        yield ids, torch.arange(be.length, be.length + k), mask, rows


@pytest.mark.skipif(not VARIANTS, reason="no kernel variant runs here")
@pytest.mark.parametrize("mode", ["screened", "whole head", "bf16w"])
def test_greedy_steps_are_the_whole_heads(mode):
    """Greedy steps run to their ids in the whole forward's one call (``Stack.greedy``), screened or not, and
    give the argmax of the logits the same step returns."""
    be = Backend(tiny_model(3, vocab=2000), tokenizer=None, name="tiny", screen_head=mode == "screened",
                 bf16_weights=mode == "bf16w")
    assert isinstance(be._ops, FusedOps) and be._ops.whole_forward
    assert (be.head_screen is not None) == be._ops.screens_head == (mode == "screened")
    assert ("greedy LM head screened in bfloat16" in be.matmul_path) == (mode == "screened")
    whole = be._lm_head.weight_bytes
    head = whole // 2 if mode == "screened" else whole
    assert be.step_weight_bytes() == sum(p.weight_bytes for lp in be._proj for p in lp.all()) + head
    fused = be._ops.greedy
    calls = []
    be._ops.greedy = lambda *a: calls.append(1) or fused(*a)  # the one call, not logits then argmax
    for ids, pos, mask, rows in _steps(be, torch.Generator().manual_seed(0)):
        want = be.argmax(be.forward(ids, pos, mask, rows))
        be.commit([])
        assert be.greedy_forward(ids, pos, mask, rows) == want
        be.commit()
    assert len(calls) == 7


@pytest.mark.skipif(not VARIANTS, reason="no kernel variant runs here")
def test_screen_only_for_float32_heads_and_on_request():
    model = tiny_model(3, vocab=2000)
    assert Backend(model, tokenizer=None, name="tiny", screen_head=False).head_screen is None
    assert Backend(model, tokenizer=None, name="tiny", matmul="library").head_screen is None
    assert Backend(model, tokenizer=None, name="tiny", bf16_weights=True).head_screen is None
    off = Backend(model, tokenizer=None, name="tiny", screen_head=False)
    assert "screened" not in off.matmul_path
    ids, pos = torch.tensor([5, 6]), torch.arange(2)
    off.reset(8)
    assert off.greedy_forward(ids, pos) == off.argmax(off.forward(ids, pos))


@pytest.mark.skipif(not VARIANTS, reason="no kernel variant runs here")
@pytest.mark.parametrize("name,params", [("ar", {}), ("lookahead", {"W": 4, "N": 3, "G": 4}), ("pld", {})])
def test_decoders_emit_the_whole_heads_tokens(name, params):
    """Every decoder's greedy tokens with the screen are those without it (and the screen ran)."""
    on = Backend(tiny_model(4, vocab=2000), tokenizer=None, name="tiny")
    off = Backend(on.model, tokenizer=None, name="tiny", screen_head=False)
    assert on.head_screen is not None and off.head_screen is None
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        prompt = torch.randint(4, 2000, (6,), generator=g).tolist() * 2  # a repeat: pld drafts from it
        a = build_decoder(name, **params).generate(on, prompt, 40)
        b = build_decoder(name, **params).generate(off, prompt, 40)
        assert a.tokens == b.tokens and a.steps == b.steps
