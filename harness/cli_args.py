"""Argument types of the harness's command-line scripts (`perf`, `demo`): each turns a typed value into the
Python one, or into argparse's one-line error that says what was expected, so a mistyped option stops the
script before it loads a model; and the options both scripts take."""

from __future__ import annotations

import argparse

from decoders.lookahead import SHAPE, shape_of


def positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def parse_shape(text: str) -> dict[str, int | None]:
    """``"1,3,3,7,6"`` -> W, N, G, text_ngram, step_tokens, prompt_lookup (the last three optional; 0 or
    absent: None) and solo_root off (the tuner's choice alone); a clear error for anything else."""
    parts = text.split(",")
    numeric = SHAPE[:6]
    if not 3 <= len(parts) <= len(numeric) or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected W,N,G[,text_ngram[,step_tokens[,prompt_lookup]]] as 3-6 integers (0 = unset), e.g. 1,5,1 "
            f"or 1,3,3,7,6 or 1,2,1,7,12,10; got {text!r}")
    values = [int(p) for p in parts[:3]] + [int(p) or None for p in parts[3:]] + [None] * (len(numeric) - len(parts))
    return shape_of(values)


def parse_pld(text: str) -> tuple[int, int, bool]:
    """``"6,10"`` -> (max_ngram, num_pred, False); ``"6,10,recent"`` -> the same with pld's recency rule;
    a clear error for anything else."""
    parts = text.split(",")
    recent = len(parts) == 3 and parts[2].strip() == "recent"
    nums = parts[:2] if recent else parts
    if len(nums) != 2 or not all(p.strip().isdigit() and int(p) >= 1 for p in nums):
        raise argparse.ArgumentTypeError("expected MAX_NGRAM,NUM_PRED as two integers >= 1, optionally followed by "
                                         f",recent, e.g. 6,10 or 6,10,recent; got {text!r}")
    return int(nums[0]), int(nums[1]), recent


def add_matmul_option(ap: argparse.ArgumentParser) -> None:
    """``--matmul``: the matmul path, or a kernel variant to force (``avx2`` on an AVX-512 CPU)."""
    from harness.runtime.matmul import MATMUL_CHOICES

    ap.add_argument("--matmul", default="auto", choices=MATMUL_CHOICES,
                    help="matmul path: auto, library, or a kernel variant to force (e.g. avx2 on an AVX-512 CPU)")
