"""Dataset loading shared by every task: Hugging Face hub by id, or a local copy in the same schema.

Resolution of the local directory, first match wins:

1. the ``data_dir`` argument given to the task;
2. the ``LOOKAHEAD_DATA_DIR`` environment variable (ignored when unset or empty);
3. neither: ``datasets.load_dataset(hf_id, hf_config, split=hf_split)`` from the hub.

With a directory, the file ``<dir>/<local_file>`` is read with the ``json`` builder (whose single split is
always named ``train``); there is no silent fallback to the hub, so a run never mixes sources. Any failure
becomes one :class:`DatasetUnavailable` naming the dataset and where it was looked for.

Offline hosts: a hub load without network retries for ~25 s before failing; set ``HF_HUB_OFFLINE=1`` (a
``datasets``/``huggingface_hub`` setting, not ours) to make it fail at once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DATA_DIR_ENV = "LOOKAHEAD_DATA_DIR"
#: The offline copies beside a checkout (``../shared/data``): the default of ``perf``, ``regression``
#: and the tests, which must run without the hub.
SHARED_DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"


class DatasetUnavailable(RuntimeError):
    """The dataset could not be loaded from the hub or the local data directory."""


def resolve_data_dir(data_dir: str | os.PathLike[str] | None) -> Path | None:
    """The local data directory to use, or None for the hub (see module docstring for the order)."""
    if data_dir is None:
        data_dir = os.environ.get(DATA_DIR_ENV) or None
    return None if data_dir is None else Path(data_dir).expanduser()


def _how_to_fix(local_file: str) -> str:
    return (
        f"Provide it by passing data_dir=<dir> (or setting {DATA_DIR_ENV}=<dir>) where <dir>/{local_file} "
        "exists in the Hugging Face schema, or make the Hugging Face hub reachable."
    )


@contextlib.contextmanager
def _quiet_progress(datasets: Any) -> Iterator[None]:
    """Hide ``datasets``' "Generating train split" bars while a local file is read, then restore them.

    Why: a cold cache otherwise prints two bar lines to stderr, burying a bad-input error in noise; the
    harness shows its own progress bar per job.
    """
    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def load_records(
    *,
    hf_id: str,
    hf_config: str | None,
    hf_split: str,
    local_file: str,
    data_dir: str | os.PathLike[str] | None,
) -> list[dict[str, Any]]:
    """All records of the split as plain dicts, in file/split order."""
    import datasets  # deferred: importing datasets costs ~1 s and tasks are often built just to list them

    directory = resolve_data_dir(data_dir)
    if directory is not None:
        path = directory / local_file
        if not path.is_file():
            raise DatasetUnavailable(
                f"Dataset {hf_id!r} not found locally: expected file {path} (data directory {directory}). "
                + _how_to_fix(local_file)
            )
        try:
            with _quiet_progress(datasets):
                ds = datasets.load_dataset("json", data_files=str(path), split="train")
        except Exception as exc:  # malformed file, unreadable path, ...
            raise DatasetUnavailable(
                f"Dataset {hf_id!r}: could not read local file {path} (data directory {directory}): "
                f"{type(exc).__name__}: {exc}. " + _how_to_fix(local_file)
            ) from None
        return ds.to_list()

    config = f", config {hf_config!r}" if hf_config else ""
    try:
        ds = datasets.load_dataset(hf_id, hf_config, split=hf_split)
    except Exception as exc:  # no network, unknown id, gated repo, ...
        raise DatasetUnavailable(
            f"Dataset {hf_id!r}{config}, split {hf_split!r} could not be loaded from the Hugging Face hub "
            f"({type(exc).__name__}: {exc}). No local data directory was set (data_dir=None and "
            f"{DATA_DIR_ENV} unset). " + _how_to_fix(local_file)
        ) from None
    return ds.to_list()
