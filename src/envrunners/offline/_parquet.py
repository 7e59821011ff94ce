"""Arrow tables <-> columns of steps and episodes, in RLlib 2.60's Parquet layouts.

Why: offline data goes to and comes from Parquet: for pandas/polars/DuckDB, and for
RLlib's new-stack ``OfflineData``. One layout holds one row per timestep: nested
columns are flattened with dots (``obs.position``, tuple items ``obs.0``);
multi-dimensional columns are fixed-size lists of the flattened row
(:func:`batch_to_table`, for ``offline convert --to parquet``) or, in the files of
``OfflineSingleAgentEnvRunner`` (:func:`episodes_to_rows_table`), Ray Data's tensor
columns as RLlib writes them (a ``large_list`` of the flattened row with the field
metadata ``ARROW:extension:name = ray.data.arrow_tensor_v2`` and the row shape); complex
numbers become ``[real, imag]`` pairs; ``infos`` and other object columns become JSON
strings (plain-data tagged, see ``_plain_data``). The exact dtype and per-row shape of
every column is stored in the schema metadata under ``b"envrunners"``. The other
layout holds one episode per row: RLlib's msgpack episode state in column ``item``.

Reading validates the layout (a clear error names the file and the column) and
refuses RLlib's packed columns (cloudpickle + LZ4 + base64 strings) unless
``allow_pickle``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from envrunners.offline import _plain_data
from envrunners.policy.sample_batch import SampleBatch

__all__ = [
    "EPISODE_COLUMN",
    "METADATA_KEY",
    "batch_to_table",
    "columns_from_table",
    "episodes_from_table",
    "episodes_to_rows_table",
    "episodes_to_table",
    "rows_table_from_episode_table",
]

METADATA_KEY = b"envrunners"
EPISODE_COLUMN = "item"
TENSOR_EXTENSION = b"ray.data.arrow_tensor_v2"
_EXT_NAME, _EXT_META = b"ARROW:extension:name", b"ARROW:extension:metadata"
# base64 of an LZ4 frame's magic number: how RLlib's ``pack`` output starts.
_PACKED_PREFIX = "BCJNGG"


def tensor_column(arr: np.ndarray) -> tuple[Any, Any]:
    """``(pyarrow array, field)``-ready pair for a batch-first array: 1-D as is, N-D as tensors.

    Returns:
        ``(array, metadata)``: ``metadata`` is None for 1-D columns, else Ray Data's
        tensor-extension field metadata holding the row shape.
    """
    import pyarrow as pa

    if arr.ndim == 1:
        return pa.array(arr), None
    flat = pa.array(np.ascontiguousarray(arr).reshape(-1))
    offsets = np.arange(len(arr) + 1, dtype=np.int64) * math.prod(arr.shape[1:])
    values = pa.LargeListArray.from_arrays(pa.array(offsets), flat)
    return values, {_EXT_NAME: TENSOR_EXTENSION, _EXT_META: json.dumps(list(arr.shape[1:]))}


def _table(columns: dict[str, tuple[Any, Any]], metadata: dict[bytes, bytes] | None = None) -> Any:
    import pyarrow as pa

    fields = [pa.field(name, arr.type, metadata=meta) for name, (arr, meta) in columns.items()]
    return pa.Table.from_arrays(
        [arr for arr, _ in columns.values()], schema=pa.schema(fields, metadata=metadata)
    )


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
    arrays: dict[str, tuple[Any, Any]] = {}
    meta: dict[str, Any] = {}
    for name, value in flat.items():
        if name == SampleBatch.SEQ_LENS:
            continue  # one value per sequence, not per step
        if isinstance(value, list) or (isinstance(value, np.ndarray) and value.dtype.kind == "O"):
            arrays[name] = (pa.array(_json_rows(list(value), name), type=pa.string()), None)
            meta[name] = {"dtype": "json", "shape": []}
            continue
        arr = np.asarray(value)
        meta[name] = {"dtype": arr.dtype.str, "shape": list(arr.shape[1:])}
        if arr.dtype.kind == "c":
            arr = np.stack([arr.real, arr.imag], axis=-1)
        if arr.ndim == 0 or len(arr) != n:
            raise ValueError(f"column {name!r} has {arr.shape[:1]} rows, the batch has {n}")
        if arr.ndim == 1:
            arrays[name] = (pa.array(arr), None)
        else:  # fixed-size lists: plain Arrow, whatever extension types are registered
            flat_values = pa.array(np.ascontiguousarray(arr).reshape(-1))
            width = math.prod(arr.shape[1:])
            arrays[name] = (pa.FixedSizeListArray.from_arrays(flat_values, width), None)
    return _table(arrays), meta


# ------------------------------------------------------------- episodes -> tables


def episodes_to_table(episodes: list[Any]) -> Any:
    """One row per episode chunk: RLlib's msgpack episode state in column ``item`` (binary).

    Raises:
        UnencodableValueError: if a chunk holds values that are not plain data.
    """
    import pyarrow as pa

    from envrunners.offline._msgpack_arrays import packb
    from envrunners.offline._rllib_episode_state import episode_to_rllib_state

    items = [packb(episode_to_rllib_state(ep)) for ep in episodes]
    return pa.table({EPISODE_COLUMN: pa.array(items, type=pa.binary())})


def _stack(parts: list[Any]) -> np.ndarray:
    return np.concatenate([np.asarray(p) for p in parts]) if parts else np.zeros(0)


def _episode_steps(ep: Any) -> tuple | None:
    """``(id, observations incl. the last, actions, rewards, extras, terminated, truncated)``."""
    n = len(ep)
    if n == 0:
        return None
    extras = {str(k): buf.get() for k, buf in ep.extra_model_outputs.items()}
    return (ep.id_, ep.observations.get(slice(0, n + 1)), ep.actions.get(), ep.rewards.get(),
            extras, bool(ep.is_terminated), bool(ep.is_truncated))  # fmt: skip


def _state_steps(state: dict[str, Any]) -> tuple | None:
    """:func:`_episode_steps` straight from an RLlib episode state (no episode object).

    Only for flat array buffers with one lookback (what both libraries' env runners
    write); returns None for anything else (nested observations, ragged buffers), which
    then goes through ``episode_from_rllib_state``.
    """
    from envrunners.offline._rllib_episode_state import _stacked

    extra_states = state.get("extra_model_outputs") or {}
    bufs = [state["observations"], state["actions"], state["rewards"], *extra_states.values()]
    lookback = state["infos"]["lookback"]
    if any(b["lookback"] != lookback for b in bufs):
        return None
    arrays = [_stacked(b["data"]) for b in bufs]
    if any(a is None for a in arrays):
        return None
    obs, actions, rewards, *extras = (a[lookback:] for a in arrays)
    n = len(actions)
    if n == 0 or len(obs) != n + 1 or len(rewards) != n or any(len(e) != n for e in extras):
        return None
    return (state["id_"], obs, actions, rewards, dict(zip(extra_states, extras, strict=True)),
            bool(state["is_terminated"]), bool(state["is_truncated"]))  # fmt: skip


def episodes_to_rows_table(episodes: list[Any]) -> Any:
    """One row per timestep in the columns of RLlib's ``OfflineSingleAgentEnvRunner``.

    Columns: ``eps_id``, ``agent_id``, ``module_id``, ``obs``, ``actions``, ``rewards``,
    ``new_obs``, ``terminateds``, ``truncateds`` and every extra model output (nested
    observations are flattened with dots). Never compressed: RLlib reads
    uncompressed columns whatever its ``input_compress_columns``.
    """
    return _steps_to_rows_table([s for s in map(_episode_steps, episodes) if s is not None])


def _steps_to_rows_table(steps: list[tuple]) -> Any:
    import pyarrow as pa

    obs, new_obs, cols = [], [], {}
    eps_ids, lengths, terms, truncs = [], [], [], []
    for id_, o, actions, rewards, extras, terminated, truncated in steps:
        n = len(rewards)  # (actions may be a dict / tuple of arrays: Dict / Tuple spaces)
        obs.append(o[:-1] if not isinstance(o, dict | tuple) else _tree_slice(o, 0, n))
        new_obs.append(o[1:] if not isinstance(o, dict | tuple) else _tree_slice(o, 1, n + 1))
        cols.setdefault("actions", []).append(actions)
        cols.setdefault("rewards", []).append(rewards)
        for key, value in extras.items():
            cols.setdefault(key, []).append(value)
        eps_ids.append(id_)
        lengths.append(n)
        terms.append(terminated)
        truncs.append(truncated)
    flat: dict[str, Any] = {}
    for name, parts in (("obs", obs), ("new_obs", new_obs)):
        _flatten(name, _tree_concat(parts), flat)
    for name, parts in cols.items():
        _flatten(name, _tree_concat(parts), flat)
    lengths_arr = np.asarray(lengths, dtype=np.int64)
    n_rows = int(lengths_arr.sum())
    last = np.cumsum(lengths_arr) - 1
    done = np.zeros((2, n_rows), dtype=bool)
    done[0, last] = terms
    done[1, last] = truncs
    ids = pa.array(eps_ids, type=pa.string())
    columns: dict[str, tuple[Any, Any]] = {
        "eps_id": (ids.take(pa.array(np.repeat(np.arange(len(steps)), lengths_arr))), None),
        "agent_id": (pa.nulls(n_rows), None),
        "module_id": (pa.nulls(n_rows), None),
    }
    order = ["obs", "actions", "rewards", "new_obs"]
    names = [k for k in flat if k.split(".")[0] in order]
    names.sort(key=lambda k: order.index(k.split(".")[0]))
    for name in names:
        columns[name] = tensor_column(np.asarray(flat[name]))
    columns["terminateds"] = (pa.array(done[0]), None)
    columns["truncateds"] = (pa.array(done[1]), None)
    for name, value in flat.items():
        if name not in columns:
            columns[name] = tensor_column(np.asarray(value))
    return _table(columns)


def _tree_slice(tree: Any, start: int, stop: int) -> Any:
    if isinstance(tree, dict):
        return {k: _tree_slice(v, start, stop) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_tree_slice(v, start, stop) for v in tree)
    return tree[start:stop]


def _tree_concat(parts: list[Any]) -> Any:
    first = parts[0] if parts else None
    if isinstance(first, dict):
        return {k: _tree_concat([p[k] for p in parts]) for k in first}
    if isinstance(first, tuple):
        return tuple(_tree_concat([p[i] for p in parts]) for i in range(len(first)))
    return _stack(parts)


# ------------------------------------------------------------- tables -> columns


def _is_packed(values: list[Any]) -> bool:
    return any(
        isinstance(v, str)
        and v.startswith(_PACKED_PREFIX)
        or isinstance(v, bytes)
        and v.startswith(b"\x04\x22\x4d\x18")
        for v in values[:8]
    )


def unpack_rllib(values: list[Any], path: str | None, column: str, allow_pickle: bool) -> Any:
    """Decode RLlib's ``pack`` output (base64 of LZ4 of cloudpickle), if ``allow_pickle``.

    Raises:
        PickleNotAllowedError: without ``allow_pickle`` (names the file and column).
    """
    import base64
    import pickle

    from envrunners.errors import PickleNotAllowedError

    if not allow_pickle:
        raise PickleNotAllowedError(
            f"column {column!r} holds RLlib-packed values (cloudpickle + LZ4 + base64, "
            "config output_compress_columns); unpickling runs code from the file: pass "
            "allow_pickle=True for trusted files only, or write the data with "
            "output_compress_columns=[]",
            path=path,
        )
    import lz4.frame

    out = []
    for v in values:
        raw = base64.b64decode(v) if isinstance(v, str) else v
        out.append(pickle.loads(lz4.frame.decompress(raw)))  # noqa: S301 - allowed by caller
    return np.stack([np.asarray(o) for o in out]) if out else np.zeros(0)


def _list_column(col: Any, field: Any, path: str | None, name: str) -> np.ndarray:
    import pyarrow as pa

    from envrunners.errors import OfflineSchemaError

    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n = len(col)
    if n and col.null_count:
        raise OfflineSchemaError("has null rows in a tensor column", path=path, column=name)
    meta = field.metadata or {}
    if pa.types.is_fixed_size_list(col.type):
        lengths = np.full(n, col.type.list_size, dtype=np.int64)
    else:
        lengths = np.diff(np.asarray(col.offsets)) if n else np.zeros(0, dtype=np.int64)
    if _EXT_META in meta:
        shape = tuple(json.loads(meta[_EXT_META]))
    elif pa.types.is_fixed_size_list(col.type):
        shape = (col.type.list_size,)
    else:
        if len(set(lengths.tolist())) > 1:
            raise OfflineSchemaError(
                f"rows have different lengths {sorted(set(lengths.tolist()))[:5]}; "
                "expected one fixed row shape",
                path=path,
                column=name,
            )
        shape = (int(lengths[0]),) if n else (0,)
    values = col.flatten().to_numpy(zero_copy_only=False)
    width = math.prod(shape)
    if len(values) != n * width or (len(lengths) and np.any(lengths != width)):
        raise OfflineSchemaError(
            f"rows do not hold {width} values each (row shape {list(shape)})",
            path=path,
            column=name,
        )
    return values.reshape((n, *shape))


def columns_from_table(
    table: Any, path: str | None = None, *, allow_pickle: bool = False
) -> dict[str, Any]:
    """Decode a one-row-per-step table into numpy columns (``None`` for all-null columns).

    Raises:
        OfflineSchemaError: for a column type that is not a step column (names it).
        PickleNotAllowedError: for an RLlib-packed column without ``allow_pickle``.
    """
    import pyarrow as pa

    from envrunners.errors import OfflineSchemaError

    meta = json.loads((table.schema.metadata or {}).get(METADATA_KEY, b"{}"))
    out: dict[str, Any] = {}
    for field in table.schema:
        name, col, typ = field.name, table.column(field.name), field.type
        info = meta.get(name) or {}
        if isinstance(typ, pa.ExtensionType):  # e.g. Ray Data's tensor type, when registered
            shape = getattr(typ, "shape", None)
            col = pa.chunked_array([c.storage for c in col.chunks], type=typ.storage_type)
            typ = typ.storage_type
            if shape is not None:
                field = pa.field(name, typ, metadata={_EXT_META: json.dumps(list(shape))})
        if pa.types.is_null(typ):
            out[name] = None
        elif (
            pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)
        ):
            if not (pa.types.is_integer(typ.value_type) or pa.types.is_floating(typ.value_type)
                    or pa.types.is_boolean(typ.value_type)):  # fmt: skip
                raise OfflineSchemaError(
                    f"is a list of {typ.value_type}; expected numbers", path=path, column=name
                )
            out[name] = _list_column(col, field, path, name)
        elif (
            pa.types.is_string(typ)
            or pa.types.is_large_string(typ)
            or pa.types.is_binary(typ)
            or pa.types.is_large_binary(typ)
        ):
            values = col.to_pylist()
            if info.get("dtype") == "json":
                out[name] = [_plain_data.decode(json.loads(v)) for v in values]
            elif _is_packed(values):
                out[name] = unpack_rllib(values, path, name, allow_pickle)
            else:
                out[name] = np.asarray(values, dtype=object)
        elif pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
            out[name] = col.to_numpy()
        else:
            raise OfflineSchemaError(
                f"has Arrow type {typ}, which is not a step column (numbers, fixed-shape "
                "number lists, strings)",
                path=path,
                column=name,
            )
        if info and isinstance(out[name], np.ndarray) and info.get("dtype") not in (None, "json"):
            dtype = np.dtype(info["dtype"])
            arr = out[name]
            if dtype.kind == "c":
                arr = arr[..., 0] + 1j * arr[..., 1]
            out[name] = arr.astype(dtype, copy=False).reshape((len(arr), *info["shape"]))
    return out


def _episode_states(table: Any, path: str | None, allow_pickle: bool) -> Iterator[tuple]:
    """``(where, state)`` for each row of an episode table (msgpack decoded, checked)."""
    from envrunners.errors import OfflineDataError, OfflineSchemaError
    from envrunners.offline._msgpack_arrays import unpackb

    check_episode_schema(table.schema, path)
    for i, raw in enumerate(table.column(EPISODE_COLUMN).to_pylist()):
        where = f"{path or 'table'} row {i}"
        if raw is None:
            raise OfflineSchemaError(f"row {i} is null", path=path, column=EPISODE_COLUMN)
        try:
            state = unpackb(raw, allow_pickle=allow_pickle, where=where)
        except OfflineDataError:
            raise
        except Exception as e:
            raise OfflineDataError(
                f"row {i} of column 'item' is not an msgpack episode state: {e}", path=path
            ) from None
        if not isinstance(state, dict):
            raise OfflineDataError(f"row {i} of column 'item' is not an episode state", path=path)
        yield where, state


def episodes_from_table(
    table: Any, path: str | None = None, *, allow_pickle: bool = False
) -> list[Any]:
    """Decode RLlib's one-episode-per-row table (column ``item``) into numpy'd episodes.

    Raises:
        OfflineSchemaError: if ``item`` is missing or not binary.
        OfflineDataError: for a row that is not an msgpack episode state (names the row).
        PickleNotAllowedError: for a pickled array inside an episode, without ``allow_pickle``.
    """
    from envrunners.offline._rllib_episode_state import episode_from_rllib_state

    return [
        episode_from_rllib_state(state, where)
        for where, state in _episode_states(table, path, allow_pickle)
    ]


def rows_table_from_episode_table(
    table: Any, path: str | None = None, *, allow_pickle: bool = False
) -> Any:
    """``episodes_to_rows_table(episodes_from_table(table))`` without building episodes.

    Flat array episodes are sliced straight out of their decoded states (one
    concatenation per column for the whole table); others are rebuilt as episodes.
    Same errors as :func:`episodes_from_table`.
    """
    from envrunners.offline._rllib_episode_state import episode_from_rllib_state

    steps = []
    for where, state in _episode_states(table, path, allow_pickle):
        try:
            step = _state_steps(state)
        except (KeyError, TypeError, ValueError, AttributeError):
            step = None
        if step is None:
            step = _episode_steps(episode_from_rllib_state(state, where))
        if step is not None:
            steps.append(step)
    return _steps_to_rows_table(steps)


def check_episode_schema(schema: Any, path: str | None) -> None:
    """Raise ``OfflineSchemaError`` unless ``schema`` is RLlib's episode layout (binary ``item``)."""
    import pyarrow as pa

    from envrunners.errors import OfflineSchemaError

    if EPISODE_COLUMN not in schema.names:
        raise OfflineSchemaError(
            f"missing; an episode file holds one msgpack episode state per row in a binary "
            f"column 'item' (it has {schema.names}); read step files with episodes=False",
            path=path,
            column=EPISODE_COLUMN,
        )
    typ = schema.field(EPISODE_COLUMN).type
    if not (pa.types.is_binary(typ) or pa.types.is_large_binary(typ)):
        raise OfflineSchemaError(f"has type {typ}, expected binary", path=path, column="item")


def check_rows_schema(schema: Any, path: str | None) -> None:
    """Raise ``OfflineSchemaError`` unless ``schema`` has the step columns RLlib needs."""
    from envrunners.errors import OfflineSchemaError

    names = {n.split(".")[0] for n in schema.names}
    for required in ("obs", "actions", "rewards"):
        if required not in names:
            hint = " (an episode file: read it with episodes=True)" if "item" in names else ""
            raise OfflineSchemaError(
                f"missing; a step file needs obs, actions and rewards (it has "
                f"{schema.names}){hint}",
                path=path,
                column=required,
            )


def episode_batch(ep: Any) -> SampleBatch:
    """``ep.get_sample_batch()`` plus ``new_obs`` (the next observations), without ``infos``."""
    batch = ep.get_sample_batch()
    n = len(ep)
    batch["new_obs"] = ep.get_observations(slice(1, n + 1))
    batch.pop("infos", None)
    return batch


def batch_from_columns(cols: dict[str, Any]) -> SampleBatch:
    """A ``SampleBatch`` of the decoded step columns (all-null columns left out)."""
    return SampleBatch({k: v for k, v in cols.items() if v is not None})


def episodes_from_columns(cols: dict[str, Any], path: str | None = None) -> list[Any]:
    """Episode chunks from decoded step columns: one per run of equal ``eps_id``.

    Observations are a run's ``obs`` plus the last ``new_obs`` (zeros without a
    ``new_obs`` column, as RLlib's ``OfflinePreLearner``); the chunk is terminated or
    truncated as its last row says; other columns become extra model outputs.
    """
    from envrunners.env.single_agent_episode import SingleAgentEpisode
    from envrunners.errors import OfflineSchemaError

    obs, rewards = cols.get("obs"), cols.get("rewards")
    if obs is None or rewards is None or cols.get("actions") is None:
        raise OfflineSchemaError("missing", path=path, column="obs/actions/rewards")
    n = len(rewards)
    eps = cols.get("eps_id")
    if eps is None:
        starts = np.array([0]) if n else np.zeros(0, dtype=np.int64)
    else:
        eps = np.asarray(eps)
        starts = np.flatnonzero(np.r_[True, eps[1:] != eps[:-1]]) if n else np.zeros(0, int)
    bounds = np.r_[starts, n].astype(np.int64)
    new_obs = cols.get("new_obs")
    terms, truncs = cols.get("terminateds"), cols.get("truncateds")
    skip = {"obs", "new_obs", "actions", "rewards", "terminateds", "truncateds", "eps_id",
            "agent_id", "module_id", "infos", "t", "unroll_id"}  # fmt: skip
    extras = {k: v for k, v in cols.items() if k not in skip and isinstance(v, np.ndarray)}
    out = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        last = new_obs[b - 1 : b] if new_obs is not None else np.zeros_like(obs[b - 1 : b])
        out.append(
            SingleAgentEpisode.from_columns(
                observations=np.concatenate([obs[a:b], last]),
                actions=cols["actions"][a:b],
                rewards=np.asarray(rewards[a:b]),
                extra_model_outputs={k: v[a:b] for k, v in extras.items()},
                terminated=bool(terms[b - 1]) if terms is not None else False,
                truncated=bool(truncs[b - 1]) if truncs is not None else False,
                id_=str(eps[a]) if eps is not None else None,
            )
        )
    return out
