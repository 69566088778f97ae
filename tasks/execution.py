"""Run untrusted generated code for the code tasks (HumanEval, MBPP, ClassEval).

Model output is arbitrary code, so it never runs in the harness process. Each program runs in a fresh
``python -I`` subprocess (isolated mode: no PYTHON* variables, no user site, no script dir on sys.path)
with a fresh temporary directory as cwd and HOME, a minimal environment, stdin closed, resource limits
(address space, file size, no core dumps), its own session so a timeout kills the whole process group,
and output captured to size-limited files. This is damage control against buggy code, not a security
sandbox against a malicious author: the code still runs as this user with network and filesystem access.

The program runs as a module named ``candidate`` rather than ``__main__``, so generated
``if __name__ == "__main__":`` demo blocks (often reading input()) do not run; this matches the official
HumanEval checker, which ``exec``s the program in a fresh namespace. A run counts as passed only if the
process exits 0 *and* the program ran to its end (a per-run nonce printed after it), so an early
``sys.exit(0)`` or ``os._exit(0)`` in generated code is a failure.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_LIMIT_BYTES = 4 * 1024**3
OUTPUT_LIMIT_BYTES = 8 * 1024**2  # also the RLIMIT_FSIZE of the child: a print flood gets killed, not buffered

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
    syntax error, early exit) or ``timeout``."""

    status: Literal["passed", "failed", "timeout"]
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _sandbox_env(workdir: str) -> dict[str, str]:
    """Only what Python needs; nothing that points back at the project or the caller's home."""
    return {
        "PATH": os.defpath,
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _read_capped(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(OUTPUT_LIMIT_BYTES).decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_python(
    program: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_limit_bytes: int | None = DEFAULT_MEMORY_LIMIT_BYTES,
) -> ExecutionResult:
    """Run ``program`` in a sandboxed subprocess (see module docstring). Never raises for anything the
    program does; a hang is killed after ``timeout_s`` seconds and reported as ``timeout``."""
    nonce = f"__lookahead_done_{secrets.token_hex(16)}__"
    bootstrap = _BOOTSTRAP.format(memory=memory_limit_bytes, fsize=OUTPUT_LIMIT_BYTES, nonce=nonce)
    with tempfile.TemporaryDirectory(prefix="lookahead-exec-", ignore_cleanup_errors=True) as workdir:
        work = Path(workdir)
        (work / "program.py").write_text(program, encoding="utf-8")
        out_path, err_path = work / ".stdout", work / ".stderr"
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", bootstrap],
                cwd=workdir,
                env=_sandbox_env(workdir),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # own process group: a timeout kills forked children too
                close_fds=True,
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)  # leftover children of a finished run, or the whole hung run
                proc.wait()
        duration = time.monotonic() - start
        stdout, stderr = _read_capped(out_path), _read_capped(err_path)

    finished = nonce in stdout
    stdout = stdout.replace(f"\n{nonce}\n", "")
    if timed_out:
        status: Literal["passed", "failed", "timeout"] = "timeout"
    elif proc.returncode == 0 and finished:
        status = "passed"
    else:
        status = "failed"
    return ExecutionResult(status, None if timed_out else proc.returncode, stdout, stderr, duration)


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
