"""Tagged plain-data encoding of Python values (infos, episode states, object columns) for JSON.

Why: offline files must round-trip values that JSON cannot hold (numpy arrays and
scalars, tuples, non-str dict keys, NaN, bytes) without ever using pickle. A value
becomes JSON-able plain data; anything JSON cannot say is wrapped in a one-key
dict whose key is a *tag*:

====================  =====================================================
``"ERPK1:..."``       a numpy array (``envrunners.utils.compression.pack``)
``{"__str__": s}``    a str that starts with ``"ERPK1:"`` (escaped, not an array)
``{"__float__": r}``  a non-finite float: ``"nan"``, ``"inf"`` or ``"-inf"``
``{"__tuple__": l}``  a tuple
``{"__dict__": p}``   a dict with a non-str key (or a single tag-named key): ``[[k, v], ...]``
``{"__objects__": [shape, items]}``  a numpy object array (items flattened, C order)
``{"__scalar__": a}`` a numpy scalar (``a`` a packed 0-d array; exact dtype)
``{"__bytes__": b}``  bytes (base64)
====================  =====================================================

Subclasses of bool/int/float/str/dict/list/tuple are stored as their base type.
Everything else (classes, functions, sets, ...) is not plain data: :func:`encode`
raises :class:`UnencodableValueError` naming where the value sits (e.g.
``infos[3]['obj']``), or drops it when asked (dict entries are removed, list
items become None) and records the place in ``dropped``.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from envrunners.errors import CompressionError, UnencodableValueError
from envrunners.utils.compression import MAGIC, pack, unpack

__all__ = [
    "ARRAY_PREFIX",
    "TAGS",
    "decode",
    "encode",
    "is_plain",
    "object_array",
]

ARRAY_PREFIX = MAGIC + ":"
TAG_STR, TAG_FLOAT, TAG_TUPLE, TAG_DICT = "__str__", "__float__", "__tuple__", "__dict__"
TAG_OBJECTS, TAG_SCALAR, TAG_BYTES = "__objects__", "__scalar__", "__bytes__"
TAGS = frozenset([TAG_STR, TAG_FLOAT, TAG_TUPLE, TAG_DICT, TAG_OBJECTS, TAG_SCALAR, TAG_BYTES])
_DROP = object()


def _is_tag_dict(d: dict) -> bool:
    return len(d) == 1 and next(iter(d)) in TAGS


def is_plain(x: Any) -> bool:
    """Return True if ``x`` is JSON as it stands and decodes to itself (no tag needed)."""
    t = type(x)
    if t is str:
        return not x.startswith(ARRAY_PREFIX)
    if x is None or t is bool or t is int:
        return True
    if t is float:
        return math.isfinite(x)
    if t is dict:
        if _is_tag_dict(x):
            return False
        return all(type(k) is str and is_plain(v) for k, v in x.items())
    if t is list:
        return all(is_plain(v) for v in x)
    return False


def _pack(value: Any, where: str) -> str:
    try:
        return pack(value)
    except CompressionError as e:
        raise UnencodableValueError(f"{where}: {e}") from None


def encode(value: Any, where: str, drop: bool = False, dropped: list[str] | None = None) -> Any:
    """Turn ``value`` into JSON-able plain data, tagging what JSON cannot hold.

    Args:
        value: Any nesting of None, bool, int, float, str, bytes, list, tuple,
            dict, numpy arrays and scalars, and (CPU) torch tensors.
        where: How to name ``value`` in error messages (e.g. ``"infos[3]"``).
        drop: Drop values that are not plain data instead of raising.
        dropped: If given, the places of dropped values are appended to it.

    Raises:
        UnencodableValueError: for a value that is not plain data (without ``drop``).
    """
    out = _encode(value, where, drop, dropped)
    return None if out is _DROP else out


def _encode(value: Any, where: str, drop: bool, dropped: list[str] | None) -> Any:
    t = type(value)
    if t is str:
        return {TAG_STR: value} if value.startswith(ARRAY_PREFIX) else value
    if value is None or t is bool or t is int:
        return value
    if t is float:
        return value if math.isfinite(value) else {TAG_FLOAT: repr(value)}
    if t is dict:
        if all(type(k) is str for k in value) and not _is_tag_dict(value):
            out = {}
            for k, v in value.items():
                e = _encode(v, f"{where}[{k!r}]", drop, dropped)
                if e is not _DROP:
                    out[k] = e
            return out
        pairs = []
        for k, v in value.items():
            ek = _encode(k, f"{where} key {k!r}", drop, dropped)
            ev = _encode(v, f"{where}[{k!r}]", drop, dropped)
            if ek is not _DROP and ev is not _DROP:
                pairs.append([ek, ev])
        return {TAG_DICT: pairs}
    if t is list or t is tuple:
        items = [_encode(v, f"{where}[{i}]", drop, dropped) for i, v in enumerate(value)]
        items = [None if v is _DROP else v for v in items]
        return items if t is list else {TAG_TUPLE: items}
    if isinstance(value, np.ndarray):
        if value.dtype.kind != "O":
            return _pack(value, where)
        flat = value.ravel(order="C")
        items = [_encode(v, f"{where}[{i}]", drop, dropped) for i, v in enumerate(flat)]
        return {TAG_OBJECTS: [list(value.shape), [None if v is _DROP else v for v in items]]}
    if isinstance(value, np.generic):
        return {TAG_SCALAR: _pack(np.asarray(value), where)}
    if isinstance(value, (bytes, bytearray)):
        return {TAG_BYTES: base64.b64encode(bytes(value)).decode("ascii")}
    if type(value).__module__ == "torch" and hasattr(value, "detach"):
        return _pack(value.detach().cpu().numpy(), where)
    # Subclasses (IntEnum, OrderedDict, namedtuple, ...) are stored as their base type.
    for base in (bool, int, float, str, dict, list, tuple):
        if isinstance(value, base):
            return _encode(base(value), where, drop, dropped)
    if drop:
        if dropped is not None:
            dropped.append(where)
        return _DROP
    raise UnencodableValueError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which is not plain "
        "data (offline files hold None/bool/int/float/str/bytes, lists, tuples, dicts and "
        "numpy arrays/scalars, never pickles); convert it (e.g. to a dict or str) before "
        "writing, or let the writer drop such values (drop_non_json_infos=True)."
    )


def object_array(items: list, shape: list[int] | tuple[int, ...] | None = None) -> np.ndarray:
    """Build a numpy object array holding ``items`` as they are (no nesting into dimensions)."""
    arr = np.fromiter(items, dtype=object, count=len(items))
    return arr if shape is None else arr.reshape(tuple(shape))


def decode(x: Any) -> Any:
    """Invert :func:`encode`: restore arrays, tuples, NaN, bytes, ... from plain data.

    Raises:
        ValueError: if a tag's payload is malformed (or a packed array is corrupt).
    """
    t = type(x)
    if t is str:
        return unpack(x) if x.startswith(ARRAY_PREFIX) else x
    if t is list:
        return [decode(v) for v in x]
    if t is not dict:
        return x
    if _is_tag_dict(x):
        tag, payload = next(iter(x.items()))
        return _decode_tag(tag, payload)
    return {k: decode(v) for k, v in x.items()}


def _decode_tag(tag: str, payload: Any) -> Any:
    try:
        if tag == TAG_STR:
            return str(payload)
        if tag == TAG_FLOAT:
            if payload not in ("nan", "inf", "-inf"):
                raise ValueError(f"bad float {payload!r}")
            return float(payload)
        if tag == TAG_TUPLE:
            return tuple(decode(v) for v in payload)
        if tag == TAG_DICT:
            return {decode(k): decode(v) for k, v in payload}
        if tag == TAG_OBJECTS:
            shape, items = payload
            return object_array([decode(v) for v in items], shape)
        if tag == TAG_SCALAR:
            return unpack(payload)[()]
        return base64.b64decode(payload, validate=True)  # TAG_BYTES
    except (TypeError, ValueError) as e:
        raise ValueError(f"malformed {tag!r} value: {e}") from None
