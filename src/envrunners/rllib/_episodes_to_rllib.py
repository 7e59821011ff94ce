"""envrunners' numpy episode chunks as RLlib ``SingleAgentEpisode`` objects, without copies.

The sampler cuts each ``sample()`` call's episodes out of its column buffers once;
this wraps those same arrays in RLlib's ``InfiniteLookbackBuffer``s (finalized,
i.e. what RLlib's ``to_numpy()`` gives), keeping ids, ``t_started``, the lookback
and the extra model outputs, so RLlib's learner connectors read them as their own.
With ``as_lists`` the buffers hold per-step lists instead (not finalized), as RLlib's
runner returns its episodes when ``episodes_to_numpy=False``.
``RLlibEpisodeList`` (what ``sample()`` returns) pickles a call's episodes as one
array per column, so a remote runner's reply costs a few arrays instead of a few
per episode; the receiver gets a plain list of RLlib's own episode objects.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer as RLlibBuffer
from ray.rllib.utils.spaces.space_utils import get_base_struct_from_space, unbatch

__all__ = ["RLlibEpisodeList", "to_rllib_episode"]

#: The space RLlib gives its reward buffers.
_REWARD_SPACE = gym.spaces.Box(float("-inf"), float("inf"), (), np.float32)
_NEW_EPISODE = RLlibEpisode.__new__
_NEW_BUFFER = RLlibBuffer.__new__
#: The state ``InfiniteLookbackBuffer.__init__`` gives a buffer, in its order.
_BUFFER_KEYS = ("data", "lookback", "finalized", "_space", "_space_struct")
#: ``SingleAgentEpisode`` slots other than its buffers, packed as they are.
_PLAIN_SLOTS = (
    "id_",
    "agent_id",
    "module_id",
    "multi_agent_episode_id",
    "is_terminated",
    "is_truncated",
    "t",
    "t_started",
    "_observation_space",
    "_action_space",
    "_start_time",
    "_last_step_time",
    "_last_added_observation",
    "_last_added_infos",
    "_custom_data",
)
_COLUMNS = ("observations", "actions", "rewards")
#: Columns up to this size are joined into one array for pickling.
_JOIN_MAX_BYTES = 1 << 22


def _buffer(data: Any, lookback: int, space: Any, struct: Any) -> RLlibBuffer:
    """``InfiniteLookbackBuffer(data, lookback, space)`` without its per-call setter work."""
    out = _NEW_BUFFER(RLlibBuffer)
    out.__dict__.update(
        data=data,
        lookback=min(lookback, len(data)),
        finalized=not isinstance(data, list),
        _space=space,
        _space_struct=struct,
    )
    return out


def _episode(
    id_: str,
    observations: RLlibBuffer,
    infos: RLlibBuffer,
    actions: RLlibBuffer,
    rewards: RLlibBuffer,
    extra_model_outputs: dict,
    terminated: bool,
    truncated: bool,
    t_started: int,
) -> RLlibEpisode:
    """The episode ``SingleAgentEpisode(...)`` builds from these finalized buffers.

    Sets every slot as its ``__init__`` does (``t`` from the rewards past the
    lookback); its ``validate()`` holds by construction of the sampler's columns.
    """
    out = _NEW_EPISODE(RLlibEpisode)
    out.id_ = id_
    out.agent_id = out.module_id = out.multi_agent_episode_id = None
    out.observations = observations
    out._observation_space = observations._space
    out.infos = infos
    out.actions = actions
    out._action_space = actions._space
    out.rewards = rewards
    out.is_terminated = terminated
    out.is_truncated = truncated
    out.extra_model_outputs = extra_model_outputs
    out.t_started = t_started or 0
    out.t = len(rewards) + out.t_started
    out._custom_data = {}
    out._start_time = out._last_step_time = None
    out._last_added_observation = out._last_added_infos = None
    return out


def _own_list(infos: Any) -> list:
    """The chunk's info list itself (the chunk is dropped after conversion), else a copy."""
    return infos if type(infos) is list else list(infos)


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
    if as_lists:
        return _list_episode(episode, observation_space, action_space, duration_s)
    k = episode.observations.lookback
    obs_struct = get_base_struct_from_space(observation_space)
    act_struct = get_base_struct_from_space(action_space)
    out = _episode(
        episode.id_,
        observations=_buffer(episode.observations.data, k, observation_space, obs_struct),
        infos=_buffer(_own_list(episode.infos.data), k, None, None),
        actions=_buffer(episode.actions.data, k, action_space, act_struct),
        # float64, as RLlib's ``to_numpy()`` batches the env's Python/float64 rewards.
        rewards=_buffer(episode.rewards.data.astype(np.float64), k, _REWARD_SPACE, _REWARD_SPACE),
        extra_model_outputs={
            key: _buffer(b.data, k, None, None) for key, b in episode.extra_model_outputs.items()
        },
        terminated=episode.is_terminated,
        truncated=episode.is_truncated,
        t_started=episode.t_started,
    )
    if duration_s is not None:
        now = time.perf_counter()
        out._start_time, out._last_step_time = now - duration_s, now
    return out


def _list_episode(
    episode: Any,
    observation_space: gym.Space,
    action_space: gym.Space,
    duration_s: float | None,
) -> RLlibEpisode:
    """``to_rllib_episode(..., as_lists=True)``: RLlib's own constructor over row lists."""
    k = episode.observations.lookback

    def buf(src: Any, space: gym.Space | None = None) -> RLlibBuffer:
        return RLlibBuffer(data=_rows(src.data), lookback=k, space=space)

    out = RLlibEpisode(
        episode.id_,
        observations=buf(episode.observations, observation_space),
        observation_space=observation_space,
        infos=RLlibBuffer(data=list(episode.infos.data), lookback=k),
        actions=buf(episode.actions, action_space),
        action_space=action_space,
        rewards=RLlibBuffer(
            data=_rows(episode.rewards.data.astype(np.float64)), lookback=k, space=_REWARD_SPACE
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


def _rows(data: Any) -> list:
    """A column as the per-step list RLlib's list buffers hold (nested rows for
    Dict/Tuple spaces and ``state_out``)."""
    if isinstance(data, np.ndarray):
        return list(data)
    return unbatch(data)


class RLlibEpisodeList(list):
    """A ``sample()`` call's RLlib episodes; pickled column-wise, unpickled as a plain list.

    A list of RLlib ``SingleAgentEpisode``s like any other; only its pickled form
    differs: each column (observations, actions, rewards, every extra model
    output) of all its episodes goes as one array (up to 4 MiB; larger ones
    per episode), each episode's own arrays become views of it on unpickling.
    Episodes that are not plain numpy'd RLlib episodes (nested spaces, a
    callback's edits to the buffers) pickle as a plain list.
    """

    __slots__ = ()

    def __copy__(self) -> RLlibEpisodeList:
        return RLlibEpisodeList(self)  # the same episode objects, as for a list

    def __deepcopy__(self, memo: dict) -> RLlibEpisodeList:
        return RLlibEpisodeList(copy.deepcopy(list(self), memo))

    def __reduce__(self) -> tuple:
        """``(_unpack, packed columns)``; a plain list's reduction where packing does not fit."""
        packed = _pack(self)
        if packed is None:
            return (list, (list(self),))
        return (_unpack, packed)


def _buffer_meta(buffer: Any) -> tuple | None:
    """``(lookback, finalized, space, space struct)`` of a plain RLlib buffer, else None."""
    if type(buffer) is not RLlibBuffer:
        return None
    state = buffer.__dict__
    if tuple(state) != _BUFFER_KEYS:
        return None
    return (state["lookback"], state["finalized"], state["_space"], state["_space_struct"])


def _pack(episodes: list) -> tuple | None:
    """``(plain slots, buffer metas, column arrays, column lengths, infos)`` or None."""
    if not episodes:
        return None
    plain, metas, infos = [], [], []
    columns: list[list] = []
    extra_keys = None
    for episode in episodes:
        if type(episode) is not RLlibEpisode:
            return None
        try:
            plain.append(tuple(getattr(episode, s) for s in _PLAIN_SLOTS))
        except AttributeError:  # an unset slot
            return None
        extras = episode.extra_model_outputs
        if extra_keys is None:
            extra_keys = tuple(extras)
            columns = [[] for _ in range(len(_COLUMNS) + len(extra_keys))]
        if type(extras) is not dict or tuple(extras) != extra_keys:
            return None
        buffers = [getattr(episode, c) for c in _COLUMNS] + list(extras.values())
        buffers.append(episode.infos)
        meta = tuple(_buffer_meta(b) for b in buffers)
        if None in meta:
            return None
        for column, buffer in zip(columns, buffers):
            if type(buffer.data) is not np.ndarray:
                return None
            column.append(buffer.data)
        info_list = episode.infos.data
        if type(info_list) is not list:
            return None
        # Empty info dicts (the common case) go as their count.
        empty = all(type(i) is dict and not i for i in info_list)
        infos.append(len(info_list) if empty else info_list)
        metas.append(meta)
    arrays, lengths = [], []
    for parts in columns:
        first = parts[0]
        if any(p.dtype != first.dtype or p.shape[1:] != first.shape[1:] for p in parts):
            return None
        # A large column (image observations) goes as its episodes' arrays: joining
        # them would cost one more copy of it than pickling them one by one.
        big = sum(p.nbytes for p in parts) > _JOIN_MAX_BYTES
        arrays.append(parts if big else np.concatenate(parts))
        lengths.append([len(p) for p in parts])
    return (plain, metas, extra_keys, arrays, lengths, infos)


def _unpack(
    plain: list, metas: list, extra_keys: tuple, arrays: list, lengths: list, infos: list
) -> list:
    """The plain list of RLlib episodes ``_pack`` packed."""
    views = []
    for array, lens in zip(arrays, lengths):
        if type(array) is list:  # a large column, sent per episode
            views.append(array)
            continue
        stops = np.cumsum(lens).tolist()
        starts = [0, *stops[:-1]]
        views.append([array[a:b] for a, b in zip(starts, stops)])
    out = []
    for i, (values, meta, info) in enumerate(zip(plain, metas, infos)):
        episode = _NEW_EPISODE(RLlibEpisode)
        for slot, value in zip(_PLAIN_SLOTS, values):
            setattr(episode, slot, value)
        buffers = []
        for column, m in zip(views, meta):
            buffer = _NEW_BUFFER(RLlibBuffer)
            buffer.__dict__.update(
                data=column[i], lookback=m[0], finalized=m[1], _space=m[2], _space_struct=m[3]
            )
            buffers.append(buffer)
        m = meta[-1]
        info_buffer = _NEW_BUFFER(RLlibBuffer)
        info_buffer.__dict__.update(
            data=[{} for _ in range(info)] if type(info) is int else info,
            lookback=m[0],
            finalized=m[1],
            _space=m[2],
            _space_struct=m[3],
        )
        episode.observations, episode.actions, episode.rewards = buffers[:3]
        episode.infos = info_buffer
        episode.extra_model_outputs = dict(zip(extra_keys, buffers[3:]))
        out.append(episode)
    return out
