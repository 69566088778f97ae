"""Spawning one contained child process, shared by both sandbox kinds (:mod:`tasks.execution`'s rlimits
path and :mod:`tasks.sandbox`'s namespace launch): the minimal environment it gets, its own session with
stdin closed and output to files, the wall-clock timeout, the kill of its whole process group, and the
size-capped read of what it wrote (``OUTPUT_LIMIT_BYTES``)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

OUTPUT_LIMIT_BYTES = 8 * 1024**2  # what is read of stdout/stderr; also the RLIMIT_FSIZE of the program


def sandbox_env(workdir: str) -> dict[str, str]:
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


def read_capped(path: Path, limit: int = OUTPUT_LIMIT_BYTES) -> str:
    """The first ``limit`` bytes of ``path``, decoded leniently."""
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def spawn_and_wait(argv: list[str], *, workdir: str, env: dict[str, str], out, err, timeout_s: float,
                   pass_fds: tuple[int, ...] = (), graceful: bool = False) -> tuple[subprocess.Popen, bool]:
    """(finished process, timed out) of ``argv``. On a timeout the process gets SIGTERM first if
    ``graceful``; either way its process group is killed afterwards, hung or finished."""
    proc = subprocess.Popen(
        argv,
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        start_new_session=True,  # own process group: a timeout kills forked children too
        close_fds=True,
        pass_fds=pass_fds,
    )
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        if graceful:  # the namespace supervisor kills its PID namespace and waits until it is empty
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    finally:
        _kill_group(proc.pid)  # leftover children of a finished run, or the whole hung run
        proc.wait()
    return proc, timed_out
