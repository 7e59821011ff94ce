"""``Algorithm`` / ``PPO`` / ``PG``: building, ``train()`` results, evaluation, checkpoints.

Runs are tiny (a few hundred env steps per iteration) so the file stays fast;
tests with remote runners use the shared local Ray of ``ray_session``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from envrunners.algorithms import algorithm as algorithm_module
from envrunners.algorithms.algorithm import Algorithm
from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.algorithms.pg import PG, PGConfig
from envrunners.algorithms.ppo import PPO, PPOConfig
from envrunners.errors import ConfigError, EnvRunnersError


def _config(num_env_runners: int = 0, **evaluation) -> PPOConfig:
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=num_env_runners, rollout_fragment_length="auto")
        .training(train_batch_size=256, minibatch_size=64, num_epochs=2)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=0)
    )
    if evaluation:
        config.evaluation(**evaluation)
    return config


@pytest.fixture
def algo():
    algo = _config().build_algo()
    yield algo
    algo.stop()


def _flat(weights: dict) -> dict:
    out = {}
    for key, value in weights.items():
        if isinstance(value, dict):
            out.update({f"{key}/{k}": v for k, v in _flat(value).items()})
        else:
            out[key] = np.asarray(value)
    return out


def _same_weights(a: dict, b: dict) -> bool:
    fa, fb = _flat(a), _flat(b)
    return fa.keys() == fb.keys() and all(np.array_equal(fa[k], fb[k]) for k in fa)


# ---------------------------------------------------------------------- building
def test_build_algo_builds_ppo_with_a_frozen_copy_of_the_config(algo):
    assert type(algo) is PPO
    assert isinstance(algo, Algorithm)
    assert algo.config.is_frozen
    assert algo.env_runner_group.local_env_runner is algo.env_runner
    assert algo.get_module() is not None
    assert algo.get_module("no_such_module") is None


def test_ppo_config_keyword_and_deprecated_build_alias():
    direct = PPO(config=_config())
    try:
        assert type(direct) is PPO and direct.config.train_batch_size == 256
    finally:
        direct.stop()
    with pytest.warns(DeprecationWarning, match="build_algo"):
        old = _config().build()
    try:
        assert type(old) is PPO
    finally:
        old.stop()


def test_pg_config_builds_pg_and_trains():
    config = (
        PGConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(train_batch_size=200)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        assert type(algo) is PG
        result = algo.train()
        assert "policy_loss" in result["learners"]["default_policy"]
        assert result["num_env_steps_sampled_lifetime"] == 200
    finally:
        algo.stop()


def test_base_config_without_an_algorithm_class_is_refused():
    with pytest.raises(ConfigError, match="names no algorithm class"):
        AlgorithmConfig().environment("CartPole-v1").build_algo()


def test_remote_learners_are_refused_with_a_config_error():
    with pytest.raises(ConfigError, match="num_learners=2"):
        _config().learners(num_learners=2).build_algo()


def test_gpus_on_a_machine_without_them_are_refused(monkeypatch):
    monkeypatch.setattr(algorithm_module, "_cuda_available", lambda: False)
    with pytest.raises(ConfigError, match="GPU"):
        _config().learners(num_gpus_per_learner=1).build_algo()


# ---------------------------------------------------------------------- train()
def test_train_returns_rllib_result_layout(algo):
    first = algo.train()
    result = algo.train()
    runners = result["env_runners"]
    for key in ("episode_return_mean", "episode_return_min", "episode_return_max"):
        assert math.isfinite(runners[key])
    assert runners["episode_return_min"] <= runners["episode_return_mean"]
    assert runners["episode_return_mean"] <= runners["episode_return_max"]
    assert runners["episode_len_mean"] == pytest.approx(runners["episode_return_mean"])
    assert runners["num_env_steps_sampled"] == 256
    assert first["num_env_steps_sampled_lifetime"] == 256
    assert result["num_env_steps_sampled_lifetime"] == 512
    assert runners["num_env_steps_sampled_lifetime"] == 512
    losses = result["learners"]["default_policy"]
    for key in ("policy_loss", "vf_loss", "total_loss", "entropy", "mean_kl_loss"):
        assert math.isfinite(losses[key])
    assert result["learners"]["__all_modules__"]["num_env_steps_trained_lifetime"] == 512
    for key in ("training_iteration", "env_runner_sampling_timer", "learner_update_timer"):
        assert result["timers"][key] >= 0.0
    assert first["training_iteration"] == 1 and result["training_iteration"] == 2
    assert algo.training_iteration == 2
    assert result["config"]["train_batch_size"] == 256
    assert "evaluation" not in result


def test_train_with_remote_runners_and_evaluation_interval(ray_session):
    config = _config(  # 1 + 1 runners: ray_session has 2 CPUs
        num_env_runners=1,
        evaluation_interval=2,
        evaluation_num_env_runners=1,
        evaluation_duration=3,
        evaluation_duration_unit="episodes",
    )
    algo = config.build_algo()
    try:
        assert algo.eval_env_runner_group.num_remote_env_runners() == 1
        first = algo.train()
        second = algo.train()
        assert "evaluation" not in first
        assert first["fault_tolerance"]["num_healthy_workers"] == 1
        assert first["env_runners"]["num_env_steps_sampled"] == 256
        evaluation = second["evaluation"]["env_runners"]
        assert evaluation["num_episodes"] >= 3
        assert math.isfinite(evaluation["episode_return_mean"])
        assert (
            evaluation["weights_seq_no"] == second["learners"]["default_policy"]["weights_seq_no"]
        )
    finally:
        algo.stop()


# ---------------------------------------------------------------------- evaluate()
def test_evaluate_in_timesteps_with_evaluation_config_overrides(algo):
    algo.train()
    config = _config(
        evaluation_duration=50,
        evaluation_duration_unit="timesteps",
        evaluation_config={"explore": False},
    )
    evaluator = config.build_algo()
    try:
        result = evaluator.evaluate()
        assert set(result) >= {"env_runners"}
        assert result["env_runners"]["num_env_steps_sampled"] == 50
        assert evaluator.eval_env_runner_group.local_env_runner.config.explore is False
        assert evaluator.env_runner.config.explore is True
    finally:
        evaluator.stop()


def test_custom_evaluation_function_gets_the_algorithm_and_the_evaluation_group():
    seen = []

    def custom(algorithm, group):
        seen.append((algorithm, group))
        return {"my_metric": 1.0}, 7, 7

    config = _config(evaluation_interval=1, custom_evaluation_function=custom)
    custom_algo = config.build_algo()
    try:
        result = custom_algo.train()
        assert result["evaluation"] == {"my_metric": 1.0}
        assert seen == [(custom_algo, custom_algo.eval_env_runner_group)]
    finally:
        custom_algo.stop()
    bad = _config(custom_evaluation_function=lambda a, g: {"x": 1}).build_algo()
    try:
        with pytest.raises(ValueError, match="env_steps, agent_steps"):
            bad.evaluate()
    finally:
        bad.stop()


def test_parallel_evaluation_is_refused():
    with pytest.raises(ConfigError, match="evaluation_parallel_to_training"):
        _config(evaluation_parallel_to_training=True, evaluation_interval=1).build_algo()


# ---------------------------------------------------------------------- weights, checkpoints
def test_get_and_set_weights_reach_the_runners(algo):
    other = _config().debugging(seed=1).build_algo()
    try:
        assert not _same_weights(algo.get_weights(), other.get_weights())
        other.set_weights(algo.get_weights())
        assert _same_weights(algo.get_weights(), other.get_weights())
        runner_state = other.env_runner.module.get_state()
        learner_state = other.learner.module.get_state(inference_only=True)
        assert _same_weights(runner_state, learner_state)
    finally:
        other.stop()


def test_checkpoint_restores_weights_counters_and_greedy_return(tmp_path):
    config = _config(evaluation_duration=2, evaluation_config={"explore": False}).env_runners(
        observation_filter="MeanStdFilter"
    )
    algo = config.build_algo()
    try:
        for _ in range(2):
            algo.train()
        path = algo.save_to_path(tmp_path / "ckpt")
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
            "arrays.npz",
            "metadata.json",
            "state.json",
        ]
        expected = algo.evaluate()["env_runners"]["episode_return_mean"]
        restored = Algorithm.from_checkpoint(path)
    finally:
        algo.stop()
    try:
        assert type(restored) is PPO
        assert restored.config.train_batch_size == 256
        assert restored.config.observation_filter == "MeanStdFilter"
        assert restored.training_iteration == 2
        assert _same_weights(restored.get_weights(), algo.get_weights())
        greedy = restored.evaluate()["env_runners"]["episode_return_mean"]
        assert greedy == expected
        result = restored.train()
        assert result["training_iteration"] == 3
        assert result["num_env_steps_sampled_lifetime"] == 3 * 256
    finally:
        restored.stop()


def test_restore_from_path_into_a_running_algorithm(tmp_path, algo):
    algo.train()
    algo.save_to_path(tmp_path / "ckpt")
    fresh = _config().debugging(seed=3).build_algo()
    try:
        fresh.restore_from_path(tmp_path / "ckpt")
        assert _same_weights(fresh.get_weights(), algo.get_weights())
        assert fresh.training_iteration == 1
    finally:
        fresh.stop()


def test_from_checkpoint_refuses_a_foreign_directory(tmp_path):
    from envrunners.utils.checkpoints import save_state

    save_state(tmp_path / "other", {"x": 1}, {"format": "something-else"})
    with pytest.raises(EnvRunnersError, match="not an Algorithm checkpoint"):
        Algorithm.from_checkpoint(tmp_path / "other")


# ---------------------------------------------------------------------- solving CartPole
def test_rllib_script_example_solves_cartpole_and_restores_the_greedy_return():
    """``examples/rllib_script.py`` in-process: mean return >= 450 (about 50 iterations)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "rllib_script.py"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, str(script), "--num-env-runners", "0", "--iterations", "100"],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "solved CartPole-v1" in proc.stdout, proc.stdout[-2000:]
    greedy, restored = proc.stdout.split("greedy return ")[1].split("; restored from ")
    assert float(greedy) == float(restored.rsplit(": ", 1)[1])
