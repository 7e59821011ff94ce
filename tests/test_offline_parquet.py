"""RLlib 2.60's new-stack offline Parquet: OfflineSingleAgentEnvRunner, readers, safety.

The files under tests/data/rllib_offline/ were written by RLlib 2.60 itself (see the
README there); these tests read them, and write files that have RLlib's layout.
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from envrunners.algorithms.ppo import PPOConfig
from envrunners.core._nested import flatten, paths
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
            pa.table({"obs": [datetime.date(2026, 1, 1)], "actions": [0], "rewards": [1.0]}),
            "column 'obs': has Arrow type date32",
        ),
        (  # a struct's field is named by its path
            pa.table({"obs": [{"x": datetime.date(2026, 1, 1)}], "actions": [0], "rewards": [1]}),
            "column 'obs.x': has Arrow type date32",
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


def assert_same_steps(back, episodes):
    """Episodes read back hold the written episodes' observations, actions and rewards,
    leaf by leaf (the whole observation column: the last observation comes from new_obs)."""
    assert len(back) == len(episodes)
    for ep, orig in zip(back, episodes, strict=True):
        assert ep.id_ == orig.id_ and len(ep) == len(orig)
        for got, want in ((ep.get_observations(), orig.get_observations()),
                          (ep.get_actions(), orig.get_actions())):  # fmt: skip
            assert paths(got) == paths(want)  # the same nesting: dicts, tuples, keys
            for g, w in zip(flatten(got), flatten(want), strict=True):
                np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(ep.get_rewards(), orig.get_rewards())
        assert (ep.is_terminated, ep.is_truncated) == (orig.is_terminated, orig.is_truncated)


def test_dict_spaces_write_as_rows_and_episodes(tmp_path, dict_space_episodes):
    """Dict observations and actions: one row per step, each Dict a struct column (RLlib's
    layout), or whole episodes; both read back nested."""
    episodes = dict_space_episodes
    steps = sum(len(e) for e in episodes)
    rows = ParquetEpisodeWriter(str(tmp_path / "rows"), write_episodes=False)
    rows.write(episodes)
    rows.close()
    table = pq.read_table(rows.published_files[0])
    assert table.num_rows == steps
    for name, fields in (("obs", ["pos", "t"]), ("new_obs", ["pos", "t"]),
                         ("actions", ["move", "push"])):  # fmt: skip
        assert pa.types.is_struct(table.schema.field(name).type), name
        assert [f.name for f in table.schema.field(name).type] == fields
    moves = table.column("actions").combine_chunks().field("move").to_numpy()
    np.testing.assert_array_equal(
        np.concatenate([e.get_actions()["move"] for e in episodes]), moves
    )
    assert_same_steps(list(read_parquet_episodes(str(tmp_path / "rows"))), episodes)
    (batch,) = read_parquet_batches(str(tmp_path / "rows"))
    assert batch["obs"]["pos"].shape == (steps, 2) and batch["actions"]["push"].shape == (steps, 2)
    whole = ParquetEpisodeWriter(str(tmp_path / "episodes"), write_episodes=True)
    whole.write(episodes)
    whole.close()
    assert_same_steps(list(read_parquet_episodes(str(tmp_path / "episodes"))), episodes)


def test_rllib_struct_rows_and_dotted_rows_read_back_nested(tmp_path):
    """A Dict observation as RLlib 2.60's writer stores it (a struct of a float list and
    an int64; schema taken from its OfflineSingleAgentEnvRunner), and the same steps with
    the nested columns flattened with dots (``offline convert --to parquet``, and this
    library's rows files before struct columns): both read back as dict observations."""
    pos = [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]
    struct = pa.table({
        "eps_id": ["a", "a", "b"],
        "obs": pa.array([{"pos": p, "t": i} for i, p in enumerate(pos)]),
        "actions": [0, 1, 1],
        "rewards": [1.0, 1.0, 1.0],
        "new_obs": pa.array([{"pos": p[::-1], "t": i + 1} for i, p in enumerate(pos)]),
        "terminateds": [False, True, False],
        "truncateds": [False, False, True],
    })  # fmt: skip
    dotted = pa.table({
        "eps_id": ["a", "a", "b"],
        "obs.pos": pa.array(pos, pa.list_(pa.float32(), 2)),
        "obs.t": [0, 1, 2],
        "actions.0": [0, 1, 1],
        "actions.1": [0.5, 0.5, 0.5],
        "rewards": [1.0, 1.0, 1.0],
    })  # fmt: skip
    pq.write_table(struct, tmp_path / "struct.parquet")
    pq.write_table(dotted, tmp_path / "dotted.parquet")
    a, b = read_parquet_episodes(str(tmp_path / "struct.parquet"))
    np.testing.assert_allclose(a.get_observations()["pos"], [[0.1, 0.2], [0.3, 0.4], [0.4, 0.3]])
    np.testing.assert_array_equal(a.get_observations()["t"], [0, 1, 2])
    assert a.is_terminated and b.is_truncated and b.get_observations()["t"].tolist() == [2, 3]
    a, b = read_parquet_episodes(str(tmp_path / "dotted.parquet"))
    np.testing.assert_allclose(a.get_observations()["pos"][:2], pos[:2])
    np.testing.assert_array_equal(a.get_observations()["pos"][2], [0, 0])  # no new_obs column
    assert isinstance(a.get_actions(), tuple)  # items "0", "1": a tuple
    np.testing.assert_array_equal(a.get_actions()[1], [0.5, 0.5])


def test_tuple_spaces_round_trip_through_rows(tmp_path):
    """A Tuple observation: a struct column whose field metadata marks a tuple (RLlib can
    only pickle it), read back as a tuple."""
    from envrunners.env.single_agent_episode import SingleAgentEpisode

    obs = (np.arange(8, dtype=np.float32).reshape(4, 2), np.array([0, 1, 2, 3]))
    episode = SingleAgentEpisode.from_columns(
        observations=obs, actions=np.array([1, 0, 1]), rewards=np.ones(3, np.float32),
        terminated=True, id_="tup",
    )  # fmt: skip
    writer = ParquetEpisodeWriter(str(tmp_path), write_episodes=False)
    writer.write([episode])
    writer.close()
    assert pa.types.is_struct(pq.read_schema(writer.published_files[0]).field("obs").type)
    assert_same_steps(list(read_parquet_episodes(str(tmp_path))), [episode])


def test_ray_pickled_columns_need_allow_pickle(tmp_path):
    """RLlib stores values Arrow cannot hold (a Tuple observation) as Ray Data's pickled
    objects: refused without ``allow_pickle``, naming the file and column."""
    field = pa.field(
        "obs", pa.binary(), metadata={b"ARROW:extension:name": b"ray.data.arrow_pickled_object"}
    )
    values = [pickle.dumps((np.zeros(2), 1)), pickle.dumps((np.ones(2), 2))]
    table = pa.Table.from_arrays(
        [pa.array(values, pa.binary()), pa.array([0, 1]), pa.array([1.0, 1.0])],
        schema=pa.schema(
            [field, pa.field("actions", pa.int64()), pa.field("rewards", pa.float64())]
        ),
    )
    path = tmp_path / "pickled.parquet"
    pq.write_table(table, path)
    with pytest.raises(PickleNotAllowedError, match="'obs' holds pickled") as e:
        list(read_parquet_batches(str(path)))
    assert str(path) in str(e.value)
    (batch,) = read_parquet_batches(str(path), allow_pickle=True)
    positions, counts = batch["obs"]  # tuples come back as a tuple column
    np.testing.assert_array_equal(positions, [[0, 0], [1, 1]])
    np.testing.assert_array_equal(counts, [1, 2])
