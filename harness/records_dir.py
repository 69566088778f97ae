"""A run directory's shared files beside the records: the writers' lock, claims and the manifest.

Locks, so that any number of processes can write one results tree:

* :class:`RunLock` (``<run_dir>/.lock``, ``flock``): every writer holds it around "re-read the keys
  on disk, drop a torn tail, append, fsync", and around every manifest update. A write therefore
  always sees the records of every other process, and a torn tail under the lock can only be left
  by a writer that died (the kernel releases a dead process's lock), so cutting it is safe.
* :class:`Claims` (``<run_dir>/.claims``, one byte-range ``lockf`` lock per example): a runner
  claims an example before decoding it, so two processes on one job split the prompts instead of
  decoding each twice. A claim is only an economy: if the claimant dies its lock is released and
  another process decodes the example; duplicates are prevented by the write under ``RunLock``.

Both are advisory (POSIX ``fcntl``); both are released by the kernel when a process dies, so a
SIGKILL never leaves a stale lock. Shared filesystems need working ``flock``/``lockf`` (Linux NFS
client and Lustre with ``flock`` mount option provide them).

``manifest.json`` is written atomically (temp file + rename); :func:`update_manifest` is its
read-modify-write under the lock, so concurrent invocations each append their entry.
This module must stay free of torch/transformers (analysis imports it through ``harness.records``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

LOCK_FILE = ".lock"
CLAIMS_FILE = ".claims"
MANIFEST_FILE = "manifest.json"


class RecordsError(Exception):
    """Records cannot be found, parsed or trusted; the message says where and why."""


def clean_json(value: Any) -> Any:
    """Make a value strict-JSON safe: NaN/inf become null, numpy scalars/arrays plain."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    if hasattr(value, "tolist"):  # numpy scalar or array, without importing numpy here
        return clean_json(value.tolist())
    return value


class RunLock:
    """Exclusive lock on a run directory (``with lock: ...``); not reentrant, never nest it."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    def __enter__(self) -> RunLock:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class Claims:
    """Per-example claims: a one-byte ``lockf`` lock at an offset derived from the example's name.

    POSIX record locks belong to the process: claims of two objects in one process never exclude
    each other (harmless: one process decodes its examples one at a time).
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self._fd = os.open(Path(run_dir) / CLAIMS_FILE, os.O_RDWR | os.O_CREAT, 0o644)

    @staticmethod
    def _offset(name: str) -> int:
        return int(hashlib.sha256(name.encode()).hexdigest()[:10], 16)  # < 2**40: a sparse, empty file

    def acquire(self, name: str, wait: bool) -> bool:
        """Claim ``name``; with ``wait=False`` return False at once if another process holds it."""
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB), 1, self._offset(name))
        except (BlockingIOError, PermissionError):
            return False
        return True

    def release(self, name: str) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, self._offset(name))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def write_manifest(run_dir: str | os.PathLike[str], manifest: Mapping[str, Any]) -> Path:
    """Write ``manifest.json`` atomically (temp file in the same dir + os.replace)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir / MANIFEST_FILE
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".manifest.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(clean_json(manifest), fh, indent=2, sort_keys=True, allow_nan=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def update_manifest(
    run_dir: str | os.PathLike[str], change: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    """Read-modify-write ``manifest.json`` under the run dir's lock (atomic for concurrent
    processes); ``change`` gets the current manifest ({} if none) and returns the new one."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock(run_dir)
    try:
        with lock:
            new = change(read_manifest(run_dir))
            write_manifest(run_dir, new)
    finally:
        lock.close()
    return new


def read_manifest(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The run dir's manifest, or {} if it has none."""
    path = Path(run_dir) / MANIFEST_FILE
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise RecordsError(f"{path}: unreadable JSON ({err.msg} at line {err.lineno})") from err
