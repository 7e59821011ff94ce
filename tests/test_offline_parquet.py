"""RLlib 2.60's new-stack offline Parquet: OfflineSingleAgentEnvRunner, readers, safety.

The files under tests/data/rllib_offline/ were written by RLlib 2.60 itself (see the
README there); these tests read them, and write files that have RLlib's layout.
"""

from __future__ import annotations

import glob
import json
import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from envrunners.algorithms.ppo import PPOConfig
from envrunners.errors import (
    ConfigError,
    OfflineDataError,
    OfflineSchemaError,
    PickleNotAllowedError,
    UnencodableValueError,
)
from envrunners.offline._msgpack_arrays import packb, unpackb
from envrunners.offline.offline_env_runner import OfflineSingleAgentEnvRunner
from envrunners.offline.offline_prelearner import OfflinePreLearner
from envrunners.offline.parquet_reader import read_parquet_batches, read_parquet_episodes
from envrunners.offline.parquet_writer import ParquetEpisodeWriter

RLLIB = os.path.join(os.path.dirname(__file__), "data", "rllib_offline")


def _config(out, **offline):
    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=2)
        .offline_data(output=str(out), **offline)
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Episodes and steps recorded by OfflineSingleAgentEnvRunner (2 sample calls each)."""
    base = tmp_path_factory.mktemp("rec")
    out = {}
    for mode in (True, False):
        runner = OfflineSingleAgentEnvRunner(
            config=_config(base / str(mode), output_write_episodes=mode), worker_index=1
        )
        episodes = runner.sample(num_timesteps=150) + runner.sample(num_timesteps=100)
        runner.stop()
        out[mode] = (str(base / str(mode)), episodes, runner.published_files)
    return out


def _tensor(field):
    """(extension name, row shape) of a Ray tensor column, registered with pyarrow or not."""
    if isinstance(field.type, pa.ExtensionType):  # ray.data imported in this process
        return field.type.extension_name, list(field.type.shape)
    meta = field.metadata or {}
    return meta[b"ARROW:extension:name"].decode(), json.loads(meta[b"ARROW:extension:metadata"])


def _steps(episodes):
    obs = np.concatenate([ep.get_observations(slice(0, len(ep))) for ep in episodes])
    acts = np.concatenate([ep.get_actions() for ep in episodes])
    return obs, acts


@pytest.mark.parametrize("mode", [True, False])
def test_runner_writes_rllib_layout_and_reads_back(recorded, mode):
    path, episodes, files = recorded[mode]
    # RLlib's directory layout: <output>/<env id lower>/run-<worker>-<event>/*.parquet
    assert [os.path.relpath(f, path).split(os.sep)[:2] for f in files] == [
        ["cartpole-v1", "run-000001-00001"],
        ["cartpole-v1", "run-000001-00002"],
    ]
    assert not glob.glob(os.path.join(path, "**", ".*"), recursive=True)  # no temporaries
    schema = pq.read_schema(files[0])
    if mode:
        assert schema.names == ["item"] and schema.field("item").type == pa.binary()
    else:
        assert schema.names[:9] == ["eps_id", "agent_id", "module_id", "obs", "actions",
                                    "rewards", "new_obs", "terminateds", "truncateds"]  # fmt: skip
        assert _tensor(schema.field("obs")) == ("ray.data.arrow_tensor_v2", [4])
    back = list(read_parquet_episodes(path))
    obs, acts = _steps([ep for ep in episodes if len(ep)])
    obs2, acts2 = _steps(back)
    np.testing.assert_array_equal(obs, obs2)
    np.testing.assert_array_equal(acts, acts2)
    assert sum(b.count for b in read_parquet_batches(path)) == len(obs)
    if mode:  # whole chunks come back: ids, flags, extra model outputs
        assert [ep.id_ for ep in back] == [ep.id_ for ep in episodes]
        assert [ep.is_terminated for ep in back] == [ep.is_terminated for ep in episodes]
        np.testing.assert_array_equal(
            back[0].get_extra_model_outputs("action_logp"),
            episodes[0].get_extra_model_outputs("action_logp"),
        )


def test_max_rows_per_file_and_remaining_data(tmp_path):
    config = _config(tmp_path, output_write_episodes=False, output_max_rows_per_file=64,
                     output_write_remaining_data=True)  # fmt: skip
    runner = OfflineSingleAgentEnvRunner(config=config, worker_index=2)
    runner.sample(num_timesteps=100)
    runner.sample(num_timesteps=100)
    assert [pq.read_metadata(f).num_rows for f in runner.published_files] == [64, 64, 64]
    runner.stop()  # writes the rest
    rows = [pq.read_metadata(f).num_rows for f in runner.published_files]
    assert rows[:3] == [64, 64, 64] and sum(rows) >= 200 and rows[3] < 64


def test_runner_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="needs config.offline_data\\(output=<directory>\\)"):
        OfflineSingleAgentEnvRunner(config=PPOConfig().environment("CartPole-v1"))
    with pytest.raises(ConfigError, match="output_write_method='write_json'"):
        OfflineSingleAgentEnvRunner(config=_config(tmp_path, output_write_method="write_json"))


def test_reads_rllib_written_episode_file():
    episodes = list(read_parquet_episodes(os.path.join(RLLIB, "episodes")))
    assert [len(ep) for ep in episodes] == [17, 14, 29]
    assert [ep.is_terminated for ep in episodes] == [True, True, False]
    ep = episodes[0]
    assert ep.is_numpy and ep.observation_space.shape == (4,) and ep.action_space.n == 2
    assert ep.get_observations(slice(0, len(ep) + 1)).shape == (18, 4)
    assert list(ep.extra_model_outputs) == ["weights_seq_no"]


def test_reads_rllib_written_rows_and_matches_its_columns():
    (batch,) = read_parquet_batches(os.path.join(RLLIB, "rows"))
    assert batch.count == 60 and batch["obs"].shape == (60, 4) and batch["obs"].dtype == np.float32
    episodes = list(read_parquet_episodes(os.path.join(RLLIB, "rows")))
    assert [len(ep) for ep in episodes] == [21, 22, 11, 6]
    assert [ep.is_terminated for ep in episodes] == [True, True, True, False]
    for ep in episodes:  # next observations chain inside each episode
        o = ep.get_observations(slice(0, len(ep) + 1))
        rows = batch["eps_id"] == ep.id_
        np.testing.assert_array_equal(o[:-1], batch["obs"][rows])
        np.testing.assert_array_equal(o[1:], batch["new_obs"][rows])


def test_our_rows_have_rllib_schema(tmp_path):
    """Our step files have the same column names and types as the file RLlib wrote."""
    episodes = list(read_parquet_episodes(os.path.join(RLLIB, "rows")))
    with ParquetEpisodeWriter(str(tmp_path), write_episodes=False) as w:
        w.write(episodes)
    ours, theirs = (
        pq.read_schema(w.published_files[0]),
        pq.read_schema(glob.glob(os.path.join(RLLIB, "rows", "*.parquet"))[0]),
    )
    assert ours.names == theirs.names
    for name in ours.names:
        a, b = ours.field(name).type, theirs.field(name).type
        if name in ("obs", "new_obs"):
            assert _tensor(ours.field(name)) == _tensor(theirs.field(name)), name
        elif name != "rewards":  # RLlib writes Python floats (double); we keep float32
            assert a == b, name


def test_episode_state_matches_rllib_keys(tmp_path):
    """Our msgpack episode states have RLlib's keys and space encoding."""
    table = pq.read_table(glob.glob(os.path.join(RLLIB, "episodes", "*.parquet"))[0])
    theirs = unpackb(table.column("item")[0].as_py())
    with ParquetEpisodeWriter(str(tmp_path)) as w:
        w.write(list(read_parquet_episodes(os.path.join(RLLIB, "episodes"))))
    ours = unpackb(pq.read_table(w.published_files[0]).column("item")[0].as_py())
    assert sorted(ours) == sorted(theirs)
    assert ours["_observation_space"] == theirs["_observation_space"]
    assert ours["_action_space"] == theirs["_action_space"]
    assert sorted(ours["observations"]) == sorted(theirs["observations"])


def test_rllib_packed_columns_refused_unless_allow_pickle():
    path = os.path.join(RLLIB, "rows_packed")
    with pytest.raises(PickleNotAllowedError, match="column 'obs' holds RLlib-packed values") as e:
        list(read_parquet_batches(path))
    assert "part-0.parquet" in str(e.value)
    (batch,) = read_parquet_batches(path, allow_pickle=True)
    (plain,) = read_parquet_batches(os.path.join(RLLIB, "rows"))
    assert batch["obs"].shape == (60, 4) and batch.count == plain.count


def test_pickled_array_inside_episode_refused(tmp_path):
    """An object-dtype array in msgpack_numpy form is a pickle: refused unless allow_pickle."""
    state = unpackb(pq.read_table(glob.glob(os.path.join(RLLIB, "episodes", "*"))[0])["item"][0]
                    .as_py())  # fmt: skip
    evil = pickle.dumps(np.array([{"a": 1}], dtype=object))
    obj = {b"nd": True, b"type": "|O", b"kind": b"", b"shape": [1], b"data": evil}
    state["custom_data"] = {"x": obj}
    path = tmp_path / "evil.parquet"
    pq.write_table(pa.table({"item": pa.array([packb(state)], pa.binary())}), path)
    with pytest.raises(PickleNotAllowedError, match="object-dtype array stored as a pickle"):
        list(read_parquet_episodes(str(path)))
    (ep,) = read_parquet_episodes(str(path), allow_pickle=True)
    assert ep.custom_data["x"][0] == {"a": 1}
    with pytest.raises(UnencodableValueError, match="object-dtype array"):
        packb({"x": np.array([object()])})


@pytest.mark.parametrize(
    "table, match",
    [
        (pa.table({"obs": [1.0], "rewards": [1.0]}), "column 'actions': missing"),
        (pa.table({"item": pa.array([1], pa.int64())}), "column 'item': has type int64"),
        (pa.table({"item": pa.array([b"\xc1garbage"], pa.binary())}), "not an msgpack episode"),
        (
            pa.table({"obs": pa.array([[1.0], [1.0, 2.0]]), "actions": [0, 1], "rewards": [1, 1]}),
            "column 'obs': rows have different lengths",
        ),
        (
            pa.table({"obs": [{"x": 1}], "actions": [0], "rewards": [1.0]}),
            "column 'obs': has Arrow type struct",
        ),
    ],
)
def test_wrong_schema_names_file_and_column(tmp_path, table, match):
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    with pytest.raises(OfflineDataError, match=match) as e:
        list(read_parquet_episodes(str(path)))
    assert str(path) in str(e.value)


def test_truncated_file_is_a_clear_error(recorded, tmp_path):
    src = recorded[False][2][0]
    data = open(src, "rb").read()
    bad = tmp_path / "truncated.parquet"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(OfflineDataError, match="not a readable Parquet file") as e:
        list(read_parquet_batches(str(bad)))
    assert "truncated.parquet" in str(e.value)
    assert isinstance(e.value, ValueError)
    with pytest.raises(OfflineDataError, match="no Parquet file found"):
        list(read_parquet_batches(str(tmp_path / "nothing")))


def test_failed_write_leaves_no_file(tmp_path):
    """A chunk that cannot be stored without pickle fails before any file appears."""
    episodes = list(read_parquet_episodes(os.path.join(RLLIB, "episodes")))
    episodes[0].custom_data["bad"] = object()
    with pytest.raises(UnencodableValueError, match="not plain data"):
        ParquetEpisodeWriter(str(tmp_path)).write(episodes)
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs]


def test_prelearner_maps_raw_blocks(tmp_path):
    table = pq.read_table(glob.glob(os.path.join(RLLIB, "episodes", "*"))[0])
    config = PPOConfig().offline_data(input_read_episodes=True)
    out = OfflinePreLearner(config=config)(table)
    assert out.num_rows == 60 and "new_obs" in out.schema.names
    with pytest.raises(OfflineSchemaError, match="set config.offline_data\\(input_read_epis"):
        OfflinePreLearner(config=PPOConfig())(table)
    rows = pq.read_table(glob.glob(os.path.join(RLLIB, "rows", "*"))[0])
    as_numpy = {  # Ray Data's "numpy" batch format
        k: np.asarray(v, np.float32 if k in ("obs", "new_obs") else None)
        for k, v in rows.to_pydict().items()
        if k not in ("agent_id", "module_id")
    }
    assert OfflinePreLearner(config=PPOConfig())(as_numpy).num_rows == 60


def test_new_stack_offline_config_keys():
    config = PPOConfig().offline_data(
        input_=["/data"], input_read_method="read_parquet", input_read_episodes=True,
        dataset_num_iters_per_learner=4, output="/out", output_write_episodes=False,
        output_max_rows_per_file=500, output_compress_columns=[],
    )  # fmt: skip
    assert (config.input_read_episodes, config.dataset_num_iters_per_learner) == (True, 4)
    assert (config.output_write_episodes, config.output_max_rows_per_file) == (False, 500)
    d = config.to_dict()
    assert d["output_max_rows_per_file"] == 500 and d["input_read_method"] == "read_parquet"
    assert PPOConfig.from_dict(d).output_write_episodes is False
    defaults = PPOConfig()  # RLlib 2.60's defaults
    assert defaults.output_write_episodes is True and defaults.output_max_rows_per_file is None
    assert defaults.input_compress_columns == ["obs", "new_obs"]
    with pytest.raises(ConfigError, match="output_max_rows_per_file"):
        PPOConfig().offline_data(output_max_rows_per_file=0)


def test_dict_spaces_write_as_rows_and_episodes(tmp_path, dict_space_episodes):
    """Dict observations and actions: one row per step (a column per leaf), or whole
    episodes that read back nested."""
    episodes = dict_space_episodes
    steps = sum(len(e) for e in episodes)
    rows = ParquetEpisodeWriter(str(tmp_path / "rows"), write_episodes=False)
    rows.write(episodes)
    rows.close()
    table = pq.read_table(rows.published_files[0])
    assert table.num_rows == steps
    assert {"obs.pos", "obs.t", "actions.move", "actions.push", "new_obs.pos"} <= set(
        table.column_names
    )
    np.testing.assert_array_equal(
        np.concatenate([e.get_actions()["move"] for e in episodes]),
        table.column("actions.move").to_numpy(),
    )
    whole = ParquetEpisodeWriter(str(tmp_path / "episodes"), write_episodes=True)
    whole.write(episodes)
    whole.close()
    back = list(read_parquet_episodes(str(tmp_path / "episodes")))
    for ep, orig in zip(back, episodes, strict=True):
        np.testing.assert_array_equal(ep.get_observations()["pos"], orig.get_observations()["pos"])
        np.testing.assert_array_equal(ep.get_actions()["push"], orig.get_actions()["push"])
