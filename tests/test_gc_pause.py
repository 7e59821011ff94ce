"""Garbage collection deferred during ``sample()`` (``envrunners.env._gc_pause``).

Real runners on real envs: an env that records the collector's thresholds while it
steps shows the pause; the thresholds (and ``gc.isenabled()``) must be what they
were after every call, also when the call raises, and with nested or concurrent
pauses.
"""

from __future__ import annotations

import gc
import threading

import pytest
from tests.envs.simple import CountingEnv, FailingEnv

from envrunners.algorithms.ppo import PPOConfig
from envrunners.env._gc_pause import PAUSED_GEN0_THRESHOLD, GCPause, gc_paused_now
from envrunners.env.multi_agent_env import make_multi_agent
from envrunners.env.multi_agent_env_runner import MultiAgentEnvRunner
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.errors import ConfigError, EnvRunnerError

#: Thresholds the tests set before sampling (not the interpreter's default).
CUSTOM = (555, 7, 9)


class ThresholdProbeEnv(CountingEnv):
    """A ``CountingEnv`` that records ``gc.get_threshold()`` at every step."""

    seen: list[tuple[int, int, int]] = []

    def step(self, action):
        ThresholdProbeEnv.seen.append(gc.get_threshold())
        return super().step(action)


@pytest.fixture
def custom_thresholds():
    """Run the test under ``CUSTOM`` thresholds; put the real ones back afterwards."""
    saved, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(*CUSTOM)
    ThresholdProbeEnv.seen = []
    yield
    gc.set_threshold(*saved)
    if enabled:
        gc.enable()


def _config(env=ThresholdProbeEnv, **runner_kw):
    return (
        PPOConfig()
        .environment(env, env_config={"episode_len": 4})
        .env_runners(num_envs_per_env_runner=2, **runner_kw)
        .debugging(seed=0)
    )


def test_single_agent_sample_pauses_and_restores(custom_thresholds):
    runner = SingleAgentEnvRunner(config=_config())
    try:
        ThresholdProbeEnv.seen = []
        episodes = runner.sample(num_timesteps=20)
        assert sum(len(e) for e in episodes) >= 20
        assert ThresholdProbeEnv.seen
        assert set(ThresholdProbeEnv.seen) == {(PAUSED_GEN0_THRESHOLD, 7, 9)}
        assert gc.get_threshold() == CUSTOM and gc.isenabled() and not gc_paused_now()
        runner.sample(num_episodes=2)  # episode mode too
        assert gc.get_threshold() == CUSTOM
    finally:
        runner.stop()


def test_key_false_keeps_the_thresholds(custom_thresholds):
    runner = SingleAgentEnvRunner(config=_config(pause_gc_during_sample=False))
    try:
        ThresholdProbeEnv.seen = []
        runner.sample(num_timesteps=10)
        assert set(ThresholdProbeEnv.seen) == {CUSTOM}
        assert gc.get_threshold() == CUSTOM
    finally:
        runner.stop()


def test_disabled_collector_stays_disabled(custom_thresholds):
    runner = SingleAgentEnvRunner(config=_config())
    try:
        gc.disable()
        runner.sample(num_timesteps=10)
        assert not gc.isenabled() and gc.get_threshold() == CUSTOM
    finally:
        runner.stop()


def test_restored_when_sample_raises(custom_thresholds):
    FailingEnv.failures = 0
    config = (
        PPOConfig()
        .environment(FailingEnv, env_config={"fail_at_step": 3, "fail_once": False})
        .env_runners(num_envs_per_env_runner=1)
        .fault_tolerance(restart_failed_sub_environments=False)
    )
    runner = SingleAgentEnvRunner(config=config)
    try:
        with pytest.raises(EnvRunnerError, match="simulated failure"):
            runner.sample(num_timesteps=10)
        assert gc.get_threshold() == CUSTOM and gc.isenabled() and not gc_paused_now()
    finally:
        runner.stop()


def test_multi_agent_sample_pauses_and_restores(custom_thresholds):
    config = (
        PPOConfig()
        .environment(
            make_multi_agent(lambda cfg: ThresholdProbeEnv(cfg)),
            env_config={"num_agents": 2, "episode_len": 4},
        )
        .env_runners(num_envs_per_env_runner=1, rollout_fragment_length=10)
        .multi_agent(policies={"p0"}, policy_mapping_fn=lambda aid, *a, **kw: "p0")
    )
    runner = MultiAgentEnvRunner(config=config)
    try:
        ThresholdProbeEnv.seen = []
        runner.sample(num_timesteps=10)
        assert ThresholdProbeEnv.seen
        assert set(ThresholdProbeEnv.seen) == {(PAUSED_GEN0_THRESHOLD, 7, 9)}
        assert gc.get_threshold() == CUSTOM and not gc_paused_now()
    finally:
        runner.stop()


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_key_must_be_a_bool(value):
    with pytest.raises(ConfigError, match="pause_gc_during_sample") as info:
        PPOConfig().env_runners(pause_gc_during_sample=value)
    assert repr(value) in str(info.value) or str(value) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_nested_pauses_restore_once(custom_thresholds):
    with GCPause():
        with GCPause():
            assert gc.get_threshold()[0] == PAUSED_GEN0_THRESHOLD
        assert gc.get_threshold()[0] == PAUSED_GEN0_THRESHOLD  # the outer one still holds
        with pytest.raises(RuntimeError), GCPause():
            raise RuntimeError("boom")
        assert gc_paused_now()
    assert gc.get_threshold() == CUSTOM and not gc_paused_now()
    with GCPause(False):
        assert gc.get_threshold() == CUSTOM


def test_thresholds_set_meanwhile_are_kept(custom_thresholds):
    with GCPause():
        gc.set_threshold(1234, 5, 6)
    assert gc.get_threshold() == (1234, 5, 6)


def test_zero_threshold_stays_zero(custom_thresholds):
    gc.set_threshold(0, 7, 9)
    with GCPause():
        assert gc.get_threshold() == (0, 7, 9)
    assert gc.get_threshold() == (0, 7, 9)


def test_overlapping_threads_restore(custom_thresholds):
    """Two threads whose pauses overlap in every order leave the thresholds as found."""
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    errors = []

    def first():
        try:
            with GCPause():
                first_in.set()
                second_in.wait(10)
            first_out.set()
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    def second():
        try:
            first_in.wait(10)
            with GCPause():
                second_in.set()
                first_out.wait(10)  # the first one leaves while this one is inside
                assert gc.get_threshold()[0] == PAUSED_GEN0_THRESHOLD
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    assert gc.get_threshold() == CUSTOM and not gc_paused_now()
