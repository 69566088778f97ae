"""Finding live processes by a marker in their command line, for the code-execution tests: pids printed
inside a PID namespace mean nothing outside it, so the tests look for a marker instead."""

from __future__ import annotations

import os
from pathlib import Path


def processes_with(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains ``marker`` (zombies have an empty one)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found
