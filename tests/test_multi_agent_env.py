"""MultiAgentEnv base class, make_multi_agent and agent groups (spec §5.1)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from tests.envs.simple import CountingEnv

from envrunners.env.env_context import EnvContext
from envrunners.env.multi_agent_env import GroupAgentsWrapper, MultiAgentEnv, make_multi_agent
from envrunners.errors import MultiAgentEnvError

BOX = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


class Legacy(MultiAgentEnv):
    def __init__(self, space):
        self._agent_ids = {"x", "y"}
        self.observation_space = space
        self.action_space = gym.spaces.Discrete(3)
        super().__init__()


class TestBaseClass:
    def test_agents_from_legacy_ids(self):
        env = Legacy(BOX)
        assert sorted(env.agents) == ["x", "y"] and sorted(env.possible_agents) == ["x", "y"]
        assert env.num_agents == env.max_num_agents == 2
        assert MultiAgentEnv.agents == [] and MultiAgentEnv.possible_agents == []
        with pytest.warns(DeprecationWarning):
            assert env.get_agent_ids() == {"x", "y"}

    def test_space_lookup_order(self):
        per_agent = Legacy(BOX)
        per_agent.observation_spaces = {"x": BOX}
        assert per_agent.get_observation_space("x") is BOX
        with pytest.raises(MultiAgentEnvError, match=r"'y' is not in .*observation_spaces.*'x'"):
            per_agent.get_observation_space("y")
        as_dict = Legacy(gym.spaces.Dict({"x": BOX, "y": gym.spaces.Discrete(2)}))
        assert as_dict.get_observation_space("y") == gym.spaces.Discrete(2)
        with pytest.raises(MultiAgentEnvError, match="'z' is not a key"):
            as_dict.get_observation_space("z")
        shared = Legacy(BOX)
        assert shared.get_observation_space("anything") is BOX
        assert shared.get_action_space("x") == gym.spaces.Discrete(3)

    def test_no_spaces_at_all(self):
        class Empty(MultiAgentEnv):
            possible_agents = ["a"]

        with pytest.raises(MultiAgentEnvError, match="defines neither"):
            Empty().get_action_space("a")

    def test_reset_seeds_and_step_is_abstract(self):
        env = Legacy(BOX)
        env.reset(seed=3)
        first = env.np_random.random()
        env.reset(seed=3)
        assert env.np_random.random() == first
        with pytest.raises(NotImplementedError):
            env.step({"x": 0})


class TestMakeMultiAgent:
    def test_gym_id(self):
        cls = make_multi_agent("CartPole-v1")
        env = cls({"num_agents": 3})
        assert isinstance(env, MultiAgentEnv) and cls.__name__ == "MultiAgentCartPole"
        assert env.possible_agents == [0, 1, 2] == env.agents
        assert env.get_observation_space(1) == env.envs[1].observation_space
        obs, infos = env.reset(seed=5)
        assert set(obs) == set(infos) == {0, 1, 2}
        assert all(np.array_equal(obs[0], o) for o in obs.values())  # same seed for all
        with pytest.raises(ValueError, match="at least one action"):
            env.step({})

    def test_copies_keep_the_time_limit_and_need_a_reset_first(self):
        env = make_multi_agent("CartPole-v1")({"num_agents": 2, "max_episode_steps": 3})
        with pytest.raises(gym.error.ResetNeeded, match="reset"):
            env.step({0: 0, 1: 0})
        # One wrapper layer per copy: the time limit (no checker, no order enforcer).
        assert all(type(e.unwrapped) is type(e.env) for e in env.envs)
        env.reset(seed=0)
        for _ in range(2):
            _, _, term, trunc, _ = env.step({a: 0 for a in env.agents})
            assert not any(trunc.values())
        _, _, term, trunc, _ = env.step({a: 0 for a in env.agents})
        assert trunc == {a: True for a in trunc} or any(term.values())

    def test_default_one_agent_and_config_untouched(self):
        config = EnvContext({"num_agents": 2}, worker_index=1)
        env = make_multi_agent("CartPole-v1")(config)
        assert config["num_agents"] == 2 and len(env.envs) == 2
        assert make_multi_agent("CartPole-v1")().possible_agents == [0]

    @pytest.mark.parametrize(
        "lens, truncs, all_term, all_trunc",
        [
            ((2, 2), (False, False), True, False),
            ((2, 2), (True, True), True, True),  # RLlib: all truncated sets both flags
            ((2, 2), (True, False), True, False),  # mixed endings count as terminated
        ],
    )
    def test_all_flags(self, lens, truncs, all_term, all_trunc):
        def creator(config):
            i = creator.count
            creator.count += 1
            return CountingEnv({"episode_len": lens[i], "truncate": truncs[i]})

        creator.count = 0
        env = make_multi_agent(creator)({"num_agents": 2})
        env.reset()
        _, _, term, trunc, _ = env.step({0: 0, 1: 0})
        assert not term["__all__"] and not trunc["__all__"]
        _, rew, term, trunc, _ = env.step({0: 0, 1: 0})
        assert (term["__all__"], trunc["__all__"]) == (all_term, all_trunc)
        assert rew == {0: 1.0, 1: 1.0}

    def test_agents_leave_one_by_one(self):
        def creator(config):
            creator.count += 1
            return CountingEnv({"episode_len": creator.count})

        creator.count = 0
        env = make_multi_agent(creator)({"num_agents": 2})
        env.reset()
        _, _, term, _, _ = env.step({0: 0, 1: 0})
        assert term == {0: True, 1: False, "__all__": False} and env.agents == [1]
        _, _, term, _, _ = env.step({1: 0})
        assert term == {1: True, "__all__": True} and env.agents == []


class TestGroups:
    def test_grouped_env(self):
        env = make_multi_agent("CartPole-v1")({"num_agents": 3})
        grouped = env.with_agent_groups({"g": [0, 1]})
        assert isinstance(grouped, GroupAgentsWrapper)
        assert grouped.possible_agents == [2, "g"]
        assert grouped.get_action_space("g") == gym.spaces.Tuple([gym.spaces.Discrete(2)] * 2)
        obs, infos = grouped.reset(seed=0)
        assert set(obs) == {2, "g"} and len(obs["g"]) == 2
        obs, rew, term, trunc, infos = grouped.step({"g": (0, 1), 2: 1})
        assert rew["g"] == 2.0 and rew[2] == 1.0 and term["g"] is False
        assert "__all__" in term and len(infos["g"]["_group_info"]) == 2

    def test_overlapping_groups(self):
        env = make_multi_agent("CartPole-v1")({"num_agents": 2})
        with pytest.raises(MultiAgentEnvError, match="more than one group"):
            env.with_agent_groups({"g": [0, 1], "h": [1]})
