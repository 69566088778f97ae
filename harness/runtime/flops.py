"""FLOPs accounting: the model's shape and the one formula every forward is counted with.

FLOPs per forward, for ``k`` new tokens on a cache of ``L`` committed entries and ``r`` rows whose
logits are computed::

    linear  = 2 * P_layers * k                      # every decoder-layer matmul: q,k,v,o,gate,up,down
    attn    = 4 * n_layers * n_heads * d_head * k * (L + k)   # QK^T and AV, all k x (L+k) scores
    lm_head = 2 * vocab * hidden * r
    total   = linear + attn + lm_head

A multiply-add counts as 2 FLOPs; norms, RoPE, softmax and the embedding gather are O(k * hidden) and
left out (<0.5% here). Masked-out scores are still computed by the kernels, so they are counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

@dataclass(frozen=True)
class ModelShape:
    """The numbers the FLOPs formula needs."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int
    vocab: int
    layer_params: int  # parameters of all decoder-layer linear maps (norms excluded)
    max_positions: int


def forward_flops(shape: ModelShape, k: int, cache_len: int, logit_rows: int) -> float:
    """FLOPs of one forward over ``k`` new tokens; derivation in the module docstring."""
    linear = 2.0 * shape.layer_params * k
    attn = 4.0 * shape.n_layers * shape.n_heads * shape.head_dim * k * (cache_len + k)
    head = 2.0 * shape.vocab * shape.hidden * logit_rows
    return linear + attn + head


def model_shape(model: torch.nn.Module) -> ModelShape:
    cfg = model.config
    layers = model.model.layers
    layer_params = sum(
        m.weight.numel() for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear)
    )
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelShape(
        n_layers=len(layers),
        n_heads=cfg.num_attention_heads,
        n_kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim,
        hidden=cfg.hidden_size,
        vocab=cfg.vocab_size,
        layer_params=layer_params,
        max_positions=cfg.max_position_embeddings,
    )

