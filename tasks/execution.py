"""Run untrusted generated code for the code tasks (HumanEval, MBPP, ClassEval): :func:`run_python` and
its :class:`ExecutionResult`, the ``python -I`` bootstrap that runs the program, the rlimits-only path,
and the helpers that pull the code out of a model answer (:func:`extract_code` and friends).

Model output is arbitrary code, so it never runs in the harness process. Every program runs in a fresh
``python -I`` process (isolated mode: no PYTHON* variables, no user site, no script dir on sys.path) with
a minimal environment, stdin closed, output captured to size-limited files and resource limits: address
space (``memory_limit_bytes``), CPU seconds (twice the timeout, a backstop for anything the wall clock
misses), file size (the output cap) and no core dumps. A wall-clock timeout ends the whole run.

On Linux the program also runs inside the namespace sandbox of :mod:`tasks.sandbox` (``sandbox=
"namespaces"``; that module says what it isolates and what not): own PID, mount, network, user, IPC and
UTS namespaces, uid "nobody" without capabilities, a read-only filesystem with the homes and /run hidden
and one size-capped tmpfs as the only writable place, no network, a process limit, and every process of
the run gone when ``run_python`` returns. A sandbox that cannot be built raises :class:`SandboxError`
(never for what the program does). Where namespaces are unavailable, :func:`sandbox_kind` (probed once
per process) says ``"rlimits"`` and prints one warning line to stderr, and ``sandbox="auto"`` (the
default) runs programs with only the resource limits, their own session (a timeout kills the process
group, but a child that calls ``setsid`` escapes it; ``RLIMIT_CPU`` ends it later) and a temporary cwd:
damage control against buggy code, not a sandbox. A caller that needs one kind passes it as ``sandbox=``;
every :class:`ExecutionResult` records which sandbox ran it.

The program runs as a module named ``candidate`` rather than ``__main__``, so generated
``if __name__ == "__main__":`` demo blocks (often reading input()) do not run; this matches the official
HumanEval checker, which ``exec``s the program in a fresh namespace. A run counts as passed only if the
process exits 0 *and* the program ran to its end (a per-run nonce printed after it), so an early
``sys.exit(0)`` or ``os._exit(0)`` in generated code is a failure.
"""

from __future__ import annotations

import re
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tasks.process import OUTPUT_LIMIT_BYTES, read_capped, sandbox_env, spawn_and_wait
from tasks.sandbox import (
    DEFAULT_DISK_LIMIT_BYTES,
    DEFAULT_MAX_PROCESSES,
    SandboxError,
    SandboxKind,
    run_in_namespaces,
    sandbox_kind,
)

__all__ = [
    "DEFAULT_DISK_LIMIT_BYTES", "DEFAULT_MAX_PROCESSES", "DEFAULT_MEMORY_LIMIT_BYTES", "DEFAULT_TIMEOUT_S",
    "OUTPUT_LIMIT_BYTES", "ExecutionResult", "SandboxError", "SandboxKind", "extract_code", "fenced_blocks",
    "pick_block", "run_python", "sandbox_kind", "truncate_at_stops",
]

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_LIMIT_BYTES = 4 * 1024**3

# Executed with `python -I -c`; the program file is read and run as module "candidate".
_BOOTSTRAP = """\
import os, resource, sys, types
def _limit(which, value):
    try:
        soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))
    except (ValueError, OSError):
        pass
_memory = {memory!r}
if _memory is not None:
    _limit(resource.RLIMIT_AS, _memory)
_limit(resource.RLIMIT_FSIZE, {fsize!r})
_limit(resource.RLIMIT_CORE, 0)
_limit(resource.RLIMIT_CPU, {cpu!r})
sys.argv = ["program.py"]
with open("program.py", encoding="utf-8") as _f:
    _code = compile(_f.read(), "program.py", "exec")
_mod = types.ModuleType("candidate")
_mod.__file__ = os.path.abspath("program.py")
sys.modules["candidate"] = _mod
del _f, _limit, _memory
exec(_code, _mod.__dict__)
sys.stdout.flush()
os.write(1, b"\\n{nonce}\\n")
"""


@dataclass(frozen=True)
class ExecutionResult:
    """Outcome of one sandboxed run. ``status`` is ``passed``, ``failed`` (non-zero exit, exception,
    syntax error, early exit) or ``timeout``; ``sandbox`` says which isolation ran it (module docstring)."""

    status: Literal["passed", "failed", "timeout"]
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    sandbox: SandboxKind = "rlimits"

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def run_python(
    program: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES,
    sandbox: Literal["auto", "namespaces", "rlimits"] = "auto",
    disk_limit_bytes: int = DEFAULT_DISK_LIMIT_BYTES,
    max_processes: int = DEFAULT_MAX_PROCESSES,
) -> ExecutionResult:
    """Run ``program`` in a sandboxed subprocess (see module docstring). Never raises for anything the
    program does; a hang is killed after ``timeout_s`` seconds and reported as ``timeout``.

    ``sandbox="auto"`` uses :func:`sandbox_kind` (probed once per process); ``"namespaces"`` insists on
    the namespace sandbox and raises :class:`SandboxError` if it cannot be built; ``"rlimits"`` forces
    the fallback. ``disk_limit_bytes`` and ``max_processes`` apply to the namespace sandbox only."""
    kind: SandboxKind = sandbox_kind() if sandbox == "auto" else sandbox
    if kind not in ("namespaces", "rlimits"):
        raise ValueError(f"sandbox must be 'auto', 'namespaces' or 'rlimits', got {sandbox!r}")
    nonce = f"__lookahead_done_{secrets.token_hex(16)}__"
    cpu_s = int(2 * timeout_s) + 1
    bootstrap = _BOOTSTRAP.format(memory=memory_limit_bytes, fsize=OUTPUT_LIMIT_BYTES, cpu=cpu_s, nonce=nonce)
    with tempfile.TemporaryDirectory(prefix="lookahead-exec-", ignore_cleanup_errors=True) as workdir:
        work = Path(workdir)
        (work / "program.py").write_text(program, encoding="utf-8")
        out_path, err_path = work / ".stdout", work / ".stderr"
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            if kind == "rlimits":
                proc, timed_out = spawn_and_wait(
                    [sys.executable, "-I", "-c", bootstrap], workdir=workdir, env=sandbox_env(workdir),
                    out=out, err=err, timeout_s=timeout_s)
                returncode: int | None = proc.returncode
            else:
                timed_out, returncode = run_in_namespaces(
                    work, bootstrap, out=out, err=err, timeout_s=timeout_s,
                    disk_limit_bytes=disk_limit_bytes, max_processes=max_processes)
        duration = time.monotonic() - start
        stdout, stderr = read_capped(out_path), read_capped(err_path)

    finished = nonce in stdout
    stdout = stdout.replace(f"\n{nonce}\n", "")
    if timed_out:
        status: Literal["passed", "failed", "timeout"] = "timeout"
    elif returncode == 0 and finished:
        status = "passed"
    else:
        status = "failed"
    return ExecutionResult(status, None if timed_out else returncode, stdout, stderr, duration, kind)


# ------------------------------------------------------------------------------------ code extraction

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = frozenset({"", "python", "py", "python3", "python2"})
_DEFINES = re.compile(r"^\s*(?:async\s+def|def|class)\s", re.MULTILINE)


def fenced_blocks(text: str) -> list[str]:
    """Bodies of the Python (or untagged) ``` blocks in ``text``; an unclosed last block counts, since
    generation often stops at max_new_tokens inside one."""
    return [body for tag, body in _FENCE.findall(text) if tag.lower() in _PYTHON_TAGS]


def pick_block(blocks: list[str]) -> str:
    """The first block that defines something (chat models often add a usage block after the solution),
    else the first block."""
    for block in blocks:
        if _DEFINES.search(block):
            return block
    return blocks[0]


def extract_code(text: str) -> str:
    """The code in a model answer: the chosen fenced block (see :func:`pick_block`), else the whole text."""
    blocks = fenced_blocks(text)
    return pick_block(blocks) if blocks else text


def truncate_at_stops(text: str, stops: tuple[str, ...]) -> str:
    """``text`` up to the earliest occurrence of any stop sequence."""
    cut = len(text)
    for stop in stops:
        index = text.find(stop)
        if index != -1:
            cut = min(cut, index)
    return text[:cut]
