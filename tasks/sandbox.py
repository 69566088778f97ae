"""The namespace sandbox that :mod:`tasks.execution` runs generated code in on Linux: the ``_NS_INIT``
bootstrap, its launch (:func:`run_in_namespaces`; :mod:`tasks.process` spawns it), :class:`SandboxError`
and the :func:`sandbox_kind` probe. ``_NS_INIT`` (``python -I -S``) builds it through ctypes, without root:

* **Processes**: a new PID namespace whose init supervises. When the program's main process exits, or the
  harness's timeout kills the supervisor, the kernel kills every process left in the namespace (``setsid``
  children too) before the launch returns. The program's own user namespace has ``RLIMIT_NPROC =
  max_processes`` (default 64; threads count), so a fork bomb stops there; it cannot signal the supervisor.
* **Identity**: uid/gid 65534 ("nobody"), no capabilities, ``no_new_privs``: under root the real host uid 65534
  (no supplementary groups), otherwise the harness's uid mapped through user namespaces (the kernel sees it).
* **Filesystem**: a private mount namespace, every mount read-only and nosuid. The only writable place
  is one fresh tmpfs of ``disk_limit_bytes`` (default 64 MB, in RAM): ``/tmp``, ``/dev/shm`` and the
  cwd = HOME = TMPDIR (``/tmp/lookahead-exec-*``); it vanishes with the namespace. ``/root``, ``/home``,
  the harness user's home, ``/run`` (host sockets) and ``/var/tmp`` are covered by empty tmpfs; the Python
  installation (``sys.prefix``, ...) is bound back read-only there and in ``/tmp``. ``/proc`` is the sandbox's.
* **Network**: a new network namespace whose loopback is down: no connections, not even to 127.0.0.1,
  nor to the host's abstract unix sockets. IPC and UTS namespaces are new too.

Not covered: no seccomp filter (a kernel exploit escapes); everything outside the hidden directories
(this repository, the datasets, /etc) stays *readable*; memory is capped per process (``RLIMIT_AS``: up to
``max_processes`` times that plus the tmpfs; a per-sandbox cap needs cgroups); a unix socket outside them
that the uid may write to still accepts connections. :class:`SandboxError` means the sandbox could not be
built; where it cannot be (not Linux, user namespaces off, a container without the rights)
:func:`sandbox_kind` says ``"rlimits"`` and prints one warning line.
"""

from __future__ import annotations

import functools
import os
import pwd
import sys
import tempfile
from pathlib import Path
from typing import Literal

from tasks.process import read_capped, sandbox_env, spawn_and_wait

SandboxKind = Literal["namespaces", "rlimits"]
DEFAULT_DISK_LIMIT_BYTES = 64 * 1024**2  # the sandbox's tmpfs: cwd, /tmp and /dev/shm together
DEFAULT_MAX_PROCESSES = 64  # RLIMIT_NPROC inside the sandbox (processes and threads)

# Run as `python -I -S -c` (no site: starts in a few ms) with "__CONFIG__" replaced by a dict literal: builds
# the sandbox of the module docstring, reports "exit <wait status>" or "error <why it could not>" on the status
# pipe. Processes: this one (outside; SIGTERM = kill) -> init of the new PID namespace (mounts, reaps) -> program.
_NS_INIT = r'''
import ctypes, os, resource
try:
    import _signal as signal  # the C module: `signal` would import enum, 10 ms of start-up
except ImportError:
    import signal
C = __CONFIG__
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.unshare.argtypes = [ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
NEWNS, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET = 0x20000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SYS_mount_setattr, AT_FDCWD, AT_RECURSIVE, ATTR_RDONLY, ATTR_NOSUID = 442, -100, 0x8000, 1, 2
NOBODY = 65534
STATUS = C["status_fd"]
os.set_inheritable(STATUS, False)  # open in this tree until each process execs; never in the program

def report(line):
    try:
        os.write(STATUS, (line.replace("\n", " ") + "\n").encode("utf-8", "replace"))
    except OSError:
        pass

def check(ret, what):
    if ret != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, what + ": " + os.strerror(errno))

def enc(s):
    return None if s is None else os.fsencode(s)

def mount(source, target, fstype, flags, data=None):
    check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), "mount " + target)

def bind(source, target, flags=0):
    mount(source, target, None, BIND | REC)
    if flags:
        mount(None, target, None, REMOUNT | BIND | flags)

def write(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)

def under(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")

def grab(root, keep):
    """O_PATH handles of the outermost paths in `keep` under `root`, taken before `root` is covered."""
    keep = sorted(p for p in keep if under(p, root))
    fds = []
    for path in [p for i, p in enumerate(keep) if not any(under(p, q) for q in keep[:i])]:
        try:
            fds.append((path, os.open(path, os.O_PATH | os.O_CLOEXEC)))
        except OSError:
            pass  # not reachable by this uid: not by the program either
    return fds

def bind_back(fds):
    """Bind each grabbed path back where it was, on top of what now covers it (read-only, as its source)."""
    for path, fd in fds:
        source = "/proc/self/fd/%d" % fd
        if os.path.isdir(source):
            os.makedirs(path, 0o755, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
        bind(source, path)
        os.close(fd)

def read_only_everywhere():
    attr = (ctypes.c_uint64 * 4)(ATTR_RDONLY | ATTR_NOSUID, 0, 0, 0)
    ret = libc.syscall(ctypes.c_long(SYS_mount_setattr), ctypes.c_int(AT_FDCWD), ctypes.c_char_p(b"/"),
                       ctypes.c_uint(AT_RECURSIVE), attr, ctypes.c_size_t(ctypes.sizeof(attr)))
    check(ret, "mount_setattr / read-only")

def run_program(drop_to_nobody):
    """In the init's child: become an unprivileged uid in a user namespace of its own, exec the program."""
    if drop_to_nobody:  # real root: drop to the host's nobody
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
    check(libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "prctl dumpable")  # /proc/self/*_map writable by us
    uid, gid = os.geteuid(), os.getegid()
    # A user namespace per sandbox: RLIMIT_NPROC (set below, after it exists) then counts only its tasks,
    # and exec as a non-zero uid in it leaves the program without capabilities anywhere.
    check(libc.unshare(NEWUSER), "unshare user namespace")
    write("/proc/self/setgroups", "deny")
    write("/proc/self/uid_map", "%d %d 1" % (NOBODY, uid))
    write("/proc/self/gid_map", "%d %d 1" % (NOBODY, gid))
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl no_new_privs")
    resource.setrlimit(resource.RLIMIT_NPROC, (C["nproc"], C["nproc"]))
    os.chdir(C["cwd"])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)  # as subprocess's restore_signals does
    os.execve(C["exe"], [C["exe"], "-I", "-c", C["bootstrap"]], C["env"])

def init(drop_to_nobody):
    """PID 1 of the new PID namespace: build the filesystem view, start the program, reap, exit with it."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # the program may signal us: no Python handler to run
        signal.signal(sig, signal.SIG_IGN)
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl pdeathsig")
    check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl dumpable")  # the program may not ptrace us
    os.chdir("/")
    workdir = C["workdir"]
    with open(os.path.join(workdir, "program.py"), "rb") as f:
        program = f.read()
    for home in C["hide"]:  # an empty tmpfs over each, the interpreter's paths under it bound back
        fds = grab(home, C["keep"])
        mount("tmpfs", home, "tmpfs", NOSUID | NODEV, "size=1m,nr_inodes=1000,mode=755")
        bind_back(fds)
    read_only_everywhere()
    # The one writable place: a size-limited tmpfs, mounted on the (host) workdir and bound to /tmp and
    # /dev/shm; the program's directory is /tmp/<name of the workdir>.
    mount("tmpfs", workdir, "tmpfs", NOSUID | NODEV, "size=%d,nr_inodes=%d,mode=755" % (C["disk"], C["inodes"]))
    owner = (NOBODY, NOBODY) if drop_to_nobody else (0, 0)
    for sub in ("tmp", "shm"):
        os.mkdir(os.path.join(workdir, sub))
        os.chmod(os.path.join(workdir, sub), 0o1777)
    home = os.path.join(workdir, "tmp", os.path.basename(C["cwd"]))
    os.mkdir(home, 0o700)
    with open(os.path.join(home, "program.py"), "wb") as f:
        f.write(program)
    for path in (home, os.path.join(home, "program.py")):
        os.chown(path, *owner)
    if os.path.isdir("/dev/shm") and not os.path.islink("/dev/shm"):
        bind(os.path.join(workdir, "shm"), "/dev/shm", NOSUID | NODEV)
    fds = grab("/tmp", [k for k in C["keep"] if not under(k, workdir)])  # a checkout or venv under /tmp
    bind(os.path.join(workdir, "tmp"), "/tmp", NOSUID | NODEV)
    bind_back(fds)
    mount("proc", "/proc", "proc", NOSUID | NODEV | NOEXEC)
    child = os.fork()
    if child == 0:
        try:
            run_program(drop_to_nobody)
        except BaseException as e:
            report("error starting the program: %r" % (e,))
        os._exit(127)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            report("error the program's process vanished")
            os._exit(1)
        if pid == child:
            report("exit %d" % status)
            os._exit(0)  # the kernel now kills everything else in the namespace

def mapped(path, id=NOBODY):
    with open(path) as f:
        return any(int(inner) <= id < int(inner) + int(count) for inner, _, count in map(str.split, f))

def main():
    uid, gid = os.geteuid(), os.getegid()
    before = os.readlink("/proc/self/ns/mnt")
    flags = NEWNS | NEWNET | NEWPID | NEWIPC | NEWUTS
    as_root = uid == 0 and libc.unshare(flags) == 0
    # Root drops to nobody, if that uid exists here (not in every user namespace a container runs in).
    drop_to_nobody = as_root and mapped("/proc/self/uid_map") and mapped("/proc/self/gid_map")
    if not as_root:
        check(libc.unshare(flags | NEWUSER), "unshare")
        write("/proc/self/setgroups", "deny")
        write("/proc/self/uid_map", "0 %d 1" % uid)
        write("/proc/self/gid_map", "0 %d 1" % gid)
    if os.readlink("/proc/self/ns/mnt") == before:  # never touch the host's mounts
        raise OSError("no new mount namespace")
    mount(None, "/", None, REC | PRIVATE)  # nothing below propagates back to the host
    pid1 = [0]

    def on_sigterm(*_):  # the harness's timeout: kill init, which takes the whole namespace with it
        if pid1[0] > 0:
            os.kill(pid1[0], signal.SIGKILL)
        else:
            os._exit(1)

    signal.signal(signal.SIGTERM, on_sigterm)
    pid1[0] = os.fork()
    if pid1[0] == 0:
        try:
            init(drop_to_nobody)
        except BaseException as e:
            report("error building the sandbox: %r" % (e,))
        os._exit(1)
    while True:
        try:
            os.waitpid(pid1[0], 0)  # returns once init is gone, i.e. after every process in the namespace
            break
        except ChildProcessError:
            break

try:
    main()
except BaseException as e:
    report("error creating namespaces: %r" % (e,))
    os._exit(1)
'''

class SandboxError(RuntimeError):
    """The namespace sandbox could not be built or did not report (never raised for program behaviour)."""


def _hidden_dirs() -> list[str]:
    """Directories replaced by an empty tmpfs in the sandbox: homes (keys, tokens, caches) and /run (the
    host's sockets: dbus, docker, ...)."""
    candidates = ["/root", "/home", "/run", "/var/tmp", os.path.expanduser("~")]
    try:
        candidates.append(pwd.getpwuid(os.geteuid()).pw_dir)
    except KeyError:
        pass
    dirs = sorted({os.path.realpath(p) for p in candidates if p and os.path.isdir(p)} - {"/"})
    return [d for i, d in enumerate(dirs) if not any(d.startswith(top.rstrip("/") + "/") for top in dirs[:i])]


def _ns_init_source(workdir: str, cwd: str, bootstrap: str, env: dict[str, str], status_fd: int,
                    disk_limit_bytes: int, max_processes: int) -> str:
    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                os.path.dirname(os.path.realpath(sys.executable)))
    keep = sorted({os.path.realpath(p) for p in prefixes if p})  # the program's interpreter must see these
    # A hidden directory that contains the interpreter's prefix itself (e.g. a venv at ~/.venv) is hidden
    # with the prefix bound back; one that *is* inside the prefix is simply not hidden.
    hide = [d for d in _hidden_dirs() if not any(d == k or d.startswith(k.rstrip("/") + "/") for k in keep)]
    config = {
        "workdir": workdir, "cwd": cwd, "exe": sys.executable, "bootstrap": bootstrap, "env": env,
        "status_fd": status_fd, "hide": hide, "keep": keep, "disk": int(disk_limit_bytes),
        "inodes": 16384, "nproc": int(max_processes),
    }
    return _NS_INIT.replace("__CONFIG__", repr(config), 1)


def _parse_report(raw: bytes) -> tuple[int | None, str | None]:
    """(wait status of the program, error) from the status pipe."""
    status, error = None, None
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if line.startswith("exit "):
            status = int(line[5:])
        elif line.startswith("error ") and error is None:
            error = line[6:]
    return status, error


def run_in_namespaces(work: Path, bootstrap: str, *, out, err, timeout_s: float,
                      disk_limit_bytes: int = DEFAULT_DISK_LIMIT_BYTES,
                      max_processes: int = DEFAULT_MAX_PROCESSES) -> tuple[bool, int | None]:
    """(timed out, return code) of ``python -I -c bootstrap`` run by ``_NS_INIT`` in the sandbox, with
    ``work/program.py`` copied into its cwd; ``out``/``err`` are the files ``work/.stdout``/``.stderr``."""
    cwd = "/tmp/" + work.name  # inside the sandbox: its private /tmp
    env = sandbox_env(cwd)
    read_fd, write_fd = os.pipe()
    try:
        init = _ns_init_source(str(work), cwd, bootstrap, env, write_fd, disk_limit_bytes, max_processes)
        try:
            _, timed_out = spawn_and_wait(
                [sys.executable, "-I", "-S", "-c", init], workdir=str(work), env=env, out=out, err=err,
                timeout_s=timeout_s, pass_fds=(write_fd,), graceful=True)
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)  # every writer is gone by now; never wait on a stray one
        try:
            raw = os.read(read_fd, 65536)
        except BlockingIOError:
            raw = b""
    finally:
        os.close(read_fd)
    wait_status, error = _parse_report(raw)
    if error is not None or (wait_status is None and not timed_out):
        detail = error or "no report; stderr: " + read_capped(work / ".stderr")[-500:].strip()
        raise SandboxError(f"namespace sandbox failed: {detail}")
    return timed_out, None if wait_status is None else os.waitstatus_to_exitcode(wait_status)


@functools.cache
def sandbox_kind() -> SandboxKind:
    """Which sandbox ``run_python(sandbox="auto")`` uses here: ``"namespaces"`` if a probe program ran
    in it, else ``"rlimits"`` (with one warning line on stderr). Probed once per process (about 0.1 s);
    a caller that needs a particular kind passes ``sandbox=`` to ``run_python`` instead."""
    reason = _probe_namespaces()
    if reason is None:
        return "namespaces"
    print(f"lookahead-bench: WARNING: no namespace sandbox for generated code ({reason}); "
          "running it with resource limits only", file=sys.stderr)
    return "rlimits"


def _probe_namespaces() -> str | None:
    """None if the namespace sandbox works here (a program in it prints what it should), else why not."""
    if not sys.platform.startswith("linux"):
        return f"not Linux ({sys.platform})"
    bootstrap = "exec(compile(open('program.py').read(), 'program.py', 'exec'))"  # as run_python's does
    try:
        with tempfile.TemporaryDirectory(prefix="lookahead-exec-", ignore_cleanup_errors=True) as workdir:
            work = Path(workdir)
            (work / "program.py").write_text("print('sandbox ok')\n", encoding="utf-8")
            with open(work / ".stdout", "wb") as out, open(work / ".stderr", "wb") as err:
                timed_out, returncode = run_in_namespaces(work, bootstrap, out=out, err=err, timeout_s=30)
            stdout, stderr = (read_capped(work / name) for name in (".stdout", ".stderr"))
    except (SandboxError, OSError) as e:
        return str(e)
    if timed_out or returncode != 0 or stdout != "sandbox ok\n":
        status = "timeout" if timed_out else "failed" if returncode else "passed"
        return f"probe program {status}: {(stderr or stdout).strip()[-300:]}"
    return None
