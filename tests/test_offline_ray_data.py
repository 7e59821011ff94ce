"""OfflineData: Parquet episodes and steps streamed through Ray Data, split across consumers."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from envrunners.algorithms.ppo import PPOConfig
from envrunners.errors import ConfigError
from envrunners.offline.offline_data import OfflineData
from envrunners.offline.parquet_reader import read_parquet_batches, read_parquet_episodes
from envrunners.offline.parquet_writer import ParquetEpisodeWriter

pytest.importorskip("pandas")  # ray.data needs it

RLLIB = os.path.join(os.path.dirname(__file__), "data", "rllib_offline")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """8 episode files, each the 4 RLlib-recorded episodes (60 steps) under new ids."""
    base = tmp_path_factory.mktemp("ds")
    episodes = list(read_parquet_episodes(os.path.join(RLLIB, "rows")))
    for mode in ("episodes",):
        with ParquetEpisodeWriter(str(base / mode), write_episodes=True) as w:
            for k in range(8):
                for ep in episodes:
                    ep.id_ = f"{k}-{ep.id_.split('-')[-1]}"
                w.write(episodes)
    return str(base)


def _config(path, episodes):
    return PPOConfig().offline_data(
        input_=[path],
        input_read_episodes=episodes,
        map_batches_kwargs={"concurrency": 1},
        iter_batches_kwargs={"prefetch_batches": 1},
    )


def test_two_consumers_see_every_row_exactly_once(ray_session, dataset):
    """Episode files -> pre-learner -> streaming_split(2): each row reaches one consumer."""
    mode = "episodes"
    path = os.path.join(dataset, mode)
    expected = [(e, o.tobytes()) for b in read_parquet_batches(path)
                for e, o in zip(b["eps_id"], b["obs"], strict=True)]  # fmt: skip
    assert len(expected) == 8 * 60 == len(set(expected))
    shards = OfflineData(_config(path, mode == "episodes")).sample(16, num_shards=2)
    seen: list[list] = [[], []]

    def consume(i):
        for batch in shards[i].iter_batches(batch_size=50, batch_format="numpy"):
            seen[i].extend(zip(batch["eps_id"], (o.tobytes() for o in batch["obs"]), strict=True))

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(seen)  # both consumers got data
    assert sorted(seen[0] + seen[1]) == sorted(expected)  # together: every row exactly once


def test_sample_returns_step_batches(ray_session):
    batch = OfflineData(_config(os.path.join(RLLIB, "episodes"), True)).sample(32)
    sb = batch.policy_batches["default_policy"]
    assert batch.env_steps() == 32 and sb["obs"].shape == (32, 4)
    assert {"actions", "rewards", "new_obs", "terminateds", "truncateds"} <= set(sb.keys())
    local = np.concatenate(
        [b["obs"] for b in read_parquet_batches(os.path.join(RLLIB, "episodes"))]
    )
    np.testing.assert_array_equal(sb["obs"], local[:32])  # the first steps, in file order


def test_dict_space_rows_sample_nested(ray_session, tmp_path, dict_space_episodes):
    """Step files with Dict observations and actions (struct columns) come out of
    ``sample()`` as nested arrays, the same values the local reader gives; before, the
    nested columns were dropped from the batch."""
    with ParquetEpisodeWriter(str(tmp_path), write_episodes=False) as w:
        w.write(dict_space_episodes)
    steps = sum(len(e) for e in dict_space_episodes)
    sb = OfflineData(_config(str(tmp_path), False)).sample(steps).policy_batches["default_policy"]
    (local,) = read_parquet_batches(str(tmp_path))
    for column, key in (("obs", "pos"), ("obs", "t"), ("new_obs", "pos"), ("actions", "move"),
                        ("actions", "push")):  # fmt: skip
        assert sb[column][key].shape[0] == steps
        np.testing.assert_array_equal(sb[column][key], local[column][key])


def test_offline_data_config_errors(ray_session):
    with pytest.raises(ConfigError, match="needs config.offline_data\\(input_=<Parquet path"):
        OfflineData(PPOConfig())
    with pytest.raises(ConfigError, match="input_read_method='nope' is not a ray.data reader"):
        OfflineData(PPOConfig().offline_data(input_=[RLLIB], input_read_method="nope"))


def test_prelearner_decodes_episode_rows_as_the_episode_path(dataset, tmp_path):
    """Episode rows straight to step columns == episodes first, then steps; pickles refused."""
    import glob
    import pickle

    import pyarrow as pa
    import pyarrow.parquet as pq

    from envrunners.errors import PickleNotAllowedError
    from envrunners.offline._msgpack_arrays import packb, unpackb
    from envrunners.offline._parquet import episodes_from_table, episodes_to_rows_table
    from envrunners.offline.offline_prelearner import OfflinePreLearner

    files = glob.glob(os.path.join(RLLIB, "episodes", "*.parquet"))
    files += glob.glob(os.path.join(dataset, "episodes", "**", "*.parquet"), recursive=True)[:2]
    prelearner = OfflinePreLearner(input_read_episodes=True)
    for path in files:
        table = pq.read_table(path)
        expected = episodes_to_rows_table(episodes_from_table(table))
        assert prelearner(table).equals(expected), path
    state = unpackb(pq.read_table(files[0])["item"][0].as_py())
    evil = pickle.dumps(np.array([{"a": 1}], dtype=object))
    state["custom_data"] = {"x": {b"nd": True, b"type": "|O", b"kind": b"", b"shape": [1],
                                  b"data": evil}}  # fmt: skip
    table = pa.table({"item": pa.array([packb(state)], pa.binary())})
    with pytest.raises(PickleNotAllowedError, match="object-dtype array stored as a pickle"):
        prelearner(table)


def test_read_is_lazy_and_leaves_ray_settings_alone(ray_session, dataset):
    """Nothing is read before a consumer iterates; the per-read block cap is undone."""
    from ray.data import DataContext
    from ray.data.dataset import MaterializedDataset

    ctx = DataContext.get_current()
    before = ctx.target_max_block_size
    data = OfflineData(_config(os.path.join(dataset, "episodes"), True))
    shards = data.sample(16, num_shards=2)
    assert len(shards) == 2 and not isinstance(data.data, MaterializedDataset)
    assert ctx.target_max_block_size == before
    assert "RAY_DATA_PARQUET_BIN_PACKING_BYTES" not in os.environ
