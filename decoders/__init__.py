"""Decoders: one file each, all sharing the generate loop, draft trees and verification in base/tree.

``build_decoder(name, **params)`` is the one entry point; ``DECODERS`` maps names to classes.
``lookahead`` with ``auto=True`` is built as :class:`AutoTunedLookahead`, which tunes its shape first.
"""

from __future__ import annotations

from typing import Any

from decoders.ar import AutoregressiveDecoder
from decoders.autotune import AutoTunedLookahead
from decoders.base import DecodeResult, Decoder
from decoders.jacobi import JacobiDecoder
from decoders.lookahead import LookaheadDecoder
from decoders.pld import PromptLookupDecoder

DECODERS: dict[str, type[Decoder]] = {
    cls.name: cls for cls in (AutoregressiveDecoder, JacobiDecoder, PromptLookupDecoder, LookaheadDecoder)
}


def build_decoder(name: str, **params: Any) -> Decoder:
    """Instantiate a decoder by name; unknown names and parameters raise ValueError."""
    cls = DECODERS.get(name)
    if cls is None:
        raise ValueError(f"unknown decoder {name!r}; choose one of {sorted(DECODERS)}")
    if cls is LookaheadDecoder and params.get("auto") is True:
        cls = AutoTunedLookahead
    try:
        return cls(**params)
    except TypeError as err:
        raise ValueError(f"bad parameters for decoder {name!r}: {err}") from None


__all__ = [
    "DECODERS", "AutoTunedLookahead", "AutoregressiveDecoder", "DecodeResult", "Decoder", "JacobiDecoder", "LookaheadDecoder",
    "PromptLookupDecoder", "build_decoder",
]
