"""Execute the notebooks in place against the reference results and store their outputs.

    .venv/bin/python notebooks/execute.py                      # both notebooks, against results/
    .venv/bin/python notebooks/execute.py --results other/dir scaling_curves.ipynb
    .venv/bin/python notebooks/execute.py --clear              # strip the stored outputs again

A reader then sees every table and figure on GitHub without running anything. Each notebook finds
its records through environment variables read by its parameters cell, so the committed sources are
the same ones CI re-executes on the fixture (tests/test_notebooks.py, which unsets the variables):

* ``ablation.ipynb``: ``LOOKAHEAD_RESULTS=<results>/ablation`` (Table 3) and
  ``LOOKAHEAD_SAMPLING_RESULTS=<results>/sampling`` (Table 2);
* ``scaling_curves.ipynb``: ``LOOKAHEAD_RESULTS=<results>/scaling``.

Paths under the repository are passed relative to it, so the stored outputs name ``results/...``,
not this machine's folders. Cells run from the notebook's folder with the Agg backend and no timing
metadata is recorded, so re-running on unchanged records leaves the files byte for byte the same.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: notebook -> {environment variable: folder under --results}
FOLDERS: dict[str, dict[str, str]] = {
    "ablation.ipynb": {"LOOKAHEAD_RESULTS": "ablation", "LOOKAHEAD_SAMPLING_RESULTS": "sampling"},
    "scaling_curves.ipynb": {"LOOKAHEAD_RESULTS": "scaling"},
}
TIMEOUT_S = 600


def _relative(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def execute(path: Path, results: Path, timeout: int = TIMEOUT_S) -> nbformat.NotebookNode:
    """Run ``path`` top to bottom against ``results`` and write it back with its outputs."""
    env = {var: _relative(results / sub) for var, sub in FOLDERS[path.name].items()}
    missing = [f"{v}={p}" for v, p in env.items() if not (ROOT / p).exists()]
    if missing:
        raise FileNotFoundError(f"{path.name}: no records folder {', '.join(missing)}")
    saved = {k: os.environ.get(k) for k in (*env, "MPLBACKEND")}
    os.environ.update(env, MPLBACKEND="Agg")  # the kernel inherits this process's environment
    try:
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    nbformat.write(nb, path)
    return nb


def clear(path: Path) -> None:
    """Strip outputs and execution counts (the notebook as CI runs it)."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="notebooks/execute.py", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help=f"which ones (default: {', '.join(FOLDERS)})")
    parser.add_argument("--results", type=Path, default=ROOT / "results", help="results root (default: results/)")
    parser.add_argument("--dir", type=Path, default=HERE, help="folder holding the notebooks (default: notebooks/)")
    parser.add_argument("--clear", action="store_true", help="strip stored outputs instead of executing")
    args = parser.parse_args(argv)
    for name in args.notebooks or list(FOLDERS):
        path = args.dir / Path(name).name
        if args.clear:
            clear(path)
            print(f"cleared {path}")
            continue
        try:
            nb = execute(path, args.results.resolve())
        except FileNotFoundError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
        print(f"executed {path} ({images} figures stored)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
