"""The one place benchmark records are written and read.

A run directory holds one job: ``records.jsonl`` (one JSON object per prompt and turn, each carrying
the job's ``job_id``) and ``manifest.json`` (the job's identity, config, one entry per invocation).
A results directory holds any number of run directories, at any depth.

Durability rule: a record counts only once its line, *including* the final newline, is on disk. The
writer emits each record as a single ``write`` of the whole line followed by ``flush`` + ``fsync``,
so a kill can leave at most one trailing line without its newline; the writer cuts such a line (under
the run dir's lock, see :mod:`harness.records_dir`), the loader skips it with a warning. Concurrent
writers (any number of processes, same or different jobs) lose nothing and duplicate nothing: every
write re-reads the keys on disk under the lock first. The loader also drops duplicate keys within a
run dir (keeping the first), which files written before the lock existed may hold.

This module must stay free of torch/transformers: analysis runs on a laptop.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from harness.records_dir import (  # noqa: F401  (manifest functions re-exported: one import for users)
    MANIFEST_FILE, Claims, RecordsError, RunLock, clean_json, read_manifest, update_manifest, write_manifest,
)

RECORDS_FILE = "records.jsonl"

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
    "job_id", "variant", "run_dir",
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


# --------------------------------------------------------------------------- writing


def record_key(record: Mapping[str, Any]) -> Key:
    """Identity of a record inside one run dir: (task, example_id, turn)."""
    return (str(record["task"]), str(record["example_id"]), int(record["turn"]))


def _dumps(record: Mapping[str, Any]) -> str:
    return json.dumps(clean_json(record), ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _committed_length(data: bytes) -> int:
    """Bytes up to and including the last newline: the part that was fully written."""
    return data.rfind(b"\n") + 1


class RecordWriter:
    """Append-only, crash-safe writer for ``<run_dir>/records.jsonl``, safe with concurrent writers.

    Use as a context manager, or call ``close()``. Every ``write`` runs under the run dir's lock
    (:class:`~harness.records_dir.RunLock`): it first reads the lines other processes appended
    since, drops a torn tail (only a dead writer can leave one), then refuses (returns False) a
    record whose key is on disk, else appends it and fsyncs. So N writers on one directory lose
    nothing and duplicate nothing. ``has(key)`` re-reads the same way, so a runner can skip a prompt
    another process finished; ``claim(name)`` lets runners split the examples (see ``Claims``).

    ``job_id``: when given, every record on disk and every record written must carry it; a run
    directory holds exactly one job, so a mismatch raises :class:`RecordsError`.
    """

    def __init__(self, run_dir: str | os.PathLike[str], job_id: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / RECORDS_FILE
        self.job_id = job_id
        self._keys: set[Key] = set()
        self._texts: dict[Key, str] = {}
        self._offset = self._lines = 0  # bytes and lines of the file already read
        self._lock = RunLock(self.run_dir)
        self._claims = Claims(self.run_dir)
        with self._lock:
            self._sync()
        self._fh = open(self.path, "ab")

    def _sync(self) -> None:
        """Read what was committed since the last call and cut a torn tail (caller holds the lock;
        a tail without its newline can then only come from a writer that died mid-write)."""
        if not self.path.exists():
            return
        with open(self.path, "r+b") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < self._offset:  # truncated or replaced behind our back: read it all again
                self._keys, self._texts, self._offset, self._lines = set(), {}, 0, 0
            fh.seek(self._offset)
            data = fh.read()
            keep = _committed_length(data)
            if keep < len(data):
                warnings.warn(
                    f"{self.path}: dropping a partial last line ({len(data) - keep} bytes, no newline) "
                    "left by an interrupted run; that prompt will be re-run",
                    stacklevel=4,
                )
                fh.truncate(self._offset + keep)
                fh.flush()
                os.fsync(fh.fileno())
        for raw in data[:keep].decode("utf-8", errors="replace").split("\n")[:-1]:
            self._lines += 1
            if raw.strip():
                self._add(_parse(raw, self.path, self._lines))
        self._offset += keep

    def _add(self, record: Mapping[str, Any]) -> None:
        if self.job_id is not None and record.get("job_id") != self.job_id:
            raise RecordsError(
                f"{self.path}:{self._lines}: a record of job {record.get('job_id')!r}, but this run "
                f"directory is written by job {self.job_id!r}; one directory holds one job: move "
                f"{self.run_dir} away or choose another results_dir"
            )
        key = record_key(record)
        if key not in self._keys:  # an old duplicated file: the first record counts
            self._keys.add(key)
            self._texts[key] = record.get("text") or ""

    def done_keys(self) -> set[Key]:
        """Keys (task, example_id, turn) recorded in this run dir by any process, as of now."""
        with self._lock:
            self._sync()
        return set(self._keys)

    def has(self, key: Key) -> bool:
        """Whether ``key`` is recorded, re-reading what other processes appended."""
        with self._lock:
            self._sync()
        return key in self._keys

    def text(self, key: Key) -> str | None:
        """Output text of a recorded prompt (a resumed multi-turn example needs its earlier answers)."""
        return self._texts.get(key)

    @contextmanager
    def claim(self, name: str, wait: bool = False) -> Iterator[bool]:
        """Hold the claim on example ``name`` for the block; yields False (not waiting) if another
        process holds it."""
        got = self._claims.acquire(name, wait)
        try:
            yield got
        finally:
            if got:
                self._claims.release(name)

    def write(self, record: Mapping[str, Any]) -> bool:
        """Append one record durably; False (and nothing written) if its key is already on disk."""
        missing = [f for f in REQUIRED_FIELDS if f not in record]
        if missing:
            raise RecordsError(f"record is missing required fields {missing}: {dict(record)!r:.200}")
        if self.job_id is not None and record.get("job_id") != self.job_id:
            raise RecordsError(f"record of job {record.get('job_id')!r} given to the writer of job {self.job_id!r}")
        key = record_key(record)
        line = (_dumps(record) + "\n").encode("utf-8")
        with self._lock:
            self._sync()
            if key in self._keys:
                warnings.warn(f"{self.path}: {key} already recorded; not writing a duplicate", stacklevel=2)
                return False
            self._fh.write(line)  # one write: line and newline together
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._offset += len(line)
            self._lines += 1
        self._keys.add(key)
        self._texts[key] = record.get("text") or ""
        return True

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
        self._lock.close()
        self._claims.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- reading


def _parse(raw: str, path: Path, lineno: int) -> dict[str, Any]:
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as err:
        raise RecordsError(f"{path}:{lineno}: unreadable JSON ({err.msg})") from err
    if not isinstance(record, dict):
        raise RecordsError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
    _check_fields(record, path, lineno)
    return record


def _iter_file(path: Path) -> Iterator[tuple[dict[str, Any], int]]:
    """Yield (record, line number) for committed lines; skip an uncommitted tail."""
    data = path.read_bytes()
    keep = _committed_length(data)
    if keep < len(data):
        warnings.warn(
            f"{path}: skipping a partial last line (no newline; an interrupted write)",
            stacklevel=3,
        )
    for lineno, raw in enumerate(data[:keep].decode("utf-8", errors="replace").split("\n")[:-1], start=1):
        if raw.strip():
            yield _parse(raw, path, lineno), lineno


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
    dict), ``run_dir``. Every column in ``STANDARD_COLUMNS`` exists (``variant`` is "" for records
    written before prompt variants existed). A key recorded twice in one run dir counts once.
    """
    rows = []
    for file in find_record_files(path):
        seen: set[Key] = set()
        dup = 0
        for record, _ in _iter_file(file):
            key = record_key(record)
            dup += key in seen
            if key not in seen:
                seen.add(key)
                rows.append(_flatten(record, file.parent))
        if dup:
            warnings.warn(f"{file}: {dup} duplicate record(s) of one key; each key counts once (the first)", stacklevel=2)
    if not rows:
        raise RecordsError(f"no records found under {path} (the records files are empty)")
    df = pd.DataFrame(rows)
    for col in STANDARD_COLUMNS:
        if col not in df.columns:
            df[col] = None
    extra = [c for c in df.columns if c not in STANDARD_COLUMNS]
    df = df[list(STANDARD_COLUMNS) + extra]
    df["example_id"] = df["example_id"].astype(str)
    df["variant"] = df["variant"].fillna("")  # records from before variants: one shared variant
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
