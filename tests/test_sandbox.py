"""Attacks on the namespace sandbox (tasks.sandbox, run through tasks.execution.run_python), and its
probe. Each attack runs under ``sandbox="namespaces"`` (which raises SandboxError rather than quietly
falling back), and where it is harmless the same attack is shown to succeed under the rlimits-only
fallback, so these tests fail without the sandbox."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

import tasks.sandbox as sandbox_module
from tasks.execution import DEFAULT_DISK_LIMIT_BYTES, DEFAULT_MAX_PROCESSES, run_python, sandbox_kind
from procs import processes_with

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the namespace sandbox is Linux-only")

REPO = Path(__file__).resolve().parents[1]
MB = 1024**2


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _marker() -> str:
    return f"lookahead-sandbox-test-{secrets.token_hex(8)}"


def test_auto_uses_the_namespace_sandbox() -> None:
    assert sandbox_kind() == "namespaces"  # if this fails, the host cannot build the sandbox: see the warning
    assert run_python("print(1)\n", timeout_s=10).sandbox == "namespaces"
    assert run_python("print(1)\n", timeout_s=10, sandbox="rlimits").sandbox == "rlimits"


@pytest.fixture
def fresh_probe():
    """sandbox_kind() with its per-process cache emptied before and after, so a faked probe never leaks."""
    sandbox_kind.cache_clear()
    yield
    sandbox_kind.cache_clear()


def test_sandbox_kind_fallback_warns_once(monkeypatch, capsys, fresh_probe) -> None:
    calls = []
    monkeypatch.setattr(sandbox_module, "_probe_namespaces",
                        lambda: calls.append(1) or "user namespaces disabled")
    assert sandbox_kind() == "rlimits" and sandbox_kind() == "rlimits"
    assert len(calls) == 1  # probed once per process
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "user namespaces disabled" in err
    assert run_python("print(1)\n", timeout_s=10).sandbox == "rlimits"
    assert run_python("print(1)\n", timeout_s=10, sandbox="namespaces").sandbox == "namespaces"  # explicit


def test_no_environment_variable_picks_the_sandbox(monkeypatch, fresh_probe) -> None:
    monkeypatch.setenv("LOOKAHEAD_SANDBOX", "rlimits")  # the retired switch: ignored, the probe decides
    monkeypatch.setattr(sandbox_module, "_probe_namespaces", lambda: None)
    assert sandbox_kind() == "namespaces"
    assert not hasattr(sandbox_module, "SANDBOX_ENV_VAR")


def test_the_real_probe_passes() -> None:
    assert sandbox_module._probe_namespaces() is None


def test_fork_bomb_is_contained() -> None:
    # Safety first: a bounded, linear fork loop must hit the process limit before the real bomb runs.
    linear = (
        "import os, time\nn = 0\nfor _ in range(4 * %d):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
        "    n += 1\nprint(n)\n" % DEFAULT_MAX_PROCESSES
    )
    probe = run_python(linear, timeout_s=20, sandbox="namespaces")
    assert probe.passed and int(probe.stdout) < DEFAULT_MAX_PROCESSES, "process limit not enforced; bomb not run"

    marker = _marker()
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    program = f"import os, sys\nos.execv(sys.executable, [sys.executable, '-c', {bomb!r}, {marker!r}])\n"
    start = time.monotonic()
    try:
        result = run_python(program, timeout_s=3, sandbox="namespaces")
        elapsed, survivors = time.monotonic() - start, processes_with(marker)
    finally:
        _kill_all(processes_with(marker))
    assert result.status in ("failed", "timeout")
    assert elapsed < 3 + 5
    assert survivors == []
    assert run_python("print(1)\n", timeout_s=10, sandbox="namespaces").passed  # the machine still forks


@pytest.mark.parametrize("wait", [False, True], ids=["exits", "times-out"])
def test_setsid_child_does_not_survive(wait: bool) -> None:
    def program(marker: str) -> str:
        return (
            "import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n"
            f"    os.execv(sys.executable, [sys.executable, '-c', 'while True: pass', {marker!r}])\n"
            "time.sleep(0.5)\nprint('started')\n" + ("time.sleep(60)\n" if wait else "")
        )

    marker = _marker()
    try:
        result = run_python(program(marker), timeout_s=3, sandbox="namespaces")
        survivors = processes_with(marker)  # immediately, no grace period
    finally:
        _kill_all(processes_with(marker))
    assert result.status == ("timeout" if wait else "passed")
    assert survivors == []

    marker = _marker()  # the fallback kills only the process group: the setsid child escapes
    try:
        run_python(program(marker), timeout_s=3, sandbox="rlimits")
        deadline = time.monotonic() + 5
        while not (survivors := processes_with(marker)) and time.monotonic() < deadline:
            time.sleep(0.05)  # a slow machine may not have reached the exec yet
    finally:
        _kill_all(processes_with(marker))
    assert survivors


def _visible_scratch_dir() -> Path:
    """A world-writable directory the sandbox can see (not under /tmp, /var/tmp, /run or a home): only the
    read-only mount can stop a deletion there. In a checkout under /tmp, the interpreter's prefix (bound
    back into the sandbox's /tmp) is the visible place."""
    tmp = Path("/tmp").resolve()
    outside = [p for p in (REPO.parent, REPO) if tmp not in (p.resolve(), *p.resolve().parents)]
    for parent in (*outside, Path(sys.prefix)):
        try:
            path = Path(tempfile.mkdtemp(prefix=".lookahead-sandbox-victim-", dir=parent))
        except OSError:
            continue
        path.chmod(0o777)
        return path
    pytest.skip("no writable directory outside /tmp and the homes")


def test_files_outside_the_workdir_cannot_be_deleted(tmp_path: Path) -> None:
    scratch = _visible_scratch_dir()
    try:
        victims = [tmp_path / "victim.txt", scratch / "victim.txt"]
        for victim in victims:
            victim.write_text("precious")
            victim.chmod(0o666)
        program = (
            "import os, json\nseen = {}\nfor path in %r:\n    seen[path] = os.path.exists(path)\n"
            "print(json.dumps(seen), flush=True)\nfor path in %r:\n    os.remove(path)\n"
        ) % ([str(v) for v in victims], [str(v) for v in victims])
        result = run_python(program, timeout_s=10, sandbox="namespaces")
        assert result.status == "failed"
        assert json.loads(result.stdout)[str(victims[1])] is True  # visible, yet read-only
        assert "Read-only file system" in result.stderr or "FileNotFoundError" in result.stderr
        assert all(v.read_text() == "precious" for v in victims)

        assert run_python(program, timeout_s=10, sandbox="rlimits").passed  # fallback: both are gone
        assert not any(v.exists() for v in victims)
    finally:
        for victim in scratch.iterdir():
            victim.unlink()
        scratch.rmdir()


_DISK_FILL = """\
import json, os
marker, per_place = {marker!r}, {per_place!r}
places = [os.getcwd(), "/tmp", "/dev/shm", "/var/tmp", os.path.dirname(os.getcwd())]
written = {{}}
for place in places:
    written[place] = 0
    try:
        for i in range(per_place // (4 << 20)):
            with open(os.path.join(place, "%s-%d" % (marker, i)), "wb") as f:
                f.write(b"x" * (4 << 20))
            written[place] += 4 << 20
    except OSError as e:
        written[place + " error"] = e.strerror
print(json.dumps({{"cwd": os.getcwd(), "written": written}}))
"""


def _leftovers(marker: str) -> list[Path]:
    return [p for d in ("/tmp", "/dev/shm", "/var/tmp") for p in Path(d).glob(f"{marker}-*")]


def _fill(per_place: int, sandbox: str, timeout_s: float) -> tuple[object, dict]:
    """Run the disk filler; whatever it left on the host is deleted before returning."""
    marker = _marker()
    try:
        result = run_python(_DISK_FILL.format(marker=marker, per_place=per_place), timeout_s=timeout_s,
                            sandbox=sandbox)
        leftovers = _leftovers(marker)
    finally:
        for path in _leftovers(marker):
            path.unlink()
    report = json.loads(result.stdout) if result.passed else {}
    report["leftovers"] = leftovers
    report["total"] = sum(v for v in report.get("written", {}).values() if isinstance(v, int))
    return result, report


def test_disk_writes_are_capped_and_vanish() -> None:
    # 80 MB per place first: more than the cap, and harmless if the cap were missing.
    for per_place in (80 * MB, 1024 * MB):
        result, report = _fill(per_place, "namespaces", timeout_s=30)
        assert result.passed, result.stderr  # the program proves it could not: its writes fail (ENOSPC/EROFS)
        assert report["total"] <= DEFAULT_DISK_LIMIT_BYTES  # cwd, /tmp and /dev/shm share one 64 MB tmpfs
        assert report["written"]["/var/tmp"] == 0
        assert not Path(report["cwd"]).exists() and report["leftovers"] == []

    result, report = _fill(80 * MB, "rlimits", timeout_s=60)  # the fallback has no cap
    assert result.passed and report["total"] > 80 * MB and report["leftovers"]


def test_no_network_not_even_loopback() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3).close()\nprint('in')\n"

        result = run_python(program, timeout_s=10, sandbox="namespaces")
        assert result.status == "failed" and "Network is unreachable" in result.stderr
        with pytest.raises(socket.timeout):
            server.accept()

        assert run_python(program, timeout_s=10, sandbox="rlimits").passed  # fallback: it gets through
        server.accept()[0].close()


def test_real_home_is_hidden() -> None:
    ssh = Path.home() / ".ssh"
    created = not ssh.exists()
    ssh.mkdir(mode=0o700, exist_ok=True)
    secret_file = ssh / f"{_marker()}.key"
    try:
        secret_file.write_text("secret-key-material")
        program = f"print(open({str(secret_file)!r}).read())\n"
        result = run_python(program, timeout_s=10, sandbox="namespaces")
        assert result.status == "failed" and "secret-key-material" not in result.stdout
        assert "FileNotFoundError" in result.stderr or "PermissionError" in result.stderr

        fallback = run_python(program, timeout_s=10, sandbox="rlimits")
        assert fallback.passed and "secret-key-material" in fallback.stdout
    finally:
        secret_file.unlink(missing_ok=True)
        if created:
            ssh.rmdir()


def test_program_has_no_privileges_and_no_stray_fds() -> None:
    program = (
        "import json, os\nstatus = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "print(json.dumps({'uid': os.getuid(), 'caps': status['CapEff'].strip(), 'nnp': status['NoNewPrivs'].strip(),"
        " 'fds': sorted(int(fd) for fd in os.listdir('/proc/self/fd'))}))\n"
    )
    info = json.loads(run_python(program, timeout_s=10, sandbox="namespaces").stdout)
    assert info["uid"] == 65534 and int(info["caps"], 16) == 0 and info["nnp"] == "1"
    assert info["fds"] == [0, 1, 2, 3]  # 3: the listdir itself; the supervisor's status pipe is not inherited


def test_supervisor_shrugs_off_signals() -> None:
    # Signals pid 1 only if pid 1 is the sandbox's supervisor (its command line holds the config), never
    # the machine's init, whatever happens to the sandbox.
    program = (
        "import os, signal\nassert b'status_fd' in open('/proc/1/cmdline', 'rb').read(), 'not sandboxed'\n"
        "for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGSTOP, signal.SIGKILL):\n"
        "    try:\n        os.kill(1, sig)\n    except OSError:\n        pass\nprint('still here')\n"
    )
    result = run_python(program, timeout_s=10, sandbox="namespaces")
    assert result.passed and result.stdout == "still here\n"


def test_interpreter_under_tmp_runs_in_the_sandbox(tmp_path: Path) -> None:
    """A checkout or venv under /tmp: the sandbox's own tmpfs covers /tmp, so the interpreter's prefix must be
    bound back there (without that the program could not even start)."""
    import site
    import subprocess

    if sandbox_module.sandbox_kind() != "namespaces":
        pytest.skip("no namespace sandbox on this machine")
    with tempfile.TemporaryDirectory(prefix="lookahead-venv-", dir="/tmp") as venv:
        os.chmod(venv, 0o755)  # as a checkout's folders are: the program's uid must reach the interpreter
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        path = os.pathsep.join([str(REPO), *site.getsitepackages()])
        probe = "from tasks.sandbox import _probe_namespaces as p; print(p())"
        out = subprocess.run([os.path.join(venv, "bin", "python"), "-c", probe], capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": path}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "None", out.stdout  # None: the probe program ran and printed what it should
