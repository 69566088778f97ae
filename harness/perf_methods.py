"""What ``harness.perf`` times on task prompts: our decoders and transformers' ``generate``, each a
callable (prompt ids, max_new) -> measurements with the total time, prefill included."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from decoders.base import token_hash
from harness.jobs import measure


@dataclass
class Method:
    name: str
    run: Callable[[list[int], int], dict[str, Any]]  # (prompt ids, max_new) -> measurements


def ours(backend, decoder) -> Callable[[list[int], int], dict[str, Any]]:
    def go(ids: list[int], max_new: int) -> dict[str, Any]:
        _, m = measure(decoder, backend, ids, max_new)
        return {**m, "total_s": m["prefill_s"] + m["decode_s"]}
    return go


def transformers_generate(backend, model=None, full_length: bool = False,
                          **kw: Any) -> Callable[[list[int], int], dict[str, Any]]:
    """transformers' ``generate`` on the backend's model, or on ``model`` (e.g. a bfloat16 copy);
    ``full_length``: no stop at EOS, every call makes ``max_new`` tokens, so a model whose text differs from
    ``ar``'s (and may end sooner) is still timed over as many tokens: compare its tok/s."""
    import torch

    model = backend.model if model is None else model

    def go(ids: list[int], max_new: int) -> dict[str, Any]:
        x = torch.tensor([ids], device=backend.device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                pad_token_id=backend.tokenizer.eos_token_id, **({"min_new_tokens": max_new} if full_length else {}),
                **kw,
            )
        backend.sync()
        tokens = out[0, len(ids):].tolist()
        return {"new_tokens": len(tokens), "output_hash": token_hash(tokens), "total_s": time.perf_counter() - t0}
    return go


def hf_bfloat16(backend):
    """A bfloat16 copy of the backend's transformers model: how transformers itself runs bf16 weights
    (bfloat16 activations too, so its text is its own, not ``ar``'s). Why beside the bf16w rows: their
    ``generate`` reads the same bf16 values stored in float32, twice the bytes; this is the other fair
    baseline."""
    import copy

    import torch

    return copy.deepcopy(backend.model).to(torch.bfloat16)
