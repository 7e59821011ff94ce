"""The built-in connector steps: observation filter, action unsquash/clip, reward clip."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.errors import ConfigError
from envrunners.utils import filter as filters

__all__ = ["MeanStdFilter", "NormalizeAndClipActions", "clip_rewards_fn"]


class MeanStdFilter(ConnectorV2):
    """Normalises observations with running mean/std statistics (env-to-module).

    Statistics update from every observation the runner sees unless
    ``update=False``; ``merge_states`` combines several runners' statistics.
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        clip: float = 10.0,
        demean: bool = True,
        destd: bool = True,
        update: bool = True,
        **kwargs: Any,
    ):
        super().__init__(input_observation_space, input_action_space)
        if input_observation_space is not None and not isinstance(
            input_observation_space, gym.spaces.Box
        ):
            raise ConfigError(
                f"MeanStdFilter needs a Box observation space, got {input_observation_space}; "
                "use observation_filter='NoFilter' for this env."
            )
        self.clip = clip
        self.update = update
        shape = input_observation_space.shape if input_observation_space is not None else ()
        self.filter = filters.MeanStdFilter(shape, demean=demean, destd=destd, clip=clip)

    def recompute_output_observation_space(self, input_observation_space, input_action_space):
        """Filtered observations are float32 in ``[-clip, clip]``."""
        if input_observation_space is None:
            return None
        return gym.spaces.Box(
            -self.clip, self.clip, shape=input_observation_space.shape, dtype=np.float32
        )

    def __call__(self, *, batch: dict[str, Any], explore: bool | None = None, **kwargs: Any):
        """Normalise ``batch["obs"]`` (one row per sub-env) in one vectorised call."""
        obs = np.asarray(batch["obs"], dtype=np.float64)
        batch["obs"] = np.asarray(self.filter(obs, update=self.update), dtype=np.float32)
        return batch

    def get_state(self) -> dict[str, Any]:
        """The running statistics and the not-yet-synced delta buffer."""
        return self.filter.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore statistics from ``get_state`` or ``merge_states``."""
        self.filter.set_state(state)

    def reset_state(self) -> None:
        """Forget all statistics."""
        self.filter = filters.MeanStdFilter(
            self.filter.shape, demean=self.filter.demean, destd=self.filter.destd, clip=self.clip
        )

    @staticmethod
    def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Combine several runners' statistics into one (exact parallel moments)."""
        return filters.MeanStdFilter.merge_states(states)


class NormalizeAndClipActions(ConnectorV2):
    """Maps module actions to env actions for Box spaces (module-to-env).

    ``normalize_actions``: the module acts in ``[-1, 1]``; actions are unsquashed
    to ``[low, high]`` for the env. ``clip_actions``: actions are clipped to the
    bounds. Either way ``batch["actions"]`` keeps what the module produced and the
    env receives ``batch["actions_for_env"]``.
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        normalize_actions: bool = True,
        clip_actions: bool = False,
        **kwargs: Any,
    ):
        super().__init__(input_observation_space, input_action_space)
        self.normalize_actions = normalize_actions
        self.clip_actions = clip_actions
        space = input_action_space
        self._active = isinstance(space, gym.spaces.Box) and (normalize_actions or clip_actions)
        if self._active:
            self._low = space.low.astype(np.float64)
            self._high = space.high.astype(np.float64)
            bounded = np.isfinite(self._low) & np.isfinite(self._high)
            self._unsquash = normalize_actions and bool(bounded.all())
            self._dtype = space.dtype

    def __call__(self, *, batch: dict[str, Any], explore: bool | None = None, **kwargs: Any):
        """Add ``actions_for_env`` next to ``actions``."""
        actions = batch["actions"]
        if not self._active:
            batch["actions_for_env"] = actions
            return batch
        a = np.asarray(actions, dtype=np.float64)
        if self._unsquash:
            a = self._low + (np.clip(a, -1.0, 1.0) + 1.0) * 0.5 * (self._high - self._low)
        elif self.clip_actions:
            a = np.clip(a, self._low, self._high)
        batch["actions_for_env"] = a.astype(self._dtype, copy=False)
        return batch


def clip_rewards_fn(clip_rewards: bool | float | None) -> Callable[[np.ndarray], np.ndarray] | None:
    """The reward transform for ``config.clip_rewards``: sign (True), ``[-c, c]`` or none."""
    if clip_rewards is None or clip_rewards is False:
        return None
    if clip_rewards is True:
        return np.sign
    if isinstance(clip_rewards, int | float) and clip_rewards > 0:
        bound = float(clip_rewards)
        return lambda r: np.clip(r, -bound, bound)
    raise ConfigError(
        f"clip_rewards={clip_rewards!r} is invalid: expected None/False (no clipping), True "
        "(sign of the reward) or a positive number c (clip to [-c, c])."
    )
