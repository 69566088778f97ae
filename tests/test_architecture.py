"""The layout's rules, checked from the source: no import cycles, who may import whom, small files.

Imports are read from the AST, function-level (lazy) imports and TYPE_CHECKING blocks included, so a
cycle hidden behind a lazy import still fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "decoders", "tasks")
MAX_LINES = 350


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Project modules ``name`` imports anywhere in its file (``from pkg import mod`` resolves to pkg.mod)."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # `import harness.runtime.backend.x` -> the module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_lazy_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_is_read():
    assert "decoders.lookahead" in GRAPH["decoders.autotune"]
    assert "harness.runtime.backend" in GRAPH["harness.runtime.loading"]


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


def test_the_tuner_imports_lookahead_never_the_reverse():
    assert "decoders.autotune" not in GRAPH["decoders.lookahead"]


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("decoders")))
def test_decoders_know_only_the_backend(name):
    outside = {m for m in GRAPH[name] if not m.startswith("decoders")}
    assert outside <= {"harness.runtime.backend"}, f"{name} imports {sorted(outside)}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("tasks")))
def test_tasks_never_import_decoders_or_harness(name):
    assert not {m for m in GRAPH[name] if not m.startswith("tasks")}, f"{name} imports {sorted(GRAPH[name])}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("harness.analysis") or n == "harness.records"))
def test_analysis_reads_records_only(name):
    """No model, no torch: a notebook redraws every figure on a laptop."""
    allowed = ("harness.analysis", "harness.records")
    assert all(m.startswith(allowed) for m in GRAPH[name]), f"{name} imports {sorted(GRAPH[name])}"
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not roots & {"torch", "transformers", "decoders"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_is_small_and_says_what_it_owns(name):
    path = MODULES[name]
    text = path.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_LINES, f"{path.relative_to(ROOT)} has more than {MAX_LINES} lines"
    if text.strip():
        assert ast.get_docstring(ast.parse(text)), f"{path.relative_to(ROOT)} has no module docstring"
