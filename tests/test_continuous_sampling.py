"""Continuous sampling (``sample_continuously``): bounded staleness, weight versions, faults.

Real runners on the shared local Ray of ``ray_session``. Each weights version ``v``
is a policy whose logits are ``[v, 0]`` for every observation, so every step's
recorded ``action_dist_inputs`` names the weights that really produced it and can
be compared with the step's recorded ``weights_seq_no``.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from envrunners.algorithms.ppo import PPOConfig
from envrunners.env.env_runner_group import EnvRunnerGroup
from envrunners.errors import ConfigError
from envrunners.execution._continuous_sampling import TAG_PREFIX, ContinuousSampler

K = 2


def _config(**runners) -> PPOConfig:
    settings = {
        "num_env_runners": 2,
        "num_envs_per_env_runner": 2,
        "rollout_fragment_length": 16,
        "max_requests_in_flight_per_env_runner": K,
        **runners,
    }
    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(**settings)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .debugging(seed=0)
    )


def _push_version(group: EnvRunnerGroup, version: int) -> None:
    """Give the local runner weights with logits ``[version, 0]`` and push them, not waiting."""
    local = group.local_env_runner
    weights = local.get_state(components="rl_module")["rl_module"]
    module = weights.get("default_policy", weights)
    module["pi.layers.0.weight"] = np.zeros_like(module["pi.layers.0.weight"])
    module["pi.layers.0.bias"] = np.array([float(version), 0.0], np.float32)
    local.set_state({"rl_module": weights, "weights_seq_no": version})
    group.sync_weights(timeout_seconds=0)


def _steps(episode) -> tuple[np.ndarray, np.ndarray]:
    """Per step: the recorded weights version, and the version the logits encode."""
    seq = np.asarray(episode.get_extra_model_outputs("weights_seq_no"))
    logits = np.asarray(episode.get_extra_model_outputs("action_dist_inputs"))
    return seq, logits[:, 0]


def _check_outstanding(group: EnvRunnerGroup, sampler: ContinuousSampler) -> None:
    for runner_id in group.healthy_env_runner_ids():
        assert sampler.num_outstanding(runner_id) <= K
        assert group.num_in_flight_async_reqs(f"{TAG_PREFIX}{runner_id}") <= K


def test_staleness_bound_and_recorded_weight_versions(ray_session):
    group = EnvRunnerGroup(config=_config())
    try:
        sampler = ContinuousSampler(group)
        version = 1
        _push_version(group, version)
        sampler.set_weights_version(version)
        trained_steps = 0
        for _ in range(8):
            results = sampler.take(max_env_steps=32, timeout_s=60)
            _check_outstanding(group, sampler)
            assert results
            for result in results:
                staleness = version - result.weights_seq_no
                assert 0 <= staleness <= K, (version, result.weights_seq_no)
                assert result.weights_seq_no >= result.sent_version
                for episode in result.samples:
                    seq, encoded = _steps(episode)
                    # The recorded version is the one whose weights acted, step by step.
                    np.testing.assert_array_equal(seq, encoded)
                    assert (seq == result.weights_seq_no).all()
                    trained_steps += len(episode)
            # "Training": a new version, pushed while the runners are busy sampling.
            version += 1
            _push_version(group, version)
            sampler.set_weights_version(version)
            sampler.poll(0.02)
            _check_outstanding(group, sampler)
        assert trained_steps >= 8 * 32
        assert sampler.num_requests_lost == 0
        # K requests per runner are out while the driver "trains".
        assert sampler.num_in_flight() + sampler.num_queued() == K * 2
        # A jump of more than K versions (set_weights, a restore): what was sampled
        # before it is dropped, never trained, and sampling goes on with the new weights.
        version += K + 1
        _push_version(group, version)
        sampler.set_weights_version(version)
        results = sampler.take(max_env_steps=32, timeout_s=60)
        assert results and all(r.weights_seq_no == version for r in results)
        assert sampler.num_results_too_stale > 0
    finally:
        group.stop()


def test_killed_runner_loses_no_accepted_result_and_sampling_goes_on(ray_session):
    import ray

    config = _config().fault_tolerance(restart_failed_env_runners=True)
    group = EnvRunnerGroup(config=config)
    try:
        sampler = ContinuousSampler(group)
        sampler.take(max_env_steps=32, timeout_s=60)
        deadline = time.monotonic() + 30
        while sampler.num_queued(1) == 0 and time.monotonic() < deadline:
            sampler.poll(0.05)
        accepted = {
            (ep.id_, ep.t_started) for r in sampler._ready if r.runner_id == 1 for ep in r.samples
        }
        assert accepted, "runner 1 delivered nothing to the queue"
        ray.kill(group.remote_workers()[0])  # runner 1
        taken: set = set()
        after = 0
        for _ in range(6):
            results = sampler.take(max_env_steps=32, timeout_s=60)
            _check_outstanding(group, sampler)
            taken |= {(ep.id_, ep.t_started) for r in results for ep in r.samples}
            after += sum(r.env_steps for r in results)
        assert accepted <= taken  # every result fetched before the kill was handed out
        assert after >= 6 * 32  # and sampling went on
    finally:
        group.stop()


def test_zero_timeout_take_returns_results_that_finished_before_the_call(ray_session):
    group = EnvRunnerGroup(config=_config())
    try:
        sampler = ContinuousSampler(group)
        assert sampler.take(max_env_steps=1, timeout_s=60)
        while sampler.num_queued():  # only a fetch in the zero-timeout call can deliver now
            assert sampler.take(max_env_steps=1, timeout_s=60)
        tags = [f"{TAG_PREFIX}{runner_id}" for runner_id in group.healthy_env_runner_ids()]
        assert group.wait_async_reqs(tags=tags, timeout_seconds=60)  # one has finished
        received = sampler.num_results_received
        results = sampler.take(max_env_steps=1, timeout_s=0)
        assert results and sampler.num_results_received > received
        assert all(r.env_steps > 0 for r in results)
    finally:
        group.stop()


def test_ppo_trains_continuously_and_improves_on_cartpole(ray_session):
    config = (
        _config(num_envs_per_env_runner=4, rollout_fragment_length=64, sample_continuously=True)
        .training(train_batch_size=512, minibatch_size=128, num_epochs=4, lr=0.001)
        .rl_module(model_config={"fcnet_hiddens": [32]})
    )
    algo = config.build_algo()
    try:
        returns, staleness, lags = [], [], []
        for _ in range(15):
            result = algo.train()
            returns.append(result["env_runners"]["episode_return_mean"])
            continuous = result["continuous_sampling"]
            assert continuous["staleness_bound"] == K
            assert 0 <= continuous["weights_staleness_max"] <= K
            staleness.append(continuous["weights_staleness_mean"])
            # RLlib's name for it, per trained step: the update itself adds one version.
            lag = result["learners"]["default_policy"]["diff_num_grad_updates_vs_sampler_policy"]
            assert 1.0 <= lag <= K + 1
            lags.append(lag)
            assert result["env_runners"]["num_env_steps_sampled"] >= 512
        assert max(staleness) > 0  # the runners really sampled while the driver trained
        assert max(lags) > 1.0
        assert np.mean(returns[-3:]) > 1.5 * np.mean(returns[:3]), returns
    finally:
        algo.stop()


def test_bad_values_are_clear_config_errors():
    with pytest.raises(ConfigError, match=r"sample_continuously.*True or False.*'yes'"):
        PPOConfig().env_runners(sample_continuously="yes")
    with pytest.raises(ConfigError, match=r"sample_continuously=True needs remote env runners"):
        _config(num_env_runners=0, sample_continuously=True).build_algo()
    old_stack = _config(sample_continuously=True).api_stack(
        enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False
    )
    with pytest.raises(ConfigError, match=r"sample_continuously=True needs the new API stack"):
        old_stack.build_algo()


def test_weights_set_from_another_thread_never_change_a_running_sample():
    """A local runner sampling in a thread: a ``set_state`` meanwhile waits for the sample.

    So every step is recorded with the version whose weights acted, and the next
    ``sample()`` uses (and records) the new version.
    """
    import threading

    from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner

    config = _config(num_env_runners=0, num_envs_per_env_runner=2)
    runner = SingleAgentEnvRunner(config=config)
    try:

        def weights(version: int) -> dict:
            state = runner.get_state(components="rl_module")["rl_module"]
            module = state.get("default_policy", state)
            module["pi.layers.0.weight"] = np.zeros_like(module["pi.layers.0.weight"])
            module["pi.layers.0.bias"] = np.array([float(version), 0.0], np.float32)
            return {"rl_module": state, "weights_seq_no": version}

        runner.set_state(weights(1))
        out: list = []
        thread = threading.Thread(target=lambda: out.extend(runner.sample(num_timesteps=20_000)))
        thread.start()
        time.sleep(0.05)
        runner.set_state(weights(2))  # while the thread samples
        thread.join()
        later = runner.sample(num_timesteps=64)
        for episodes, version in ((out, 1), (later, 2)):
            for episode in episodes:
                seq, encoded = _steps(episode)
                np.testing.assert_array_equal(seq, encoded)
                assert (seq == version).all()
    finally:
        runner.stop()


def test_multi_agent_ppo_trains_continuously(ray_session):
    from envrunners.env.multi_agent_env import make_multi_agent

    config = (
        PPOConfig()
        .environment(make_multi_agent("CartPole-v1"), env_config={"num_agents": 2})
        .env_runners(num_env_runners=1, rollout_fragment_length=50, sample_continuously=True)
        .training(train_batch_size=200, minibatch_size=100, num_epochs=1)
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda agent_id, episode, **kwargs: f"p{agent_id}",
        )
        .debugging(seed=0)
    )
    algo = config.build_algo()
    try:
        for _ in range(3):
            result = algo.train()
        assert result["continuous_sampling"]["weights_staleness_max"] <= 1
        assert result["learners"]["p0"]["num_module_steps_trained"] > 0
        assert result["learners"]["p1"]["num_module_steps_trained"] > 0
    finally:
        algo.stop()


def test_training_goes_on_after_every_runner_is_killed_at_once(ray_session):
    """PPO sampling continuously, both remote runners SIGKILLed together once the
    group's standby runner is up. Before: the standby replaced one, then no request
    was in flight, ``take`` only slept and nothing moved the restores along:
    ``train()`` raised after ``sample_timeout_s``."""
    import os
    import signal

    config = (
        # (half a CPU each: room for the standby runner on the 2-CPU test cluster)
        _config(
            num_cpus_per_env_runner=0.5,
            num_envs_per_env_runner=4,
            rollout_fragment_length=64,
            sample_continuously=True,
            sample_timeout_s=20.0,
        )
        .training(train_batch_size=256, minibatch_size=128, num_epochs=1)
        .fault_tolerance(restart_failed_env_runners=True)
    )
    algo = config.build_algo()
    try:
        group = algo.env_runner_group
        recovery = group._recovery
        deadline = time.monotonic() + 60
        while recovery._standby_ready is None and time.monotonic() < deadline:
            algo.train()  # (drives the group's upkeep, which starts the standby)
        ray_session.get(recovery._standby_ready, timeout=60)
        pids = group.foreach_env_runner(lambda runner: os.getpid(), local_env_runner=False)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        for _ in range(3):
            result = algo.train()
            assert result["env_runners"]["num_env_steps_sampled"] >= 256
        deadline = time.monotonic() + 30
        while group.num_healthy_remote_env_runners() < 2 and time.monotonic() < deadline:
            algo.train()
        assert group.num_healthy_remote_env_runners() == 2
        new_pids = group.foreach_env_runner(lambda runner: os.getpid(), local_env_runner=False)
        assert not set(new_pids) & set(pids)
    finally:
        algo.stop()
