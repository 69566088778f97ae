"""The one comparison against the reference decoder (``ar``): speedup and exact match per prompt.

Used by the report (records), ``perf`` (its interleaved timings) and the regression guard (greedy
exactness), so "faster than ar" and "equal to ar" mean the same thing everywhere: a row is paired
with the reference row of the same ``keys`` only, never across prompt variants or setups.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

REFERENCE = "ar"


def against_reference(
    rows: pd.DataFrame, keys: Sequence[str], time_col: str = "decode_s", reference: str = REFERENCE,
    by: str = "decoder",
) -> pd.DataFrame:
    """``rows`` with ``ref_<time_col>``, ``ref_output_hash``, ``speedup`` (reference time / time) and
    ``exact`` (1.0 when the output hash equals the reference's; NaN where no reference row matched).

    Rows whose ``by`` column equals ``reference`` are the reference; duplicates of one key keep the first.
    """
    ref = (
        rows[rows[by] == reference]
        .drop_duplicates(list(keys))[[*keys, time_col, "output_hash"]]
        .rename(columns={time_col: f"ref_{time_col}", "output_hash": "ref_output_hash"})
    )
    out = rows.merge(ref, on=list(keys), how="left", validate="many_to_one")
    has_ref = out[f"ref_{time_col}"].notna()
    out["speedup"] = (out[f"ref_{time_col}"] / out[time_col]).where(has_ref)
    out["exact"] = (out["output_hash"] == out["ref_output_hash"]).astype(float).where(has_ref)
    return out
