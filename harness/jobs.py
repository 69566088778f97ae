"""The one decode-and-measure step that ``run``, ``perf`` and ``regression`` share.

Every figure the harness prints about a generation (tokens, steps, S, accepted lengths, FLOPs, wall
times, the output's identity) comes from :func:`measure`, so a record, a perf row and a regression
entry of the same generation can never disagree on how a number was taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from decoders.base import DecodeResult, Decoder
    from harness.runtime.backend import Backend


def measurement(res: DecodeResult) -> dict[str, Any]:
    """The record fields of one generation (S = new_tokens / steps; prefill is not a step)."""
    return {
        "new_tokens": len(res.tokens), "steps": res.steps, "accepted": res.accepted,
        "input_tokens": res.input_tokens, "flops": sum(res.flops), "prefill_flops": res.prefill_flops,
        "prefill_s": res.prefill_s, "decode_s": res.decode_s, "forward_s": res.forward_s,
        "stop_reason": res.stop_reason, "output_hash": res.output_hash,
    }


def measure(
    decoder: Decoder, backend: Backend, prompt_ids: list[int], max_new_tokens: int, **sampling: Any
) -> tuple[DecodeResult, dict[str, Any]]:
    """Generate once; return the result and its :func:`measurement`."""
    res = decoder.generate(backend, prompt_ids, max_new_tokens, **sampling)
    return res, measurement(res)
