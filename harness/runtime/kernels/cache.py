"""The kernel build cache's guards: a build lock that never goes stale, and checks that a cached build
is the one that last loaded (a truncated shared library passes dlopen, then dies of SIGBUS)."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

FLOCK_POLL_S = 0.2


class FlockTimeout(Exception):
    pass


class Flock:
    """An exclusive ``fcntl.flock`` on ``path``, waited for at most ``timeout_s``; a no-op without fcntl."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path, self.timeout_s, self.fd = path, timeout_s, None

    def __enter__(self) -> Flock:
        try:
            import fcntl
        except ImportError:  # not POSIX: torch's own baton only
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise FlockTimeout(f"another build held {self.path} for {self.timeout_s:g} s") from None
                time.sleep(FLOCK_POLL_S)
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None


def module_name(directory: Path) -> str:
    return "lookahead_small_gemm_" + directory.name.replace("-", "_")


def elf_intact(path: Path) -> bool:
    """Whether an ELF file's headers, segments and section table lie within it (a truncated shared
    library passes dlopen and then dies of SIGBUS on first touch, so it must be caught before)."""
    import struct

    data = path.read_bytes()
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return False
    end = "<" if data[5] == 1 else ">"
    if data[4] == 2:  # 64-bit
        phoff, shoff = struct.unpack_from(end + "QQ", data, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", data, 0x36)
        ph_fmt, ph_off_at, ph_filesz_at = end + "Q", 8, 32
    else:
        phoff, shoff = struct.unpack_from(end + "II", data, 0x1C)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", data, 0x2A)
        ph_fmt, ph_off_at, ph_filesz_at = end + "I", 4, 16
    size = len(data)
    if phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
        return False
    for i in range(phnum):
        base = phoff + i * phentsize
        (offset,) = struct.unpack_from(ph_fmt, data, base + ph_off_at)
        (filesz,) = struct.unpack_from(ph_fmt, data, base + ph_filesz_at)
        if offset + filesz > size:
            return False
    return True


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cached_build_ok(directory: Path) -> tuple[bool, str]:
    """Whether the cached library (if any) is the one that last loaded: its recorded sha256 where we
    recorded one, else a structural ELF check. Returns (ok, why not)."""
    so = directory / (module_name(directory) + ".so")
    if not so.exists():
        return True, ""
    recorded = so.with_name(so.name + ".sha256")
    if recorded.exists():
        if recorded.read_text().strip() != _digest(so):
            return False, f"{so.name} differs from the build that loaded (checksum)"
        return True, ""
    if sys.platform.startswith("linux") and not elf_intact(so):
        return False, f"{so.name} is truncated or not a shared library"
    return True, ""


def record_good_build(directory: Path) -> None:
    """After a successful import: the library's sha256, checked by later processes before importing."""
    so = directory / (module_name(directory) + ".so")
    if so.exists():
        tmp = so.with_name(so.name + ".sha256.tmp")
        tmp.write_text(_digest(so) + "\n")
        tmp.replace(so.with_name(so.name + ".sha256"))
