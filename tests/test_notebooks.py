"""Notebooks run top to bottom on the fixture; plot functions render without a display."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from matplotlib.figure import Figure
from nbclient import NotebookClient

from harness.analysis import plots, tables
from harness.analysis.fit import fit_scaling_law
from harness.analysis.io import save_figure
from harness.records import load_records

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FIXTURE = ROOT / "tests" / "fixtures" / "results"


def test_expected_notebooks_exist() -> None:
    assert {p.name for p in NOTEBOOKS} >= {"scaling_curves.ipynb", "ablation.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOKAHEAD_RESULTS", raising=False)  # the default must be the fixture
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells), "needs a parameters cell"
    # run from the notebook's own folder, as Jupyter would
    NotebookClient(nb, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
    images = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert images >= 3
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert str(FIXTURE) in text


def sparse_results(root: Path) -> Path:
    """A results dir with just ar and one lookahead config: too little to fit, enough to report."""
    df = load_records(FIXTURE)
    keep = df[(df["task"] == "humaneval") & df["decoder"].isin(["ar", "lookahead"])]
    for run_dir in keep["run_dir"].unique():
        src = Path(run_dir) / "records.jsonl"
        (root / Path(run_dir).name).mkdir(parents=True)
        (root / Path(run_dir).name / "records.jsonl").write_text(src.read_text())
    return root


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_survives_sparse_results(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOKAHEAD_RESULTS", str(sparse_results(tmp_path / "results")))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert str(tmp_path / "results") in text


def test_notebook_outputs_are_not_committed() -> None:
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), path.name


def test_plot_functions_render_png(tmp_path: Path) -> None:
    df = load_records(FIXTURE)
    mt = df[df["task"] == "mt_bench"]
    fit = fit_scaling_law(mt[mt["p_pool_from_prompt"] == False], w_eq_g=True)  # noqa: E712
    figures = {
        "scaling": plots.scaling_figure(fit),
        "s_vs_w": plots.s_vs_w_figure(mt),
        "speedup": plots.speedup_figure(df=df),
        "accepted": plots.accepted_hist_figure(df),
        "ablation": plots.ablation_figure(tables.ablation_table(df)),
        "empty": plots.accepted_hist_figure(df.iloc[0:0]),
    }
    for name, fig in figures.items():
        assert isinstance(fig, Figure)
        out = save_figure(fig, tmp_path / "figs" / f"{name}.png")
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.path.getsize(out) > 1000
