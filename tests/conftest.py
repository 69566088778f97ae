"""Shared fixtures: the tiny random model (fast) and the embedded SmolLM2 (slow, loaded once).

``--device cuda`` builds both on that device, so the exactness, sampling and SmolLM2 tests check the
decoders there: ``python -m pytest --device cuda tests/test_exactness.py tests/test_sampling.py
tests/test_smollm2.py`` on a GPU machine (CI has none and runs them on the CPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny import tiny_backend  # noqa: E402


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--device", default="cpu",
                     help="torch device of the tiny-model and SmolLM2 fixtures (cpu, cuda, cuda:N)")


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    return request.config.getoption("--device")


@pytest.fixture(scope="session")
def tiny(device):
    return tiny_backend(0, device=device)


@pytest.fixture(scope="session")
def smollm2(device):
    from harness import load_backend

    return load_backend("smollm2", device=device)
