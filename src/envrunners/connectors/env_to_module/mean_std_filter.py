"""``MeanStdFilter`` (env-to-module): running mean/std normalisation of observations.

The observation filter of ``config.env_runners(observation_filter="MeanStdFilter")``
and RLlib's connector piece of the same name. Statistics update from every
observation batch the runner sees (unless ``update_stats=False``); an
``EnvRunnerGroup`` merges the runners' statistics with ``merge_states``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.errors import ConfigError
from envrunners.utils import filter as filters

__all__ = ["MeanStdFilter"]


class MeanStdFilter(ConnectorV2):
    """Normalises ``batch["obs"]`` (one row per sub-env) with running statistics.

    Args:
        input_observation_space: A ``Box`` observation space (may be set later by
            the pipeline).
        input_action_space: The action space (unused).
        clip / clip_by_value: Clip filtered observations to ``[-clip, clip]``.
        demean / de_mean_to_zero: Subtract the running mean.
        destd / de_std_to_one: Divide by the running std.
        update / update_stats: Update the statistics from the batches it sees.
    """

    reads_episodes = False

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        clip: float | None = None,
        demean: bool | None = None,
        destd: bool | None = None,
        update: bool | None = None,
        clip_by_value: float | None = 10.0,
        de_mean_to_zero: bool = True,
        de_std_to_one: bool = True,
        update_stats: bool = True,
        **kwargs: Any,
    ):
        self.clip = float(clip if clip is not None else clip_by_value or 0.0) or None
        self.demean = de_mean_to_zero if demean is None else demean
        self.destd = de_std_to_one if destd is None else destd
        self.update = update_stats if update is None else update
        self.filter: filters.MeanStdFilter | None = None
        super().__init__(input_observation_space, input_action_space, **kwargs)

    @property
    def clip_by_value(self) -> float | None:
        """RLlib's name of ``clip``."""
        return self.clip

    def recompute_output_observation_space(self, input_observation_space, input_action_space):
        """Filtered observations are float32 in ``[-clip, clip]``; builds the filter."""
        if input_observation_space is None:
            return None
        if not isinstance(input_observation_space, gym.spaces.Box):
            raise ConfigError(
                f"MeanStdFilter needs a Box observation space, got {input_observation_space}; "
                "use observation_filter='NoFilter' for this env, or put a FlattenObservations "
                "piece before the filter."
            )
        shape = input_observation_space.shape
        if self.filter is None or self._shape != shape:  # keep statistics on a rewire
            self._shape = shape
            self.filter = filters.MeanStdFilter(
                shape, demean=self.demean, destd=self.destd, clip=self.clip
            )
        if self.clip is None:
            return gym.spaces.Box(-np.inf, np.inf, shape=shape, dtype=np.float32)
        return gym.spaces.Box(-self.clip, self.clip, shape=shape, dtype=np.float32)

    def __call__(self, *, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Normalise ``batch["obs"]`` in one vectorised call."""
        obs = np.asarray(batch["obs"], dtype=np.float64)
        if self.filter is None:  # used without a space: take the shape of the first batch
            self.input_observation_space = gym.spaces.Box(-np.inf, np.inf, obs.shape[1:])
        batch["obs"] = np.asarray(self.filter(obs, update=self.update), dtype=np.float32)
        return batch

    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The running statistics and the not-yet-synced delta buffer."""
        return self.filter.get_state() if self.filter is not None else {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore statistics from ``get_state`` or ``merge_states``."""
        if state and self.filter is not None:
            self.filter.set_state(state)

    def reset_state(self) -> None:
        """Forget all statistics."""
        if self.filter is not None:
            self.filter = filters.MeanStdFilter(
                self.filter.shape, demean=self.demean, destd=self.destd, clip=self.clip
            )

    @staticmethod
    def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Combine several runners' statistics into one (exact parallel moments)."""
        return filters.MeanStdFilter.merge_states(states)
