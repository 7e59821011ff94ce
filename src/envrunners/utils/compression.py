"""A plain-data codec for numpy arrays: dtype, shape and compressed raw bytes in one string.

Why: batches (``SampleBatch.compress``) and offline files need a compact, portable
array encoding that can never execute code on load, so this codec never pickles.
A packed array is one ASCII string, self-describing::

    ERPK1:<codec>:<dtype>:<shape>:<base64 payload>

- ``codec`` is ``lz4`` (LZ4 frame, when the ``lz4`` package is importable) or
  ``zlib``; the reader picks the decompressor from the header.
- ``dtype`` is numpy's ``dtype.str`` (byte order included, e.g. ``<f4``, ``|b1``,
  ``<U5``); ``shape`` is comma-separated (empty for a 0-d array).
- The payload is the C-order raw bytes of the array, compressed, then base64.

Only fixed-width numeric, bool, str/bytes and datetime arrays can be packed;
object arrays (Python objects) are refused with :class:`CompressionError`.
:func:`unpack` checks every header field and the decompressed size, so garbage
or truncated input raises :class:`CompressionError` (a ``ValueError``) instead of
returning a wrong array.
"""

from __future__ import annotations

import base64
import binascii
import math
import zlib
from typing import Any

import numpy as np

from envrunners.errors import CompressionError

try:  # lz4 is optional: faster than zlib at a similar ratio on observation data.
    import lz4.frame as _lz4_frame
except ImportError:  # pragma: no cover - depends on the environment
    _lz4_frame = None

__all__ = ["MAGIC", "CompressionError", "is_compressed", "pack", "unpack"]

MAGIC = "ERPK1"
_PREFIX = MAGIC + ":"
_PREFIX_BYTES = _PREFIX.encode("ascii")
# b: bool, i/u: ints, f: floats, c: complex, U/S: fixed-width str/bytes, m/M: time.
_PACKABLE_KINDS = frozenset("biufcUSmM")
_PREVIEW = 40


def _default_codec() -> str:
    return "lz4" if _lz4_frame is not None else "zlib"


def pack(array: Any) -> str:
    """Encode an array (or anything ``np.asarray`` accepts) as one self-describing string.

    Why: a compact, pickle-free representation for batches in memory and on disk.

    Args:
        array: A numpy array, CPU tensor, scalar or nested list of numbers/str.

    Returns:
        ``"ERPK1:<codec>:<dtype>:<shape>:<base64>"``.

    Raises:
        CompressionError: if the array's dtype is not a fixed-width numeric, bool,
            str, bytes or datetime dtype (e.g. object arrays of Python objects).
    """
    arr = np.asarray(array)
    if arr.dtype.kind not in _PACKABLE_KINDS:
        raise CompressionError(
            f"pack: cannot pack an array of dtype {arr.dtype} (kind {arr.dtype.kind!r}); only "
            "numeric, bool and fixed-width str/bytes/datetime arrays can be packed "
            "(object arrays would need pickle, which this codec never uses)."
        )
    raw = arr.tobytes(order="C")
    codec = _default_codec()
    if codec == "lz4":
        payload = _lz4_frame.compress(raw)
    else:
        payload = zlib.compress(raw, 1)
    shape = ",".join(str(d) for d in arr.shape)
    b64 = base64.b64encode(payload).decode("ascii")
    return f"{_PREFIX}{codec}:{arr.dtype.str}:{shape}:{b64}"


def is_compressed(data: Any) -> bool:
    """Return True if ``data`` is a string (or bytes) produced by :func:`pack`.

    Why: lets ``decompress_if_needed`` tell packed leaves from ordinary str data.
    Only the header is checked; :func:`unpack` validates the rest.
    """
    if isinstance(data, str):
        return data.startswith(_PREFIX)
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data[: len(_PREFIX_BYTES)]) == _PREFIX_BYTES
    return False


def _bad(data: str, why: str) -> CompressionError:
    preview = data if len(data) <= _PREVIEW else data[:_PREVIEW] + "..."
    return CompressionError(f"unpack: not a valid packed array ({why}): {preview!r}")


def _decompress(codec: str, payload: bytes, expected: int, data: str) -> bytes:
    """Decompress at most ``expected + 1`` bytes (so a bogus header cannot blow up memory)."""
    if codec == "lz4":
        if _lz4_frame is None:
            raise CompressionError(
                "unpack: the data was packed with lz4, but the 'lz4' package is not "
                "installed; install it with `pip install lz4`."
            )
        dec = _lz4_frame.LZ4FrameDecompressor()
        try:
            raw = dec.decompress(payload, max_length=expected + 1)
        except RuntimeError as e:
            raise _bad(data, f"corrupt lz4 payload: {e}") from None
        complete = dec.eof and not dec.unused_data
    elif codec == "zlib":
        dec = zlib.decompressobj()
        try:
            raw = dec.decompress(payload, expected + 1)
        except zlib.error as e:
            raise _bad(data, f"corrupt zlib payload: {e}") from None
        complete = dec.eof and not dec.unused_data
    else:
        raise _bad(data, f"unknown codec {codec!r}, expected 'lz4' or 'zlib'")
    if len(raw) != expected:
        raise _bad(data, f"payload holds {len(raw)}+ bytes, header says {expected}")
    if not complete:
        raise _bad(data, "payload is truncated or has trailing bytes")
    return raw


def unpack(data: str | bytes) -> np.ndarray:
    """Decode a string made by :func:`pack` back into a (writable) numpy array.

    Why: the inverse of :func:`pack`; strict, so corrupt offline data is reported,
    never silently turned into wrong numbers.

    Raises:
        CompressionError: if ``data`` is not a str/bytes, lacks the ``ERPK1:``
            header, names an unknown codec or invalid dtype/shape, has bad base64,
            or decompresses to a different number of bytes than dtype and shape need.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("ascii")
        except UnicodeDecodeError:
            raise CompressionError(
                "unpack: not a valid packed array (bytes are not ASCII)"
            ) from None
    if not isinstance(data, str):
        raise CompressionError(f"unpack: expected a str made by pack(), got {type(data).__name__}")
    parts = data.split(":", 4)
    if len(parts) != 5 or parts[0] != MAGIC:
        raise _bad(data, f"missing the {_PREFIX!r} header")
    _, codec, dtype_str, shape_str, b64 = parts
    try:
        dtype = np.dtype(dtype_str)
    except (TypeError, ValueError):
        raise _bad(data, f"unknown dtype {dtype_str!r}") from None
    if dtype.kind not in _PACKABLE_KINDS:
        raise _bad(data, f"dtype {dtype_str!r} is not a packable dtype")
    try:
        shape = tuple(int(d) for d in shape_str.split(",")) if shape_str else ()
    except ValueError:
        raise _bad(data, f"bad shape {shape_str!r}") from None
    if any(d < 0 for d in shape):
        raise _bad(data, f"negative dimension in shape {shape_str!r}")
    try:
        payload = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(data, "payload is not valid base64") from None
    expected = math.prod(shape) * dtype.itemsize
    raw = _decompress(codec, payload, expected, data)
    if dtype.itemsize == 0:
        return np.zeros(shape, dtype=dtype)
    return np.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)
