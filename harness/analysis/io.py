"""Output helpers every analysis CLI shares: Markdown tables, CI text, CSV + Markdown files, PNGs, the CLI shape."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 120


def _fmt(value: object, floatfmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, (float, np.floating)):
        return format(float(value), floatfmt)
    return str(value).replace("|", "\\|")


def _integral(col: pd.Series) -> bool:
    vals = pd.to_numeric(col, errors="coerce").dropna() if col.dtype.kind == "f" else pd.Series(dtype=float)
    return col.dtype.kind == "f" and len(vals) > 0 and bool((vals == vals.round()).all())


def to_markdown(df: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """GitHub Markdown table (no tabulate dependency); NaN shows as an em dash.

    Float columns holding only whole numbers (N, W, temperature 0/1, ...) print as integers.
    """
    cols = [str(c) for c in df.columns]
    fmts = [".0f" if _integral(df[c]) else floatfmt for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v, f) for v, f in zip(row, fmts)) + " |")
    return "\n".join(lines)


def with_ci_text(df: pd.DataFrame, names: list[str] | tuple[str, ...], floatfmt: str = ".3f") -> pd.DataFrame:
    """Copy of ``df`` for display: each ``name`` with ``<name>_lo``/``<name>_hi`` becomes the text
    ``value [lo, hi]`` (just ``value`` where the bounds are NaN) and the bound columns are dropped."""
    out = df.copy()
    for name in names:
        lo, hi = f"{name}_lo", f"{name}_hi"
        if name not in out.columns or lo not in out.columns or hi not in out.columns:
            continue
        out[name] = [
            _fmt(v, floatfmt) if _fmt(a, floatfmt) == "—" or _fmt(b, floatfmt) == "—"
            else f"{_fmt(v, floatfmt)} [{_fmt(a, floatfmt)}, {_fmt(b, floatfmt)}]"
            for v, a, b in zip(out[name], out[lo], out[hi])
        ]
        out = out.drop(columns=[lo, hi])
    return out


def write_outputs(df: pd.DataFrame, markdown: str, out_dir: Path, stem: str) -> list[Path]:
    """Write ``<stem>.csv`` and ``<stem>.md`` under out_dir; return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv, md = out_dir / f"{stem}.csv", out_dir / f"{stem}.md"
    df.to_csv(csv, index=False)
    md.write_text(markdown, encoding="utf-8")
    return [csv, md]


def default_out(results: Path) -> Path:
    """Where a CLI writes when --out is not given: ``<results>/analysis``."""
    return (results if results.is_dir() else results.parent) / "analysis"


def make_parser(description: str, prog: str | None = None) -> argparse.ArgumentParser:
    """Shared CLI shape: ``<results> [--out DIR] [--resamples N] [--seed S] [--level L]``."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("results", type=Path, help="results dir (searched for **/records.jsonl) or one records.jsonl")
    parser.add_argument("--out", type=Path, default=None, help="output dir (default: <results>/analysis)")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples per interval (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--level", type=float, default=0.95, help="confidence level (default 0.95)")
    return parser


def save_figure(fig: Figure, path: str | os.PathLike[str]) -> Path:
    """Write ``fig`` as PNG (creating parent dirs) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight", format="png")
    return path
