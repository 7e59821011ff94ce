"""PettingZoo adapters: a turn-based AEC game and a parallel env, alone and through the runner."""

from __future__ import annotations

import sys
import types
import warnings
from collections import defaultdict

import numpy as np
import pytest
from pettingzoo.test import api_test, parallel_api_test
from tests.envs.multi_agent import LeavingParallelEnv, TicTacToe

from envrunners.algorithms.ppo import PPOConfig
from envrunners.env.multi_agent_env import MultiAgentEnv
from envrunners.env.multi_agent_env_runner import MultiAgentEnvRunner
from envrunners.env.wrappers.pettingzoo_env import ParallelPettingZooEnv, PettingZooEnv
from envrunners.errors import MultiAgentEnvError


def test_test_envs_pass_pettingzoo_api_tests():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(TicTacToe(), num_cycles=50)
        parallel_api_test(LeavingParallelEnv(), num_cycles=50)


class TestAEC:
    def test_turns_rewards_and_end(self):
        env = PettingZooEnv(TicTacToe())
        assert isinstance(env, MultiAgentEnv)
        assert env.possible_agents == ["player_1", "player_2"]
        assert env.get_action_space("player_2").n == 9
        obs, infos = env.reset(seed=0)
        assert list(obs) == ["player_1"] and list(infos) == ["player_1"]
        obs, rew, term, trunc, _ = env.step({"player_1": 4})
        assert list(obs) == ["player_2"] and obs["player_2"][4] == -1.0  # opponent's mark
        assert rew == {"player_1": 0.0, "player_2": 0.0} and term["__all__"] is False
        with pytest.raises(MultiAgentEnvError, match="it is 'player_2'.s turn"):
            env.step({"player_1": 0})
        obs, rew, term, trunc, _ = env.step({"player_2": 4})  # illegal: cell taken
        assert set(obs) == {"player_1", "player_2"}  # final observations for both
        assert rew == {"player_1": 1.0, "player_2": -1.0}
        assert term == {"player_1": True, "player_2": True, "__all__": True}
        assert trunc["__all__"] is False and env.agents == []

    def test_win(self):
        env = PettingZooEnv(TicTacToe())
        env.reset()
        for move in ({"player_1": 0}, {"player_2": 3}, {"player_1": 1}, {"player_2": 4}):
            env.step(move)
        _, rew, term, _, _ = env.step({"player_1": 2})
        assert rew == {"player_1": 1.0, "player_2": -1.0} and term["__all__"]

    @pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pettingzoo's old env API
    def test_pettingzoo_classic_tictactoe(self):
        tictactoe_v3 = _import_tictactoe()
        r = MultiAgentEnvRunner(_config(lambda cfg: tictactoe_v3.env(), num_envs=2))
        # Dict obs with action masks: since issue 14 the default module flattens them.
        assert sum(len(e) for e in r.sample(num_timesteps=4)) >= 4
        eps = r.sample(num_episodes=6, random_actions=True)
        assert len(eps) == 6 and all(e.is_terminated for e in eps)
        for e in eps:
            steps = {aid: len(sa) for aid, sa in e.agent_episodes.items()}
            assert steps.get("player_1", 0) == (len(e) + 1) // 2
            assert steps.get("player_2", 0) == len(e) // 2
            # a win is zero-sum; PettingZoo punishes an illegal move with -1 for its maker only
            assert round(e.get_return()) in (0, -1)


def _import_tictactoe():
    """PettingZoo's tic-tac-toe; pygame (only used to render) is stubbed if missing."""
    stub = None
    try:
        import pygame  # noqa: F401
    except ImportError:
        stub = sys.modules["pygame"] = types.ModuleType("pygame")
    try:
        from pettingzoo.classic import tictactoe_v3
    finally:
        if stub is not None and sys.modules.get("pygame") is stub:
            del sys.modules["pygame"]
    return tictactoe_v3


class TestParallel:
    @pytest.mark.parametrize("max_steps, all_term, all_trunc", [(6, True, False), (2, False, True)])
    def test_agents_leave(self, max_steps, all_term, all_trunc):
        env = ParallelPettingZooEnv(LeavingParallelEnv({"max_steps": max_steps}))
        obs, infos = env.reset(seed=0)
        assert set(obs) == set(infos) == set(env.possible_agents)
        live = list(obs)
        for _ in range(10):
            obs, rew, term, trunc, infos = env.step(dict.fromkeys(live, 0))
            assert set(infos) == set(obs)
            live = [a for a in obs if not (term[a] or trunc[a])]
            if term["__all__"] or trunc["__all__"]:
                break
        assert (term["__all__"], trunc["__all__"]) == (all_term, all_trunc)
        assert live == [] and env.agents == []


def _config(creator, num_envs=1, mapping=None, policies=("p1", "p2")):
    return (
        PPOConfig()
        .environment(creator)
        .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=10)
        .multi_agent(
            policies=set(policies),
            policy_mapping_fn=mapping
            or (lambda aid, ep, **kw: "p1" if aid == "player_1" else "p2"),
        )
        .debugging(seed=0)
    )


def _whole_episodes(runner, calls):
    """Sample in chunks; return the done episodes as lists of their chunks."""
    by_id = defaultdict(list)
    for kwargs in calls:
        for e in runner.sample(**kwargs):
            by_id[e.id_].append(e)
    return [chunks for chunks in by_id.values() if chunks[-1].is_done]


class TestThroughTheRunner:
    @pytest.mark.parametrize("num_envs", [1, 3])
    def test_turn_based_episodes(self, num_envs):
        r = MultiAgentEnvRunner(_config(lambda cfg: TicTacToe(), num_envs=num_envs))
        assert isinstance(r.env.envs[0], PettingZooEnv)  # raw AEC envs are adapted
        episodes = _whole_episodes(r, [{"num_timesteps": 3}] * 12)
        episodes += [[e] for e in r.sample(num_episodes=4)]
        assert len(episodes) >= 4
        for chunks in episodes:
            moves = sum(len(c) for c in chunks)
            steps = defaultdict(int)
            returns = defaultdict(float)
            for c in chunks:
                c.validate()
                for aid, sa in c.agent_episodes.items():
                    steps[aid] += len(sa)
                    returns[aid] += sa.get_return()
                    assert len(sa.get_extra_model_outputs("action_logp")) == len(sa)
            # players alternate; each move is one agent step of its player
            assert steps["player_1"] == (moves + 1) // 2 and steps["player_2"] == moves // 2
            assert sum(returns.values()) == pytest.approx(0.0)  # zero-sum
            assert chunks[-1].is_terminated
        m = r.get_metrics()
        assert set(m["module_episode_returns_mean"]) == {"p1", "p2"}
        assert m["module_episode_returns_mean"]["p1"] == pytest.approx(
            -m["module_episode_returns_mean"]["p2"]
        )

    def test_parallel_env_agents_leave(self):
        r = MultiAgentEnvRunner(
            _config(
                lambda cfg: LeavingParallelEnv({"max_steps": 6}),
                num_envs=2,
                mapping=lambda aid, ep, **kw: "even" if aid in ("agent_0", "agent_2") else "odd",
                policies=("even", "odd"),
            )
        )
        assert isinstance(r.env.envs[0], ParallelPettingZooEnv)
        episodes = _whole_episodes(r, [{"num_timesteps": 4}] * 8)
        assert episodes
        for chunks in episodes:
            assert sum(len(c) for c in chunks) == 6
            for i in range(3):
                aid = f"agent_{i}"
                n = sum(len(c.agent_episodes[aid]) for c in chunks if aid in c.agent_episodes)
                ret = sum(c.agent_episodes[aid].get_return() for c in chunks
                          if aid in c.agent_episodes)  # fmt: skip
                assert n == min(3 + 2 * i, 6) and ret == pytest.approx((i + 1) * n)
                last = [c.agent_episodes[aid] for c in chunks if aid in c.agent_episodes][-1]
                assert last.is_truncated == (i == 2)
                obs = np.asarray(last.get_observations())
                assert np.all(obs[:, 1] == i)


def test_parallel_wrapper_around_a_turn_based_env_gets_the_parallel_adapter():
    """``aec_to_parallel`` unwraps to its AECEnv; its own class decides the adapter."""
    from pettingzoo.classic import rps_v2

    r = MultiAgentEnvRunner(
        _config(
            lambda cfg: rps_v2.parallel_env(),
            num_envs=1,
            policies=("p",),
            mapping=lambda aid, ep, **kw: "p",
        )  # fmt: skip
    )
    assert isinstance(r.env.envs[0], ParallelPettingZooEnv)
    episodes = r.sample(num_timesteps=20)
    assert sum(len(e) for e in episodes) >= 20
