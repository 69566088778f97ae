"""`make demo` (the README's first command) on the embedded model, at a few tokens: it names the matmul
path first (after the CPU), tunes, runs every decoder on every built-in prompt, and every output equals `ar`'s."""

from __future__ import annotations

import pytest

from harness.demo import BUILTIN_PROMPTS, labelled_lines, main


def test_demo_runs_exact_and_fits_100_columns(capsys):
    from harness.runtime.kernels import best_variant

    variant = best_variant()  # named, as `--matmul avx2` forces AVX2 on an AVX-512 machine
    main(["--max-new-tokens", "8", "--matmul", variant])
    lines = capsys.readouterr().out.splitlines()
    first = next(i for i, ln in enumerate(lines) if not ln.startswith(("cpu: ", "     ")))  # the CPU may wrap
    assert lines[0].startswith("cpu: ") and "torch " in " ".join(lines[:first])
    assert lines[first].startswith(f"matmuls: kernel {variant} (")
    assert any(ln.startswith("attention: ") for ln in lines[first + 1:first + 3])
    assert any("auto-tuned lookahead (" in ln for ln in lines)
    assert any("medians of 3 interleaved rounds" in ln for ln in lines)
    rows = [ln for ln in lines if ln.split() and ln.split()[0] in BUILTIN_PROMPTS]
    assert len(rows) == 5 * len(BUILTIN_PROMPTS)  # ar, jacobi, pld, lookahead paper and auto per prompt
    assert all(ln.rstrip().endswith("yes") for ln in rows), "\n".join(rows)
    assert max(len(ln) for ln in lines) <= 100


def test_a_long_cpu_line_wraps_to_100_columns():
    """A Xeon's name and flags made a 113-column first line; the demo wraps it, keeping every word."""
    cpu = ("Intel(R) Xeon(R) Processor (family 6 model 167; avx2 fma avx512f avx512_bf16 amx_tile; "
           "torch AVX512; 2 CPUs)")
    lines = labelled_lines("cpu", cpu)
    assert len(lines) == 2 and lines[0].startswith("cpu: Intel(R)") and lines[1].startswith("     ")
    assert all(len(ln) <= 100 for ln in lines)
    assert " ".join(ln.strip() for ln in lines) == f"cpu: {cpu}"
    assert labelled_lines("cpu", "AMD EPYC (family 25 model 17; avx2 fma avx512f; torch AVX512; 2 CPUs)") == [
        "cpu: AMD EPYC (family 25 model 17; avx2 fma avx512f; torch AVX512; 2 CPUs)"]


def test_a_long_matmul_path_wraps_under_its_label():
    """Zen 4's path with its tiles and 2 MB pages made a 112-column line with attention beside it."""
    from types import SimpleNamespace

    import torch

    from harness.runtime.matmul import describe_path

    info = SimpleNamespace(variant="avx512", isa="AVX512", zen4=True, openmp=False)
    path = describe_path(SimpleNamespace(kernel_info=info), pack=False, bf16_weights=False, dtype=torch.float32,
                         huge_bytes=539_000_000)
    lines = labelled_lines("matmuls", path)
    assert len(lines) >= 2 and all(len(ln) <= 100 for ln in lines)
    assert all(ln.startswith(" " * 9) and not ln[9].isspace() for ln in lines[1:])  # under the label's text
    assert " ".join(ln.strip() for ln in lines) == f"matmuls: {path}"


def test_rounds_rotate_the_decoders():
    """Each round starts at the next decoder (the demo's and perf's rounds), so `ar` (the reference) is not
    always the first timed."""
    from harness.runtime.matmul import rotated

    assert [rotated(5, r) for r in range(3)] == [[0, 1, 2, 3, 4], [1, 2, 3, 4, 0], [2, 3, 4, 0, 1]]
    assert rotated(5, 7) == [2, 3, 4, 0, 1] and rotated(1, 4) == [0]


@pytest.mark.parametrize("option", ["--repeats", "--max-new-tokens"])
def test_demo_rejects_zero_counts_before_loading(option, capsys):
    with pytest.raises(SystemExit):
        main([option, "0"])
    assert "expected an integer >= 1, got '0'" in capsys.readouterr().err


def test_demo_rejects_an_unknown_matmul_before_loading(capsys):
    with pytest.raises(SystemExit):
        main(["--matmul", "sse9"])
    assert "invalid choice: 'sse9'" in capsys.readouterr().err
