"""The small operations between a layer's matmuls: residual + RMSNorm, rotary embedding + cache write,
and the MLP's activation. Two implementations with one interface, chosen once per model.

Why two: at a few rows per step these cost torch more in dispatch and allocation than in arithmetic
(~40 us for one 576-wide RMSNorm on a Zen 3 core), and thirty layers of them were a third of a 1-token
CPU forward. Where our kernel extension is in use, :class:`FusedOps` runs them as three fused calls
from it (``harness/runtime/kernels/layer_ops.cpp``); everywhere else :class:`TorchOps` runs the
transformers modules themselves. Both are row-invariant, so either keeps every decoder exact.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


class TorchOps:
    """The transformers modules of the layer, as they are (any device, dtype, norm or activation)."""

    def __init__(self, n_heads: int, n_kv_heads: int, head_dim: int) -> None:
        self.H, self.Hkv, self.d = n_heads, n_kv_heads, head_dim
        self.split = [n_heads * head_dim, n_kv_heads * head_dim, n_kv_heads * head_dim]

    def add_norm(self, x: torch.Tensor, r: torch.Tensor | None, norm: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        """x [k, h] (+ r) -> (the new residual stream x, norm(x)), both [k, h]."""
        x = x if r is None else x + r
        return x, norm(x)

    def rope_to_cache(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kc: torch.Tensor,
                      vc: torch.Tensor, L: int) -> torch.Tensor:
        """qkv [k, (H + 2 Hkv) d]; cos/sin [1, k, d]; kc/vc [Hkv, capacity, d], the layer's cache, whose
        entries L..L+k get the rotated keys and the values. Returns the rotated queries [1, H, k, d]."""
        k = qkv.shape[0]
        q, kk, v = qkv.split(self.split, dim=-1)
        q = q.reshape(k, self.H, self.d).transpose(0, 1)[None]  # [1, H, k, d]
        kk = kk.reshape(k, self.Hkv, self.d).transpose(0, 1)[None]  # [1, Hkv, k, d]
        q, kk = apply_rotary_pos_emb(q, kk, cos, sin)
        kc[:, L : L + k] = kk[0]
        vc[:, L : L + k] = v.reshape(k, self.Hkv, self.d).transpose(0, 1)
        return q

    def act(self, gate_up: torch.Tensor, mlp: torch.nn.Module) -> torch.Tensor:
        """gate_up [k, 2 I] (gate, then up) -> act(gate) * up [k, I]."""
        gate, up = gate_up.chunk(2, dim=-1)
        return mlp.act_fn(gate) * up


class FusedOps(TorchOps):
    """The same operations as one call each into our kernel extension (float32 CPU, LLaMA's RMSNorm and
    SiLU); see ``layer_ops.cpp``."""

    def __init__(self, kernel: Any, n_heads: int, n_kv_heads: int, head_dim: int) -> None:
        super().__init__(n_heads, n_kv_heads, head_dim)
        self.kernel = kernel

    def add_norm(self, x: torch.Tensor, r: torch.Tensor | None, norm: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        return x, self.kernel.add_rms_norm(x, r, norm.weight, norm.variance_epsilon)  # x += r in place

    def rope_to_cache(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kc: torch.Tensor,
                      vc: torch.Tensor, L: int) -> torch.Tensor:
        return self.kernel.rope_to_cache(qkv, cos[0], sin[0], kc, vc, L, self.H, self.Hkv)

    def act(self, gate_up: torch.Tensor, mlp: torch.nn.Module) -> torch.Tensor:
        return self.kernel.silu_mul(gate_up)


def layer_ops(model: torch.nn.Module, kernel: Any, n_heads: int, n_kv_heads: int, head_dim: int) -> TorchOps:
    """:class:`FusedOps` where our kernel runs the matmuls and the model's layers are the plain LLaMA
    ones it implements (RMSNorm with ``variance_epsilon``, SiLU MLP); else :class:`TorchOps`."""
    layer = model.model.layers[0]
    fits = (
        kernel is not None
        and getattr(model.config, "hidden_act", None) == "silu"
        and all(hasattr(norm, "variance_epsilon") and hasattr(norm, "weight")
                for norm in (layer.input_layernorm, layer.post_attention_layernorm, model.model.norm))
    )
    return FusedOps(kernel, n_heads, n_kv_heads, head_dim) if fits else TorchOps(n_heads, n_kv_heads, head_dim)
