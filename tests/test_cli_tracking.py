"""Experiment-tracking loggers (``envrunners.callbacks.loggers``) on real ``Algorithm`` results.

One tiny in-process PPO iteration gives a real RLlib-shaped result; each logger
writes it and the files are read back with the tool's own reader (TensorBoard's
``EventAccumulator``, MLflow's client). W&B and MLflow run only where their
optional extras are installed. The same checkpoint feeds ``sample --checkpoint``.
"""

from __future__ import annotations

import csv
import importlib.util
import pickle

import pytest

from envrunners import cli
from envrunners.callbacks.loggers import (
    CSVLogger,
    LoggerCallback,
    TensorBoardLogger,
    flatten_result,
    make_loggers,
)
from envrunners.errors import UnknownLoggerError


@pytest.fixture(scope="module")
def algo_and_result():
    from envrunners.algorithms.ppo import PPOConfig

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=64)
        .training(train_batch_size=128, minibatch_size=64, num_epochs=1)
        .rl_module(model_config={"fcnet_hiddens": [16], "head_fcnet_hiddens": [8]})
        .callbacks(LoggerCallback)  # runners build it with no arguments; it stays idle there
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        yield algo, algo.train()
    finally:
        algo.stop()


def test_flatten_uses_rllib_keys(algo_and_result):
    _, result = algo_and_result
    flat = flatten_result(result)
    assert isinstance(flat["env_runners/episode_return_mean"], float)
    assert flat["training_iteration"] == 1
    assert "learners/default_policy/policy_loss" in flat
    assert not any(k.startswith("config") for k in flat) and "pid" not in flat


def test_tensorboard_logger_events_read_back(algo_and_result, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, result = algo_and_result
    with TensorBoardLogger(tmp_path) as tb:
        tb.log_result(result)
        again = pickle.loads(pickle.dumps(tb))  # picklable once open: settings only
    assert again.logdir == tmp_path and not again._opened
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    [scalar] = events.Scalars("env_runners/episode_return_mean")
    assert scalar.step == 1
    assert scalar.value == pytest.approx(result["env_runners"]["episode_return_mean"])


def test_logger_callback_and_csv(algo_and_result, tmp_path):
    algo, result = algo_and_result
    callback_class = LoggerCallback.to(tmp_path / "cb", loggers=["csv"])
    assert issubclass(callback_class, LoggerCallback) and callback_class.loggers == ("csv",)
    callback = callback_class()
    callback.on_train_result(algorithm=algo, metrics_logger=None, result=result)
    callback.close()
    with open(tmp_path / "cb" / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and float(rows[-1]["env_runners/episode_return_mean"]) == pytest.approx(
        result["env_runners"]["episode_return_mean"]
    )
    with CSVLogger(tmp_path / "direct") as logger:  # a second result appends under one header
        logger.log_result(result)
        logger.log_result({**result, "training_iteration": 2})
    with open(tmp_path / "direct" / "progress.csv", newline="") as f:
        assert [r["training_iteration"] for r in csv.DictReader(f)] == ["1", "2"]


def test_unknown_logger_names_the_choices(tmp_path):
    with pytest.raises(UnknownLoggerError, match="unknown logger 'tensorbord'.*'tensorboard'"):
        make_loggers(["tensorbord"], tmp_path)
    with pytest.raises(ValueError, match="expected one of csv, tensorboard, wandb, mlflow"):
        LoggerCallback.to(tmp_path, loggers=["csvv"])


def test_mlflow_logger_local_file_store(algo_and_result, tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from envrunners.callbacks.loggers import MLflowLogger

    _, result = algo_and_result
    logger = MLflowLogger(tmp_path)
    logger.log_result(result)
    run_id = logger._run_id
    logger.close()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    history = client.get_metric_history(run_id, "env_runners/episode_return_mean")
    assert [m.step for m in history] == [1]


def test_wandb_logger_offline(algo_and_result, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from envrunners.callbacks.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _, result = algo_and_result
    with WandbLogger(tmp_path, project="envrunners-test") as logger:
        logger.log_result(result)
    assert list((tmp_path / "wandb").glob("offline-run-*"))


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_cli_logger_without_its_package(capsys):
    code = cli.main(["train", "--env", "CartPole-v1", "--logger", "csv,wandb"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "pip install 'envrunners[wandb]'" in err


def test_sample_acts_with_an_api_checkpoint(algo_and_result, tmp_path, capsys):
    """A ``save_to_path`` checkpoint (no run.json): ``sample`` reads the network from its config."""
    algo, _ = algo_and_result
    path = algo.save_to_path(tmp_path / "ckpt")
    code = cli.main(["sample", "--env", "CartPole-v1", "--checkpoint", path,
                     "--num-env-runners", "0", "--num-envs-per-env-runner", "2",
                     "--timesteps", "50"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"checkpoint {path}" in out
