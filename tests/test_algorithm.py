"""``Algorithm`` / ``PPO`` / ``PG``: building, ``train()`` results, evaluation, checkpoints.

Runs are tiny (a few hundred env steps per iteration) so the file stays fast;
tests with remote runners use the shared local Ray of ``ray_session``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from envrunners.algorithms import algorithm as algorithm_module
from envrunners.algorithms.algorithm import Algorithm
from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.algorithms.pg import PG, PGConfig
from envrunners.algorithms.ppo import PPO, PPOConfig
from envrunners.env.multi_agent_env import make_multi_agent
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
    # RLlib 2.60 raises TypeError here ('NoneType' object is not callable).
    with pytest.raises(TypeError, match="PPOConfig"):
        AlgorithmConfig().environment("CartPole-v1").build_algo()


def test_remote_learners_are_refused_with_a_config_error():
    with pytest.raises(ConfigError, match="num_learners=2"):
        _config().learners(num_learners=2).build_algo()


def test_gpus_on_a_machine_without_them_are_refused(monkeypatch):
    monkeypatch.setattr(algorithm_module, "_cuda_available", lambda: False)
    with pytest.raises(ConfigError, match="GPU"):
        _config().learners(num_gpus_per_learner=1).build_algo()
    monkeypatch.setattr(algorithm_module, "_cuda_available", lambda: True)
    with pytest.raises(ConfigError, match="learners train on the CPU"):
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


def test_train_result_has_rllibs_keys(algo):
    """The keys RLlib 2.60's PPO result has (compared side by side), with their shapes."""
    algo.train()
    result = algo.train()
    runners, learners = result["env_runners"], result["learners"]
    throughput = runners["num_env_steps_sampled_lifetime_throughput"]
    assert set(throughput) == {"throughput_since_last_reduce", "throughput_since_last_restore"}
    # 256 steps in this iteration, 512 since the start: both rates are of those counts.
    per_iteration = 256 / result["time_this_iter_s"]  # the reads are about an iteration apart
    assert 0 < throughput["throughput_since_last_reduce"] <= 1.05 * per_iteration
    assert throughput["throughput_since_last_restore"] <= 512 / result["time_total_s"]
    everything = learners["__all_modules__"]
    num_params = sum(p.numel() for p in algo.learner.module.parameters())
    assert everything["num_trainable_parameters"] == num_params
    assert everything["num_non_trainable_parameters"] == 0
    assert everything["num_module_steps_trained_lifetime"] == 512
    for key in ("num_env_steps_trained", "num_module_steps_trained"):
        assert everything[f"{key}_throughput"] == pytest.approx(
            everything[f"{key}_lifetime_throughput"]["throughput_since_last_reduce"]
        )
        assert everything[f"{key}_throughput"] > 0
    module = learners["default_policy"]
    assert module["module_train_batch_size_mean"] == 64  # 256 steps in minibatches of 64
    assert module["vf_loss_unclipped"] >= module["vf_loss"]  # vf_clip_param=10 clips it
    # Sampled with the weights of the previous update, trained by this one: 1 version.
    assert module["diff_num_grad_updates_vs_sampler_policy"] == 1.0
    assert set(module["num_module_steps_trained_lifetime_throughput"]) == set(throughput)
    assert result["fault_tolerance"]["num_env_runners_dropped_lifetime"] == 0
    assert result["timers"]["synch_env_connectors"] >= 0.0
    assert isinstance(result["node_ip"], str) and result["node_ip"]
    assert set(result["perf"]) <= {"cpu_util_percent", "ram_util_percent"}


def test_ppo_default_fragment_length_samples_the_train_batch():
    """RLlib's ``PPOConfig`` defaults ``rollout_fragment_length`` to ``"auto"``.

    With the base default (200 per env) a train batch of 256 from 2 envs took two
    rounds, 400 steps, and a warning; with ``"auto"`` one ``train()`` samples 256
    (as RLlib does, 257 when one env's autoreset step left a vector step one short).
    """
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=2)
        .training(train_batch_size=256, minibatch_size=64, num_epochs=1)
        .rl_module(model_config={"fcnet_hiddens": [16]})
    )
    assert config.rollout_fragment_length == "auto"
    assert config.get_rollout_fragment_length(0) == 128
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*does not fit the sampling rounds")
        algo = config.build_algo()
    try:
        # 256, or 257 when one env's autoreset step left the last vector step one short.
        assert algo.train()["env_runners"]["num_env_steps_sampled"] in (256, 257)
    finally:
        algo.stop()


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
        assert second["evaluation"]["num_healthy_workers"] == 1
        assert second["evaluation"]["num_env_runners_dropped_lifetime"] == 0
        assert second["evaluation"]["actor_manager_num_outstanding_async_reqs"] == 0
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
        # Throughputs since the restore count this run's 256 steps, not the checkpoint's.
        since_restore = result["env_runners"]["num_env_steps_sampled_lifetime_throughput"][
            "throughput_since_last_restore"
        ]
        assert 0 < since_restore <= 1.01 * 256 / result["time_this_iter_s"]
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


# ---------------------------------------------------------------------- multi-agent
MultiAgentCartPole = make_multi_agent("CartPole-v1")


def _ma_config(num_env_runners: int = 0) -> PPOConfig:
    return (
        PPOConfig()
        .environment(MultiAgentCartPole, env_config={"num_agents": 2})
        .env_runners(num_env_runners=num_env_runners, rollout_fragment_length="auto")
        .training(train_batch_size=200, minibatch_size=100, num_epochs=1)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda agent_id, episode, **kwargs: f"p{agent_id}",
            policies_to_train=["p0"],
        )
        .debugging(seed=0)
    )


def test_multi_agent_two_policies_train_on_remote_runners_with_rllib_keys(ray_session, tmp_path):
    algo = _ma_config(num_env_runners=1).build_algo()
    try:
        before = algo.get_weights()
        algo.train()
        result = algo.train()
        runners, learners = result["env_runners"], result["learners"]
        assert {str(a) for a in runners["agent_episode_returns_mean"]} == {"0", "1"}
        assert set(runners["module_episode_returns_mean"]) == {"p0", "p1"}
        assert set(runners["num_module_steps_sampled"]) == {"p0", "p1"}
        assert runners["num_env_steps_sampled_lifetime"] == 400
        assert set(learners) == {"p0", "p1", "__all_modules__"}
        trained = learners["p0"]
        for key in ("policy_loss", "vf_loss", "mean_kl_loss", "num_module_steps_trained"):
            assert math.isfinite(trained[key]), key
        # p1 is not in policies_to_train: RLlib reports only its schedules.
        assert "policy_loss" not in learners["p1"]
        # p0 (the only trained module) is one update ahead of the weights it sampled with;
        # the group's version counts, not p0's own learner's.
        assert trained["diff_num_grad_updates_vs_sampler_policy"] == 1.0
        assert "default_optimizer_learning_rate" in learners["p1"]
        assert learners["__all_modules__"]["num_env_steps_trained"] == 200
        after = algo.get_weights()
        assert not _same_weights({"p0": before["p0"]}, {"p0": after["p0"]})
        assert _same_weights({"p1": before["p1"]}, {"p1": after["p1"]})
        # The remote runner acts with the learner's p0 weights.
        remote = algo.env_runner_group.foreach_env_runner(
            lambda runner: runner.module["p0"].get_state(inference_only=True),
            local_env_runner=False,
        )[0]
        expected = algo.learner.learners["p0"].module.get_state(inference_only=True)
        assert _same_weights(remote, expected)
        assert algo.get_module("p0") is not None and algo.get_module("p2") is None
        path = algo.save_to_path(tmp_path / "ma")
    finally:
        algo.stop()
    fresh = _ma_config().debugging(seed=5).build_algo()
    try:
        fresh.restore_from_path(path)
        assert _same_weights(fresh.get_weights(), after)
        assert fresh.training_iteration == 2
        assert fresh.train()["training_iteration"] == 3
    finally:
        fresh.stop()
    with pytest.raises(ConfigError, match="restore_from_path"):
        Algorithm.from_checkpoint(path)


def test_multi_agent_shared_policy_learns():
    """Both agents of a 2-agent CartPole share one module: the return rises clearly."""
    config = (
        PPOConfig()
        .environment(MultiAgentCartPole, env_config={"num_agents": 2})
        .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length="auto")
        .training(
            train_batch_size=1000,
            minibatch_size=256,
            num_epochs=6,
            lr=3e-4,
            lambda_=0.95,
            vf_loss_coeff=0.5,
            vf_clip_param=float("inf"),
            use_kl_loss=False,
        )
        .rl_module(model_config={"fcnet_hiddens": [64, 64]})
        .multi_agent(policies={"shared"}, policy_mapping_fn=lambda aid, ep, **kw: "shared")
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        returns = [
            algo.train()["env_runners"]["module_episode_returns_mean"]["shared"] for _ in range(10)
        ]
    finally:
        algo.stop()
    assert returns[-1] > max(100.0, 2 * returns[0]), returns


# ---------------------------------------------------------------------- old API stack
def _old_stack(config: AlgorithmConfig) -> AlgorithmConfig:
    return config.api_stack(
        enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False
    )


def test_old_stack_ppo_trains_with_rllib_old_keys_and_checkpoints(ray_session, tmp_path):
    config = _old_stack(
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=1, observation_filter="MeanStdFilter")
        .training(train_batch_size=200, minibatch_size=50, num_epochs=1)
        .evaluation(evaluation_interval=2, evaluation_duration=2)
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        assert algo.get_module() is None and algo.get_policy() is not None
        algo.train()
        result = algo.train()
        runners = result["env_runners"]
        for key in ("episode_reward_mean", "episode_reward_min", "episode_len_mean"):
            assert math.isfinite(runners[key]), key
        assert runners["episode_return_mean"] == runners["episode_reward_mean"]
        assert "default_policy" in runners["policy_reward_mean"]
        assert runners["episodes_this_iter"] == runners["num_episodes"] > 0
        info = result["info"]["learner"]["default_policy"]
        stats = ("total_loss", "policy_loss", "vf_loss", "kl", "cur_kl_coeff", "cur_lr")
        for key in (*stats, "vf_explained_var"):
            assert math.isfinite(info["learner_stats"][key]), key
        assert info["num_agent_steps_trained"] == 200
        assert info["diff_num_grad_updates_vs_sampler_policy"] == 1.5  # 4 minibatches
        assert result["counters"]["num_env_steps_sampled"] == 400
        assert result["num_env_steps_sampled_this_iter"] == 200
        assert result["timesteps_total"] == result["num_env_steps_trained"] == 400
        assert result["timers"]["learn_time_ms"] > 0
        assert result["evaluation"]["env_runners"]["num_episodes"] >= 2
        path = algo.save_to_path(tmp_path / "old")
        weights = algo.get_weights()
        # The remote worker's filter statistics reached the driver's filter.
        filter_state = algo.env_runner.filters["default_policy"].get_state()
        assert filter_state["running_stats"]["num_pushes"] >= 400
    finally:
        algo.stop()
    restored = config.copy().env_runners(num_env_runners=0).build_algo()  # no 2nd actor
    try:
        restored.restore_from_path(path)
        assert restored.training_iteration == 2
        assert _same_weights(restored.get_weights(), weights)
        assert _same_weights(
            restored.env_runner.filters["default_policy"].get_state(), filter_state
        )
        assert restored.train()["counters"]["num_env_steps_sampled"] == 600
    finally:
        restored.stop()


def test_old_stack_pg_builds_its_policy_trains_and_comes_back_from_a_checkpoint(tmp_path):
    config = _old_stack(
        PGConfig().environment("CartPole-v1").env_runners(num_env_runners=0)
    ).training(train_batch_size=100)
    algo = config.build_algo()
    try:
        assert type(algo.get_policy()).__name__ == "PGTorchPolicy"
        info = algo.train()["info"]["learner"]["default_policy"]["learner_stats"]
        assert math.isfinite(info["policy_loss"])
        path = algo.save_to_path(tmp_path / "pg")
        weights = algo.get_weights()
    finally:
        algo.stop()
    restored = Algorithm.from_checkpoint(path)
    try:
        assert type(restored) is PG and restored.training_iteration == 1
        assert _same_weights(restored.get_weights(), weights)
    finally:
        restored.stop()


# ---------------------------------------------------------------------- algorithm-level keys
def test_min_timesteps_per_iteration_repeat_the_training_step():
    config = _config().training(train_batch_size=100, minibatch_size=50, num_epochs=1)
    algo = config.reporting(min_sample_timesteps_per_iteration=250).build_algo()
    try:
        result = algo.train()
        assert result["num_training_step_calls_per_iteration"] == 3
        assert result["num_env_steps_sampled_lifetime"] == 300
        assert result["env_runners"]["num_env_steps_sampled"] == 300
        assert result["learners"]["__all_modules__"]["num_env_steps_trained"] == 300
    finally:
        algo.stop()
    algo = config.reporting(
        min_sample_timesteps_per_iteration=0, min_train_timesteps_per_iteration=150
    ).build_algo()
    try:
        assert algo.train()["num_training_step_calls_per_iteration"] == 2
    finally:
        algo.stop()
    algo = config.reporting(
        min_train_timesteps_per_iteration=0, min_time_s_per_iteration=0.3
    ).build_algo()
    try:
        result = algo.train()
        assert result["time_this_iter_s"] >= 0.3
        assert result["num_training_step_calls_per_iteration"] >= 1
    finally:
        algo.stop()


class _AlgoCallbacks:
    """Records the algorithm-level events (a runner instantiates its own copy)."""

    events: list = []

    def on_algorithm_init(self, *, algorithm, metrics_logger, **kwargs):
        self.events.append(("init", algorithm.iteration))
        metrics_logger.log_value("my_init_metric", 1.0)

    def on_train_result(self, *, algorithm, metrics_logger, result, **kwargs):
        self.events.append(("train_result", result["training_iteration"]))
        result["my_key"] = 42

    def on_evaluate_start(self, *, algorithm, metrics_logger, **kwargs):
        self.events.append(("evaluate_start", algorithm.iteration))

    def on_evaluate_end(self, *, algorithm, metrics_logger, evaluation_metrics, **kwargs):
        self.events.append(("evaluate_end", "env_runners" in evaluation_metrics))

    def on_checkpoint_loaded(self, *, algorithm, **kwargs):
        self.events.append(("checkpoint_loaded", algorithm.iteration))


def test_algorithm_level_callbacks_fire_where_rllib_fires_them(tmp_path):
    _AlgoCallbacks.events = []
    seen = []
    config = _config(evaluation_interval=1, evaluation_duration=1).callbacks(
        _AlgoCallbacks, on_train_result=lambda **kw: seen.append(kw["result"]["my_key"])
    )
    algo = config.build_algo()
    try:
        result = algo.train()
        assert result["my_key"] == 42 and seen == [42]
        assert result["my_init_metric"] == 1.0  # logged on the algorithm's metrics_logger
        path = algo.save_to_path(tmp_path / "cb")
        algo.restore_from_path(path)
    finally:
        algo.stop()
    assert _AlgoCallbacks.events == [
        ("init", 0),
        ("evaluate_start", 1),
        ("evaluate_end", True),
        ("train_result", 1),
        ("checkpoint_loaded", 1),
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda c: c.env_runners(exploration_config={"type": "EpsilonGreedy"}),
            "exploration_config can not be set",
        ),
        (
            lambda c: _old_stack(c).env_runners(exploration_config={"type": "EpsilonGreedy"}),
            "not supported on the old stack",
        ),
        (
            lambda c: c.env_runners(add_default_connectors_to_env_to_module_pipeline=False),
            "add_default_connectors_to_env_to_module_pipeline=False",
        ),
        (
            lambda c: c.training(add_default_connectors_to_learner_pipeline=False),
            "add_default_connectors_to_learner_pipeline=False",
        ),
        (lambda c: c.api_stack(enable_rl_module_and_learner=False), "hybrid API stack"),
        (lambda c: c.offline_data(input_="/tmp/some/episodes"), "no offline learning"),
    ],
)
def test_keys_algorithm_cannot_honour_are_refused(change, message):
    with pytest.raises(ConfigError, match=message):
        change(_config()).build_algo()


def test_module_to_env_default_connectors_flag_is_used():
    config = (
        PPOConfig()
        .environment("Pendulum-v1")
        .env_runners(
            num_env_runners=0,
            rollout_fragment_length="auto",
            add_default_connectors_to_module_to_env_pipeline=False,
        )
        .training(train_batch_size=64, minibatch_size=64, num_epochs=1)
    )
    algo = config.build_algo()
    try:
        assert len(algo.env_runner._module_to_env) == 0  # no NormalizeAndClipActions
        algo.train()
    finally:
        algo.stop()


# ---------------------------------------------------------------------- docs
def test_coming_from_rllib_page_script_runs(capsys):
    """The envrunners script of docs/coming_from_rllib.md, 2 iterations, in-process runners."""
    from pathlib import Path

    page = Path(__file__).resolve().parents[1] / "docs" / "coming_from_rllib.md"
    text = page.read_text()
    script = text.split("<!-- envrunners-script -->\n```python\n", 1)[1].split("```", 1)[0]
    rllib = text.split("```python\n", 1)[1].split("```", 1)[0]
    # Only the imports differ from the RLlib script above it.
    assert rllib.replace("ray.rllib.", "envrunners.") == script
    short = script.replace("NUM_ITERATIONS = 20", "NUM_ITERATIONS = 2").replace(
        "num_env_runners=2", "num_env_runners=0"
    )
    assert short != script
    exec(compile(short, str(page), "exec"), {"__name__": "__docs__"})
    out = capsys.readouterr().out
    assert "greedy return" in out and "restored at iteration 2" in out
