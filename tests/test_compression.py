"""The plain-data array codec: exact round trips, a self-describing header, strict decoding."""

from __future__ import annotations

import base64
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from envrunners.errors import EnvRunnersError
from envrunners.utils import compression
from envrunners.utils.compression import CompressionError, is_compressed, pack, unpack


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(5, dtype=np.int64),
        np.array([True, False, True]),
        np.array(["ab", "c", ""]),
        np.array([b"xy", b"z"]),
        np.arange(6, dtype=">i4").reshape(2, 3),  # big-endian survives
        np.array(3.5),  # 0-d
        np.zeros((0, 3), dtype=np.uint8),  # empty
        np.array([1 + 2j, 3 - 1j]),
        np.array(["2024-01-01", "2024-01-02"], dtype="datetime64[D]"),
        np.arange(24, dtype=np.int16).reshape(2, 3, 4)[:, ::2, 1:],  # non-contiguous view
    ],
    ids=lambda a: f"{a.dtype.str}{a.shape}",
)
def test_round_trip_is_exact(array):
    packed = pack(array)
    assert isinstance(packed, str)
    out = unpack(packed)
    assert out.dtype == array.dtype
    assert out.shape == array.shape
    np.testing.assert_array_equal(out, array)
    out[...] = out  # the result is writable
    assert out.flags.writeable


def test_header_names_codec_dtype_and_shape():
    packed = pack(np.zeros((2, 3), dtype=np.float32))
    magic, codec, dtype, shape, _ = packed.split(":", 4)
    assert (magic, dtype, shape) == ("ERPK1", "<f4", "2,3")
    assert codec in ("lz4", "zlib")
    assert pack(np.float64(1.0)).split(":")[3] == ""  # 0-d: empty shape


def test_pack_accepts_lists_scalars_and_cpu_tensors():
    torch = pytest.importorskip("torch")
    np.testing.assert_array_equal(unpack(pack([[1, 2], [3, 4]])), [[1, 2], [3, 4]])
    assert unpack(pack(7)) == 7
    np.testing.assert_array_equal(unpack(pack(torch.arange(3))), [0, 1, 2])


def test_zlib_fallback_round_trips(monkeypatch):
    monkeypatch.setattr(compression, "_lz4_frame", None)
    packed = pack(np.arange(10))
    assert packed.startswith("ERPK1:zlib:")
    np.testing.assert_array_equal(unpack(packed), np.arange(10))


def test_lz4_data_without_lz4_installed_names_the_fix(monkeypatch):
    pytest.importorskip("lz4.frame")
    packed = pack(np.arange(3))
    monkeypatch.setattr(compression, "_lz4_frame", None)
    with pytest.raises(CompressionError, match=r"pip install lz4"):
        unpack(packed)


def test_unpack_accepts_bytes():
    packed = pack(np.arange(4))
    np.testing.assert_array_equal(unpack(packed.encode("ascii")), np.arange(4))


def test_object_arrays_are_refused():
    with pytest.raises(CompressionError, match=r"only numeric, bool and fixed-width"):
        pack(np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(ValueError, match=r"never uses"):
        pack([{"a": 1}])


def test_errors_are_envrunners_value_errors():
    assert issubclass(CompressionError, EnvRunnersError)
    assert issubclass(CompressionError, ValueError)


def _with_payload(packed: str, payload: bytes) -> str:
    head = packed.rsplit(":", 1)[0]
    return head + ":" + base64.b64encode(payload).decode("ascii")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ("hello", r"missing the 'ERPK1:' header"),
        ("", r"missing the 'ERPK1:' header"),
        ("ERPK1:lz4:<f4:3", r"missing the 'ERPK1:' header"),
        ("ERPK1:gzip:<f4:3:AAAA", r"unknown codec 'gzip'"),
        ("ERPK1:zlib:<q9:3:AAAA", r"unknown dtype '<q9'"),
        ("ERPK1:zlib:|O:3:AAAA", r"dtype '\|O' is not a packable dtype"),
        ("ERPK1:zlib:<f4:a,b:AAAA", r"bad shape 'a,b'"),
        ("ERPK1:zlib:<f4:-1:AAAA", r"negative dimension"),
        ("ERPK1:zlib:<f4:3:not base64!", r"not valid base64"),
        ("ERPK1:zlib:<f4:3:AAAA", r"corrupt zlib payload"),
    ],
)
def test_garbage_raises_clear_value_error(data, match):
    with pytest.raises(CompressionError, match=match):
        unpack(data)


def test_wrong_size_and_truncation_are_detected(monkeypatch):
    monkeypatch.setattr(compression, "_lz4_frame", None)  # zlib: payload easy to forge
    packed = pack(np.arange(4, dtype=np.int32))
    with pytest.raises(CompressionError, match=r"header says 16"):
        unpack(_with_payload(packed, zlib.compress(b"\0" * 12)))
    with pytest.raises(CompressionError, match=r"header says 16"):
        unpack(_with_payload(packed, zlib.compress(b"\0" * 40)))
    with pytest.raises(CompressionError, match=r"truncated or has trailing bytes"):
        unpack(_with_payload(packed, zlib.compress(b"\0" * 16)[:-3]))
    with pytest.raises(CompressionError, match=r"truncated or has trailing bytes"):
        unpack(_with_payload(packed, zlib.compress(b"\0" * 16) + b"junk"))


def test_corrupt_lz4_payload_is_detected():
    pytest.importorskip("lz4.frame")
    packed = pack(np.arange(100))
    assert packed.startswith("ERPK1:lz4:")
    with pytest.raises(CompressionError, match=r"not a valid packed array"):
        unpack(_with_payload(packed, b"\x04\x22\x4d\x18garbage-garbage"))


def test_non_string_input_is_refused():
    with pytest.raises(CompressionError, match=r"expected a str made by pack\(\), got int"):
        unpack(5)
    with pytest.raises(CompressionError, match=r"bytes are not ASCII"):
        unpack(b"\xff\xfe")


def test_is_compressed():
    packed = pack(np.arange(3))
    assert is_compressed(packed)
    assert is_compressed(packed.encode())
    assert is_compressed(np.array([packed])[0])  # np.str_
    assert not is_compressed("plain text")
    assert not is_compressed(np.arange(3))
    assert not is_compressed(None)


@settings(max_examples=60, deadline=None)
@given(
    hnp.arrays(
        dtype=st.one_of(
            hnp.integer_dtypes(),
            hnp.unsigned_integer_dtypes(),
            hnp.floating_dtypes(),
            hnp.boolean_dtypes(),
            hnp.unicode_string_dtypes(max_len=4),
        ),
        shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
    )
)
def test_property_round_trip(array):
    out = unpack(pack(array))
    assert out.dtype == array.dtype and out.shape == array.shape
    np.testing.assert_array_equal(out, array)
