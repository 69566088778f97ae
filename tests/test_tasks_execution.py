"""The sandboxed executor shared by the code tasks, and the code-extraction helpers."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tasks.execution import extract_code, fenced_blocks, run_python, truncate_at_stops

REPO = Path(__file__).resolve().parents[1]


def test_passing_program() -> None:
    result = run_python("print('hello')\nassert 1 + 1 == 2\n", timeout_s=5)
    assert result.passed and result.status == "passed"
    assert result.returncode == 0 and result.stdout == "hello\n"


def test_failing_assert_crash_and_syntax_error() -> None:
    for program, needle in [("assert 1 == 2\n", "AssertionError"), ("1 / 0\n", "ZeroDivisionError"),
                            ("def f(:\n", "SyntaxError")]:
        result = run_python(program, timeout_s=5)
        assert result.status == "failed" and result.returncode != 0
        assert needle in result.stderr


def test_infinite_loop_times_out_quickly() -> None:
    start = time.monotonic()
    result = run_python("while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout" and not result.passed and result.returncode is None
    assert time.monotonic() - start < 5


def test_forked_children_are_killed_on_timeout() -> None:
    program = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nelse:\n    time.sleep(60)\n"
    start = time.monotonic()
    assert run_python(program, timeout_s=1.0).status == "timeout"
    assert time.monotonic() - start < 5


def _alive(pid: int) -> bool:
    """True if ``pid`` is a live (non-zombie) process."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_leftover_children_are_killed_after_a_normal_exit() -> None:
    program = "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(60)\n    os._exit(0)\nprint(pid)\n"
    result = run_python(program, timeout_s=5)
    assert result.passed
    child = int(result.stdout.split()[0])
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_early_exit_is_not_a_pass() -> None:
    assert run_python("import sys\nsys.exit(0)\nassert False\n", timeout_s=5).status == "failed"
    assert run_python("import os\nos._exit(0)\n", timeout_s=5).status == "failed"


def test_main_guard_does_not_run() -> None:
    """Demo blocks (often calling input()) must not run; stdin is closed anyway."""
    result = run_python("if __name__ == '__main__':\n    input()\nprint(__name__)\n", timeout_s=5)
    assert result.passed and result.stdout.strip() == "candidate"
    assert run_python("input()\n", timeout_s=5).status == "failed"


def test_isolated_cwd_and_environment() -> None:
    program = (
        "import os, sys, json\n"
        "print(json.dumps({'cwd': os.getcwd(), 'env': sorted(os.environ), 'path': sys.path}))\n"
    )
    result = run_python(program, timeout_s=5)
    assert result.passed
    info = json.loads(result.stdout)
    assert str(REPO) not in info["cwd"] and "lookahead-exec-" in info["cwd"]
    assert "PYTHONPATH" not in info["env"] and "LOOKAHEAD_DATA_DIR" not in info["env"]
    assert not any(p in (str(REPO), "") for p in info["path"])
    assert not Path(info["cwd"]).exists()  # the working directory is removed afterwards


def test_memory_and_output_floods_fail_without_hurting_the_caller() -> None:
    assert run_python("x = bytearray(64 * 1024**3)\n", timeout_s=5).status == "failed"
    flood = run_python("while True:\n    print('x' * 10000)\n", timeout_s=5)
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
