"""envrunners' numpy episode chunks as RLlib ``SingleAgentEpisode`` objects, without copies.

The sampler cuts each ``sample()`` call's episodes out of its column buffers once;
this wraps those same arrays in RLlib's ``InfiniteLookbackBuffer``s (finalized,
i.e. what RLlib's ``to_numpy()`` gives), keeping ids, ``t_started``, the lookback
and the extra model outputs, so RLlib's learner connectors read them as their own.
With ``as_lists`` the buffers hold per-step lists instead (not finalized), as RLlib's
runner returns its episodes when ``episodes_to_numpy=False``.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer as RLlibBuffer
from ray.rllib.utils.spaces.space_utils import unbatch

__all__ = ["to_rllib_episode"]

#: The space RLlib gives its reward buffers.
_REWARD_SPACE = gym.spaces.Box(float("-inf"), float("inf"), (), np.float32)


def to_rllib_episode(
    episode: Any,
    observation_space: gym.Space,
    action_space: gym.Space,
    duration_s: float | None = None,
    as_lists: bool = False,
) -> RLlibEpisode:
    """RLlib's episode holding ``episode``'s (an envrunners numpy chunk) arrays.

    ``duration_s``: the episode's wall time so far, for RLlib's ``get_duration_s``.
    ``as_lists``: list buffers of per-step rows (views of the arrays), not finalized.
    """
    k = episode.observations.lookback
    data = _rows if as_lists else _as_is

    def buf(src: Any, space: gym.Space | None = None) -> RLlibBuffer:
        return RLlibBuffer(data=data(src.data), lookback=k, space=space)

    out = RLlibEpisode(
        episode.id_,
        observations=buf(episode.observations, observation_space),
        observation_space=observation_space,
        infos=RLlibBuffer(data=list(episode.infos.data), lookback=k),
        actions=buf(episode.actions, action_space),
        action_space=action_space,
        # float64, as RLlib's ``to_numpy()`` batches the env's Python/float64 rewards.
        rewards=RLlibBuffer(
            data=data(episode.rewards.data.astype(np.float64)), lookback=k, space=_REWARD_SPACE
        ),
        terminated=episode.is_terminated,
        truncated=episode.is_truncated,
        extra_model_outputs={key: buf(b) for key, b in episode.extra_model_outputs.items()},
        t_started=episode.t_started,
        len_lookback_buffer=k,
    )
    if duration_s is not None:
        now = time.perf_counter()
        out._start_time, out._last_step_time = now - duration_s, now
    return out


def _as_is(data: Any) -> Any:
    return data


def _rows(data: Any) -> list:
    """A column as the per-step list RLlib's list buffers hold (nested rows for
    Dict/Tuple spaces and ``state_out``)."""
    if isinstance(data, np.ndarray):
        return list(data)
    return unbatch(data)
