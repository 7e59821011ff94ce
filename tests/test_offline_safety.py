"""Offline safety: no unpickling without allow_pickle, RLlib-layout files, a writer killed
mid-write (SIGKILL) never damages finished files, and unfinished files can be recovered."""

from __future__ import annotations

import base64
import glob
import json
import os
import pickle
import select
import signal
import subprocess
import sys
import textwrap

import lz4.frame
import numpy as np
import pytest

from envrunners.errors import OfflineDataError
from envrunners.offline import JsonReader, recover_partial_files
from envrunners.offline.cli_commands import offline_convert, offline_info
from envrunners.offline.json_codec import PickleNotAllowedError


def rllib_pack(obj) -> str:
    """RLlib's compression of a column: base64 of an LZ4 frame of a pickle."""
    return base64.b64encode(lz4.frame.compress(pickle.dumps(obj))).decode("ascii")


class _Evil:
    """Unpickling this creates a file: proof that code from the file ran."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def rllib_file(tmp_path, obs) -> str:
    line = {
        "type": "SampleBatch",
        "obs": rllib_pack(obs),
        "actions": [0, 1],
        "rewards": [1.0, 0.5],
        "dones": [False, True],
        "infos": [{}, {"x": 1}],
    }
    path = tmp_path / "output-rllib.json"
    path.write_text(json.dumps(line) + "\n")
    return str(path)


def test_pickled_column_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = rllib_file(tmp_path, _Evil(str(marker)))
    with pytest.raises(PickleNotAllowedError, match="column 'obs' was compressed by RLlib") as e:
        JsonReader(path).next()
    assert "allow_pickle=True" in str(e.value) and f"{path}:1:" in str(e.value)
    # skip_corrupt does not turn a refusal into silent data loss
    with pytest.raises(PickleNotAllowedError):
        list(JsonReader(path, skip_corrupt=True).read_all_files())
    assert not marker.exists()
    info = offline_info(path)
    assert info["columns"]["obs"]["format"].startswith("rllib-cloudpickle")
    assert not marker.exists()


def test_allow_pickle_reads_rllib_files_with_a_warning(tmp_path):
    obs = np.arange(8, dtype=np.float32).reshape(2, 4)
    path = rllib_file(tmp_path, obs)
    with pytest.warns(UserWarning, match="runs code stored in the file"):
        reader = JsonReader(path, allow_pickle=True)
    batch = reader.next()
    np.testing.assert_array_equal(batch["obs"], obs)
    np.testing.assert_array_equal(batch["terminateds"], [False, True])  # "dones" renamed
    assert "dones" not in batch.keys()
    assert batch["actions"].dtype == np.int64 and batch["rewards"].dtype == np.float64
    assert batch["infos"].dtype == object and batch["infos"][1] == {"x": 1}


def test_convert_rllib_file_to_pickle_free_json(tmp_path):
    obs = np.ones((2, 4), np.float32)
    path = rllib_file(tmp_path, obs)
    out = offline_convert(path, to="json", out=str(tmp_path / "clean"), allow_pickle=True)
    assert len(out) == 1 and "ERPK1:" in open(out[0]).read()
    (batch,) = JsonReader(out[0]).read_all_files()  # no allow_pickle needed any more
    np.testing.assert_array_equal(batch["obs"], obs)


def test_rllib_uncompressed_layout_reads(tmp_path):
    path = tmp_path / "plain.json"
    line = {"type": "MultiAgentBatch", "count": 2,
            "policy_batches": {"p": {"obs": [[1.0, 2.0], [3.0, 4.0]], "actions": [1, 0]}}}  # fmt: skip
    path.write_text(json.dumps(line) + "\n")
    batch = JsonReader(str(path)).next()
    assert batch.count == 2 and batch["p"]["obs"].shape == (2, 2)


WRITER_SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np
    from envrunners.offline import JsonWriter
    from envrunners.policy.sample_batch import SampleBatch
    writer = JsonWriter(sys.argv[1], max_file_size=20_000, fsync=False)
    rng = np.random.default_rng(0)
    i, said = 0, False
    while True:
        writer.write(SampleBatch({"obs": rng.standard_normal((200, 4)).astype(np.float32),
                                  "t": np.arange(200) + 200 * i}))
        i += 1
        if len(writer.published_files) >= 3 and not said:
            print("ready", flush=True)
            said = True
    """
)


def test_writer_killed_mid_write_leaves_every_closed_file_readable(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)  # a deadline, not a sleep
        assert ready and proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    closed = sorted(glob.glob(str(out / "*.json")))
    assert len(closed) >= 3
    counts = [sum(1 for _ in JsonReader(f).read_all_files()) for f in closed]
    assert all(c > 0 for c in counts)
    unfinished = glob.glob(str(out / ".output-*.json.tmp"))
    # The kill may land between publishing a file and opening the next one.
    assert len(unfinished) <= 1
    for path in unfinished:
        with open(path, "ab") as f:  # make sure there is a cut-off record to trim
            f.write(b'{"type": "SampleBatch", "obs": "ERPK1:lz4:<f4:20')
    assert offline_info(str(out))["unfinished_files"] == unfinished
    recovered = recover_partial_files(str(out))
    assert len(recovered) <= 1 and not glob.glob(str(out / ".*.tmp"))
    for f in recovered:
        batches = list(JsonReader(f).read_all_files())
        assert batches and all(b.count == 200 for b in batches)


def test_missing_dir_mentions_unfinished_files(tmp_path):
    (tmp_path / ".output-x_worker-0_0.json.tmp").write_text("{}\n")
    with pytest.raises(OfflineDataError, match="recover_partial_files"):
        JsonReader(str(tmp_path))


def test_failed_write_is_rolled_back_before_publishing(tmp_path):
    from envrunners.offline._rolling_file import RollingFileWriter

    writer = RollingFileWriter(str(tmp_path), max_file_size=10**6)
    writer.write_line(b'{"a": 1}')
    handle = writer._file.handle
    real_write = handle.write

    def disk_full(data):
        real_write(data[:5])
        handle.flush()
        raise OSError("No space left on device")

    handle.write = disk_full
    with pytest.raises(OSError, match="No space left"):
        writer.write_line(b'{"b": 2222222}')
    handle.write = real_write
    writer.close()
    (path,) = glob.glob(str(tmp_path / "*.json"))
    assert open(path, "rb").read() == b'{"a": 1}\n'
