"""``config.clip_rewards`` as a function of the reward batch (sign, ``[-c, c]`` or none)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from envrunners.errors import ConfigError

__all__ = ["clip_rewards_fn"]


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
