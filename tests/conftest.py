"""Shared fixtures: the tiny random model (fast) and the embedded SmolLM2 (slow, loaded once)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny import tiny_backend  # noqa: E402


@pytest.fixture(scope="session")
def tiny():
    return tiny_backend(0)


@pytest.fixture(scope="session")
def smollm2():
    from harness import load_backend

    return load_backend("smollm2")
