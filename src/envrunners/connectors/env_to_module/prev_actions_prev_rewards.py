"""``PrevActionsPrevRewards``: each sub-env's last n actions and rewards next to its observation.

As RLlib's piece, the observation becomes a ``Dict``::

    {"_orig_obs": obs, "prev_n_actions": (n_prev_actions * A,), "prev_n_rewards": (n_prev_rewards,)}

with ``Discrete`` actions one-hot (``A = n``; ``Box`` actions flattened), oldest
first, zeros before an episode's first step. The histories are kept per sub-env
in ``(N, n, ...)`` arrays, fed from ``episodes.actions`` / ``episodes.rewards``
and cleared at ``episodes.starts``; a ready-first batch updates only its sub-envs'
rows (``episodes.env_indices``). The default module flattens the ``Dict``
itself; a custom module may want ``FlattenObservations`` after this piece.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.connectors.env_to_module.frame_stacking import episode_starts, sub_env_rows
from envrunners.errors import ConfigError

__all__ = ["PrevActionsPrevRewards"]


class PrevActionsPrevRewards(ConnectorV2):
    """Adds the previous ``n_prev_actions`` actions and ``n_prev_rewards`` rewards.

    Args:
        input_observation_space: The observation space (may be set later).
        input_action_space: A ``Discrete`` or ``Box`` action space.
        n_prev_actions: How many previous actions (0: none).
        n_prev_rewards: How many previous rewards (0: none).
    """

    ORIG_OBS_KEY = "_orig_obs"
    PREV_ACTIONS_KEY = "prev_n_actions"
    PREV_REWARDS_KEY = "prev_n_rewards"
    supports_ready_first = True

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        multi_agent: bool = False,
        n_prev_actions: int = 1,
        n_prev_rewards: int = 1,
        **kwargs: Any,
    ):
        if multi_agent:
            raise ConfigError(
                "PrevActionsPrevRewards(multi_agent=True) is not supported: the multi-agent "
                "runner's pipelines are per module and get no per-sub-env episode views."
            )
        self.n_prev_actions = int(n_prev_actions)
        self.n_prev_rewards = int(n_prev_rewards)
        self._actions: np.ndarray | None = None
        self._rewards: np.ndarray | None = None
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def _action_width(self, space: gym.Space) -> int:
        if isinstance(space, gym.spaces.Discrete):
            return int(space.n)
        if isinstance(space, gym.spaces.Box):
            return int(np.prod(space.shape)) if space.shape else 1
        raise ConfigError(
            f"PrevActionsPrevRewards handles Discrete and Box action spaces, got {space!r}."
        )

    def recompute_output_observation_space(self, input_observation_space, input_action_space):
        """``Dict(_orig_obs, prev_n_actions, prev_n_rewards)``."""
        if input_observation_space is None or input_action_space is None:
            return None
        width = self._action_width(input_action_space) * self.n_prev_actions
        low = 0.0 if isinstance(input_action_space, gym.spaces.Discrete) else float("-inf")
        high = 1.0 if isinstance(input_action_space, gym.spaces.Discrete) else float("inf")
        return gym.spaces.Dict(
            {
                self.ORIG_OBS_KEY: input_observation_space,
                self.PREV_ACTIONS_KEY: gym.spaces.Box(low, high, (width,), np.float32),
                self.PREV_REWARDS_KEY: gym.spaces.Box(
                    float("-inf"), float("inf"), (self.n_prev_rewards,), np.float32
                ),
            }
        )

    def _encode(self, actions: Any, rows: int) -> np.ndarray:
        space = self.input_action_space
        if isinstance(space, gym.spaces.Discrete):
            out = np.zeros((rows, int(space.n)), np.float32)
            out[np.arange(rows), np.asarray(actions).reshape(rows) - int(space.start)] = 1.0
            return out
        return np.asarray(actions, np.float32).reshape(rows, -1)

    def __call__(self, *, batch: dict[str, Any], episodes: Any, **kwargs: Any) -> dict[str, Any]:
        """Shift the batch's sub-envs' histories by one step, add the newest action and
        reward, clear at starts."""
        obs = batch["obs"]
        rows = len(episodes.starts) if hasattr(episodes, "starts") else -1
        starts = episode_starts(self, episodes, rows)
        ids, num_envs = sub_env_rows(episodes, rows)
        width = self._action_width(self.input_action_space)
        if self._actions is None or len(self._actions) != num_envs:
            self._actions = np.zeros((num_envs, self.n_prev_actions, width), np.float32)
            self._rewards = np.zeros((num_envs, self.n_prev_rewards), np.float32)
        # The batch's rows of the histories (copies for a ready-first batch: written back).
        acts = self._actions if ids is None else self._actions[ids]
        rews = self._rewards if ids is None else self._rewards[ids]
        if episodes.actions is not None:
            if self.n_prev_actions:
                acts[:, :-1] = acts[:, 1:]
                acts[:, -1] = self._encode(episodes.actions, rows)
            if self.n_prev_rewards:
                rews[:, :-1] = rews[:, 1:]
                rews[:, -1] = episodes.rewards
        acts[starts] = 0.0
        rews[starts] = 0.0
        if ids is not None:
            self._actions[ids] = acts
            self._rewards[ids] = rews
        batch["obs"] = {
            self.ORIG_OBS_KEY: obs,
            self.PREV_ACTIONS_KEY: acts.reshape(rows, -1).copy(),
            self.PREV_REWARDS_KEY: rews.copy(),
        }
        return batch

    def reset_state(self) -> None:
        """Forget the histories."""
        self._actions = self._rewards = None
