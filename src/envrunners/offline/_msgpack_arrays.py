"""msgpack with numpy arrays in ``msgpack_numpy``'s layout, without pickle either way.

Why: RLlib 2.60's ``OfflineSingleAgentEnvRunner`` stores each episode as
``msgpack.packb(episode.get_state(), default=msgpack_numpy.encode)`` in the Parquet
column ``item``, and reads it back with ``object_hook=msgpack_numpy.decode``. That
layout is plain data (dtype string, shape, raw bytes) except for object-dtype
arrays, whose bytes are a pickle: decoding one runs code from the file. We write the
same layout (so RLlib reads our files) and read it (so we read RLlib's), refusing
object arrays unless ``allow_pickle``.

Layout of one array: ``{b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [4],
b"data": <bytes>}``; a numpy scalar: ``{b"nd": False, b"type": "<i8", b"data": <bytes>}``.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from envrunners.errors import PickleNotAllowedError, UnencodableValueError

__all__ = ["packb", "unpackb"]

_ND, _TYPE, _KIND, _SHAPE, _DATA = b"nd", b"type", b"kind", b"shape", b"data"


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind == "O":
            raise UnencodableValueError(
                f"an object-dtype array (shape {obj.shape}) can only be stored as a pickle; "
                "convert it to a numeric array or a list of plain values"
            )
        if obj.dtype.kind == "V":
            kind, descr = b"V", obj.dtype.descr
        else:
            kind, descr = b"", obj.dtype.str
        return {
            _ND: True,
            _TYPE: descr,
            _KIND: kind,
            _SHAPE: list(obj.shape),
            _DATA: np.ascontiguousarray(obj).tobytes(),
        }
    if isinstance(obj, np.generic):
        if obj.dtype.kind == "O":
            raise UnencodableValueError("an object-dtype numpy scalar can only be pickled")
        return {_ND: False, _TYPE: obj.dtype.str, _DATA: obj.tobytes()}
    if isinstance(obj, tuple):
        return list(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    raise UnencodableValueError(
        f"a {type(obj).__name__} is not plain data (msgpack needs dicts, lists, numbers, "
        "strings, bytes or numeric numpy arrays)"
    )


def packb(obj: Any) -> bytes:
    """Serialize ``obj`` (plain data and numeric numpy arrays) as ``msgpack_numpy`` does.

    Raises:
        UnencodableValueError: for object-dtype arrays or other non-plain values.
    """
    return msgpack.packb(obj, default=_encode, use_bin_type=True)


def _decoder(allow_pickle: bool, where: str) -> Any:
    def decode(obj: dict) -> Any:
        if _ND not in obj:
            return obj
        descr = obj[_TYPE]
        if obj.get(_KIND) == b"V":
            dtype = np.dtype([tuple(d) for d in descr])
        else:
            dtype = np.dtype(descr.decode() if isinstance(descr, bytes) else descr)
        if dtype.kind == "O" or dtype.hasobject:
            if not allow_pickle:
                raise PickleNotAllowedError(
                    f"an object-dtype array stored as a pickle (msgpack_numpy) in {where}; "
                    "reading it runs code from the file: pass allow_pickle=True for "
                    "trusted files only",
                )
            import pickle

            return pickle.loads(obj[_DATA])  # noqa: S301 - explicitly allowed by the caller
        if obj[_ND]:
            return np.frombuffer(obj[_DATA], dtype=dtype).reshape(obj[_SHAPE])
        return np.frombuffer(obj[_DATA], dtype=dtype)[0]

    return decode


def unpackb(data: bytes, *, allow_pickle: bool = False, where: str = "a msgpack record") -> Any:
    """Decode ``msgpack_numpy`` bytes; arrays come back read-only views of ``data``.

    Raises:
        PickleNotAllowedError: for a pickled (object-dtype) array without ``allow_pickle``.
        ValueError: for bytes that are not msgpack.
    """
    return msgpack.unpackb(data, object_hook=_decoder(allow_pickle, where))
