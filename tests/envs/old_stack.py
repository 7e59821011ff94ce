"""Envs and policies for the old-API-stack tests (RolloutWorker, policies, sampler)."""

from __future__ import annotations

import random
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Discrete

from envrunners.env.multi_agent_env import MultiAgentEnv
from envrunners.evaluation.postprocessing import compute_advantages
from envrunners.policy.policy import Policy


class MockEnv(gym.Env):
    """Obs 0, reward ``reward`` per step, terminates after ``episode_length`` steps.

    Logs every observation it returns (``obs_log``) and the seeds it was reset with.
    """

    def __init__(self, episode_length: int = 10, reward: float = 1.0, config: Any = None):
        self.episode_length = episode_length
        self.reward = reward
        self.observation_space = Box(-1e6, 1e6, (1,), np.float32)
        self.action_space = Discrete(2)
        self.t = 0
        self.seeds: list[int | None] = []
        self.obs_log: list[float] = []
        self.config = config

    def _obs(self, value: float) -> np.ndarray:
        self.obs_log.append(value)
        return np.array([value], np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.seeds.append(seed)
        self.t = 0
        return self._obs(0.0), {}

    def step(self, action):
        self.t += 1
        done = self.t >= self.episode_length
        return self._obs(float(self.t)), self.reward, done, False, {"t": self.t}


class MockEnv2(MockEnv):
    """A MockEnv paying 100 per step (reward clipping tests)."""

    def __init__(self, episode_length: int = 10, config: Any = None):
        super().__init__(episode_length, reward=100.0, config=config)


class BoxActionEnv(gym.Env):
    """Box(-2, 1, (3,)) actions; an action outside the bounds raises ``ValueError``."""

    def __init__(self, low: float = -2.0, high: float = 1.0):
        self.observation_space = Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = Box(low, high, (3,), np.float32)
        self.received: list[np.ndarray] = []
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        action = np.asarray(action)
        if not self.action_space.contains(action.astype(np.float32)):
            raise ValueError(f"Illegal action {action}")
        self.received.append(action.copy())
        self.t += 1
        return np.zeros(2, np.float32), 1.0, self.t >= 10, False, {}


class MockPolicy(Policy):
    """Random 0/1 actions; postprocessing adds plain discounted returns (RLlib's test policy)."""

    def __init__(self, observation_space, action_space, config):
        super().__init__(observation_space, action_space, config)
        self.rng = np.random.default_rng(0)
        self.weights = {"w": np.zeros(1, np.float32)}
        self.learned: list[int] = []

    def compute_actions(self, obs_batch, state_batches=None, *args, **kwargs):
        n = len(obs_batch)
        return self.rng.integers(0, 2, n), [], {}

    def postprocess_trajectory(self, sample_batch, other_agent_batches=None, episode=None):
        return compute_advantages(sample_batch, 100.0, 0.9, use_gae=False, use_critic=False)

    def learn_on_batch(self, samples):
        self.learned.append(len(samples))
        return {"learned": len(samples)}

    def compute_gradients(self, postprocessed_batch):
        return [np.ones(1)], {"n": len(postprocessed_batch)}

    def apply_gradients(self, gradients):
        self.weights["w"] = self.weights["w"] + gradients[0]

    def get_weights(self):
        return {k: v.copy() for k, v in self.weights.items()}

    def set_weights(self, weights):
        self.weights = {k: np.asarray(v).copy() for k, v in weights.items()}


class OutOfBoundsPolicy(MockPolicy):
    """Always acts ``[5, -5, 0]`` (ignores the Box bounds)."""

    def compute_actions(self, obs_batch, state_batches=None, *args, **kwargs):
        n = len(obs_batch)
        return np.tile(np.array([5.0, -5.0, 0.0], np.float32), (n, 1)), [], {}


class BasicMultiAgent(MultiAgentEnv):
    """``num`` agents (ids 0..num-1) that all end after 25 steps; reward 1 per agent step."""

    def __init__(self, num: int = 4):
        super().__init__()
        self.possible_agents = self.agents = list(range(num))
        self.observation_spaces = {a: Box(-1.0, 1.0, (2,), np.float32) for a in self.agents}
        self.action_spaces = {a: Discrete(2) for a in self.agents}
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {a: np.zeros(2, np.float32) for a in self.agents}, {}

    def step(self, action_dict):
        self.t += 1
        done = self.t >= 25
        obs = {a: np.full(2, 0.01 * self.t, np.float32) for a in action_dict}
        rew = dict.fromkeys(action_dict, 1.0)
        terms = dict.fromkeys(action_dict, done)
        terms["__all__"] = done
        return obs, rew, terms, {"__all__": False}, {}


class MultiAgentTrafficGrid(MultiAgentEnv):
    """The seed page's example env: ``num_cars`` cars and 2 traffic lights, 10-step episodes."""

    def __init__(self, num_cars: int = 25, num_lights: int = 2):
        super().__init__()
        cars = [f"car_{i}" for i in range(num_cars)]
        lights = [f"traffic_light_{i}" for i in range(num_lights)]
        self.possible_agents = self.agents = cars + lights
        self.observation_spaces = {
            a: Box(-1.0, 1.0, (3,) if a.startswith("car_") else (2,), np.float32)
            for a in self.agents
        }
        self.action_spaces = {a: Discrete(3 if a.startswith("car_") else 2) for a in self.agents}
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return {a: np.zeros(self.observation_spaces[a].shape, np.float32) for a in self.agents}, {}

    def step(self, action_dict):
        self.t += 1
        obs = {
            a: np.full(self.observation_spaces[a].shape, 0.05 * self.t, np.float32)
            for a in action_dict
        }
        rew = {a: float(random.random()) for a in action_dict}
        done = self.t >= 10
        return obs, rew, {"__all__": done}, {"__all__": False}, {}
