"""``NormalizeAndClipActions`` (module-to-env): module actions -> env actions for Box spaces.

``normalize_actions``: the module acts in ``[-1, 1]``; actions are unsquashed to
``[low, high]`` for the env. ``clip_actions``: actions are clipped to the bounds.
Either way ``batch["actions"]`` keeps what the module produced (that is what
episodes record) and the env receives ``batch["actions_for_env"]``, as in RLlib.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.connectors.connector_v2 import ConnectorV2

__all__ = ["NormalizeAndClipActions"]


class NormalizeAndClipActions(ConnectorV2):
    """Adds ``actions_for_env`` next to ``actions`` (whole ``(N, ...)`` batch).

    Args:
        input_observation_space: The observation space (unused).
        input_action_space: The env's action space (may be set later); only a
            ``Box`` is unsquashed/clipped, other spaces pass through.
        normalize_actions: Unsquash from ``[-1, 1]`` to the bounds (finite bounds only).
        clip_actions: Clip to the bounds.
    """

    reads_episodes = False

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        normalize_actions: bool = True,
        clip_actions: bool = False,
        **kwargs: Any,
    ):
        self.normalize_actions = bool(normalize_actions)
        self.clip_actions = bool(clip_actions)
        self._active = False
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def recompute_output_action_space(self, input_observation_space, input_action_space):
        """Unchanged; prepares the bounds for the call."""
        space = input_action_space
        self._active = isinstance(space, gym.spaces.Box) and (
            self.normalize_actions or self.clip_actions
        )
        if self._active:
            self._low = space.low.astype(np.float64)
            self._high = space.high.astype(np.float64)
            bounded = np.isfinite(self._low) & np.isfinite(self._high)
            self._unsquash = self.normalize_actions and bool(bounded.all())
            self._dtype = space.dtype
        return input_action_space

    def __call__(self, *, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
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
