"""``envrunners evaluate`` and ``train``'s per-env presets, end to end with tiny budgets.

A checkpoint comes from ``config.build_algo()`` (one PPO iteration on CartPole,
``save_to_path``); the command runs in a subprocess and its summary table is
read back; a recorded CartPole video is decoded and its frames counted. Bad
checkpoints and a missing display run in-process through ``cli.main`` (same
code path) and pin the exit code and the one-line message.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from tests.test_cli import REPO, TINY, run_cli

from envrunners import cli
from envrunners._cli import presets
from envrunners.algorithms.algorithm import Algorithm
from envrunners.utils.checkpoints import load_state, save_state


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A PPO CartPole checkpoint after one tiny training iteration (in-process)."""
    from envrunners.algorithms.ppo import PPOConfig

    path = tmp_path_factory.mktemp("algo") / "ckpt"
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length="auto")
        .training(train_batch_size=256, minibatch_size=64, num_epochs=1)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        algo.train()
        algo.save_to_path(path)
    finally:
        algo.stop()
    return path


def table_value(stdout: str, label: str) -> str:
    """The cell right of ``label`` in the command's summary table."""
    match = re.search(rf"{re.escape(label)}\s*[│|]\s*(.+?)\s*[│|]", stdout)
    assert match, f"no {label!r} row in:\n{stdout}"
    return match.group(1)


def test_evaluate_prints_the_table_and_records_one_video_per_episode(checkpoint, tmp_path):
    """A run directory (checkpoint in ``checkpoint/``) works; each mp4 holds the reset
    frame plus one frame per step."""
    iio = pytest.importorskip("imageio.v3")
    pytest.importorskip("moviepy")
    pytest.importorskip("pygame")
    run_dir = tmp_path / "run"
    shutil.copytree(checkpoint, run_dir / "checkpoint")
    videos = tmp_path / "videos"
    proc = run_cli("evaluate", str(run_dir), "--episodes", "3", "--greedy", "--seed", "3",
                   "--video", str(videos))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert table_value(out, "episodes") == "3"
    assert table_value(out, "env") == "CartPole-v1"
    assert table_value(out, "actions") == "greedy"
    assert table_value(out, "runners") == "in-process"
    mean, std = (float(x) for x in table_value(out, "return mean ± std").split("±"))
    low, high = (float(x) for x in table_value(out, "return min / max").split("/"))
    assert 1 <= low <= mean <= high <= 500 and std >= 0
    # CartPole pays 1 per step: the mean length is the mean return.
    assert float(table_value(out, "episode length mean")) == pytest.approx(mean, abs=0.051)
    files = sorted(videos.glob("*.mp4"))
    assert [f.name for f in files] == [f"runner0-episode-{i}.mp4" for i in range(3)]
    assert table_value(out, "videos").startswith("3 mp4 file(s)")
    frames = [sum(1 for _ in iio.imiter(f)) for f in files]
    assert sum(n - 1 for n in frames) == round(mean * 3), frames
    if low == high:  # all episodes equally long: each video has exactly length + 1 frames
        assert frames == [int(low) + 1] * 3
    first = next(iter(iio.imiter(files[0])))
    assert first.ndim == 3 and first.shape[2] == 3  # RGB frames of CartPole's render


def test_evaluate_explores_in_process(checkpoint, capsys):
    code = cli.main(["evaluate", str(checkpoint), "--episodes", "2", "--explore", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert table_value(out, "actions") == "explore (sampled)"
    assert table_value(out, "episodes") == "2"


def _main(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    return code, err


def test_bad_checkpoints_are_one_line_errors(checkpoint, tmp_path, capsys):
    code, err = _main(capsys, "evaluate", str(tmp_path / "missing"))
    assert code == 2 and "no such file or directory" in err
    code, err = _main(capsys, "evaluate", str(tmp_path))
    assert code == 2 and "not a checkpoint directory" in err
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    (broken / "arrays.npz").write_bytes(b"not a zip file")
    code, err = _main(capsys, "evaluate", str(broken))
    assert code == 2 and "unreadable or corrupt" in err
    (broken / "state.json").write_text("{")
    code, err = _main(capsys, "evaluate", str(broken))
    assert code == 2 and "unreadable or corrupt" in err
    foreign = tmp_path / "foreign"
    save_state(foreign, {"x": 1}, {"format": "something-else"})
    code, err = _main(capsys, "evaluate", str(foreign))
    assert code == 2 and "'something-else' is not an Algorithm checkpoint" in err
    old = tmp_path / "old"
    state, _ = load_state(checkpoint)
    save_state(old, state, {"format": "envrunners-train-checkpoint"})
    code, err = _main(capsys, "evaluate", str(old))
    assert code == 2 and "older `envrunners train`" in err
    renamed = tmp_path / "renamed"
    save_state(renamed, state, {**load_state(checkpoint)[1], "algo_class": "nowhere.mod:PPO"})
    code, err = _main(capsys, "evaluate", str(renamed))
    assert code == 2 and "algo_class 'nowhere.mod:PPO' cannot be imported" in err
    runs = tmp_path / "runs"
    shutil.copytree(checkpoint, runs / "a")
    shutil.copytree(checkpoint, runs / "b")
    code, err = _main(capsys, "evaluate", str(runs))
    assert code == 2 and "several checkpoints in it (a, b); name one" in err
    assert "Traceback" not in err and err.count("\n") == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="DISPLAY is X11/Wayland's")
def test_render_human_without_a_display_is_a_usage_error(checkpoint, capsys, monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    code, err = _main(capsys, "evaluate", str(checkpoint), "--render", "human")
    assert code == 2
    assert err.strip() == (
        "envrunners evaluate: error: --render human needs a display, but DISPLAY is not set "
        "(record mp4 files with --video DIR instead)"
    )


# ---------------------------------------------------------------------- presets
def test_presets_translate_rl_zoo_keys():
    pend = presets.train_settings("Pendulum-v1", "ppo")
    assert pend["gamma"] == 0.9 and pend["lr"] == 1e-3 and pend["stop_timesteps"] == 100_000
    assert pend["train_batch_size"] == 4096 and pend["minibatch_size"] == 64
    assert presets.train_settings("Pendulum-v1", "pg") == {}  # PPO settings only
    assert presets.train_settings("CartPole-v1", "ppo") == {}
    hopper = presets.train_settings("Hopper-v5", "ppo")  # tuned on -v3: the whole family
    assert hopper["obs_filter"] == "MeanStdFilter" and hopper["hidden"] == [256, 256]
    run = {"env": "Hopper-v4", "algo": "ppo"}
    assert presets.training_settings(run)["grad_clip"] == 0.7
    assert presets.model_settings(run) == {
        "fcnet_activation": "relu", "vf_share_layers": False, "free_log_std": True,
    }  # fmt: skip
    inverted = presets.train_settings("InvertedPendulum-v5", "ppo")
    assert inverted["minibatch_size"] == inverted["train_batch_size"] == 32
    assert presets.find_preset("ALE/Hopper-v5") is None


def test_train_uses_the_pendulum_preset_and_states_its_budget(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("train", "--env", "Pendulum-v1", *TINY, "--stop-timesteps", "300",
                   "--no-progress", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Training PPO on Pendulum-v1 until 300 env steps")
    first = proc.stderr.splitlines()[0]  # the note goes to stderr, before the first line
    assert first.startswith("Tuned PPO settings for Pendulum-v1 from RL Baselines3 Zoo")
    assert "Pendulum-v1 has no reward threshold: the run stops after 300 env steps" in first
    run = json.loads((out / "run.json").read_text())
    assert run["gamma"] == 0.9  # from the preset; --train-batch-size etc. from flags
    assert run["train_batch_size"] == 256
    algo = Algorithm.from_checkpoint(out / "checkpoint")  # and the trained config used them
    try:
        assert algo.config.gamma == 0.9 and algo.config.train_batch_size == 256
    finally:
        algo.stop()


def test_pettingzoo_extra_brings_what_its_envs_import():
    text = (REPO / "pyproject.toml").read_text()  # no tomllib: Python 3.10 is supported

    def extra(name: str) -> str:
        match = re.search(rf"^{name} = \[(.*)\]$", text, re.MULTILINE)
        assert match, f"no {name!r} extra in pyproject.toml"
        return match.group(1)

    assert '"pygame' in extra("pettingzoo") and '"pymunk' in extra("pettingzoo")
    assert '"moviepy' in extra("video") and '"imageio-ffmpeg' in extra("video")
    assert '"gymnasium[mujoco]' in extra("mujoco")
    assert 'pip install -e ".[pettingzoo]"' in (REPO / "README.md").read_text()
