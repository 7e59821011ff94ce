"""Multi-agent with PettingZoo: sample a parallel env with MultiAgentEnvRunner / EnvRunnerGroup.

``MeetOnALine`` below is a plain PettingZoo ``ParallelEnv`` (no envrunners
imports): two walkers on a line, rewarded for meeting. The runner adapts it
(``ParallelPettingZooEnv``) on its own; each agent gets its own default module
through ``policy_mapping_fn``. Swap in any PettingZoo env, e.g.
``pettingzoo.butterfly.pistonball_v6.parallel_env`` (``pip install -e ".[pettingzoo]"``).

Run: python examples/multi_agent_pettingzoo.py [--num-env-runners 2] [--timesteps 4000]
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv

from envrunners.algorithms.ppo import PPOConfig
from envrunners.env.env_runner_group import EnvRunnerGroup
from envrunners.execution.rollout_ops import synchronous_parallel_sample


class MeetOnALine(ParallelEnv):
    """Two walkers on positions 0..size-1; each step costs 0.05, meeting pays 1 to both."""

    metadata = {"name": "meet_on_a_line_v0"}

    def __init__(self, size: int = 9, max_steps: int = 30):
        self.size, self.max_steps = size, max_steps
        self.possible_agents = ["walker_0", "walker_1"]
        self.agents: list[str] = []
        self._pos: dict[str, int] = {}
        self._t = 0
        self._rng = np.random.default_rng()
        self._obs_space = gym.spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)
        self._act_space = gym.spaces.Discrete(3)  # left, stay, right

    def observation_space(self, agent: str) -> gym.Space:
        return self._obs_space

    def action_space(self, agent: str) -> gym.Space:
        return self._act_space

    def _obs(self) -> dict[str, np.ndarray]:
        me, other = self.possible_agents
        scale = self.size - 1
        return {
            me: np.array([self._pos[me], self._pos[other]], np.float32) / scale,
            other: np.array([self._pos[other], self._pos[me]], np.float32) / scale,
        }

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._pos = {"walker_0": 0, "walker_1": self.size - 1}
        self._t = 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]):
        self._t += 1
        for agent, action in actions.items():
            self._pos[agent] = int(np.clip(self._pos[agent] + int(action) - 1, 0, self.size - 1))
        met = self._pos["walker_0"] == self._pos["walker_1"]
        rewards = {a: (1.0 if met else -0.05) for a in self.agents}
        terminations = {a: met for a in self.agents}
        truncations = {a: self._t >= self.max_steps and not met for a in self.agents}
        obs, infos = self._obs(), {a: {} for a in self.agents}
        if met or self._t >= self.max_steps:
            self.agents = []
        return obs, rewards, terminations, truncations, infos


def make_env(env_config: dict) -> MeetOnALine:
    """Env creator: ``env_config`` comes from ``config.environment(env_config=...)``."""
    return MeetOnALine(**env_config)


def own_module(agent_id: str, episode=None, **kwargs) -> str:
    """Policy mapping: every agent gets its own module (``walker_0`` -> ``walker_0``)."""
    return agent_id


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-env-runners", type=int, default=0)
    parser.add_argument("--timesteps", type=int, default=4000)
    args = parser.parse_args(argv)

    config = (
        PPOConfig()
        .environment(make_env, env_config={"size": 9})
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=4,
            rollout_fragment_length=50,
        )
        .multi_agent(policies={"walker_0", "walker_1"}, policy_mapping_fn=own_module)
        .debugging(seed=0)
    )
    group = EnvRunnerGroup(config=config)  # MultiAgentEnvRunner: the config is multi-agent
    try:
        episodes = synchronous_parallel_sample(worker_set=group, max_env_steps=args.timesteps)
    finally:
        group.stop()
    done = [e for e in episodes if e.is_done]
    per_agent: dict[str, list[float]] = {}
    for e in done:
        for agent_id, sa_episode in e.agent_episodes.items():
            per_agent.setdefault(agent_id, []).append(sa_episode.get_return())
    env_steps = sum(len(e) for e in episodes)
    agent_steps = sum(e.agent_steps() for e in episodes)
    print(f"{env_steps} env steps, {agent_steps} agent steps, {len(done)} finished episodes")
    means = {agent: float(np.mean(rets)) for agent, rets in sorted(per_agent.items())}
    for agent, mean in means.items():
        print(f"  {agent}: mean return {mean:+.2f} (module {own_module(agent)})")
    return means


if __name__ == "__main__":
    main()
