"""Notebooks run top to bottom on the fixture; their committed outputs come from results/; plots render headless."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import nbformat
import pytest
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from nbclient import NotebookClient

from harness.analysis import plots, tables, uncertainty
from harness.analysis.fit import fit_scaling_law
from harness.analysis.io import save_figure
from harness.records import load_records

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FIXTURE = ROOT / "tests" / "fixtures" / "results"
ENV = ("LOOKAHEAD_RESULTS", "LOOKAHEAD_SAMPLING_RESULTS")
#: strings each notebook prints on the fixture: the new CIs, rank agreement, verdicts, bootstrap fit
EXPECTED = {
    "ablation.ipynb": ("1.000 [1.000, 1.000]", "pairs separated", "Kendall", "the CI of the ROUGE difference"),
    "scaling_curves.ipynb": ("alpha_lo", "f_hi", "slope_lo"),
}


def _execute_script():
    spec = importlib.util.spec_from_file_location("notebooks_execute", ROOT / "notebooks" / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(path: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    # run from the notebook's own folder, as Jupyter would
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


def _text(nb: nbformat.NotebookNode) -> str:
    """Everything a reader sees as text: streams, Markdown and plain-text results."""
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", ""))
            out += [o.get("data", {}).get(k, "") for k in ("text/markdown", "text/plain")]
    return "".join(out)


def _images(nb: nbformat.NotebookNode) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def _errors(nb: nbformat.NotebookNode) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]


def test_expected_notebooks_exist() -> None:
    assert {p.name for p in NOTEBOOKS} >= set(EXPECTED)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ENV:
        monkeypatch.delenv(var, raising=False)  # the default must be the fixture
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells), "needs a parameters cell"
    nb = _run(path)
    assert not _errors(nb)
    assert _images(nb) >= 3
    text = _text(nb)
    assert "under tests/fixtures/results" in text  # printed relative to the repo root
    for expected in EXPECTED[path.name]:
        assert expected in text, expected


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
    sparse = sparse_results(tmp_path / "results")
    monkeypatch.setenv("LOOKAHEAD_RESULTS", str(sparse))
    monkeypatch.setenv("LOOKAHEAD_SAMPLING_RESULTS", str(tmp_path / "no-sampling-runs"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = _run(path)
    assert not _errors(nb)
    assert str(sparse) in _text(nb)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_outputs_are_a_run_on_results(path: Path) -> None:
    """The stored outputs are one clean top-to-bottom run of notebooks/execute.py on results/."""
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    hint = f"{path.name}: run `.venv/bin/python notebooks/execute.py` and commit the notebook with its outputs"
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), hint
    assert not _errors(nb) and _images(nb) >= 2, hint
    text = _text(nb)
    folder = _execute_script().FOLDERS[path.name]["LOOKAHEAD_RESULTS"]
    assert f"under results/{folder}" in text, hint
    assert "tests/fixtures" not in text and str(ROOT) not in text  # no fixture run, no machine paths


def test_execute_script_passes_folders_and_writes_outputs(tmp_path: Path) -> None:
    """execute.py: env variables per notebook (relative to the repo when inside it), outputs written in place."""
    module = _execute_script()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os; print(os.environ['LOOKAHEAD_RESULTS'], os.environ['MPLBACKEND'])")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "scaling_curves.ipynb")
    (tmp_path / "res" / "scaling").mkdir(parents=True)
    assert module.main(["scaling_curves.ipynb", "--dir", str(tmp_path), "--results", str(tmp_path / "res")]) == 0
    ran = nbformat.read(tmp_path / "scaling_curves.ipynb", as_version=4)
    assert _text(ran).strip() == f"{tmp_path / 'res' / 'scaling'} Agg"
    assert "execution" not in ran.cells[0].metadata  # no timing metadata: re-runs leave the file unchanged
    assert module.main(["scaling_curves.ipynb", "--dir", str(tmp_path), "--clear"]) == 0
    assert not nbformat.read(tmp_path / "scaling_curves.ipynb", as_version=4).cells[0].outputs
    assert module.main(["ablation.ipynb", "--dir", str(tmp_path), "--results", str(tmp_path / "res")]) == 2
    assert module._relative(ROOT / "results" / "ablation") == "results/ablation"


def test_plot_functions_render_png(tmp_path: Path) -> None:
    df = load_records(FIXTURE)
    mt = df[df["task"] == "mt_bench"]
    fit = fit_scaling_law(mt[mt["p_pool_from_prompt"] == False], w_eq_g=True)  # noqa: E712
    cis, (fit_ci,) = uncertainty.bootstrap_fits(mt, [fit], n_resamples=200)
    ablation = tables.ablation_table(df, n_resamples=200)
    figures = {
        "scaling": plots.scaling_figure(fit),
        "scaling_ci": plots.scaling_figure(fit_ci, ci=cis.iloc[0].to_dict()),
        "scaling_points": plots.scaling_figure(uncertainty.config_point_cis(mt, n_resamples=200)),
        "s_vs_w": plots.s_vs_w_figure(mt),
        "speedup": plots.speedup_figure(df=df),
        "accepted": plots.accepted_hist_figure(df),
        "ablation": plots.ablation_figure(ablation),
        "empty": plots.accepted_hist_figure(df.iloc[0:0]),
    }
    for name, fig in figures.items():
        assert isinstance(fig, Figure)
        out = save_figure(fig, tmp_path / "figs" / f"{name}.png")
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.path.getsize(out) > 1000
    ax = figures["scaling_ci"].axes[0]
    assert ax.get_xscale() == "log" and "[" in ax.get_title()  # log FLOPs axis, bootstrap CIs in the title
    for axes in (ax, figures["ablation"].axes[0]):  # error bars drawn
        assert any(isinstance(c, ErrorbarContainer) for c in axes.containers)
