"""New-stack episode recording (EpisodeWriter, record_episodes, read_episodes) and the
``offline info | convert | recover`` commands."""

from __future__ import annotations

import gc
import glob
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from envrunners.algorithms.ppo import PPOConfig
from envrunners.env.multi_agent_episode import MultiAgentEpisode
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.errors import OfflineDataError
from envrunners.offline import (
    EpisodeWriter,
    JsonReader,
    JsonWriter,
    close_episode_writer,
    read_episodes,
    record_episodes,
)
from envrunners.offline.cli_commands import (
    add_offline_subcommands,
    format_info,
    main,
    offline_convert,
    offline_info,
)
from envrunners.offline.json_codec import UnencodableValueError
from envrunners.policy.sample_batch import MultiAgentBatch, SampleBatch


@pytest.fixture(scope="module")
def runner_and_episodes(tmp_path_factory):
    out = tmp_path_factory.mktemp("rec")
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=2)
        .offline_data(output=str(out))
    )
    runner = SingleAgentEnvRunner(config=config)
    episodes = runner.sample(num_timesteps=120)
    yield runner, episodes, str(out)
    runner.stop()


def same_batch(a, b):
    assert list(a.keys()) == list(b.keys())
    for k in a.keys():
        if k == "infos":
            assert list(a[k]) == list(b[k])
        else:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
            assert np.asarray(a[k]).dtype == np.asarray(b[k]).dtype


def test_record_episodes_hook_writes_one_line_per_chunk(runner_and_episodes):
    # The runner's sample() already called record_episodes (config.output is set).
    runner, episodes, out = runner_and_episodes
    assert glob.glob(os.path.join(out, "*.json")) == []  # still open, under a temporary name
    close_episode_writer(runner)
    (path,) = glob.glob(os.path.join(out, "*.json"))
    assert sum(1 for _ in open(path)) == len(episodes)
    back = list(read_episodes(out))
    assert [e.id_ for e in back] == [e.id_ for e in episodes]
    for orig, got in zip(episodes, back):
        assert type(got) is type(orig) and len(got) == len(orig)
        assert got.is_terminated == orig.is_terminated and got.t_started == orig.t_started
        same_batch(orig.get_sample_batch(), got.get_sample_batch())
    batches = list(JsonReader(out).read_all_files())  # episode files read as batches too
    assert [b.count for b in batches] == [len(e) for e in episodes]
    info = offline_info(out)
    assert info["records"] == {"SingleAgentEpisode": len(episodes)}
    assert info["env_steps"] == sum(len(e) for e in episodes)


def test_record_episodes_is_a_no_op_without_output():
    class R:
        config = PPOConfig()

    record_episodes(R(), [object()])  # nothing configured: nothing touched


def test_record_episodes_publishes_when_the_runner_is_collected(tmp_path):
    class R:
        worker_index = 2

        def __init__(self, config):
            self.config = config

    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={0: np.zeros(2, np.float32), "b": 1})
    ep.add_env_step({0: np.ones(2, np.float32), "b": 2}, {0: 1, "b": 0}, {0: 1.0, "b": 0.5})
    runner = R(PPOConfig().offline_data(output=str(tmp_path)))
    record_episodes(runner, [ep])
    del runner
    gc.collect()
    (path,) = glob.glob(str(tmp_path / "*worker-2_0.json"))
    (back,) = read_episodes(path)
    assert isinstance(back, MultiAgentEpisode) and back.agent_ids == {0, "b"}
    assert back.get_state().keys() == ep.get_state().keys()
    np.testing.assert_array_equal(back.agent_episodes[0].get_observations(), [[0, 0], [1, 1]])
    (batch,) = JsonReader(path).read_all_files()
    assert isinstance(batch, MultiAgentBatch) and set(batch.policy_batches) == {0, "b"}


def test_episode_writer_refuses_non_plain_data_unless_dropping(tmp_path, runner_and_episodes):
    _, episodes, _ = runner_and_episodes
    ep = episodes[0]
    ep.custom_data["handle"] = object()
    try:
        with EpisodeWriter(str(tmp_path / "a")) as w:
            with pytest.raises(UnencodableValueError, match=r"custom_data'\]\['handle'\]"):
                w.write(ep)
        with EpisodeWriter(str(tmp_path / "b"), drop_non_json_values=True) as w:
            assert w.write(episodes[:2]) == 2
        assert w.num_dropped_values == 1 and w.num_episodes_written == 2
    finally:
        del ep.custom_data["handle"]


def test_read_episodes_rejects_batch_files(tmp_path):
    with JsonWriter(str(tmp_path)) as w:
        w.write(SampleBatch({"obs": np.zeros((1, 1))}))
    with pytest.raises(OfflineDataError, match="holds a SampleBatch, not an episode"):
        list(read_episodes(str(tmp_path)))


# ------------------------------------------------------------------ CLI


@pytest.fixture
def batch_dir(tmp_path):
    out = tmp_path / "data"
    with JsonWriter(str(out)) as w:
        for i in range(3):
            b = SampleBatch(
                {
                    "obs": np.full((4, 2), i, np.float32),
                    "actions": np.arange(4),
                    "c": np.ones(4, np.complex64),
                    "nested": {"a": np.zeros((4, 2, 2), np.int8)},
                    "infos": [{"i": i}] * 4,
                }
            )
            w.write(b)
            w.write(MultiAgentBatch({"p0": b, "p1": b.slice(0, 2)}, 4))
    return str(out)


def test_offline_info(batch_dir):
    info = offline_info(batch_dir)
    assert info["num_files"] == 1 and info["records"] == {"SampleBatch": 3, "MultiAgentBatch": 3}
    assert info["env_steps"] == 24 and info["agent_steps"] == 12 + 18
    assert info["columns"]["obs"] == {"format": "codec/lz4", "dtype": "<f4", "shape": [4, 2]}
    assert info["columns"]["nested.a"]["shape"] == [4, 2, 2]
    assert info["policies"]["p1"]["agent_steps"] == 6
    assert info["num_corrupt_lines"] == 0 and info["unfinished_files"] == []
    text = format_info(info)
    assert "env steps:    24" in text and "nested.a" in text
    (path,) = glob.glob(os.path.join(batch_dir, "*.json"))
    with open(path, "a") as f:
        f.write("{broken\n")
    info = offline_info(path)
    assert info["num_corrupt_lines"] == 1 and f"{path}:7:" in info["errors"][0]


def test_offline_convert_to_parquet(batch_dir, tmp_path):
    out = offline_convert(batch_dir, to="parquet", out=str(tmp_path / "pq"))
    assert sorted(os.path.basename(p) for p in out) == [
        "default_policy.parquet",
        "p0.parquet",
        "p1.parquet",
    ]
    table = pq.read_table(str(tmp_path / "pq" / "default_policy.parquet"))
    assert table.num_rows == 12
    assert table.column("obs").to_pylist()[4] == [1.0, 1.0]
    assert table.column("c").to_pylist()[0] == [1.0, 0.0]
    assert len(table.column("nested.a").to_pylist()[0]) == 4
    assert json.loads(table.column("infos").to_pylist()[5]) == {"i": 1}
    meta = json.loads(table.schema.metadata[b"envrunners"])
    assert meta["obs"] == {"dtype": "<f4", "shape": [2]} and meta["c"]["dtype"] == "<c8"
    assert pq.read_table(out[2]).num_rows == 6
    assert not glob.glob(str(tmp_path / "pq" / ".*"))


def test_offline_convert_fails_cleanly_on_changing_columns(tmp_path):
    with JsonWriter(str(tmp_path / "d")) as w:
        w.write(SampleBatch({"a": np.zeros(2)}))
        w.write(SampleBatch({"b": np.zeros(2)}))
    with pytest.raises(OfflineDataError, match="columns differ"):
        offline_convert(str(tmp_path / "d"), out=str(tmp_path / "pq"))
    assert os.listdir(tmp_path / "pq") == []  # complete or absent
    with pytest.raises(ValueError, match="to must be 'parquet' or 'json'"):
        offline_convert(str(tmp_path / "d"), to="csv")


def test_main_and_subcommand_hook(batch_dir, tmp_path, capsys):
    assert main(["info", batch_dir]) == 0
    assert "records:      SampleBatch=3, MultiAgentBatch=3" in capsys.readouterr().out
    assert main(["info", "--json", batch_dir]) == 0
    assert json.loads(capsys.readouterr().out)["env_steps"] == 24
    assert main(["convert", batch_dir, "--to", "parquet", "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().out.count(".parquet") == 3
    assert main(["info", str(tmp_path / "missing")]) == 1
    assert "not found" in capsys.readouterr().err
    assert main(["recover", batch_dir]) == 0

    import argparse

    parser = argparse.ArgumentParser(prog="envrunners")
    add_offline_subcommands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["offline", "info", batch_dir])
    assert args.func(args) == 0
