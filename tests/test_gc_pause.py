"""The cyclic garbage collector is paused during sampling, with a backstop.

``DeferredGC`` (the runners' ``pause_gc_during_sample``): an env that records the
collector's thresholds while it steps shows the raised threshold; the thresholds
(and ``gc.isenabled()``) must be what they were after every call, also when the
call raises, and with nested or concurrent bodies.
"""

from __future__ import annotations

import gc
import threading
import weakref

import gymnasium as gym
import numpy as np
import pytest
from tests.envs.simple import CountingEnv, FailingEnv

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.algorithms.ppo import PPOConfig
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.env.multi_agent_env import MultiAgentEnv, make_multi_agent
from envrunners.env.multi_agent_env_runner import MultiAgentEnvRunner
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.errors import ConfigError, EnvRunnerError
from envrunners.utils import gc_pause
from envrunners.utils.gc_pause import (
    DEFERRED_GEN0_THRESHOLD,
    DeferredGC,
    gc_deferred_now,
    paused_gc,
)


@pytest.fixture
def gc_on():
    enabled = gc.isenabled()
    gc.enable()
    yield
    if not enabled:
        gc.disable()


class _Cycle:
    """A self-referencing object: freed only by the cyclic collector."""

    freed = 0

    def __init__(self):
        self.me = self
        weakref.finalize(self, _Cycle._free)

    @staticmethod
    def _free():
        _Cycle.freed += 1


def test_paused_gc_restores_the_collector(gc_on):
    with paused_gc() as backstop:
        assert not gc.isenabled()
        backstop()
    assert gc.isenabled()
    with pytest.raises(ValueError), paused_gc():
        raise ValueError("body failed")
    assert gc.isenabled()


def _start_counting(monkeypatch, backstop_at: int) -> None:
    monkeypatch.setattr(gc_pause, "BACKSTOP_OBJECTS", backstop_at)
    gc.collect()
    _Cycle.freed = 0


def _make_cycles(n: int) -> None:
    for _ in range(n):
        _Cycle()


def test_a_collector_the_user_turned_off_stays_off(gc_on, monkeypatch):
    _start_counting(monkeypatch, 10)
    gc.disable()
    with paused_gc() as backstop:
        _make_cycles(50)
        backstop()  # the user's choice wins: nothing collected
        assert _Cycle.freed == 0
    assert not gc.isenabled()
    gc.enable()
    gc.collect()
    assert _Cycle.freed == 50


def test_backstop_collects_cycles_that_piled_up(gc_on, monkeypatch):
    _start_counting(monkeypatch, 100)
    with paused_gc() as backstop:
        _make_cycles(20)
        backstop()
        assert _Cycle.freed == 0  # below the backstop: they wait
        _make_cycles(200)
        backstop()
        assert _Cycle.freed >= 100  # the young generation was collected


class _CycleMakingEnv(MultiAgentEnv):
    """Two agents; every step makes a reference cycle and notes the collector's state."""

    seen_enabled: list = []
    freed_seen: list = []

    def __init__(self, config=None):
        super().__init__()
        self.possible_agents = self.agents = ["a", "b"]
        space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.observation_spaces = dict.fromkeys(self.agents, space)
        self.action_spaces = dict.fromkeys(self.agents, gym.spaces.Discrete(2))
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return {a: np.zeros(2, np.float32) for a in self.agents}, {}

    def step(self, actions):
        self.t += 1
        _make_cycles(5)
        _CycleMakingEnv.seen_enabled.append(gc.isenabled())
        _CycleMakingEnv.freed_seen.append(_Cycle.freed)
        done = self.t >= 20
        obs = {a: np.zeros(2, np.float32) for a in actions}
        return obs, dict.fromkeys(actions, 1.0), {"__all__": done}, {"__all__": False}, {}


def test_multi_agent_sampling_pauses_gc_and_keeps_cycles_bounded(gc_on, monkeypatch):
    config = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(_CycleMakingEnv)
        .multi_agent(policies={"p"}, policy_mapping_fn=lambda aid, ep, **kw: "p")
    )
    runner = MultiAgentEnvRunner(config=config)
    _start_counting(monkeypatch, 2_000)
    _CycleMakingEnv.seen_enabled.clear()
    _CycleMakingEnv.freed_seen.clear()
    runner.sample(num_timesteps=2_000, random_actions=True)
    assert gc.isenabled()
    assert _CycleMakingEnv.seen_enabled and not any(_CycleMakingEnv.seen_enabled)
    # 10k cycles made during the call; the backstop freed most of them meanwhile.
    assert _CycleMakingEnv.freed_seen[-1] >= 5_000
    runner.stop()


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
        assert set(ThresholdProbeEnv.seen) == {(DEFERRED_GEN0_THRESHOLD, 7, 9)}
        assert gc.get_threshold() == CUSTOM and gc.isenabled() and not gc_deferred_now()
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
        assert gc.get_threshold() == CUSTOM and gc.isenabled() and not gc_deferred_now()
    finally:
        runner.stop()


class EnabledProbeEnv(ThresholdProbeEnv):
    """A ``ThresholdProbeEnv`` that also records ``gc.isenabled()`` at every step."""

    enabled: list[bool] = []

    def step(self, action):
        EnabledProbeEnv.enabled.append(gc.isenabled())
        return super().step(action)


def _multi_agent_runner(**runner_kw):
    config = (
        PPOConfig()
        .environment(
            make_multi_agent(lambda cfg: EnabledProbeEnv(cfg)),
            env_config={"num_agents": 2, "episode_len": 4},
        )
        .env_runners(num_envs_per_env_runner=1, rollout_fragment_length=10, **runner_kw)
        .multi_agent(policies={"p0"}, policy_mapping_fn=lambda aid, *a, **kw: "p0")
    )
    return MultiAgentEnvRunner(config=config)


def test_multi_agent_sample_pauses_and_restores(custom_thresholds):
    runner = _multi_agent_runner()
    try:
        ThresholdProbeEnv.seen, EnabledProbeEnv.enabled = [], []
        runner.sample(num_timesteps=10)
        assert ThresholdProbeEnv.seen
        assert set(ThresholdProbeEnv.seen) == {(DEFERRED_GEN0_THRESHOLD, 7, 9)}
        assert set(EnabledProbeEnv.enabled) == {False}  # the sampler's loop: paused_gc
        assert gc.get_threshold() == CUSTOM and gc.isenabled() and not gc_deferred_now()
    finally:
        runner.stop()


def test_multi_agent_key_false_leaves_the_collector_alone(custom_thresholds):
    runner = _multi_agent_runner(pause_gc_during_sample=False)
    try:
        ThresholdProbeEnv.seen, EnabledProbeEnv.enabled = [], []
        runner.sample(num_timesteps=10)
        assert set(ThresholdProbeEnv.seen) == {CUSTOM}
        assert set(EnabledProbeEnv.enabled) == {True}
        assert gc.get_threshold() == CUSTOM and gc.isenabled()
    finally:
        runner.stop()


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_key_must_be_a_bool(value):
    with pytest.raises(ConfigError, match="pause_gc_during_sample") as info:
        PPOConfig().env_runners(pause_gc_during_sample=value)
    assert repr(value) in str(info.value) or str(value) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_nested_pauses_restore_once(custom_thresholds):
    with DeferredGC():
        with DeferredGC():
            assert gc.get_threshold()[0] == DEFERRED_GEN0_THRESHOLD
        assert gc.get_threshold()[0] == DEFERRED_GEN0_THRESHOLD  # the outer one still holds
        with pytest.raises(RuntimeError), DeferredGC():
            raise RuntimeError("boom")
        assert gc_deferred_now()
    assert gc.get_threshold() == CUSTOM and not gc_deferred_now()
    with DeferredGC(False):
        assert gc.get_threshold() == CUSTOM


def test_thresholds_set_meanwhile_are_kept(custom_thresholds):
    with DeferredGC():
        gc.set_threshold(1234, 5, 6)
    assert gc.get_threshold() == (1234, 5, 6)


def test_zero_threshold_stays_zero(custom_thresholds):
    gc.set_threshold(0, 7, 9)
    with DeferredGC():
        assert gc.get_threshold() == (0, 7, 9)
    assert gc.get_threshold() == (0, 7, 9)


def test_overlapping_threads_restore(custom_thresholds):
    """Two threads whose pauses overlap in every order leave the thresholds as found."""
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    errors = []

    def first():
        try:
            with DeferredGC():
                first_in.set()
                second_in.wait(10)
            first_out.set()
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    def second():
        try:
            first_in.wait(10)
            with DeferredGC():
                second_in.set()
                first_out.wait(10)  # the first one leaves while this one is inside
                assert gc.get_threshold()[0] == DEFERRED_GEN0_THRESHOLD
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    assert gc.get_threshold() == CUSTOM and not gc_deferred_now()
