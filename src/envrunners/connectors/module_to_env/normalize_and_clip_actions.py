"""``NormalizeAndClipActions`` (module-to-env): module actions -> env actions for Box spaces.

Box leaves of ``Dict`` / ``Tuple`` action spaces too, each with its own bounds (as RLlib).

``normalize_actions``: the module acts in ``[-1, 1]``; actions are unsquashed to
``[low, high]`` for the env. ``clip_actions``: actions are clipped to the bounds.
Either way ``batch["actions"]`` keeps what the module produced (that is what
episodes record) and the env receives ``batch["actions_for_env"]``, as in RLlib.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.core import _nested
from envrunners.core.rl_module._space_layout import space_structure

__all__ = ["NormalizeAndClipActions", "has_box_leaf"]


@dataclasses.dataclass(frozen=True)
class _BoxBounds:
    """How one Box leaf's actions become env actions."""

    low: np.ndarray
    high: np.ndarray
    unsquash: bool
    dtype: Any


def _box_bounds(space: gym.Space, normalize: bool, clip: bool) -> _BoxBounds | None:
    """A leaf's ``_BoxBounds`` for a ``Box`` to unsquash or clip; None for a leaf that
    passes through."""
    if not isinstance(space, gym.spaces.Box) or not (normalize or clip):
        return None
    low, high = space.low.astype(np.float64), space.high.astype(np.float64)
    bounded = bool((np.isfinite(low) & np.isfinite(high)).all())
    return _BoxBounds(low, high, normalize and bounded, space.dtype)


def has_box_leaf(space: gym.Space | None) -> bool:
    """Whether ``space`` is a ``Box`` or a ``Dict`` / ``Tuple`` space with one inside."""
    return any(isinstance(s, gym.spaces.Box) for s in _nested.flatten(space_structure(space)))


def _for_env(plan: _BoxBounds | None, actions: Any, clip: bool) -> Any:
    """One leaf's env actions: unsquashed or clipped by its ``plan`` (None: as they are)."""
    if plan is None:
        return actions
    a = np.asarray(actions, dtype=np.float64)
    if plan.unsquash:
        a = plan.low + (np.clip(a, -1.0, 1.0) + 1.0) * 0.5 * (plan.high - plan.low)
    elif clip:
        a = np.clip(a, plan.low, plan.high)
    return a.astype(plan.dtype, copy=False)


class NormalizeAndClipActions(ConnectorV2):
    """Adds ``actions_for_env`` next to ``actions`` (whole ``(N, ...)`` batch).

    Args:
        input_observation_space: The observation space (unused).
        input_action_space: The env's action space (may be set later); its ``Box``
            leaves (the space itself, or those inside ``Dict`` / ``Tuple`` spaces) are
            unsquashed/clipped, other leaves pass through.
        normalize_actions: Unsquash from ``[-1, 1]`` to the bounds (a Box with finite
            bounds only).
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
        self._plan: Any = None
        self._active = False
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def recompute_output_action_space(self, input_observation_space, input_action_space):
        """Unchanged; prepares the bounds for the call."""
        # Per leaf of the space (nested like ``Dict`` / ``Tuple`` spaces).
        self._plan = _nested.map_structure(
            lambda leaf: _box_bounds(leaf, self.normalize_actions, self.clip_actions),
            space_structure(input_action_space),
        )
        self._active = any(p is not None for p in _nested.flatten(self._plan))
        return input_action_space

    def __call__(self, *, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Add ``actions_for_env`` next to ``actions``."""
        actions = batch["actions"]
        if not self._active:
            batch["actions_for_env"] = actions
            return batch
        batch["actions_for_env"] = _nested.map_structure(
            lambda plan, leaf: _for_env(plan, leaf, self.clip_actions), self._plan, actions
        )
        return batch
