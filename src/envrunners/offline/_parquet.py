"""Arrow tables <-> columns of steps and episodes, in RLlib 2.60's Parquet layouts.

Why: offline data goes to and comes from Parquet: for pandas/polars/DuckDB, and for
RLlib's new-stack ``OfflineData``. One layout holds one row per timestep. In the files of
``OfflineSingleAgentEnvRunner`` (:func:`episodes_to_rows_table`) the columns are RLlib's:
multi-dimensional columns are Ray Data's tensor columns as RLlib writes them (a
``large_list`` of the flattened row with the field metadata ``ARROW:extension:name =
ray.data.arrow_tensor_v2`` and the row shape), and a ``Dict`` observation or action is a
struct column of its leaves, as RLlib's writer stores it (a ``Tuple`` one too, which RLlib
can only pickle: its fields are ``"0"``, ``"1"``, ... and its field metadata marks it). In
``offline convert --to parquet``'s files (:func:`batch_to_table`) nested columns are
flattened with dots (``obs.position``, tuple items ``obs.0``), multi-dimensional columns
are fixed-size lists of the flattened row, complex numbers ``[real, imag]`` pairs,
``infos`` and other object columns JSON strings (plain-data tagged, see
``_plain_data``), and the exact dtype and per-row shape of every column is stored in the
schema metadata under ``b"envrunners"``. The other layout holds one episode per row:
RLlib's msgpack episode state in column ``item``.

Reading validates the layout (a clear error names the file and the column), gives
nested columns back nested (structs, and dotted names), and refuses RLlib's packed
columns (cloudpickle + LZ4 + base64 strings) and Ray Data's pickled objects unless
``allow_pickle``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from envrunners.core._nested import as_arrays, flatten, map_structure
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
    "is_array_tree",
    "rows_table_from_episode_table",
]

METADATA_KEY = b"envrunners"
EPISODE_COLUMN = "item"
TENSOR_EXTENSION = b"ray.data.arrow_tensor_v2"
_EXT_NAME, _EXT_META = b"ARROW:extension:name", b"ARROW:extension:metadata"
# base64 of an LZ4 frame's magic number: how RLlib's ``pack`` output starts.
_PACKED_PREFIX = "BCJNGG"
#: Field metadata of a struct column that holds a tuple (a ``Tuple`` space's values).
_TUPLE_META = {b"envrunners:nested": b"tuple"}
#: Ray Data's extension type for values it could only store pickled (RLlib's ``Tuple`` obs).
_PICKLED_EXTENSION = b"ray.data.arrow_pickled_object"


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
    observations and actions as struct columns). Never compressed: RLlib reads
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
    joined = {"obs": _tree_concat(obs), "new_obs": _tree_concat(new_obs)}
    joined.update((name, _tree_concat(parts)) for name, parts in cols.items())
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
    for name in ("obs", "actions", "rewards", "new_obs"):
        columns[name] = _step_column(joined.pop(name))
    columns["terminateds"] = (pa.array(done[0]), None)
    columns["truncateds"] = (pa.array(done[1]), None)
    for name, value in joined.items():
        columns[name] = _step_column(value)
    return _table(columns)


def _step_column(value: Any) -> tuple[Any, Any]:
    """A step column as ``(pyarrow array, field metadata)``: arrays as :func:`tensor_column`
    makes them, a dict / tuple tree (Dict / Tuple spaces) as a struct column, as RLlib's
    writer stores a Dict observation (a tuple's fields are named ``"0"``, ``"1"``, ... and
    its field metadata marks it, so it reads back as a tuple)."""
    import pyarrow as pa

    if not isinstance(value, dict | tuple):
        return tensor_column(np.asarray(value))
    items = value.items() if isinstance(value, dict) else enumerate(value)
    children, fields = [], []
    for key, child in items:
        arr, meta = _step_column(child)
        children.append(arr)
        fields.append(pa.field(str(key), arr.type, metadata=meta))
    return pa.StructArray.from_arrays(children, fields=fields), (
        _TUPLE_META if isinstance(value, tuple) else None
    )


def _tree_slice(tree: Any, start: int, stop: int) -> Any:
    return map_structure(lambda leaf: leaf[start:stop], tree)


def _tree_concat(parts: list[Any]) -> Any:
    return map_structure(lambda *leaves: _stack(list(leaves)), *parts) if parts else _stack([])


# ------------------------------------------------------------- tables -> columns


def _is_packed(values: list[Any]) -> bool:
    return any(
        isinstance(v, str)
        and v.startswith(_PACKED_PREFIX)
        or isinstance(v, bytes)
        and v.startswith(b"\x04\x22\x4d\x18")
        for v in values[:8]
    )


def _unpickled(
    values: list[Any], path: str | None, column: str, allow_pickle: bool, holds: str, decode: Any
) -> list[Any]:
    """``decode(v)`` of every value, if ``allow_pickle``.

    Raises:
        PickleNotAllowedError: without ``allow_pickle``, naming the file, the column and
            what it ``holds``.
    """
    from envrunners.errors import PickleNotAllowedError

    if not allow_pickle:
        raise PickleNotAllowedError(
            f"column {column!r} holds {holds}; unpickling runs code from the file: pass "
            "allow_pickle=True for trusted files only",
            path=path,
        )
    return [decode(v) for v in values]


def unpack_rllib(values: list[Any], path: str | None, column: str, allow_pickle: bool) -> Any:
    """Decode RLlib's ``pack`` output (base64 of LZ4 of cloudpickle), if ``allow_pickle``.

    Raises:
        PickleNotAllowedError: without ``allow_pickle`` (names the file and column).
    """
    import base64
    import pickle

    def decode(v: Any) -> Any:
        import lz4.frame

        raw = base64.b64decode(v) if isinstance(v, str) else v
        return pickle.loads(lz4.frame.decompress(raw))  # noqa: S301 - allowed by caller

    holds = ("RLlib-packed values (cloudpickle + LZ4 + base64, config "
             "output_compress_columns; or write the data with output_compress_columns=[])")  # fmt: skip
    out = _unpickled(values, path, column, allow_pickle, holds, decode)
    return np.stack([np.asarray(o) for o in out]) if out else np.zeros(0)


def unpack_ray_pickled(values: list[Any], path: str | None, column: str, allow_pickle: bool) -> Any:
    """Decode Ray Data's pickled-object column (what RLlib writes for values Arrow cannot
    hold, e.g. ``Tuple`` observations), if ``allow_pickle``.

    Raises:
        PickleNotAllowedError: without ``allow_pickle`` (names the file and column).
    """
    import pickle

    holds = ("pickled Python objects (Ray Data's arrow_pickled_object: values Arrow "
             "could not store, such as Tuple observations)")  # fmt: skip
    out = _unpickled(values, path, column, allow_pickle, holds, pickle.loads)
    if out and all(isinstance(v, dict | tuple) for v in out):  # Tuple / Dict values
        return as_arrays(out)  # (a nested column, stacked leaf by leaf)
    return np.asarray(out, dtype=object) if out else np.zeros(0, dtype=object)


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

    Nested columns come back nested: a struct column (RLlib's ``Dict`` observations)
    as a dict of its fields' columns (a tuple where its field metadata says so), and
    columns flattened with dots (``obs.pos``, tuple items ``obs.0``) as a dict under
    their first name (a tuple when the names are ``0`` .. ``n-1``).

    Raises:
        OfflineSchemaError: for a column type that is not a step column (names it).
        PickleNotAllowedError: for an RLlib-packed or Ray-pickled column without
            ``allow_pickle``.
    """
    meta = json.loads((table.schema.metadata or {}).get(METADATA_KEY, b"{}"))
    out: dict[str, Any] = {}
    for field in table.schema:
        name = field.name
        value = _decode_column(table.column(name), field, path, name, allow_pickle)
        info = meta.get(name) or {}
        if info and isinstance(value, np.ndarray) and info.get("dtype") not in (None, "json"):
            dtype = np.dtype(info["dtype"])
            if dtype.kind == "c":
                value = value[..., 0] + 1j * value[..., 1]
            value = value.astype(dtype, copy=False).reshape((len(value), *info["shape"]))
        elif info.get("dtype") == "json":
            value = [_plain_data.decode(json.loads(v)) for v in value]
        out[name] = value
    return _nest_dotted(out)


def _decode_column(col: Any, field: Any, path: str | None, name: str, allow_pickle: bool) -> Any:
    """One column (or struct field) of a step table as numpy (nested for a struct)."""
    import pyarrow as pa

    from envrunners.errors import OfflineSchemaError

    typ = field.type
    meta = field.metadata or {}
    if isinstance(typ, pa.ExtensionType):  # Ray Data's types, when registered
        shape = getattr(typ, "shape", None)
        ext = typ.extension_name.encode()
        col = pa.chunked_array([_storage(c) for c in _chunks(col)], type=typ.storage_type)
        typ = typ.storage_type
        meta = {_EXT_NAME: ext}
        if shape is not None:
            meta[_EXT_META] = json.dumps(list(shape))
        field = pa.field(name, typ, metadata=meta)
    if meta.get(_EXT_NAME) == _PICKLED_EXTENSION:
        return unpack_ray_pickled(col.to_pylist(), path, name, allow_pickle)
    if pa.types.is_null(typ):
        return None
    if pa.types.is_struct(typ):
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        if arr.null_count:
            raise OfflineSchemaError("has null rows in a struct column", path=path, column=name)
        values = [
            _decode_column(arr.field(i), typ.field(i), path, f"{name}.{typ.field(i).name}",
                           allow_pickle)
            for i in range(typ.num_fields)
        ]  # fmt: skip
        if meta.get(b"envrunners:nested") == b"tuple":
            return tuple(values)
        return {typ.field(i).name: v for i, v in enumerate(values)}
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        if not (pa.types.is_integer(typ.value_type) or pa.types.is_floating(typ.value_type)
                or pa.types.is_boolean(typ.value_type)):  # fmt: skip
            raise OfflineSchemaError(
                f"is a list of {typ.value_type}; expected numbers", path=path, column=name
            )
        return _list_column(col, field, path, name)
    if (
        pa.types.is_string(typ)
        or pa.types.is_large_string(typ)
        or pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
    ):
        values = col.to_pylist()
        if _is_packed(values):
            return unpack_rllib(values, path, name, allow_pickle)
        return np.asarray(values, dtype=object)
    if pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ):
        return col.to_numpy()
    raise OfflineSchemaError(
        f"has Arrow type {typ}, which is not a step column (numbers, fixed-shape "
        "number lists, structs of them, strings)",
        path=path,
        column=name,
    )


def _chunks(col: Any) -> list[Any]:
    return list(col.chunks) if hasattr(col, "chunks") else [col]


def _storage(chunk: Any) -> Any:
    return chunk.storage if hasattr(chunk, "storage") else chunk


def _nest_dotted(columns: dict[str, Any]) -> dict[str, Any]:
    """``columns`` with the dotted names of flattened nested columns (``obs.pos``,
    ``obs.0``) gathered into one nested column under their first name."""
    if not any("." in name for name in columns):
        return columns
    out: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {}
    for name, value in columns.items():
        head, dot, rest = name.partition(".")
        if not dot or head in columns:  # (a plain column of that name stays as it is)
            out[name] = value
            continue
        if head not in groups:
            out[head] = groups[head] = {}
        groups[head][rest] = value
    for head, group in groups.items():
        out[head] = _as_tuple_if_indexed(_nest_dotted(group))
    return out


def _as_tuple_if_indexed(group: dict[str, Any]) -> Any:
    """A tuple for the fields ``"0"`` .. ``"n-1"`` (how tuple items are flattened)."""
    if list(group) == [str(i) for i in range(len(group))]:
        return tuple(group.values())
    return group


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


def is_array_tree(value: Any, numbers: bool = False) -> bool:
    """Whether ``value`` is a numpy array or a dict / tuple tree of them (with ``numbers``:
    of non-object dtypes only)."""
    leaves = flatten(value)
    return bool(leaves) and all(
        isinstance(leaf, np.ndarray) and not (numbers and leaf.dtype.kind == "O") for leaf in leaves
    )


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
    extras = {k: v for k, v in cols.items() if k not in skip and is_array_tree(v)}
    out = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        last = _tree_slice(new_obs if new_obs is not None else obs, b - 1, b)
        if new_obs is None:
            last = map_structure(np.zeros_like, last)
        out.append(
            SingleAgentEpisode.from_columns(
                observations=_tree_concat([_tree_slice(obs, a, b), last]),
                actions=_tree_slice(cols["actions"], a, b),
                rewards=np.asarray(rewards[a:b]),
                extra_model_outputs={k: _tree_slice(v, a, b) for k, v in extras.items()},
                terminated=bool(terms[b - 1]) if terms is not None else False,
                truncated=bool(truncs[b - 1]) if truncs is not None else False,
                id_=str(eps[a]) if eps is not None else None,
            )
        )
    return out
