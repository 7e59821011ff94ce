"""Episode chunks -> old-stack ``SampleBatch`` columns, whole arrays at a time.

Why: ``RolloutWorker`` samples through the same core as the new-stack runners,
which returns ``SingleAgentEpisode`` chunks (numpy buffers plus a lookback). The
old stack wants one ``SampleBatch`` per trajectory with ``new_obs``,
``prev_actions``/``prev_rewards`` (shifted by one, 0 at an episode's first step)
and bookkeeping columns (``eps_id``, ``t``, ``agent_index``, ``env_id``,
``unroll_id``). Each column is one slice or ``np.concatenate`` of the episode's
buffers: no per-row Python.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from envrunners.core.columns import Columns
from envrunners.policy.sample_batch import SampleBatch

__all__ = ["episode_to_sample_batch", "next_unroll_id"]

_UNROLL_IDS = itertools.count()
#: Extra model outputs the sampler adds for the new stack; not old-stack columns.
_DROP = frozenset({"weights_seq_no"})


def next_unroll_id() -> int:
    """A process-wide increasing id for the next built trajectory batch."""
    return next(_UNROLL_IDS)


def _tree(fn: Any, x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _tree(fn, v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_tree(fn, v) for v in x)
    return fn(x)


def _window(buf: Any, lo: int, hi: int) -> Any:
    """Items ``[lo, hi)`` in episode coordinates of a numpy buffer (negative = lookback)."""
    start = buf.lookback + lo
    if start >= 0:
        return _tree(lambda a: a[start : buf.lookback + hi], buf.data)

    def padded(a: np.ndarray) -> np.ndarray:
        body = a[: buf.lookback + hi]
        pad = np.zeros((-start, *a.shape[1:]), dtype=a.dtype)
        return np.concatenate([pad, body])

    return _tree(padded, buf.data)


def episode_to_sample_batch(
    episode: Any,
    *,
    env_id: int = 0,
    agent_index: int = 0,
    unroll_id: int | None = None,
    with_prev: bool = True,
) -> SampleBatch:
    """One ``SampleBatch`` (not yet postprocessed) from a numpy ``SingleAgentEpisode`` chunk.

    Args:
        episode: The chunk (finalized/numpy); its lookback supplies the previous
            action and reward of a continuation chunk's first row.
        env_id: Sub-env index the chunk came from.
        agent_index: The agent's index within its episode (0 for single-agent).
        unroll_id: The ``unroll_id`` of every row (default: a fresh id).
        with_prev: Add ``prev_actions`` and ``prev_rewards``.

    Returns:
        A batch with ``obs``, ``new_obs``, ``actions``, ``rewards``, ``terminateds``,
        ``truncateds``, ``infos``, ``eps_id``, ``t``, ``env_id``, ``agent_index``,
        ``unroll_id``, the prev columns and every extra model output.
    """
    if not episode.is_numpy:
        episode = episode.to_numpy()
    n = len(episode)
    data = episode.get_data_dict()
    for key in _DROP:
        data.pop(key, None)
    data[Columns.NEXT_OBS] = _window(episode.observations, 1, n + 1)
    data[SampleBatch.ENV_ID] = np.full(n, env_id, dtype=np.int64)
    data[SampleBatch.AGENT_INDEX] = np.full(n, agent_index, dtype=np.int64)
    uid = next_unroll_id() if unroll_id is None else unroll_id
    data[SampleBatch.UNROLL_ID] = np.full(n, uid, dtype=np.int64)
    if with_prev:
        prev_len = min(1, episode.actions.lookback) if episode.t_started > 0 else 0
        if prev_len:
            data[SampleBatch.PREV_ACTIONS] = _window(episode.actions, -1, n - 1)
            data[SampleBatch.PREV_REWARDS] = _window(episode.rewards, -1, n - 1)
        else:
            data[SampleBatch.PREV_ACTIONS] = _tree(_shift_in_zero, data[Columns.ACTIONS])
            data[SampleBatch.PREV_REWARDS] = _shift_in_zero(np.asarray(data[Columns.REWARDS]))
    return SampleBatch(data)


def _shift_in_zero(a: np.ndarray) -> np.ndarray:
    out = np.zeros_like(a)
    out[1:] = a[:-1]
    return out
