"""The CLI's recurrent PPO (``--use-lstm``) and Atari ids (``ale_py:ALE/Pong-v5``, ``ALE/Pong-v5``).

Tiny budgets only: these check that the commands start, wrap, say so and write a
checkpoint whose settings a resume keeps; whether the LSTM learns is measured by
``examples/stateless_cartpole_lstm.py``, never here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envrunners import cli
from envrunners._cli import atari_env, train
from envrunners._cli.train_checkpoint import save_run_settings
from envrunners.utils.checkpoints import load_state, save_state
from test_cli import _main, read_csv, run_cli, run_settings

pytest.importorskip("ale_py")

TINY_LSTM = [
    "--num-env-runners", "0", "--num-envs-per-env-runner", "4", "--train-batch-size", "128",
    "--minibatch-size", "64", "--num-epochs", "1", "--seed", "1", "--use-lstm",
    "--lstm-cell-size", "16", "--max-seq-len", "8",
]  # fmt: skip
WRAP_LINE = "with Atari wrapping (wrap_atari_for_new_api_stack: 84x84 grayscale"


# ---------------------------------------------------------------------- settings
def _settings(*argv: str) -> dict:
    args = cli.build_parser().parse_args(["train", *argv])
    run, _, _ = train._settings(args)
    return run


def test_lstm_flags_reach_the_model_config(tmp_path):
    run = _settings("--env", "envrunners/StatelessCartPole-v1", *TINY_LSTM, "--out", str(tmp_path))
    assert (run["use_lstm"], run["lstm_cell_size"], run["max_seq_len"]) == (True, 16, 8)
    config = train.build_config(run)
    assert config.model_config["use_lstm"] is True
    assert config.model_config["lstm_cell_size"] == 16
    assert config.model_config["max_seq_len"] == 8
    # Without --use-lstm the model config is what it always was.
    plain = _settings("--env", "CartPole-v1", "--out", str(tmp_path / "plain"))
    assert plain["use_lstm"] is False
    assert train.model_config(plain) == {"fcnet_hiddens": [64, 64]}


def _fake_run(tmp_path: Path, **run) -> Path:
    """A run directory with its settings and a stub checkpoint (enough for ``_settings``)."""
    out = tmp_path / "run"
    out.mkdir(parents=True)
    settings = {**train.DEFAULTS, "env": "envrunners/StatelessCartPole-v1", **run}
    save_run_settings(out, settings)
    save_state(out / "checkpoint", {"progress": {"training_iteration": 1}},
               {"format": "envrunners-algorithm-checkpoint"})  # fmt: skip
    return out


def test_resume_keeps_the_lstm_settings(tmp_path):
    out = _fake_run(tmp_path, use_lstm=True, lstm_cell_size=16, max_seq_len=8)
    run = _settings("--resume", str(out))
    assert (run["use_lstm"], run["lstm_cell_size"], run["max_seq_len"]) == (True, 16, 8)
    # max_seq_len only shapes the training sequences: a resume may change it.
    assert _settings("--resume", str(out), "--max-seq-len", "4")["max_seq_len"] == 4


def test_resume_refuses_another_network(capsys, tmp_path):
    out = _fake_run(tmp_path, use_lstm=True, lstm_cell_size=16)
    code, _, err = _main(capsys, "train", "--resume", str(out), "--lstm-cell-size", "32")
    assert (
        code == 2
        and "--lstm-cell-size 32 differs from the resumed run's --lstm-cell-size 16" in err
    )
    plain = _fake_run(tmp_path / "p", use_lstm=False)
    code, _, err = _main(capsys, "train", "--resume", str(plain), "--use-lstm")
    assert code == 2 and "--use-lstm differs from the resumed run's no --use-lstm" in err


@pytest.mark.parametrize("bad", ["0", "-1", "x"])
def test_bad_lstm_numbers_are_argparse_errors(capsys, bad):
    code, _, err = _main(capsys, "train", "--env", "CartPole-v1", "--max-seq-len", bad)
    assert code == 2 and "--max-seq-len" in err


def test_train_lstm_resume_and_sample(tmp_path):
    out = tmp_path / "lstm"
    proc = run_cli("train", "--env", "envrunners/StatelessCartPole-v1", *TINY_LSTM,
                   "--stop-timesteps", "256", "--no-progress", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("Training PPO (LSTM policy) on envrunners/StatelessCartPole-v1")
    state, _ = load_state(out / "checkpoint")
    assert "lstm.weight_hh_l0" in state["learner"]["rl_module"]
    settings = run_settings(out)
    assert (settings["use_lstm"], settings["lstm_cell_size"]) == (True, 16)
    rows = read_csv(out / "metrics.csv")
    assert len(rows) == 2 and rows[-1]["policy_loss"] and rows[-1]["vf_loss"]
    # Resume without the flags: the checkpoint's LSTM settings and weights carry on.
    proc = run_cli("train", "--resume", str(out), "--stop-timesteps", "384", "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("Resuming PPO (LSTM policy)")
    assert int(read_csv(out / "metrics.csv")[-1]["env_steps"]) >= 384
    proc = run_cli("sample", "--env", "envrunners/StatelessCartPole-v1", "--checkpoint",
                   str(out), "--num-env-runners", "0", "--timesteps", "64")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]


# ---------------------------------------------------------------------- Atari
def test_atari_ids_get_the_wrapping():
    assert atari_env.wrapping_note("CartPole-v1") == ""
    for env_id in ("ale_py:ALE/Pong-v5", "ALE/Pong-v5"):
        assert WRAP_LINE in atari_env.wrapping_note(env_id)
        env = atari_env.config_env(env_id)({})
        try:
            assert env.observation_space.shape == (84, 84, 4)
            assert env.unwrapped.get_action_meanings()[:2] == ["NOOP", "FIRE"]
        finally:
            env.close()
    assert atari_env.config_env("CartPole-v1") == "CartPole-v1"


def test_train_pong_wraps_says_so_and_checkpoints(tmp_path):
    out = tmp_path / "pong"
    proc = run_cli(
        "train", "--env", "ale_py:ALE/Pong-v5", "--num-env-runners", "0",
        "--num-envs-per-env-runner", "2", "--train-batch-size", "16", "--minibatch-size", "16",
        "--num-epochs", "1", "--stop-timesteps", "16", "--seed", "0", "--no-progress",
        "--out", str(out), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith("Training PPO on ale_py:ALE/Pong-v5 " + WRAP_LINE), first
    assert "default CNN" in first
    state, _ = load_state(out / "checkpoint")
    assert run_settings(out)["env"] == "ale_py:ALE/Pong-v5"
    weights = state["learner"]["rl_module"]
    assert any(k.startswith("encoder.convs.") for k in weights)  # the default CNN, no MLP
    assert weights["encoder.convs.1.weight"].shape[1] == 4  # 4 stacked frames in
    assert len(read_csv(out / "metrics.csv")) == 1
    # `sample` acts with it on the id without the module prefix, and says so too.
    proc = run_cli(
        "sample", "--env", "ALE/Pong-v5", "--checkpoint", str(out), "--num-env-runners", "0",
        "--num-envs-per-env-runner", "2", "--timesteps", "8", timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0].startswith("Sampling ALE/Pong-v5 " + WRAP_LINE)
