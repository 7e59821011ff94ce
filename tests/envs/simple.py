"""Deterministic test envs: counting episodes of fixed length, and envs that fail on cue."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class CountingEnv(gym.Env):
    """Obs = step count in the episode; reward 1 per step; ends after ``episode_len`` steps.

    ``truncate=True`` ends by truncation instead of termination.
    """

    metadata: dict[str, Any] = {}

    def __init__(self, config: dict | None = None):
        config = dict(config or {})
        self.episode_len = int(config.get("episode_len", 5))
        self.truncate = bool(config.get("truncate", False))
        self.reward = float(config.get("reward", 1.0))
        self.observation_space = gym.spaces.Box(0.0, 1e6, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0
        self.resets = 0
        self.last_seed: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.last_seed = seed
        self.t = 0
        self.resets += 1
        return np.array([0.0], np.float32), {"reset": True}

    def step(self, action):
        self.t += 1
        done = self.t >= self.episode_len
        obs = np.array([float(self.t)], np.float32)
        return obs, self.reward, done and not self.truncate, done and self.truncate, {}


class FailingEnv(CountingEnv):
    """A CountingEnv whose ``step`` raises on its ``fail_at_step``-th call overall.

    With ``fail_once=True`` (default) only the first failure happens: later
    instances read a class-level flag, or, across processes, ``flag_file`` (created
    by the first failure) and behave.
    """

    failures = 0

    def __init__(self, config: dict | None = None):
        super().__init__(config)
        config = dict(config or {})
        self.fail_at_step = int(config.get("fail_at_step", 3))
        self.fail_once = bool(config.get("fail_once", True))
        self.error_cls = config.get("error_cls", ValueError)
        self.flag_file = config.get("flag_file")
        self.steps_total = 0

    def _failed_before(self) -> bool:
        if self.flag_file is not None:
            import os

            return os.path.exists(self.flag_file)
        return FailingEnv.failures > 0

    def step(self, action):
        self.steps_total += 1
        if self.steps_total == self.fail_at_step and not (self.fail_once and self._failed_before()):
            FailingEnv.failures += 1
            if self.flag_file is not None:
                try:
                    with open(self.flag_file, "x"):
                        pass
                except FileExistsError:
                    return super().step(action)
            raise self.error_cls(f"simulated failure at step {self.steps_total}")
        return super().step(action)


class BadObsEnv(CountingEnv):
    """Returns an observation outside its observation space."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.array([-5.0], np.float32), {}


class MarkedEnv(gym.Env):
    """Obs ``[1000 * episode + t + 1]`` (never 0), shape (1,); reward ``t``; ends at t=4
    (``config["length"]``)."""

    def __init__(self, config: dict | None = None):
        self.observation_space = gym.spaces.Box(0.0, 1e9, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.episode = -1
        self.t = 0
        self.length = int((config or {}).get("length", 4))

    def _obs(self) -> np.ndarray:
        return np.array([1000.0 * self.episode + self.t + 1], np.float32)

    def _ends(self) -> bool:
        return self.t >= self.length

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(self.t), self._ends(), False, {}


class SubEnvMarkedEnv(MarkedEnv):
    """Obs ``[10000 * (vector_index + 1) + 100 * episode + t]``: which sub-env, episode and
    step each observation is; episodes of 3 to 7 steps (by sub-env and episode), so
    sub-envs drift apart."""

    def __init__(self, config: dict | None = None):
        super().__init__(config)
        self.index = int(getattr(config, "vector_index", 0))

    def _obs(self) -> np.ndarray:
        return np.array([10000.0 * (self.index + 1) + 100.0 * self.episode + self.t], np.float32)

    def _ends(self) -> bool:
        return self.t >= 3 + (self.index + self.episode) % 5


class DictSpacesEnv(gym.Env):
    """Dict observations and Dict actions (a Discrete and a Box leaf); 3-12 step episodes."""

    observation_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-5.0, 5.0, (2,), np.float32),
            "t": gym.spaces.Box(0.0, 100.0, (1,), np.float32),
        }
    )
    action_space = gym.spaces.Dict(
        {"move": gym.spaces.Discrete(3), "push": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}
    )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.normal(size=2).astype(np.float32)
        self.t, self.limit = 0, int(self.np_random.integers(3, 13))
        return self._obs(), {}

    def _obs(self):
        return {"pos": self.pos.copy(), "t": np.array([self.t], np.float32)}

    def step(self, action):
        self.t += 1
        moved = self.pos + (int(action["move"]) - 1) * 0.3 + action["push"] * 0.1
        self.pos = np.clip(moved, -5, 5).astype(np.float32)
        reward = -float(np.abs(self.pos).sum())
        return self._obs(), reward, False, self.t >= self.limit, {}
