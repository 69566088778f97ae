"""A decoder layer of a step and the operations between its matmuls: residual + RMSNorm, rotary embedding +
cache write, attention and the MLP's activation. Two implementations with one interface, chosen once per
model.

Why two: at a few rows per step these cost torch more in dispatch and allocation than in arithmetic
(~40 us for one 576-wide RMSNorm on a Zen 3 core, ~50 us for a 1-row sdpa call), and thirty layers of them
were a third of a 1-token CPU forward. Where our kernel extension is in use, :class:`FusedOps` runs each
as one fused call (``harness/runtime/kernels/layer_ops.cpp`` and ``attention.cpp``), and with our
attention the whole layer as one call (``layer.cpp``: the Python around nine calls a layer was another
~1 ms a token); everywhere else :class:`TorchOps` runs the transformers modules and torch's attention.
Both are row-invariant, so either keeps every decoder exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from harness.runtime.head_screen import HeadScreen
from harness.runtime.matmul import LayerProjections, Projection

#: ``attn=`` choices: ``auto`` (our kernel's attention where our fused ops run, else ``sdpa``), ``kernel``,
#: ``sdpa`` (torch's fused attention) or ``eager`` (explicit matmuls and softmax).
ATTN_CHOICES = ("auto", "kernel", "sdpa", "eager")

#: Keys per block of the key cache our attention reads ([Hkv, blocks, d, KEY_BLOCK]: see ``attention.cpp``):
#: a multiple of every build's vector (16 floats with AVX-512, 8 with AVX2 and the baseline, 4 on NEON), and
#: a block row is one 64-byte line.
KEY_BLOCK = 16


def block_keys(kc: torch.Tensor, block: int = KEY_BLOCK) -> torch.Tensor:
    """A key cache [..., capacity, d] in our attention's layout [..., ceil(capacity / block), d, block]: entry j
    at block j // block, column j % block (zeros past capacity). For tests and benchmarks."""
    *lead, cap, d = kc.shape
    n = -(-cap // block)
    padded = kc.new_zeros(*lead, n * block, d)
    padded[..., :cap, :] = kc
    return padded.view(*lead, n, block, d).transpose(-1, -2).contiguous()


class TorchOps:
    """The transformers modules of the layer, as they are (any device, dtype, norm or activation), and
    torch's attention (``attn``: sdpa or eager)."""

    key_block = 0  # the key cache is [Hkv, capacity, d], as torch's attention reads it (see FusedOps')
    whole_forward = False  # FusedOps where it runs token ids to logits in one call (see its logits)
    screens_head = False  # FusedOps given the LM head's screen: its whole forward also runs to a greedy step's argmax

    def __init__(self, n_heads: int, n_kv_heads: int, head_dim: int, attn: str = "sdpa",
                 layers: Sequence[tuple[torch.nn.Module, LayerProjections]] = ()) -> None:
        """``layers``: each decoder layer's module and its matmuls, for :meth:`layer`."""
        self.H, self.Hkv, self.d = n_heads, n_kv_heads, head_dim
        self.split = [n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim]
        self.attn = attn
        self.layers = list(layers)

    def layer(self, i: int, x: torch.Tensor, add: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
              kc: torch.Tensor, vc: torch.Tensor, L: int, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder layer ``i`` on the residual stream x [k, hidden] plus ``add`` (what the previous layer adds;
        None for the first); cos/sin [k, d]; kc/vc its caches; mask from :meth:`step_mask`. Returns the
        new stream x and what this layer adds, [k, hidden] each."""
        layer, proj = self.layers[i]
        x, h = self.add_norm(x, add, layer.input_layernorm)  # [k, hidden] each
        q = self.rope_to_cache(proj.qkv(h), cos, sin, kc, vc, L)  # [1, H, k, d]
        o = self.attend(q, kc, vc, L, mask, layer.self_attn.scaling)  # [k, H * d]
        x, h = self.add_norm(x, proj.o(o), layer.post_attention_layernorm)
        gate_up = proj.gate_up(h)  # [k, 2 I], or where the kernel applies SiLU * up itself (glu) [k, I]
        return x, proj.down(gate_up if proj.gate_up.glu else self.act(gate_up, layer.mlp))

    def key_cache_size(self, n_layers: int, capacity: int) -> tuple[int, ...]:
        """The shape of a key cache of ``capacity`` entries in every layer: [n_layers, Hkv, capacity, d]."""
        return (n_layers, self.Hkv, capacity, self.d)

    def keep_keys(self, k_cache: torch.Tensor, src: torch.Tensor, start: int) -> None:
        """Copy the key cache's entries src [n] (int64) to start..start+n-1, in every layer and head."""
        k_cache[:, :, start : start + len(src)] = k_cache[:, :, src]

    def run_layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, L: int, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every decoder layer in turn (:meth:`layer`), on the caches of all layers ([n_layers, ...] each).
        Returns the residual stream x and what the last layer adds (None without layers)."""
        add = None
        for i in range(len(self.layers)):
            x, add = self.layer(i, x, add, cos, sin, k_cache[i], v_cache[i], L, mask)  # [k, hidden] each
        return x, add

    def add_norm(self, x: torch.Tensor, r: torch.Tensor | None, norm: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """x [k, h] (+ r) -> (the new residual stream x, norm(x)), both [k, h]."""
        x = x if r is None else x + r
        return x, norm(x)

    def rope_to_cache(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kc: torch.Tensor,
                      vc: torch.Tensor, L: int) -> torch.Tensor:
        """qkv [k, (H + 2 Hkv) d]; cos/sin [k, d]; kc/vc [Hkv, capacity, d], the layer's cache, whose
        entries L..L+k get the rotated keys and the values. Returns the rotated queries [1, H, k, d]."""
        k = qkv.shape[0]
        q, kk, v = qkv.split(self.split, dim=-1)
        q = q.reshape(k, self.H, self.d).transpose(0, 1)[None]  # [1, H, k, d]
        kk = kk.reshape(k, self.Hkv, self.d).transpose(0, 1)[None]  # [1, Hkv, k, d]
        q, kk = apply_rotary_pos_emb(q, kk, cos[None], sin[None])
        kc[:, L : L + k] = kk[0]
        vc[:, L : L + k] = v.reshape(k, self.Hkv, self.d).transpose(0, 1)
        return q

    def act(self, gate_up: torch.Tensor, mlp: torch.nn.Module) -> torch.Tensor:
        """gate_up [k, 2 I] (gate, then up) -> act(gate) * up [k, I]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return mlp.act_fn(gate) * up

    def step_mask(self, k: int, L: int, tree_mask: torch.Tensor | None, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor | None:
        """The forward's mask, made once for every layer: additive float [1, 1, k, L+k], 0 where attention
        is allowed and -inf where not (None for one query, which sees the whole cache). tree_mask: [k, k]
        bool among the new tokens, None = causal."""
        if k == 1:
            return None
        if tree_mask is None:
            tree_mask = torch.ones(k, k, dtype=torch.bool, device=device).tril_()
        block = torch.zeros(k, L + k, dtype=dtype, device=device)
        block[:, L:].masked_fill_(~tree_mask, float("-inf"))
        return block[None, None]

    def attend(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, L: int, mask: torch.Tensor | None,
               scale: float) -> torch.Tensor:
        """q [1, H, k, d] against the layer's cache kc/vc [Hkv, capacity, d] (entries 0..L+k-1) under
        :meth:`step_mask`'s mask -> [k, H * d], the o-projection's input.

        ``sdpa`` uses torch's fused kernel, with grouped-query heads read in place. ``eager`` folds the
        query groups into the query rows so K and V are read in place too; tests compare the two.
        """
        _, H, k, d = q.shape
        keys, values = kc[None, :, : L + k], vc[None, :, : L + k]  # [1, Hkv, S, d]
        groups = H // self.Hkv
        if self.attn == "sdpa":
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=groups > 1)
        else:
            S = L + k
            qg = q.reshape(1, self.Hkv, groups * k, d)  # heads h = kv * groups + g, as in repeat_interleave
            scores = torch.matmul(qg, keys.transpose(2, 3)) * scale  # [1, Hkv, groups*k, S]
            if mask is not None:
                scores = (scores.view(1, self.Hkv, groups, k, S) + mask[:, :, None]).view(1, self.Hkv, groups * k, S)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            o = torch.matmul(probs, values).view(1, H, k, d)
        return o[0].transpose(0, 1).reshape(k, H * d)


class FusedOps(TorchOps):
    """The same operations as one call each into our kernel extension (float32 CPU, LLaMA's RMSNorm and
    SiLU; see ``layer_ops.cpp``), attention too where ``attn="kernel"`` (``attention.cpp``: it reads the
    keys in blocks of :data:`KEY_BLOCK`, transposed within a block, so a run of keys' scores are whole
    vectors and a block is read front to back)."""

    def __init__(self, kernel: Any, n_heads: int, n_kv_heads: int, head_dim: int, attn: str = "kernel",
                 layers: Sequence[tuple[torch.nn.Module, LayerProjections]] = (),
                 ends: tuple[torch.nn.Module, torch.nn.Module, Projection] | None = None) -> None:
        """``ends``: the model's token embedding, final norm and LM head, for :meth:`logits`."""
        super().__init__(n_heads, n_kv_heads, head_dim, attn, layers)
        self.kernel = kernel
        # with our attention and every matmul ours: all layers in one call (layer.cpp), weights bound once
        whole = attn == "kernel" and all(p.small is not None for _, lp in self.layers for p in lp.all())
        self._stack = kernel.Stack([self._bind(layer, proj) for layer, proj in self.layers]) if whole else None
        self._ends = False  # whether the stack holds the embedding, final norm and LM head too
        if self._stack is not None and ends is not None:
            embed, norm, head = ends
            if type(embed) is torch.nn.Embedding and embed.max_norm is None and head.small is not None:
                self._stack.set_ends(embed.weight.detach().contiguous(), norm.weight.detach().contiguous(),
                                     norm.variance_epsilon, head.small, head.out_features, head.bias)
                self._ends = True

    @property
    def whole_forward(self) -> bool:  # type: ignore[override]
        return self._stack is not None and self._ends

    def logits(self, ids: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
               k_cache: torch.Tensor, v_cache: torch.Tensor, L: int, mask: torch.Tensor | None,
               logit_rows: torch.Tensor | None) -> torch.Tensor:
        """The whole forward in one call (``layer.cpp``'s ``Stack.logits``): ids/positions [k], rope the
        cos/sin tables [capacity, d], logit_rows [r] or None -> logits [r, vocab], bitwise the Python path's."""
        return self._stack.logits(ids, positions, rope[0], rope[1], k_cache, v_cache, L, mask, logit_rows)

    def set_screen(self, screen: HeadScreen) -> None:
        """Run greedy steps through the LM head's screen (``Stack.set_screen``); needs :attr:`whole_forward`."""
        self._stack.set_screen(screen.projection.small, screen.bound, screen.spread, screen.exact)
        self.screens_head = True

    def greedy(self, ids: torch.Tensor, positions: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
               k_cache: torch.Tensor, v_cache: torch.Tensor, L: int, mask: torch.Tensor | None,
               logit_rows: torch.Tensor | None) -> list[int]:
        """:meth:`logits`' rows' argmax (``argmax_rows``' answer on them) in the same call (``Stack.greedy``),
        through the head's screen where :meth:`set_screen` set one (``head_screen.cpp``): [r] token ids."""
        return self._stack.greedy(ids, positions, rope[0], rope[1], k_cache, v_cache, L, mask, logit_rows)

    def clock_ops(self, on: bool) -> None:
        """The clocks around each operation of the whole forward on (zeroed) or off (``layer.cpp``'s Clocks)."""
        self._stack.set_clocks(on)

    def op_seconds(self) -> dict[str, float]:
        """Seconds summed per operation of the whole forward since :meth:`clock_ops` turned the clocks on, and
        ``steps``: the forwards they cover."""
        return dict(self._stack.clock_readings())

    @property
    def key_block(self) -> int:  # type: ignore[override]
        """Our attention reads the key cache as [Hkv, blocks, d, KEY_BLOCK] (0: torch's layout)."""
        return KEY_BLOCK if self.attn == "kernel" else 0

    def key_cache_size(self, n_layers: int, capacity: int) -> tuple[int, ...]:
        B = self.key_block
        return (n_layers, self.Hkv, -(-capacity // B), self.d, B) if B else super().key_cache_size(n_layers, capacity)

    def keep_keys(self, k_cache: torch.Tensor, src: torch.Tensor, start: int) -> None:
        B = self.key_block
        if not B:
            return super().keep_keys(k_cache, src, start)
        dst = torch.arange(start, start + len(src), device=src.device)
        k_cache[:, :, dst // B, :, dst % B] = k_cache[:, :, src // B, :, src % B]

    def _bind(self, layer: torch.nn.Module, proj: LayerProjections) -> Any:
        """``layer.cpp``'s Layer: the packed weights, norms and shapes of one decoder layer."""
        norm_in, norm_post = layer.input_layernorm, layer.post_attention_layernorm
        args = [norm_in.weight.detach().contiguous(), norm_in.variance_epsilon,
                norm_post.weight.detach().contiguous(), norm_post.variance_epsilon]
        for p in proj.all():  # qkv, o, gate_up, down
            args += [p.small, p.out_features, p.bias]
        return self.kernel.Layer(*args, self.H, self.Hkv, layer.self_attn.scaling, proj.gate_up.glu)

    def run_layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, L: int, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self._stack is None:
            return super().run_layers(x, cos, sin, k_cache, v_cache, L, mask)
        return x, self._stack.forward(x, cos, sin, k_cache, v_cache, L, mask)  # x updated in place

    def add_norm(self, x: torch.Tensor, r: torch.Tensor | None, norm: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        return x, self.kernel.add_rms_norm(x, r, norm.weight, norm.variance_epsilon)  # x += r in place

    def rope_to_cache(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kc: torch.Tensor,
                      vc: torch.Tensor, L: int) -> torch.Tensor:
        return self.kernel.rope_to_cache(qkv, cos, sin, kc, vc, L, self.H, self.Hkv, self.key_block > 0)

    def act(self, gate_up: torch.Tensor, mlp: torch.nn.Module) -> torch.Tensor:
        return self.kernel.silu_mul(gate_up)

    def step_mask(self, k: int, L: int, tree_mask: torch.Tensor | None, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor | None:
        """For our attention: the [k, k] bool mask among the new tokens as it is (None = causal)."""
        if self.attn != "kernel":
            return super().step_mask(k, L, tree_mask, dtype, device)
        return None if tree_mask is None else tree_mask.contiguous()

    def attend(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, L: int, mask: torch.Tensor | None,
               scale: float) -> torch.Tensor:
        if self.attn != "kernel":
            return super().attend(q, kc, vc, L, mask, scale)
        return self.kernel.attend(q, kc, vc, L, mask, scale)


def fused_ops_fit(model: torch.nn.Module, kernel: Any) -> bool:
    """Whether :class:`FusedOps` implements the model's layers: our kernel runs, and they are the plain LLaMA
    ones (RMSNorm with ``variance_epsilon``, a SiLU MLP)."""
    layer = model.model.layers[0]
    return (kernel is not None and getattr(model.config, "hidden_act", None) == "silu"
            and all(hasattr(norm, "variance_epsilon") and hasattr(norm, "weight")
                    for norm in (layer.input_layernorm, layer.post_attention_layernorm, model.model.norm)))


def glu_fits(model: torch.nn.Module, kernel: Any) -> bool:
    """Whether our kernel's gate_up matmuls can apply SiLU * up themselves (``Projection.glu``, its ``swiglu``):
    :func:`fused_ops_fit`, MLPs without biases, and an intermediate size of whole half-blocks (32 columns).
    Why: SiLU as a pass of its own read the half of gate_up that the other thread wrote (see small_gemm.cpp's
    swiglu_block)."""
    if not fused_ops_fit(model, kernel):
        return False
    half = kernel.info()["block"] // 2
    return all(m.gate_proj.bias is None and m.up_proj.bias is None and m.gate_proj.out_features % half == 0
               for m in (layer.mlp for layer in model.model.layers))


def layer_ops(model: torch.nn.Module, kernel: Any, n_heads: int, n_kv_heads: int, head_dim: int,
              attn: str = "auto", projections: Sequence[LayerProjections] = (),
              lm_head: Projection | None = None) -> TorchOps:
    """:class:`FusedOps` where our kernel runs the matmuls and the model's layers are the plain LLaMA
    ones it implements (RMSNorm with ``variance_epsilon``, SiLU MLP); else :class:`TorchOps`. ``attn``
    (:data:`ATTN_CHOICES`) is resolved here: ``auto`` is ``kernel`` with FusedOps, else ``sdpa``.
    ``projections``: each layer's matmuls (:meth:`TorchOps.layer` runs them); ``lm_head``: the LM head's,
    for FusedOps' whole forward."""
    if attn not in ATTN_CHOICES:
        raise ValueError(f"attn must be one of {', '.join(ATTN_CHOICES)}, got {attn!r}")
    fits = fused_ops_fit(model, kernel)
    if attn == "kernel" and not fits:
        raise ValueError("attn=kernel needs our kernel's fused layer ops: a float32 or bf16w LLaMA model on CPU "
                         "with matmul=auto or a kernel variant; use attn=auto or attn=sdpa")
    if attn == "auto":
        attn = "kernel" if fits else "sdpa"
    layers = list(zip(model.model.layers, projections))
    if fits:
        ends = None if lm_head is None else (model.model.embed_tokens, model.model.norm, lm_head)
        return FusedOps(kernel, n_heads, n_kv_heads, head_dim, attn, layers, ends)
    return TorchOps(n_heads, n_kv_heads, head_dim, attn, layers)
