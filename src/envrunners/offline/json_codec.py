"""The offline line format: one batch (or episode chunk) per JSON line, never pickle.

Why: ``JsonWriter``, ``JsonReader``, the episode writer and the CLI share one
definition of a line. The layout is RLlib's (so RLlib-written files read too)::

    {"type": "SampleBatch", "<column>": <value>, ...}
    {"type": "MultiAgentBatch", "count": <env steps>,
     "policy_batches": {"<policy id>": {"<column>": <value>, ...}, ...}}

plus two envrunners record types for new-stack recordings:
``{"type": "SingleAgentEpisode" | "MultiAgentEpisode", "state": <episode.get_state()>}``.

Column values written by envrunners:

- every numpy array (and torch tensor) is **one** codec string
  ``"ERPK1:<lz4|zlib>:<dtype>:<shape>:<base64>"`` (``envrunners.utils.compression``):
  exact dtype (float16/32/64, (u)ints, bool, complex, fixed-width str/bytes,
  datetime) and shape, encoded and decoded whole (no per-row Python);
- nested (dict) columns are JSON objects of such values, tuples ``{"__tuple__": [...]}``;
- ``infos`` is a JSON list of info dicts when they are plain JSON, else
  ``{"__objects__": [shape, items]}`` with tagged values (see ``_plain_data``); it reads
  back as a 1-d numpy object array (as RLlib's reader gives);
- other object columns use ``{"__objects__": ...}`` as well.

``compress_columns`` therefore changes nothing in our files: all arrays are packed.
As in RLlib, batch settings (``time_major``, ``zero_padded``, ``is_training``) are
not stored; ``max_seq_len`` is recomputed from ``seq_lens``.
Values read from RLlib files: lists become ``np.asarray(list)`` (dtype inferred by
numpy, as in RLlib); a ``"dones"`` column is renamed ``"terminateds"``; RLlib's
compressed columns (base64 of lz4 of a cloudpickle) are refused unless the caller
passes ``allow_pickle=True``, because unpickling runs code from the file.
"""

from __future__ import annotations

import base64
import json
import pickle
from typing import Any

import numpy as np

from envrunners.errors import (
    CompressionError,
    OfflineDataError,
    PickleNotAllowedError,
    UnencodableValueError,
)
from envrunners.offline import _plain_data
from envrunners.offline._plain_data import ARRAY_PREFIX, TAG_DICT, TAG_TUPLE
from envrunners.policy._batch_ops import is_packed_rows, is_torch_tensor
from envrunners.policy.sample_batch import MultiAgentBatch, SampleBatch
from envrunners.utils.compression import is_compressed, unpack

try:  # orjson is optional and faster; the stdlib json is the fallback.
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = [
    "EPISODE_TYPES",
    "RECORD_TYPES",
    "PickleNotAllowedError",
    "UnencodableValueError",
    "batch_to_record",
    "dumps",
    "episode_to_record",
    "loads",
    "record_to_object",
]

BATCH_TYPES = ("SampleBatch", "MultiAgentBatch")
EPISODE_TYPES = ("SingleAgentEpisode", "MultiAgentEpisode")
RECORD_TYPES = BATCH_TYPES + EPISODE_TYPES
INFOS = SampleBatch.INFOS
_RLLIB_LZ4_B64 = "BCJNG"  # base64 of the LZ4 frame magic 04 22 4D 18: RLlib's pack()


# --------------------------------------------------------------------------- JSON


def dumps(record: dict[str, Any]) -> bytes:
    """Serialise one record as compact, strict JSON (ASCII bytes, no trailing newline)."""
    if _orjson is not None:
        try:
            return _orjson.dumps(record)
        except TypeError:  # e.g. an int beyond 64 bits: the stdlib handles it
            pass
    return json.dumps(record, separators=(",", ":"), allow_nan=False).encode("ascii")


def loads(line: bytes | str) -> Any:
    """Parse one line (RLlib files may hold NaN tokens, which only the stdlib reads)."""
    if _orjson is not None:
        try:
            return _orjson.loads(line)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(line)


# ------------------------------------------------------------------------ writing


def batch_to_record(
    batch: SampleBatch | MultiAgentBatch,
    *,
    drop_non_json_infos: bool = False,
    dropped: list[str] | None = None,
) -> dict[str, Any]:
    """Turn a ``SampleBatch``/``MultiAgentBatch`` into the JSON-able record of one line.

    Args:
        batch: The batch (compressed columns are written decompressed).
        drop_non_json_infos: Drop info values that are not plain data instead of raising.
        dropped: If given, the places of dropped info values are appended to it.

    Raises:
        UnencodableValueError: if a column or info value is not plain data; the
            message names the column (and row/key).
        TypeError: if ``batch`` is neither a SampleBatch nor a MultiAgentBatch.
    """
    if isinstance(batch, MultiAgentBatch):
        policies = {pid: _columns(b, drop_non_json_infos, dropped, f"policy {pid!r}: ")
                    for pid, b in batch.policy_batches.items()}  # fmt: skip
        if not all(type(pid) is str for pid in policies):
            policies = {
                TAG_DICT: [[_plain_data.encode(p, "policy id"), c] for p, c in policies.items()]
            }
        return {"type": "MultiAgentBatch", "count": int(batch.count), "policy_batches": policies}
    if isinstance(batch, SampleBatch):
        return {"type": "SampleBatch", **_columns(batch, drop_non_json_infos, dropped, "")}
    raise TypeError(
        f"can only write a SampleBatch or MultiAgentBatch, not a {type(batch).__name__} "
        "(episodes: use envrunners.offline.episode_writer.EpisodeWriter)"
    )


def _columns(batch: SampleBatch, drop: bool, dropped: list | None, ctx: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dict.items(batch):  # around the interceptor and key tracking
        if type(key) is not str:
            raise UnencodableValueError(f"{ctx}column name {key!r} is not a str")
        if key == INFOS:
            out[key] = _encode_infos(value, f"{ctx}infos", drop, dropped)
        else:
            out[key] = _encode_column(value, f"{ctx}column {key!r}")
    return out


def _encode_column(value: Any, where: str) -> Any:
    if isinstance(value, np.ndarray):
        if is_packed_rows(value):  # SampleBatch.compress() packed each row
            value = np.stack([unpack(row) for row in value])
        return _plain_data.encode(value, where)
    if isinstance(value, str) and is_compressed(value):  # already one packed array
        return value
    if type(value) is dict:
        if all(type(k) is str for k in value) and not (
            len(value) == 1 and next(iter(value)) in _plain_data.TAGS
        ):
            return {k: _encode_column(v, f"{where}[{k!r}]") for k, v in value.items()}
        return _plain_data.encode(value, where)
    if type(value) is tuple:
        return {TAG_TUPLE: [_encode_column(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if is_torch_tensor(value):
        return _plain_data.encode(value.detach().cpu().numpy(), where)
    return _plain_data.encode(value, where)


def _encode_infos(value: Any, where: str, drop: bool, dropped: list | None) -> Any:
    if isinstance(value, np.ndarray) and value.dtype.kind != "O":
        return _plain_data.encode(value, where)
    rows = value.tolist() if isinstance(value, np.ndarray) and value.ndim == 1 else value
    if isinstance(rows, list):
        if all(type(r) is dict and not r for r in rows) or all(map(_plain_data.is_plain, rows)):
            return rows
    return _plain_data.encode(_plain_data.object_array(list(rows)), where, drop, dropped)


def episode_to_record(
    episode: Any, *, drop_non_json_values: bool = False, dropped: list[str] | None = None
) -> dict[str, Any]:
    """Turn a ``SingleAgentEpisode``/``MultiAgentEpisode`` chunk into a record (its state).

    Args:
        episode: The episode chunk.
        drop_non_json_values: Drop values that are not plain data (e.g. objects in
            infos or custom data) instead of raising.
        dropped: If given, the places of dropped values are appended to it.

    Raises:
        UnencodableValueError: if the episode holds a value that is not plain data.
        TypeError: for any other object.
    """
    kind = type(episode).__name__
    if kind not in EPISODE_TYPES or not hasattr(episode, "get_state"):
        raise TypeError(f"expected a SingleAgentEpisode or MultiAgentEpisode, got {kind}")
    state = _plain_data.encode(episode.get_state(), f"{kind} state", drop_non_json_values, dropped)
    return {"type": kind, "state": state}


# ------------------------------------------------------------------------ reading


def record_to_object(record: Any, *, allow_pickle: bool = False, episodes: bool = False) -> Any:
    """Turn one parsed line back into a batch (or, with ``episodes=True``, an episode).

    Episode records become ``episode.get_sample_batch()`` unless ``episodes`` is set.

    Raises:
        PickleNotAllowedError: for RLlib cloudpickle data without ``allow_pickle``.
        ValueError: for a record that is not a dict, has no or an unknown ``"type"``,
            or holds a malformed value (callers add the file and line).
    """
    if not isinstance(record, dict):
        raise ValueError(f"a record must be a JSON object, got {type(record).__name__}")
    kind = record.get("type")
    if kind is None:
        raise ValueError("JSON record missing 'type' field")
    if kind == "SampleBatch":
        return _sample_batch(record, allow_pickle, skip_type=True)
    if kind == "MultiAgentBatch":
        policies = record.get("policy_batches")
        if isinstance(policies, dict) and len(policies) == 1 and TAG_DICT in policies:
            pairs = [(_plain_data.decode(p), b) for p, b in policies[TAG_DICT]]
        elif isinstance(policies, dict):
            pairs = list(policies.items())
        else:
            raise ValueError("MultiAgentBatch record without a 'policy_batches' object")
        batches = {pid: _sample_batch(b, allow_pickle, ctx=f"policy {pid!r}: ") for pid, b in pairs}
        return MultiAgentBatch(batches, int(record.get("count", 0)))
    if kind in EPISODE_TYPES:
        from envrunners.env.multi_agent_episode import MultiAgentEpisode
        from envrunners.env.single_agent_episode import SingleAgentEpisode

        cls = SingleAgentEpisode if kind == "SingleAgentEpisode" else MultiAgentEpisode
        episode = cls.from_state(_plain_data.decode(record["state"]))
        return episode if episodes else episode.get_sample_batch()
    raise ValueError(f"unknown record type {kind!r}; expected one of {list(RECORD_TYPES)}")


def _sample_batch(
    cols: Any, allow_pickle: bool, skip_type: bool = False, ctx: str = ""
) -> SampleBatch:
    if not isinstance(cols, dict):
        raise ValueError(f"{ctx}a batch must be a JSON object, got {type(cols).__name__}")
    data: dict[str, Any] = {}
    for key, value in cols.items():
        if skip_type and key == "type":
            continue
        try:
            column = _decode_column(key, value, allow_pickle)
        except (CompressionError, ValueError) as e:
            if isinstance(e, OfflineDataError):
                raise
            raise ValueError(f"{ctx}column {key!r}: {e}") from None
        data["terminateds" if key == "dones" else key] = column
    if "dones" in cols and "terminateds" in cols:  # both given: keep the real one
        data["terminateds"] = _decode_column("terminateds", cols["terminateds"], allow_pickle)
    return SampleBatch(data)


def _decode_column(key: str, value: Any, allow_pickle: bool) -> Any:
    t = type(value)
    if t is str:
        if value.startswith(ARRAY_PREFIX):
            return unpack(value)
        return _rllib_packed(key, value, allow_pickle)
    if t is list:  # RLlib's uncompressed layout
        if key == INFOS:
            return _plain_data.object_array(value)
        return np.asarray(value)
    if t is dict:
        if len(value) == 1 and next(iter(value)) in _plain_data.TAGS:
            return _plain_data.decode(value)
        return {k: _decode_column(k, v, allow_pickle) for k, v in value.items()}
    return value


def _rllib_packed(key: str, value: str, allow_pickle: bool) -> Any:
    """Decode RLlib's ``pack()`` output (base64 of lz4 of a cloudpickle) if allowed."""
    if not value.startswith(_RLLIB_LZ4_B64):
        raise ValueError(
            "a str that is neither an envrunners packed array ('ERPK1:...') nor RLlib's "
            "base64-packed column"
        )
    if not allow_pickle:
        raise PickleNotAllowedError(
            f"column {key!r} was compressed by RLlib with cloudpickle (base64 of lz4 of a "
            "pickle). Reading it means unpickling, which can run any code stored in the "
            "file, so it is refused. If you trust this file, pass allow_pickle=True "
            "(JsonReader(..., allow_pickle=True), or config.offline_data(input_config="
            "{'allow_pickle': True})); better, convert it once into the pickle-free format "
            "with `python -m envrunners.offline.cli_commands convert --to json ...`."
        )
    import lz4.frame

    raw = lz4.frame.decompress(base64.b64decode(value))
    return pickle.loads(raw)  # noqa: S301 - explicitly allowed by the caller
