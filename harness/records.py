"""The one place benchmark records are written and read.

A run directory holds ``records.jsonl`` (one JSON object per prompt and turn)
and ``manifest.json``. A results directory holds any number of run
directories, at any depth.

Durability rule: a record counts only once its line, *including* the final
newline, is on disk. The writer emits each record as a single ``write`` of the
whole line followed by ``flush`` + ``fsync``, so a kill can leave at most one
trailing line without its newline. Both the writer (on open) and the loader
treat such a line as never written: the writer truncates it before appending,
the loader skips it with a warning. A re-run therefore resumes from
``done_keys()`` without duplicating or half-counting a prompt.

This module must stay free of torch/transformers: analysis runs on a laptop.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

RECORDS_FILE = "records.jsonl"
MANIFEST_FILE = "manifest.json"

#: Fields every record must have, whatever its status.
REQUIRED_FIELDS: tuple[str, ...] = ("task", "example_id", "turn", "model", "decoder", "status")
#: Extra fields a record with ``status == "ok"`` must have (the report needs them).
REQUIRED_OK_FIELDS: tuple[str, ...] = ("new_tokens", "steps", "decode_s")
#: Columns always present in ``load_records`` output (NaN when a record lacks them),
#: so downstream code can rely on them for matching and grouping.
STANDARD_COLUMNS: tuple[str, ...] = (
    "task", "example_id", "turn", "model", "dtype", "device", "decoder", "config",
    "seed", "temperature", "top_k", "top_p", "max_new_tokens", "status",
    "prompt_tokens", "new_tokens", "steps", "accepted", "input_tokens", "flops",
    "prefill_flops", "prefill_s", "decode_s", "stop_reason", "text", "output_hash",
    "run_dir",
)
#: Standard columns that must be numeric (None/null becomes NaN).
NUMERIC_COLUMNS: tuple[str, ...] = (
    "turn", "seed", "temperature", "top_k", "top_p", "max_new_tokens", "prompt_tokens",
    "new_tokens", "steps", "flops", "prefill_flops", "prefill_s", "decode_s",
)
#: Order in which parameter letters appear in a config label (the rest sorted).
PARAM_ORDER: tuple[str, ...] = ("W", "N", "G", "window", "max_ngram", "num_pred")

Key = tuple[str, str, int]


def compression(tokens: Any, steps: Any) -> Any:
    """S = new tokens / decoding steps (prefill is not a step). The one formula, for numbers (0 for no
    steps) and for pandas columns (NaN for no steps)."""
    if isinstance(steps, pd.Series):
        return tokens / steps.where(steps != 0)
    return tokens / steps if steps else 0.0


class RecordsError(Exception):
    """Records cannot be found, parsed or trusted; the message says where and why."""


# --------------------------------------------------------------------------- writing


def record_key(record: Mapping[str, Any]) -> Key:
    """Identity of a record inside one run dir: (task, example_id, turn)."""
    return (str(record["task"]), str(record["example_id"]), int(record["turn"]))


def _clean(value: Any) -> Any:
    """Make a value strict-JSON safe: NaN/inf become null, numpy scalars/arrays plain."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "tolist"):  # numpy scalar or array, without importing numpy here
        return _clean(value.tolist())
    return value


def _dumps(record: Mapping[str, Any]) -> str:
    return json.dumps(_clean(record), ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _committed_length(data: bytes) -> int:
    """Bytes up to and including the last newline: the part that was fully written."""
    return data.rfind(b"\n") + 1


class RecordWriter:
    """Append-only, crash-safe writer for ``<run_dir>/records.jsonl``.

    Use as a context manager, or call ``close()``. ``write`` refuses (returns
    False) a record whose key is already on disk, so resuming never duplicates.
    """

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / RECORDS_FILE
        self._repair_tail()
        done = [r for r, _ in _iter_file(self.path)] if self.path.exists() else []
        self._keys: set[Key] = {record_key(r) for r in done}
        self._texts: dict[Key, str] = {record_key(r): r.get("text") or "" for r in done}
        self._fh = open(self.path, "a", encoding="utf-8")

    def _repair_tail(self) -> None:
        """Truncate a trailing line that lacks its newline (a crash mid-write)."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        keep = _committed_length(data)
        if keep == len(data):
            return
        warnings.warn(
            f"{self.path}: dropping a partial last line ({len(data) - keep} bytes, no newline) "
            "left by an interrupted run; that prompt will be re-run",
            stacklevel=3,
        )
        with open(self.path, "r+b") as fh:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())

    def done_keys(self) -> set[Key]:
        """Keys (task, example_id, turn) already recorded in this run dir."""
        return set(self._keys)

    def text(self, key: Key) -> str | None:
        """Output text of a recorded prompt (a resumed multi-turn example needs its earlier answers)."""
        return self._texts.get(key)

    def write(self, record: Mapping[str, Any]) -> bool:
        """Append one record durably; False (and nothing written) if its key is done."""
        missing = [f for f in REQUIRED_FIELDS if f not in record]
        if missing:
            raise RecordsError(f"record is missing required fields {missing}: {dict(record)!r:.200}")
        key = record_key(record)
        if key in self._keys:
            warnings.warn(f"{self.path}: {key} already recorded; not writing a duplicate", stacklevel=2)
            return False
        self._fh.write(_dumps(record) + "\n")  # one write: line and newline together
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._keys.add(key)
        self._texts[key] = record.get("text") or ""
        return True

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_manifest(run_dir: str | os.PathLike[str], manifest: Mapping[str, Any]) -> Path:
    """Write ``manifest.json`` atomically (temp file in the same dir + os.replace)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    target = run_dir / MANIFEST_FILE
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".manifest.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(_clean(manifest), fh, indent=2, sort_keys=True, allow_nan=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_manifest(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The run dir's manifest, or {} if it has none."""
    path = Path(run_dir) / MANIFEST_FILE
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise RecordsError(f"{path}: unreadable JSON ({err.msg} at line {err.lineno})") from err


# --------------------------------------------------------------------------- reading


def _iter_file(path: Path) -> Iterator[tuple[dict[str, Any], int]]:
    """Yield (record, line number) for committed lines; skip an uncommitted tail."""
    data = path.read_bytes()
    keep = _committed_length(data)
    if keep < len(data):
        warnings.warn(
            f"{path}: skipping a partial last line (no newline; an interrupted write)",
            stacklevel=3,
        )
    for lineno, raw in enumerate(data[:keep].decode("utf-8", errors="replace").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as err:
            raise RecordsError(f"{path}:{lineno}: unreadable JSON ({err.msg})") from err
        if not isinstance(record, dict):
            raise RecordsError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
        _check_fields(record, path, lineno)
        yield record, lineno


def _check_fields(record: Mapping[str, Any], path: Path, lineno: int) -> None:
    required = list(REQUIRED_FIELDS)
    if record.get("status") == "ok":
        required += REQUIRED_OK_FIELDS
    missing = [f for f in required if record.get(f) is None]
    if missing:
        raise RecordsError(f"{path}:{lineno}: record is missing required fields {missing}")


def find_record_files(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` itself if a file, else every ``**/records.jsonl`` under it (sorted)."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.exists():
        raise RecordsError(f"{path}: no such file or directory")
    files = sorted(path.rglob(RECORDS_FILE))
    if not files:
        raise RecordsError(f"no records found under {path} (looked for **/{RECORDS_FILE})")
    return files


def _format_value(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def config_label(decoder: str, params: Mapping[str, Any] | None) -> str:
    """Readable, order-independent label, e.g. ``lookahead(W=5,N=3,G=5,pool_from_prompt=True)``."""
    params = dict(params or {})
    if not params:
        return str(decoder)
    known = [k for k in PARAM_ORDER if k in params]
    names = known + sorted(k for k in params if k not in PARAM_ORDER)
    return f"{decoder}(" + ",".join(f"{k}={_format_value(params[k])}" for k in names) + ")"


def _scalar(value: Any) -> Any:
    """Params/scores become columns; non-scalar values are kept as compact JSON text."""
    return json.dumps(value, separators=(",", ":")) if isinstance(value, (list, dict)) else value


def _flatten(record: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    params = record.get("params") or {}
    scores = record.get("scores") or {}
    row = {k: v for k, v in record.items() if k not in ("params", "scores")}
    row.update({f"p_{k}": _scalar(v) for k, v in params.items()})
    row.update({f"score_{k}": _scalar(v) for k, v in scores.items()})
    row["config"] = config_label(record["decoder"], params)
    row["params"] = dict(params)
    row["run_dir"] = str(run_dir)
    return row


def load_records(path: str | os.PathLike[str]) -> pd.DataFrame:
    """All records under ``path`` (results dir or one ``records.jsonl``) as one DataFrame.

    Columns: the record fields, ``p_<name>`` per decoder param, ``score_<name>``
    per task score, ``config`` (label of decoder + params), ``params`` (the
    dict), ``run_dir``. Every column in ``STANDARD_COLUMNS`` exists.
    """
    rows = [
        _flatten(record, file.parent)
        for file in find_record_files(path)
        for record, _ in _iter_file(file)
    ]
    if not rows:
        raise RecordsError(f"no records found under {path} (the records files are empty)")
    df = pd.DataFrame(rows)
    for col in STANDARD_COLUMNS:
        if col not in df.columns:
            df[col] = None
    extra = [c for c in df.columns if c not in STANDARD_COLUMNS]
    df = df[list(STANDARD_COLUMNS) + extra]
    df["example_id"] = df["example_id"].astype(str)
    for col in NUMERIC_COLUMNS:
        try:
            df[col] = pd.to_numeric(df[col]).astype(float)
        except (TypeError, ValueError) as err:
            raise RecordsError(f"records under {path}: field {col!r} is not numeric ({err})") from err
    df["turn"] = df["turn"].astype(int)
    return df


def ok_records(df: pd.DataFrame) -> pd.DataFrame:
    """Records whose stats are valid (status ``ok``)."""
    return df[df["status"] == "ok"]
