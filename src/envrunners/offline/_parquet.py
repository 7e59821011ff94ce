"""Convert ``SampleBatch`` columns to Arrow tables (for ``offline convert --to parquet``).

Why: users inspect and analyse offline data with pandas, polars or DuckDB, which
read Parquet. One Parquet row is one timestep. Nested columns are flattened with
dots (``obs.position``, tuple items ``obs.0``); multi-dimensional columns become
fixed-size lists of their flattened rows; complex numbers become ``[real, imag]``
pairs; ``infos`` and other object columns become JSON strings (plain-data tagged,
see ``_plain_data``). The exact dtype and per-row shape of every column is stored in
the schema metadata under ``b"envrunners"``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from envrunners.offline import _plain_data
from envrunners.policy.sample_batch import SampleBatch

__all__ = ["METADATA_KEY", "batch_to_table"]

METADATA_KEY = b"envrunners"


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    elif isinstance(value, tuple):
        for i, v in enumerate(value):
            _flatten(f"{prefix}.{i}", v, out)
    else:
        out[prefix] = value


def _json_rows(values: Any, name: str) -> list[str]:
    return [
        json.dumps(_plain_data.encode(v, f"{name}[{i}]", drop=True), allow_nan=False)
        for i, v in enumerate(values)
    ]


def batch_to_table(batch: SampleBatch) -> tuple[Any, dict[str, Any]]:
    """Return ``(pyarrow.Table, column metadata)`` for one ``SampleBatch`` (one row per step).

    Raises:
        ImportError: if pyarrow is not installed.
    """
    import pyarrow as pa

    flat: dict[str, Any] = {}
    for key, value in dict.items(batch):
        _flatten(str(key), value, flat)
    n = batch.count
    arrays: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for name, value in flat.items():
        if name == SampleBatch.SEQ_LENS:
            continue  # one value per sequence, not per step
        if isinstance(value, list) or (isinstance(value, np.ndarray) and value.dtype.kind == "O"):
            arrays[name] = pa.array(_json_rows(list(value), name), type=pa.string())
            meta[name] = {"dtype": "json", "shape": []}
            continue
        arr = np.asarray(value)
        meta[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape[1:])}
        if arr.dtype.kind == "c":
            arr = np.stack([arr.real, arr.imag], axis=-1)
        if arr.ndim == 0 or len(arr) != n:
            raise ValueError(f"column {name!r} has {arr.shape[:1]} rows, the batch has {n}")
        if arr.ndim == 1:
            arrays[name] = pa.array(arr)
        else:
            width = math.prod(arr.shape[1:])
            flat_values = pa.array(np.ascontiguousarray(arr).reshape(-1))
            arrays[name] = pa.FixedSizeListArray.from_arrays(flat_values, width)
    return pa.table(arrays), meta
