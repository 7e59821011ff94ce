"""Multi-agent test envs: a schedule-driven env, a turn-based AEC game, a parallel env, bad envs."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import AECEnv, ParallelEnv

from envrunners.env.multi_agent_env import MultiAgentEnv

ALL = "__all__"
OBS_SPACE = gym.spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)


def make_schedule(seed: int, num_agents: int = 3, length: int = 12, p_obs: float = 0.6) -> dict:
    """A random agent-presence schedule (plain data, so hypothesis can shrink the seed).

    Agent ``k`` joins (first observation) at ``join[k]``, observes at each later
    step with probability ``p_obs`` and ends at ``end[k]`` (final observation,
    terminated or truncated) with ``join < end <= length``; agent ``a0`` lives from
    0 to ``length`` (when ``"__all__"`` ends the episode). Every live agent gets a
    reward of 1.0 at each step in ``(join, end]``.
    """
    rng = np.random.default_rng(seed)
    sched: dict[str, Any] = {"length": length, "agents": {}}
    for k in range(num_agents):
        # a0 lives the whole episode, so some agent is live until "__all__" ends it.
        join = 0 if k == 0 else int(rng.integers(0, length - 1))
        end = length if k == 0 else int(rng.integers(join + 1, length + 1))
        observes = [t for t in range(join + 1, end) if rng.random() < p_obs]
        sched["agents"][f"a{k}"] = {
            "join": join,
            "end": end,
            "observes": sorted({join, *observes, end}),
            "truncate": bool(rng.random() < 0.3),
        }
    return sched


def expected_counts(sched: dict) -> dict[str, tuple[int, float]]:
    """Per agent: (agent steps, return) of a whole episode of ``sched``."""
    out = {}
    for aid, a in sched["agents"].items():
        out[aid] = (len(a["observes"]) - 1, float(a["end"] - a["join"]))
    return out


class ScheduleEnv(MultiAgentEnv):
    """Agents observe, get rewards and end exactly as a schedule says.

    Observation of agent ``a`` at env step ``t``: ``[t, index of a]``. The env checks
    the runner: at each step the actions must be exactly for the agents that
    observed last step and are not done.
    """

    def __init__(self, config: dict | None = None):
        config = dict(config or {})
        self.sched = config.get("schedule") or make_schedule(int(config.get("seed", 0)))
        self.possible_agents = list(self.sched["agents"])
        self.agents = list(self.possible_agents)
        self.observation_spaces = dict.fromkeys(self.possible_agents, OBS_SPACE)
        self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.possible_agents}
        self.t = 0
        self._expect: set[str] = set()
        super().__init__()

    def _obs(self, aid: str) -> np.ndarray:
        return np.array([self.t, self.possible_agents.index(aid)], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        obs = {a: self._obs(a) for a, s in self.sched["agents"].items() if s["join"] == 0}
        self._expect = set(obs)
        return obs, {a: {"t": 0} for a in obs}

    def step(self, action_dict):
        assert set(action_dict) == self._expect, (
            f"t={self.t}: actions for {sorted(action_dict)}, expected {sorted(self._expect)}"
        )
        self.t += 1
        t = self.t
        obs, rew, term, trunc, infos = {}, {}, {}, {}, {}
        for aid, s in self.sched["agents"].items():
            if s["join"] < t <= s["end"]:
                rew[aid] = 1.0
            if t in s["observes"]:
                obs[aid] = self._obs(aid)
                infos[aid] = {"t": t}
            if t == s["end"]:
                (trunc if s["truncate"] else term)[aid] = True
        done_all = t >= self.sched["length"]
        term[ALL] = done_all
        trunc[ALL] = False
        self._expect = {a for a in obs if not (term.get(a) or trunc.get(a))}
        if done_all:
            self._expect = set()
        return obs, rew, term, trunc, infos


class TicTacToe(AECEnv):
    """A turn-based tic-tac-toe (PettingZoo AEC): flat Box obs, Discrete(9) moves.

    Obs of a player: the 9 cells as +1 (own), -1 (opponent), 0 (empty). An illegal
    move loses (-1, opponent +1). Win +1/-1, draw 0/0.
    """

    metadata = {"name": "tictactoe_test_v0", "is_parallelizable": False}

    def __init__(self, config: Any = None):
        super().__init__()
        self.possible_agents = ["player_1", "player_2"]
        self._obs_space = gym.spaces.Box(-1.0, 1.0, shape=(9,), dtype=np.float32)
        self._act_space = gym.spaces.Discrete(9)

    def observation_space(self, agent):
        return self._obs_space

    def action_space(self, agent):
        return self._act_space

    def observe(self, agent):
        sign = 1.0 if agent == "player_1" else -1.0
        return (self.board * sign).astype(np.float32)

    def reset(self, seed=None, options=None):
        self.board = np.zeros(9, dtype=np.float32)
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = "player_1"
        self.moves = 0

    def _winner(self) -> bool:
        b = self.board.reshape(3, 3)
        lines = [*b, *b.T, b.diagonal(), np.fliplr(b).diagonal()]
        return any(abs(line.sum()) == 3 for line in lines)

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        other = "player_2" if agent == "player_1" else "player_1"
        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        sign = 1.0 if agent == "player_1" else -1.0
        if self.board[action] != 0:
            self.rewards[agent], self.rewards[other] = -1.0, 1.0
            self.terminations = dict.fromkeys(self.agents, True)
        else:
            self.board[action] = sign
            self.moves += 1
            if self._winner():
                self.rewards[agent], self.rewards[other] = 1.0, -1.0
                self.terminations = dict.fromkeys(self.agents, True)
            elif self.moves == 9:
                self.terminations = dict.fromkeys(self.agents, True)
        self.agent_selection = other
        self._accumulate_rewards()


class LeavingParallelEnv(ParallelEnv):
    """Parallel env: agent ``i`` terminates after ``3 + 2 * i`` steps; the rest are
    truncated at ``max_steps``. Obs ``[t, i]``, reward ``i + 1`` per step."""

    metadata = {"name": "leaving_parallel_v0"}

    def __init__(self, config: Any = None):
        config = dict(config or {})
        self.n = int(config.get("num_agents", 3))
        self.max_steps = int(config.get("max_steps", 6))
        self.possible_agents = [f"agent_{i}" for i in range(self.n)]
        self._space = gym.spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)
        self._act_space = gym.spaces.Discrete(3)

    def observation_space(self, agent):
        return self._space

    def action_space(self, agent):
        return self._act_space

    def _obs(self, agent):
        return np.array([self.t, self.possible_agents.index(agent)], dtype=np.float32)

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (sorted(actions), self.agents)
        self.t += 1
        obs, rew, term, trunc, infos = {}, {}, {}, {}, {}
        for a in self.agents:
            i = self.possible_agents.index(a)
            obs[a], rew[a], infos[a] = self._obs(a), float(i + 1), {}
            term[a] = self.t >= 3 + 2 * i
            trunc[a] = not term[a] and self.t >= self.max_steps
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, infos


class BadMultiAgentEnv(MultiAgentEnv):
    """Breaks the multi-agent protocol on cue (``config["bug"]``) at env step 2.

    - ``"ghost"``: an observation for an agent that is not in observation_spaces;
    - ``"obs_after_done"``: agent a0 ends at step 1 and observes again at step 2;
    - ``"trunc_no_obs"``: a1 acts at step 1 (no obs) and is truncated at 2 without obs;
    - ``"no_all"``: terminateds without ``"__all__"``;
    - ``"raise"``: step() raises ValueError (``BadMultiAgentEnv.raises_left`` times);
    - ``"slow"``: step() sleeps ``config["sleep"]`` seconds.
    """

    raises_left = 10**9

    def __init__(self, config: dict | None = None):
        config = dict(config or {})
        self.bug = config.get("bug")
        self.sleep = float(config.get("sleep", 0.0))
        self.possible_agents = ["a0", "a1"]
        self.agents = list(self.possible_agents)
        self.observation_spaces = dict.fromkeys(self.possible_agents, OBS_SPACE)
        self.action_spaces = dict.fromkeys(self.possible_agents, gym.spaces.Discrete(2))
        super().__init__()

    def reset(self, *, seed=None, options=None):
        self.t = 0
        o = np.zeros(2, np.float32)
        return {"a0": o, "a1": o}, {}

    def step(self, action_dict):
        self.t += 1
        o = np.full(2, self.t, np.float32)
        if self.bug == "raise" and self.t >= 2 and BadMultiAgentEnv.raises_left > 0:
            BadMultiAgentEnv.raises_left -= 1
            raise ValueError("boom from BadMultiAgentEnv")
        if self.bug == "slow":
            time.sleep(self.sleep)
        obs = {"a0": o, "a1": o}
        term = {ALL: False}
        trunc = {ALL: False}
        if self.bug == "obs_after_done" and self.t == 1:
            term["a0"] = True
        if self.bug == "trunc_no_obs":
            if self.t == 1:
                obs = {"a0": o}
            elif self.t == 2:
                obs, trunc["a1"] = {"a0": o}, True
        if self.t == 2 and self.bug == "ghost":
            obs["ghost"] = o
        if self.t == 2 and self.bug == "no_all":
            term = {}
        rew = {a: 1.0 for a in obs}
        if self.bug == "trunc_no_obs":
            rew = {"a0": 1.0, "a1": 0.0}
        return obs, rew, term, trunc, {}


class BufferReusingEnv(MultiAgentEnv):
    """Two agents whose observations are the env's own arrays, overwritten every step.

    ``obs_kind="box"``: a float array per agent; ``"dict"``: ``{"pos": array, "t": int}``
    with the array reused. An agent's observation at agent step t holds t.
    """

    def __init__(self, config=None):
        super().__init__()
        config = config or {}
        self.kind = config.get("obs_kind", "box")
        self.length = int(config.get("length", 5))
        self.possible_agents = self.agents = ["a", "b"]
        box = gym.spaces.Box(0.0, 1000.0, (2,), np.float32)
        space = (
            box
            if self.kind == "box"
            else gym.spaces.Dict({"pos": box, "t": gym.spaces.Discrete(1000)})
        )
        self.observation_spaces = dict.fromkeys(self.agents, space)
        self.action_spaces = dict.fromkeys(self.agents, gym.spaces.Discrete(2))
        self.buffers = {a: np.zeros(2, np.float32) for a in self.agents}
        self.t = 0

    def _obs(self):
        for buf in self.buffers.values():
            buf[:] = self.t
        if self.kind == "box":
            return dict(self.buffers)
        return {a: {"pos": buf, "t": self.t} for a, buf in self.buffers.items()}

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self._obs(), {}

    def step(self, actions):
        self.t += 1
        done = self.t >= self.length
        return (
            self._obs(),
            dict.fromkeys(actions, 1.0),
            {**dict.fromkeys(actions, done), "__all__": done},
            {"__all__": False},
            {},
        )
