"""The sandboxed executor shared by the code tasks, and the code-extraction helpers."""

from __future__ import annotations

import json
import secrets
import sys
import time
from pathlib import Path

import pytest

import tasks.execution as execution
from tasks.execution import extract_code, fenced_blocks, run_python, truncate_at_stops
from procs import processes_with

REPO = Path(__file__).resolve().parents[1]

# Every behaviour below must hold for the namespace sandbox (Linux) and for the rlimits-only fallback.
SANDBOXES = ["namespaces", "rlimits"] if sys.platform.startswith("linux") else ["rlimits"]
each_sandbox = pytest.mark.parametrize("sandbox", SANDBOXES)


def test_public_names_and_sandbox_choice() -> None:
    """tasks.execution is the one import for the code tasks, the sandbox's names included."""
    assert all(hasattr(execution, name) for name in execution.__all__)
    assert {"SandboxError", "sandbox_kind", "DEFAULT_MAX_PROCESSES"} <= set(execution.__all__)
    with pytest.raises(ValueError):
        run_python("print(1)\n", timeout_s=5, sandbox="docker")  # type: ignore[arg-type]


@each_sandbox
def test_passing_program(sandbox: str) -> None:
    result = run_python("print('hello')\nassert 1 + 1 == 2\n", timeout_s=5, sandbox=sandbox)
    assert result.passed and result.status == "passed" and result.sandbox == sandbox
    assert result.returncode == 0 and result.stdout == "hello\n"


@each_sandbox
def test_failing_assert_crash_and_syntax_error(sandbox: str) -> None:
    for program, needle in [("assert 1 == 2\n", "AssertionError"), ("1 / 0\n", "ZeroDivisionError"),
                            ("def f(:\n", "SyntaxError")]:
        result = run_python(program, timeout_s=5, sandbox=sandbox)
        assert result.status == "failed" and result.returncode != 0
        assert needle in result.stderr


@each_sandbox
def test_infinite_loop_times_out_quickly(sandbox: str) -> None:
    start = time.monotonic()
    result = run_python("while True:\n    pass\n", timeout_s=1.0, sandbox=sandbox)
    assert result.status == "timeout" and not result.passed and result.returncode is None
    assert time.monotonic() - start < 5


@each_sandbox
def test_forked_children_are_killed_on_timeout(sandbox: str) -> None:
    program = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nelse:\n    time.sleep(60)\n"
    start = time.monotonic()
    assert run_python(program, timeout_s=1.0, sandbox=sandbox).status == "timeout"
    assert time.monotonic() - start < 5


@each_sandbox
def test_leftover_children_are_killed_after_a_normal_exit(sandbox: str) -> None:
    marker = f"lookahead-leftover-{secrets.token_hex(8)}"
    program = (
        "import os, sys\nif os.fork() == 0:\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\n"
        "print('parent done')\n"
    )
    result = run_python(program, timeout_s=5, sandbox=sandbox)
    assert result.passed
    deadline = time.monotonic() + 5
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


@each_sandbox
def test_early_exit_is_not_a_pass(sandbox: str) -> None:
    assert run_python("import sys\nsys.exit(0)\nassert False\n", timeout_s=5, sandbox=sandbox).status == "failed"
    assert run_python("import os\nos._exit(0)\n", timeout_s=5, sandbox=sandbox).status == "failed"


@each_sandbox
def test_main_guard_does_not_run(sandbox: str) -> None:
    """Demo blocks (often calling input()) must not run; stdin is closed anyway."""
    result = run_python("if __name__ == '__main__':\n    input()\nprint(__name__)\n", timeout_s=5, sandbox=sandbox)
    assert result.passed and result.stdout.strip() == "candidate"
    assert run_python("input()\n", timeout_s=5, sandbox=sandbox).status == "failed"


@each_sandbox
def test_isolated_cwd_and_environment(sandbox: str) -> None:
    program = (
        "import os, sys, json\n"
        "print(json.dumps({'cwd': os.getcwd(), 'env': sorted(os.environ), 'path': sys.path}))\n"
    )
    result = run_python(program, timeout_s=5, sandbox=sandbox)
    assert result.passed
    info = json.loads(result.stdout)
    assert str(REPO) not in info["cwd"] and "lookahead-exec-" in info["cwd"]
    assert "PYTHONPATH" not in info["env"] and "LOOKAHEAD_DATA_DIR" not in info["env"]
    assert not any(p in (str(REPO), "") for p in info["path"])
    assert not Path(info["cwd"]).exists()  # the working directory is removed afterwards


@each_sandbox
def test_memory_and_output_floods_fail_without_hurting_the_caller(sandbox: str) -> None:
    assert run_python("x = bytearray(64 * 1024**3)\n", timeout_s=5, sandbox=sandbox).status == "failed"
    flood = run_python("while True:\n    print('x' * 10000)\n", timeout_s=5, sandbox=sandbox)
    assert flood.status == "failed" and len(flood.stdout) <= 8 * 1024**2


def test_fenced_blocks_and_extract_code() -> None:
    text = "Here you go:\n```python\ndef f(x):\n    return x\n```\nUsage:\n```python\nprint(f(1))\n```\n"
    assert fenced_blocks(text) == ["def f(x):\n    return x\n", "print(f(1))\n"]
    assert extract_code(text) == "def f(x):\n    return x\n"
    assert extract_code("```\nprint(1)\n```") == "print(1)\n"
    assert extract_code("```bash\nls\n```\n") == "```bash\nls\n```\n"  # no Python block: text as is
    assert extract_code("```python\ndef g():\n    pass") == "def g():\n    pass"  # cut off mid-block
    assert extract_code("def h():\n    return 1\n") == "def h():\n    return 1\n"


def test_truncate_at_stops() -> None:
    assert truncate_at_stops("a\nb\ndef c", ("\ndef ", "\nb")) == "a"
    assert truncate_at_stops("abc", ("\ndef ",)) == "abc"
