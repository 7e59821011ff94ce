"""``FrameStackingEnvToModule``: the last ``num_frames`` observations, stacked on the last axis.

As RLlib's piece: the observation space must be a ``Box`` whose last axis is 1
(e.g. ``(84, 84, 1)`` grey frames); the output is ``(..., num_frames)``, oldest
frame first, with zero frames before an episode's first observation. Here the
frame history is kept per sub-env in one ``(N, num_frames, ...)`` array and
cleared at each sub-env's episode start (``episodes.starts`` from the runner). A
ready-first batch updates only its sub-envs' rows (``episodes.env_indices``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.errors import ConfigError, ConnectorError

__all__ = ["FrameStackingEnvToModule"]


def episode_starts(connector: Any, episodes: Any, rows: int) -> np.ndarray:
    """``episodes.starts`` (``(rows,)`` bool), or a ``ConnectorError`` naming ``connector``."""
    starts = getattr(episodes, "starts", None)
    if starts is None or len(starts) != rows:
        raise ConnectorError(
            f"{type(connector).__name__} needs to know where each sub-env's episode starts: "
            "call it with the `episodes` of a SingleAgentEnvRunner's env-to-module pipeline "
            "(a VectorEpisodes with one row per sub-env, see "
            f"envrunners.connectors.vector_episodes); got {type(episodes).__name__}."
        )
    return starts


def sub_env_rows(episodes: Any, rows: int) -> tuple[np.ndarray | None, int]:
    """``(episodes.env_indices, episodes.num_envs)``: which sub-env each of the ``rows``
    batch rows is (None: row ``i`` is sub-env ``i``) and how many sub-envs there are."""
    ids = getattr(episodes, "env_indices", None)
    if ids is None:
        return None, rows
    return ids, int(episodes.num_envs)


class FrameStackingEnvToModule(ConnectorV2):
    """Stacks each sub-env's last ``num_frames`` observations into one.

    Works on ready-first batches (its history rows follow ``episodes.env_indices``).

    Args:
        input_observation_space: A ``Box`` with last axis 1 (may be set later).
        input_action_space: The action space (unused).
        num_frames: How many observations to stack.
    """

    supports_ready_first = True

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        num_frames: int = 1,
        multi_agent: bool = False,
        **kwargs: Any,
    ):
        if multi_agent:
            raise ConfigError(
                "FrameStackingEnvToModule(multi_agent=True) is not supported: the "
                "multi-agent runner's pipelines are per module and get no per-sub-env "
                "episode starts. Stack frames in the env instead (a gymnasium FrameStack "
                "wrapper)."
            )
        self.num_frames = int(num_frames)
        self._frames: np.ndarray | None = None
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def recompute_output_observation_space(self, input_observation_space, input_action_space):
        """``Box`` with the last axis ``num_frames`` wide (bounds repeated)."""
        space = input_observation_space
        if space is None:
            return None
        if not isinstance(space, gym.spaces.Box) or not space.shape or space.shape[-1] != 1:
            raise ConfigError(
                "FrameStackingEnvToModule needs a Box observation space whose last axis is 1 "
                f"(e.g. (84, 84, 1)), got {space!r}."
            )
        return gym.spaces.Box(
            low=np.repeat(space.low, self.num_frames, axis=-1),
            high=np.repeat(space.high, self.num_frames, axis=-1),
            shape=(*space.shape[:-1], self.num_frames),
            dtype=space.dtype,
        )

    def __call__(self, *, batch: dict[str, Any], episodes: Any, **kwargs: Any) -> dict[str, Any]:
        """Shift the batch's sub-envs' histories by one frame, add the new one, clear at
        starts.

        The history is kept frame-major, ``(N, num_frames, ...)``: shifting moves whole
        frames, and the ``(..., num_frames)`` output is put together one frame at a time.
        Along the last axis both would be element-by-element copies (~5x slower for
        84x84 frames).
        """
        obs = np.asarray(batch["obs"])
        starts = episode_starts(self, episodes, len(obs))
        ids, num_envs = sub_env_rows(episodes, len(obs))
        shape = (num_envs, self.num_frames, *obs.shape[1:-1])
        history = self._frames
        if history is None or history.shape != shape or history.dtype != obs.dtype:
            history = self._frames = np.zeros(shape, obs.dtype)
        planes = history if ids is None else history[ids]  # (a copy: written back below)
        planes[:, :-1] = planes[:, 1:]
        planes[starts] = 0
        planes[:, -1] = obs[..., 0]
        if ids is not None:
            history[ids] = planes
        batch["obs"] = np.stack([planes[:, j] for j in range(self.num_frames)], axis=-1)
        return batch

    def reset_state(self) -> None:
        """Forget the frame histories."""
        self._frames = None
