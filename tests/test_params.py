"""Bad parameters raise ValueError naming the parameter and its valid range."""

from __future__ import annotations

import pytest

from decoders import build_decoder


@pytest.mark.parametrize(
    "name, params, word",
    [
        ("lookahead", {"W": 0}, "W"),
        ("lookahead", {"N": 1}, "N"),
        ("lookahead", {"G": -1}, "G"),
        ("lookahead", {"W": 2.5}, "W"),
        ("lookahead", {"pool_from_prompt": "yes"}, "pool_from_prompt"),
        ("lookahead", {"text_ngram": 1}, "text_ngram"),
        ("lookahead", {"W": 2, "N": 4, "step_tokens": 7}, r"step_tokens .*W=2, N=4 need 8"),
        ("jacobi", {"window": 0}, "window"),
        ("pld", {"max_ngram": 0}, "max_ngram"),
        ("pld", {"num_pred": 0}, "num_pred"),
        ("ar", {"W": 3}, "ar"),
        ("beam", {}, "unknown decoder"),
    ],
)
def test_bad_decoder_params(name, params, word):
    with pytest.raises(ValueError, match=word):
        build_decoder(name, **params)


def test_range_in_message():
    with pytest.raises(ValueError, match=r"W \(lookahead window width\) must be an integer >= 1, got 0"):
        build_decoder("lookahead", W=0)


def test_bad_generate_args(tiny):
    dec = build_decoder("ar")
    with pytest.raises(ValueError, match="max_new_tokens"):
        dec.generate(tiny, [5, 6], 0)
    with pytest.raises(ValueError, match="at least one token"):
        dec.generate(tiny, [], 4)
    with pytest.raises(ValueError, match="context of 512"):
        dec.generate(tiny, [5] * 500, 20)
    with pytest.raises(ValueError, match="temperature"):
        dec.generate(tiny, [5], 4, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        dec.generate(tiny, [5], 4, temperature=1.0, top_p=0.0)


def test_unknown_model_and_dtype():
    from harness import load_backend
    from harness.runtime.backend import ModelLoadError

    with pytest.raises(ValueError, match="dtype"):
        load_backend("smollm2", dtype="int3")
    with pytest.raises(ModelLoadError, match="cannot load model"):
        load_backend("/nonexistent/llama-checkpoint")
