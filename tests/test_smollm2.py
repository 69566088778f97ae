"""Exactness on the real embedded model (SmolLM2-135M-Instruct, fp32): every decoder equals `ar`,
and `ar` equals transformers' own greedy `generate`."""

from __future__ import annotations

import pytest
import torch

from decoders import build_decoder

pytestmark = pytest.mark.slow

PROMPTS = {
    "chat": [{"role": "user", "content": "Give me three tips for staying focused while studying."}],
    "code": [
        {
            "role": "user",
            "content": "Complete this function:\n\ndef fibonacci(n: int) -> list[int]:\n"
            '    """Return the first n Fibonacci numbers."""\n',
        }
    ],
    "summarization": [
        {
            "role": "user",
            "content": "Summarize the following article in one sentence.\n\nThe city council voted on Tuesday "
            "to extend the riverside bike path by four miles, connecting two parks and the central train "
            "station. Construction will begin next spring and is expected to take eighteen months. Council "
            "members said the path would reduce traffic and give commuters a safer route to work.",
        }
    ],
}
CONFIGS = [
    ("jacobi", {"window": 5}),
    ("pld", {"max_ngram": 3, "num_pred": 10}),
    ("lookahead", {"W": 5, "N": 3, "G": 5, "pool_from_prompt": True}),
    ("lookahead", {"W": 7, "N": 5, "G": 7, "pool_from_prompt": False}),
]
MAX_NEW = 40


def _ids(backend, messages) -> list[int]:
    out = backend.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


@pytest.fixture(scope="module")
def references(smollm2):
    return {k: build_decoder("ar").generate(smollm2, _ids(smollm2, m), MAX_NEW) for k, m in PROMPTS.items()}


@pytest.mark.parametrize("kind", sorted(PROMPTS))
def test_ar_equals_transformers_generate(smollm2, references, kind):
    ids = _ids(smollm2, PROMPTS[kind])
    with torch.inference_mode():
        out = smollm2.model.generate(torch.tensor([ids], device=smollm2.device), max_new_tokens=MAX_NEW, do_sample=False)
    assert references[kind].tokens == out[0, len(ids) :].tolist()


@pytest.mark.parametrize("name, params", CONFIGS, ids=lambda x: str(x))
def test_decoders_equal_ar(smollm2, references, name, params):
    for kind, messages in PROMPTS.items():
        res = build_decoder(name, **params).generate(smollm2, _ids(smollm2, messages), MAX_NEW)
        assert res.tokens == references[kind].tokens, (kind, name, params)


def test_lookahead_compresses_code_with_prompt_pool(smollm2):
    """Lookahead with the prompt pool reaches S well above 1 on a code-editing prompt, exactly."""
    code = (
        "def moving_average(values, window):\n"
        "    result = []\n"
        "    for i in range(len(values) - window + 1):\n"
        "        chunk = values[i:i + window]\n"
        "        result.append(sum(chunk) / window)\n"
        "    return result\n"
    )
    msgs = [{"role": "user", "content": f"Rewrite this function with type hints and a docstring:\n\n{code}"}]
    ids = _ids(smollm2, msgs)
    ar = build_decoder("ar").generate(smollm2, ids, 96)
    la = build_decoder("lookahead", W=5, N=5, G=5, pool_from_prompt=True).generate(smollm2, ids, 96)
    assert la.tokens == ar.tokens
    assert la.compression > 1.5, la.compression


def test_projections_are_batch_invariant(smollm2):
    """A row's projection does not depend on the other rows in the call, on every matmul shape of the
    model, so a 1-token step and a multi-token step agree bitwise on equal rows. With our few-row kernel
    (float32, AVX-512) that holds at every row count; on the library paths within each: oneDNN from 3
    rows, MKL on 1-2. Projection's docstring relies on it. Plain F.linear promises nothing: skipped."""
    proj = smollm2._proj[0]
    g = torch.Generator().manual_seed(0)
    for p in (proj.qkv, proj.o, proj.gate_up, proj.down, smollm2._lm_head):
        n_in = p.linears[0].in_features
        x = torch.randn(40, n_in, generator=g).to(smollm2.device)
        if p.small is not None:
            full = p(x)
            for rows in (1, 2, 3, 6, 7, 12, 23):
                for start in (0, 17):
                    assert torch.equal(p(x[start : start + rows]), full[start : start + rows]), (n_in, rows)
        elif p.packed is not None:
            full = p(x)
            for rows in (3, 6, 12):
                for start in (0, 17):
                    assert torch.equal(p(x[start : start + rows]), full[start : start + rows]), (n_in, rows)
            for start in (0, 17):
                assert torch.equal(p(x[start : start + 1]), p(x[start : start + 2])[:1]), (n_in, start)
        else:
            pytest.skip("plain F.linear on this machine: no batch-invariance claim to check")


def _other_variants() -> list[str]:
    """The kernel variants this CPU runs besides its default, except the baseline build (generic arrays: a
    57-token step of SmolLM2 takes seconds there; its decoders are checked on the tiny model)."""
    from harness.runtime.kernels import available_variants

    return [v for v in available_variants()[1:] if v != "baseline"]


@pytest.mark.parametrize("variant", _other_variants() or [None])
def test_decoders_equal_ar_on_another_kernel_variant(device, variant):
    """The same equality with the AVX2 build forced on an AVX-512 machine (its own `ar` as the reference):
    what most users' CPUs run, checked on the real model where the CPU can run both."""
    if device != "cpu":
        pytest.skip("kernel variants are CPU builds")
    if variant is None:
        pytest.skip("this CPU runs one SIMD kernel variant: the tests above ran it")
    from harness import load_backend

    be = load_backend("smollm2", matmul=variant)
    assert be.matmul_path.startswith(f"kernel {variant} ")
    cpu_shape = {"W": 1, "N": 2, "G": 1, "text_ngram": 7, "step_tokens": 6, "prompt_lookup": 5,
                 "pool_from_output": True, "pool_context": True}  # the tuner's pick on these CPUs
    for kind, messages in PROMPTS.items():
        ids = _ids(be, messages)
        ref = build_decoder("ar").generate(be, ids, MAX_NEW).tokens
        for name, params in (CONFIGS[1], CONFIGS[2], ("lookahead", cpu_shape)):
            assert build_decoder(name, **params).generate(be, ids, MAX_NEW).tokens == ref, (variant, kind, name)
