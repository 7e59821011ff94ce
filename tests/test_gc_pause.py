"""The cyclic garbage collector is paused during sampling, with a backstop."""

from __future__ import annotations

import gc
import weakref

import gymnasium as gym
import numpy as np
import pytest

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.env.multi_agent_env import MultiAgentEnv
from envrunners.env.multi_agent_env_runner import MultiAgentEnvRunner
from envrunners.utils import gc_pause
from envrunners.utils.gc_pause import paused_gc


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
