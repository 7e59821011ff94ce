"""JsonWriter/JsonReader: exact round trips, file naming and rolling, input resolution,
batch sizes, corrupt and truncated lines (spec §12.3, §12.4, §18.11)."""

from __future__ import annotations

import glob
import os
import re
import zipfile

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.errors import OfflineDataError, UnencodableValueError
from envrunners.offline import IOContext, JsonReader, JsonWriter
from envrunners.policy.sample_batch import MultiAgentBatch, SampleBatch

NAME = re.compile(r"^output-\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_worker-(\d+)_(\d+)(\.\d+)?\.json$")


def assert_same(a, b):
    """Exact equality of two columns: dtype, shape and values (NaN == NaN), recursively."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, np.ndarray) and a.dtype.kind != "O":
        assert isinstance(b, np.ndarray)
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    else:
        assert type(a) is type(b) or isinstance(b, np.ndarray)
        assert len(a) == len(b)
        for x, y in zip(a, b):
            if isinstance(x, dict):
                assert list(x) == list(y)
                for k in x:
                    assert_same_leaf(x[k], y[k])
            else:
                assert_same_leaf(x, y)


def assert_same_leaf(x, y):
    if isinstance(x, np.ndarray):
        assert_same(x, y)
    elif isinstance(x, float) and np.isnan(x):
        assert isinstance(y, float) and np.isnan(y)
    else:
        assert type(x) is type(y) and x == y


def write_read(tmp_path, *batches, **writer_kwargs):
    with JsonWriter(str(tmp_path / "out"), **writer_kwargs) as writer:
        for b in batches:
            writer.write(b)
    return list(JsonReader(str(tmp_path / "out")).read_all_files())


def every_dtype_batch(n=4):
    rng = np.random.default_rng(0)
    return SampleBatch(
        {
            "obs": rng.standard_normal((n, 2, 3)).astype(np.float32),
            "f16": rng.standard_normal(n).astype(np.float16),
            "f64": np.array([np.nan, np.inf, -0.0, 1e300][:n]),
            "i8": np.arange(n, dtype=np.int8) - 3,
            "u64": np.full(n, 2**64 - 1, dtype=np.uint64),
            "b": np.arange(n) % 2 == 0,
            "c128": np.arange(n) * (1 + 2j),
            "s": np.array(["a", "bb", "ccc", "dddd"][:n]),
            "by": np.array([b"x", b"yy", b"", b"z"][:n]),
            "be": np.arange(n, dtype=">i4"),
            "dt": np.arange(n).astype("datetime64[s]"),
            "empty_tail": np.zeros((n, 0), np.float32),
            "nested": {"a": np.ones((n, 2), np.int16), "b": (np.zeros(n), {"c": np.ones(n, bool)})},
            "infos": np.array([{"x": 1}, {}, {"y": "z"}, {"n": None}][:n], dtype=object),
        }
    )


def test_round_trip_is_exact_for_every_dtype_shape_and_nesting(tmp_path):
    batch = every_dtype_batch()
    (back,) = write_read(tmp_path, batch)
    assert isinstance(back, SampleBatch) and back.count == 4
    assert list(back.keys()) == list(batch.keys())
    for key in batch:
        assert_same(batch[key], back[key])


def test_infos_with_non_json_values_round_trip(tmp_path):
    infos = [
        {"arr": np.arange(3, dtype=np.uint8), "f32": np.float32(1.5), "nan": float("nan")},
        {3: "int key", (1, 2): "tuple key", "t": (1, [2, 3])},
        {"bytes": b"\x00\xff", "esc": "ERPK1:not an array", "__tuple__": "a tag name"},
        {"big": 2**70, "nested": {"deep": [np.int64(7), {"x": np.bool_(True)}]}},
    ]
    batch = SampleBatch({"obs": np.zeros((4, 1)), "infos": infos})
    (back,) = write_read(tmp_path, batch)
    got = back["infos"]
    assert isinstance(got, np.ndarray) and got.dtype == object and len(got) == 4
    assert_same_leaf(got[0]["arr"], infos[0]["arr"])
    assert type(got[0]["f32"]) is np.float32 and got[0]["f32"] == 1.5
    assert np.isnan(got[0]["nan"])
    assert got[1] == infos[1]
    assert got[2] == infos[2]
    assert got[3]["big"] == 2**70 and type(got[3]["nested"]["deep"][0]) is np.int64
    assert got[3]["nested"]["deep"][1]["x"] is np.bool_(True)


def test_plain_infos_are_written_as_a_json_list(tmp_path):
    batch = SampleBatch({"obs": np.zeros((2, 1)), "infos": [{"a": 1}, {}]})
    write_read(tmp_path, batch)
    (path,) = glob.glob(str(tmp_path / "out" / "*.json"))
    assert '"infos":[{"a":1},{}]' in open(path).read().replace(" ", "")


def test_non_json_info_is_an_error_naming_the_key_unless_dropped(tmp_path):
    batch = SampleBatch({"obs": np.zeros((2, 1)), "infos": [{}, {"bad": object(), "ok": 1}]})
    writer = JsonWriter(str(tmp_path / "a"))
    with pytest.raises(UnencodableValueError, match=r"infos\[1\]\['bad'\] is a builtins.object"):
        writer.write(batch)
    assert isinstance(UnencodableValueError("x"), TypeError)
    writer.close()
    assert glob.glob(str(tmp_path / "a" / "*.json")) == [] or all(
        os.path.getsize(p) == 0 for p in glob.glob(str(tmp_path / "a" / "*.json"))
    )
    (back,) = write_read(tmp_path, batch, drop_non_json_infos=True)
    assert back["infos"][1] == {"ok": 1}


def test_object_and_tensor_columns(tmp_path):
    batch = SampleBatch(
        {
            "obs": torch.arange(6, dtype=torch.float32).reshape(3, 2),
            "tags": np.array([{"k": 1}, "s", None], dtype=object),
        }
    )
    (back,) = write_read(tmp_path, batch)
    assert back["obs"].dtype == np.float32 and back["obs"].shape == (3, 2)
    assert list(back["tags"]) == [{"k": 1}, "s", None]


def test_compressed_batches_are_written_decompressed(tmp_path):
    batch = SampleBatch({"obs": np.arange(12.0).reshape(6, 2), "t": np.arange(6)})
    batch.compress(columns=["obs"])  # row-wise packed
    other = SampleBatch({"obs": np.arange(12.0).reshape(6, 2), "t": np.arange(6)})
    other.compress(bulk=True, columns=["obs"])
    for back in write_read(tmp_path, batch, other):
        np.testing.assert_array_equal(back["obs"], np.arange(12.0).reshape(6, 2))


def test_multi_agent_batch_round_trip_including_non_str_policy_ids(tmp_path):
    a = SampleBatch({"obs": np.ones((2, 3), np.float32), "actions": np.array([1, 2])})
    b = SampleBatch({"obs": np.zeros((1, 3), np.float32), "actions": np.array([0])})
    backs = write_read(tmp_path, MultiAgentBatch({"p0": a, "p1": b}, 2), MultiAgentBatch({7: a}, 2))
    assert isinstance(backs[0], MultiAgentBatch) and backs[0].count == 2
    assert set(backs[0].policy_batches) == {"p0", "p1"}
    assert_same(backs[0]["p1"]["obs"], b["obs"])
    assert list(backs[1].policy_batches) == [7]


def test_empty_batch_round_trips(tmp_path):
    (back,) = write_read(tmp_path, SampleBatch({"obs": np.zeros((0, 4), np.float32)}))
    assert back.count == 0 and back["obs"].shape == (0, 4)


@settings(max_examples=40, deadline=None)
@given(
    arr=hnp.arrays(
        dtype=st.one_of(
            hnp.floating_dtypes(),
            hnp.integer_dtypes(),
            hnp.unsigned_integer_dtypes(),
            hnp.complex_number_dtypes(),
            hnp.boolean_dtypes(),
            hnp.unicode_string_dtypes(max_len=4),
        ),
        shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
    )
)
def test_property_any_array_round_trips_exactly(arr):
    from envrunners.offline.json_codec import batch_to_record, dumps, loads, record_to_object

    record = loads(dumps(batch_to_record(SampleBatch({"x": arr}))))
    back = record_to_object(record)["x"]
    assert back.dtype == arr.dtype and back.shape == arr.shape
    assert back.tobytes() == arr.tobytes()


# ------------------------------------------------------------------ files, rolling


def test_file_naming_and_temp_file_until_close(tmp_path):
    out = tmp_path / "out"
    writer = JsonWriter(str(out), IOContext(worker_index=3))
    writer.write(SampleBatch({"obs": np.zeros((2, 1))}))
    assert glob.glob(str(out / "*.json")) == []  # only the hidden temporary file so far
    (tmp,) = os.listdir(out)
    assert tmp.startswith(".output-") and tmp.endswith(".json.tmp")
    writer.close()
    (name,) = os.listdir(out)
    m = NAME.match(name)
    assert m and m.group(1) == "3" and m.group(2) == "0"
    assert writer.published_files == [str(out / name)]


def test_rolling_by_size(tmp_path):
    batch = SampleBatch({"actions": np.array([1, 1, 1]), "obs": np.array([1.0, 1.0, 1.0])})
    with JsonWriter(str(tmp_path / "small"), max_file_size=1000) as w:
        w.write(batch)
        w.write(batch)
    assert len(os.listdir(tmp_path / "small")) == 1
    with JsonWriter(str(tmp_path / "big"), max_file_size=5000) as w:
        for _ in range(100):
            w.write(batch)
    files = sorted(os.listdir(tmp_path / "big"))
    assert len(files) >= 2 and all(NAME.match(f) for f in files)
    sizes = [os.path.getsize(tmp_path / "big" / f) for f in files]
    line = sizes[-1] if len(files) == 1 else min(sizes)
    assert max(sizes) < 5000 + line  # over the limit by at most one record
    assert len(list(JsonReader(str(tmp_path / "big")).read_all_files())) == 100


def test_garbage_collected_writer_publishes_its_file(tmp_path):
    w = JsonWriter(str(tmp_path / "o"))
    w.write(SampleBatch({"obs": np.zeros((1, 1))}))
    del w
    import gc

    gc.collect()
    assert len(glob.glob(str(tmp_path / "o" / "*.json"))) == 1


def test_json_writer_rejects_remote_uris(tmp_path):
    with pytest.raises(ValueError, match="only local directories"):
        JsonWriter("s3://bucket/prefix")


# ------------------------------------------------------------------ inputs


def make_files(tmp_path, n_batches=100, max_file_size=5000):
    out = tmp_path / "data"
    with JsonWriter(str(out), max_file_size=max_file_size, compress_columns=["obs"]) as w:
        for i in range(n_batches):
            w.write(SampleBatch({"actions": np.array([i, i, i]), "obs": np.array([i, i, i])}))
    return out


def test_rllib_io_test_distinct_values_from_rolled_files(tmp_path):
    out = make_files(tmp_path)
    reader = JsonReader(str(out), IOContext(config={}), seed=0)
    seen = {int(reader.next()["actions"][0]) for _ in range(1000)}
    assert 91 <= len(seen) <= 100


def test_inputs_as_dir_glob_list_zip_and_file_uri(tmp_path):
    out = make_files(tmp_path, n_batches=10, max_file_size=200)
    files = sorted(glob.glob(str(out / "*.json")))
    assert len(JsonReader(str(out)).files) == len(files)
    assert JsonReader(str(out / "output-*.json")).files == files
    assert JsonReader(["file://" + files[0], files[1]]).files == files[:2]
    zpath = tmp_path / "data.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for f in files:
            zf.write(f, os.path.basename(f))
    reader = JsonReader(str(zpath))
    assert sorted(int(b["actions"][0]) for b in reader.read_all_files()) == list(range(10))


@pytest.mark.parametrize(
    "inputs, match",
    [
        ("", "empty string"),
        ([], "list of inputs is empty"),
        ("{missing}/*.json", "No files found matching"),
        ("{missing}/x.json", "not found"),
        ("{empty_dir}", "has no \\*.json or \\*.zip files"),
    ],
)
def test_missing_or_empty_inputs_fail_at_construction(tmp_path, inputs, match):
    (tmp_path / "empty").mkdir()
    if isinstance(inputs, str):
        inputs = inputs.format(missing=tmp_path / "nope", empty_dir=tmp_path / "empty")
    with pytest.raises(OfflineDataError, match=match) as info:
        JsonReader(inputs)
    assert isinstance(info.value, (ValueError, FileNotFoundError))


def test_bad_input_types():
    with pytest.raises(ValueError, match="type of inputs must be list or str"):
        JsonReader(42)
    with pytest.raises(ValueError, match="Don't know how to glob"):
        JsonReader("s3://bucket/*.json")


def test_empty_files_and_blank_lines_are_skipped(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text("")
    f1 = tmp_path / "f1.json"
    f2 = tmp_path / "f2.json"
    with JsonWriter(str(tmp_path / "w")) as w:
        w.write(SampleBatch({"actions": np.array([0])}))
        w.write(SampleBatch({"actions": np.array([1])}))
    (src,) = glob.glob(str(tmp_path / "w" / "*.json"))
    line0, line1 = open(src).read().splitlines()
    f1.write_text("\n\n" + line0 + "\n")
    f2.write_text(line1 + "\n")
    reader = JsonReader([str(empty), str(f1), "file://" + str(f2)], seed=1)
    assert {int(reader.next()["actions"][0]) for _ in range(100)} == {0, 1}
    assert [int(b["actions"][0]) for b in reader.read_all_files()] == [0, 1]


def test_only_empty_files_fail_on_next(tmp_path):
    (tmp_path / "a.json").write_text("")
    (tmp_path / "b.json").write_text("\n" * 100)
    reader = JsonReader(str(tmp_path))
    with pytest.raises(OfflineDataError, match="Failed to read valid experience batch"):
        reader.next()


def test_next_returns_train_batch_size_steps_split_over_runners(tmp_path):
    out = tmp_path / "o"
    with JsonWriter(str(out)) as w:
        for i in range(30):
            w.write(SampleBatch({"t": np.arange(100) + 100 * i}))
    cfg = AlgorithmConfig().training(train_batch_size=1200)
    assert len(JsonReader(str(out), IOContext(config=cfg, worker_index=0)).next()) == 1200
    cfg2 = AlgorithmConfig().training(train_batch_size=1200).env_runners(num_env_runners=4)
    reader = JsonReader(str(out), IOContext(config=cfg2))
    assert reader.batch_size == 300 and len(reader.next()) == 300
    assert len(JsonReader(str(out), IOContext(config={"train_batch_size": 250})).next()) == 300


# ------------------------------------------------------------------ corrupt input


def corrupt_file(tmp_path):
    out = make_files(tmp_path, n_batches=4, max_file_size=10**6)
    (path,) = glob.glob(str(out / "*.json"))
    with open(path, "a") as f:
        f.write('{"type": "SampleBatch", "actions": "ERPK1:lz4:<i8:3:AAAA"}\n')
        f.write("{..corrupted_json_record\n")
    return path


def test_corrupt_line_names_file_and_line(tmp_path):
    path = corrupt_file(tmp_path)
    reader = JsonReader(path)
    with pytest.raises(OfflineDataError, match=re.escape(path) + ":5: corrupt record") as info:
        list(reader.read_all_files())
    assert info.value.path == path and info.value.line == 5
    assert "skip_corrupt=True" in str(info.value)


def test_skip_corrupt_skips_and_counts(tmp_path):
    path = corrupt_file(tmp_path)
    reader = JsonReader(path, skip_corrupt=True)
    assert len(list(reader.read_all_files())) == 4
    assert reader.num_corrupt_skipped == 2
    reader2 = JsonReader(path, IOContext(config={"input_config": {"skip_corrupt": True}}))
    assert len({int(reader2.next()["actions"][0]) for _ in range(10)}) == 4


def test_truncated_last_line(tmp_path):
    out = make_files(tmp_path, n_batches=3, max_file_size=10**6)
    (path,) = glob.glob(str(out / "*.json"))
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) - 10])  # cut into the last record
    with pytest.raises(OfflineDataError, match=r":3: .*cut off while being written"):
        list(JsonReader(path).read_all_files())
    reader = JsonReader(path, skip_corrupt=True)
    assert [int(b["actions"][0]) for b in reader.read_all_files()] == [0, 1]
    assert reader.num_corrupt_skipped == 1


@pytest.mark.parametrize(
    "line, match",
    [
        ('{"actions": [1]}', "missing 'type' field"),
        ('{"type": "Nope"}', "unknown record type 'Nope'"),
        ("[1, 2]", "must be a JSON object"),
        ('{"type": "SampleBatch", "obs": "hello"}', "column 'obs'"),
    ],
)
def test_malformed_records(tmp_path, line, match):
    path = tmp_path / "bad.json"
    path.write_text(line + "\n")
    with pytest.raises(OfflineDataError, match=match):
        JsonReader(str(path)).next()


def test_subclasses_are_stored_as_their_base_type(tmp_path):
    import collections
    import enum

    class Color(enum.IntEnum):
        RED = 1

    Point = collections.namedtuple("Point", "x y")
    infos = [{"c": Color.RED, "od": collections.OrderedDict(a=1), "p": Point(1, 2)}]
    (back,) = write_read(tmp_path, SampleBatch({"obs": np.zeros((1, 1)), "infos": infos}))
    assert back["infos"][0] == {"c": 1, "od": {"a": 1}, "p": (1, 2)}
    assert type(back["infos"][0]["c"]) is int and type(back["infos"][0]["od"]) is dict


def test_next_skips_empty_batches_and_fails_if_there_is_nothing_else(tmp_path):
    with JsonWriter(str(tmp_path / "e")) as w:
        w.write(SampleBatch({"obs": np.zeros((0, 2))}))
    with pytest.raises(OfflineDataError, match="none of the 1 input file"):
        JsonReader(str(tmp_path / "e")).next()
    with JsonWriter(str(tmp_path / "f")) as w:
        w.write(SampleBatch({"obs": np.zeros((0, 2))}))
        w.write(SampleBatch({"obs": np.ones((2, 2))}))
    assert JsonReader(str(tmp_path / "f")).next().count == 2
