"""Minari datasets (built with Minari's own DataCollector) and ``offline convert`` between
JSON, Parquet (steps and episodes), Minari and D4RL HDF5, with its row check."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from envrunners.errors import OfflineDataError, OfflineInputNotFoundError
from envrunners.offline.cli_commands import _step_columns, detect_format, offline_convert

minari = pytest.importorskip("minari")
# Minari asks for author, e-mail, permalink... of every dataset it creates.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:minari")

RLLIB = os.path.join(os.path.dirname(__file__), "data", "rllib_offline")


@pytest.fixture(scope="module")
def minari_dir(tmp_path_factory):
    """A 120-step CartPole dataset recorded by minari.DataCollector (random actions)."""
    root = tmp_path_factory.mktemp("minari")
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        env = minari.DataCollector(gym.make("CartPole-v1"))
        env.reset(seed=0)
        env.action_space.seed(0)
        for _ in range(120):
            _, _, term, trunc, _ = env.step(env.action_space.sample())
            if term or trunc:
                env.reset()
        env.create_dataset(dataset_id="cartpole/random-v0", algorithm_name="random")
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH")
        else:
            os.environ["MINARI_DATASETS_PATH"] = old
    return str(root / "cartpole" / "random-v0")


def test_read_minari_episodes_and_batches(minari_dir):
    from envrunners.offline.minari_io import read_minari_batches, read_minari_episodes

    ds = minari.MinariDataset(os.path.join(minari_dir, "data"))
    episodes = list(read_minari_episodes(minari_dir))
    assert len(episodes) == ds.total_episodes and sum(map(len, episodes)) == ds.total_steps
    for ep, raw in zip(episodes, ds.iterate_episodes(), strict=True):
        np.testing.assert_array_equal(ep.get_observations(slice(0, len(ep) + 1)), raw.observations)
        np.testing.assert_array_equal(ep.get_actions(), raw.actions)
        assert ep.is_terminated == bool(raw.terminations[-1])
        assert ep.observation_space == ds.observation_space
    batches = list(read_minari_batches(minari_dir))
    assert sum(b.count for b in batches) == ds.total_steps
    with pytest.raises(OfflineInputNotFoundError, match="no local Minari dataset"):
        list(read_minari_episodes("nobody/nothing-v0"))


def _core(path, fmt):
    cols = list(_step_columns(path, fmt, False, False))
    return {k: np.concatenate([c[k] for c in cols]) for k in ("obs", "actions", "rewards")}


def test_convert_round_trip_every_format(minari_dir, tmp_path):
    """minari -> parquet-episodes -> parquet -> json -> d4rl -> minari: same steps throughout."""
    assert detect_format(minari_dir) == "minari"
    start = _core(minari_dir, "minari")
    path, fmt = minari_dir, "minari"
    for to in ("parquet-episodes", "parquet", "json", "d4rl", "minari"):
        written = offline_convert(path, to=to, out=str(tmp_path / to), dataset_id="rt/conv-v0")
        path = written[0] if to in ("d4rl", "minari", "parquet") else str(tmp_path / to)
        fmt = {"parquet-episodes": "parquet"}.get(to, to)
        assert detect_format(path) == fmt
        now = _core(path, fmt)
        for k in start:
            np.testing.assert_allclose(now[k], start[k], err_msg=f"{to}: {k}")
    assert not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.endswith(".tmp")]


def test_convert_rllib_files_and_check_catches_mismatch(tmp_path, monkeypatch):
    written = offline_convert(os.path.join(RLLIB, "episodes"), to="minari", out=str(tmp_path))
    assert minari.MinariDataset(os.path.join(written[0], "data")).total_steps == 60
    with pytest.raises(OfflineDataError, match="RLlib-packed"):
        offline_convert(os.path.join(RLLIB, "rows_packed"), to="json", out=str(tmp_path / "j"))
    out = offline_convert(os.path.join(RLLIB, "rows_packed"), to="json", out=str(tmp_path / "j"),
                          allow_pickle=True)  # fmt: skip
    assert len(out) == 1

    # The row check compares what was written with the input: break the writer's output.
    import envrunners.offline.cli_commands as cli

    real = cli._d4rl_columns

    def shifted(data, where):
        cols = real(data, where)
        cols["rewards"] = cols["rewards"] + 1.0
        return cols

    monkeypatch.setattr(cli, "_d4rl_columns", shifted)
    with pytest.raises(OfflineDataError, match=r"does not match the input \(parquet\).*rewards"):
        offline_convert(os.path.join(RLLIB, "rows"), to="d4rl", out=str(tmp_path / "d"))


def test_convert_cli_subprocess(minari_dir, tmp_path):
    out = tmp_path / "pq"
    proc = subprocess.run(
        [sys.executable, "-m", "envrunners.offline.cli_commands", "convert", minari_dir,
         "--to", "parquet-episodes", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(".parquet")
    bad = subprocess.run(
        [sys.executable, "-m", "envrunners.offline.cli_commands", "convert",
         os.path.join(RLLIB, "rows_packed"), "--to", "json", "--out", str(tmp_path / "j")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert bad.returncode == 1 and "allow_pickle=True" in bad.stderr


def test_write_minari_keeps_dict_observations_and_actions(tmp_path, dict_space_episodes):
    from tests.envs.simple import DictSpacesEnv

    from envrunners.offline.minari_io import read_minari_episodes, write_minari

    episodes = dict_space_episodes
    path = write_minari(episodes, str(tmp_path), "test/dict-spaces-v0")
    back = list(read_minari_episodes(path))
    assert len(back) == 3
    for ep, orig in zip(back, episodes, strict=True):
        assert len(ep) == len(orig) and ep.observation_space == DictSpacesEnv.observation_space
        for key in ("pos", "t"):
            np.testing.assert_array_equal(ep.get_observations()[key], orig.get_observations()[key])
        for key in ("move", "push"):
            np.testing.assert_array_equal(ep.get_actions()[key], orig.get_actions()[key])
