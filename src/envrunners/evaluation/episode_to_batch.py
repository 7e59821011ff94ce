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
from envrunners.policy._seq_ops import chop_seq_lens, seq_starts
from envrunners.policy.sample_batch import SampleBatch

__all__ = ["add_sequences", "episode_to_sample_batch", "next_unroll_id"]

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
    eps_id: Any = None,
    with_prev: bool = True,
) -> SampleBatch:
    """One ``SampleBatch`` (not yet postprocessed) from a ``SingleAgentEpisode`` chunk.

    Args:
        episode: The chunk (made numpy if it is not); its lookback supplies the
            previous action and reward of a continuation chunk's first row.
        env_id: Sub-env index the chunk came from.
        agent_index: The agent's index within its episode (0 for single-agent).
        unroll_id: The ``unroll_id`` of every row (default: a fresh id).
        eps_id: The ``eps_id`` of every row (default: the chunk's ``id_``).
        with_prev: Add ``prev_actions`` and ``prev_rewards``.

    Returns:
        A batch with ``obs``, ``new_obs``, ``actions``, ``rewards``, ``terminateds``,
        ``truncateds``, ``infos``, ``eps_id``, ``t``, ``env_id``, ``agent_index``,
        ``unroll_id``, the prev columns and every extra model output.
    """
    if not episode.is_numpy:
        episode = episode.to_numpy()
    n = len(episode)
    obs_buf, act_buf, rew_buf = episode.observations, episode.actions, episode.rewards
    terminateds = np.zeros(n, dtype=np.bool_)
    truncateds = np.zeros(n, dtype=np.bool_)
    if n:
        terminateds[-1] = episode.is_terminated
        truncateds[-1] = episode.is_truncated
    infos = np.empty(n, dtype=object)
    infos[:] = _info_items(episode.infos, n)
    uid = next_unroll_id() if unroll_id is None else unroll_id
    data: dict[str, Any] = {
        Columns.OBS: _window(obs_buf, 0, n),
        Columns.NEXT_OBS: _window(obs_buf, 1, n + 1),
        Columns.ACTIONS: _window(act_buf, 0, n),
        Columns.REWARDS: _window(rew_buf, 0, n),
        Columns.TERMINATEDS: terminateds,
        Columns.TRUNCATEDS: truncateds,
        Columns.INFOS: infos,
        Columns.T: np.arange(episode.t_started, episode.t_started + n, dtype=np.int64),
        Columns.EPS_ID: np.full(n, episode.id_ if eps_id is None else eps_id),
        SampleBatch.ENV_ID: np.full(n, env_id, dtype=np.int64),
        SampleBatch.AGENT_INDEX: np.full(n, agent_index, dtype=np.int64),
        SampleBatch.UNROLL_ID: np.full(n, uid, dtype=np.int64),
    }
    for key, buf in episode.extra_model_outputs.items():
        if key not in _DROP:
            data[key] = _window(buf, 0, n)
    if with_prev:
        if episode.t_started > 0 and act_buf.lookback >= 1:
            data[SampleBatch.PREV_ACTIONS] = _window(act_buf, -1, n - 1)
            data[SampleBatch.PREV_REWARDS] = _window(rew_buf, -1, n - 1)
        else:
            data[SampleBatch.PREV_ACTIONS] = _tree(_shift_in_zero, data[Columns.ACTIONS])
            data[SampleBatch.PREV_REWARDS] = _shift_in_zero(data[Columns.REWARDS])
    return SampleBatch(data)


def _info_items(buf: Any, n: int) -> list[Any]:
    if isinstance(buf.data, list):
        return buf.data[buf.lookback : buf.lookback + n]
    return list(buf.get(slice(0, n)))


def _shift_in_zero(a: np.ndarray) -> np.ndarray:
    out = np.zeros_like(a)
    out[1:] = a[:-1]
    return out


def add_sequences(batch: SampleBatch, max_seq_len: int) -> SampleBatch:
    """Cut one trajectory's rows into RNN sequences the way RLlib's old stack does.

    Why: a recurrent policy trains on sequences of at most ``max_seq_len`` steps,
    each starting from the state the policy had there. The sampler records
    ``state_in_*`` and ``state_out_*`` for every step; afterwards ``seq_lens``
    holds the trajectory's sequence lengths (``[5, 5, 2]`` for 12 rows at 5),
    ``state_in_*`` keeps only each sequence's first row (so it equals the previous
    step's ``state_out_*``, the initial state at an episode's start), and
    ``state_out_*`` stays per step. Rows are not padded (``right_zero_pad`` does that).

    A batch that joins several chunks (an episode continued under a new
    ``unroll_id``, as ``complete_episodes`` joins them) starts a new sequence at
    each change of ``(eps_id, unroll_id)``, as RLlib's ``chop_into_sequences``
    does.

    Returns:
        ``batch``, changed in place.
    """
    lens = np.concatenate(
        [chop_seq_lens(n, max_seq_len) for n in _run_lengths(batch)] or [np.zeros(0, np.int32)]
    ).astype(np.int32)
    starts = seq_starts(lens)
    for key in [k for k in batch.keys() if str(k).startswith("state_in_")]:
        batch[key] = np.asarray(batch[key])[starts]
    batch[SampleBatch.SEQ_LENS] = lens
    batch.max_seq_len = int(max_seq_len)
    return batch


def _run_lengths(batch: SampleBatch) -> list[int]:
    """Lengths of the runs of rows with the same ``(eps_id, unroll_id)``, in order."""
    n = batch.count
    if n == 0:
        return []
    change = np.zeros(n, np.bool_)
    for key in (SampleBatch.EPS_ID, SampleBatch.UNROLL_ID):
        if key in batch:
            column = np.asarray(batch[key])
            change[1:] |= column[1:] != column[:-1]
    bounds = np.concatenate([[0], np.flatnonzero(change), [n]])
    return np.diff(bounds).tolist()
