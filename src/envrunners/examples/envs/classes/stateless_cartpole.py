"""CartPole without its velocities, at RLlib's path (``ray.rllib.examples.envs.classes``).

Observations are ``[cart position, pole angle]``: a policy must remember earlier
observations to infer the velocities, so a memoryless (MLP) policy does poorly and a
recurrent one (``use_lstm=True``) can solve it. Registered with gymnasium as
``"envrunners/StatelessCartPole-v1"`` (500-step limit, like ``CartPole-v1``) once
``envrunners.env.registry`` is imported; the class itself has no time limit, as in RLlib.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv
from gymnasium.spaces import Box

__all__ = ["StatelessCartPole"]


class StatelessCartPole(CartPoleEnv):
    """Partially observable CartPole: the observation keeps position and angle only."""

    def __init__(self, config: Any = None):
        super().__init__()
        high = np.array([self.x_threshold * 2, self.theta_threshold_radians * 2], np.float32)
        self.observation_space = Box(low=-high, high=high, dtype=np.float32)

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[[0, 2]], reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = super().reset(seed=seed, options=options)
        return obs[[0, 2]], info
