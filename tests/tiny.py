"""A tiny random-weight LLaMA for fast exactness tests.

Weights are drawn with a large init scale so that logits are well separated: near-ties would make
argmax depend on float summation order, which differs between a 1-token and a k-token forward.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from harness.runtime.backend import Backend

TINY_VOCAB = 48
TINY_EOS = 3


def tiny_model(seed: int = 0, attn_implementation: str = "sdpa", vocab: int = TINY_VOCAB,
               bias: bool = False, rope: dict | None = None) -> LlamaForCausalLM:
    """``rope``: transformers' ``rope_parameters`` (None: the default RoPE)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.35,
        eos_token_id=TINY_EOS,
        bos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=False,
        attn_implementation=attn_implementation,
        attention_bias=bias,
        mlp_bias=bias,
        **({} if rope is None else {"rope_parameters": rope}),
    )
    model = LlamaForCausalLM(cfg).eval()
    return model


def tiny_backend(seed: int = 0, attn: str = "auto", device: str = "cpu", matmul: str = "auto") -> Backend:
    """The product's default paths: our kernel and its attention where this machine builds it (on CPU;
    on ``device="cuda"`` the library paths); ``matmul`` forces another (a kernel variant)."""
    return Backend(tiny_model(seed).to(device), tokenizer=None, name=f"tiny-{seed}", attn=attn, matmul=matmul)
