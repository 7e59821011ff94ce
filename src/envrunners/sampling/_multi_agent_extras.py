"""Deferred extra model outputs of the multi-agent sampler: one tape per module.

Why: recording each agent's extra model outputs (``action_logp``,
``action_dist_inputs``, ..., ``weights_seq_no``) per step costs a row split per
key, a tuple per agent and an append per key and agent; ``to_numpy`` then
stacks those rows again. Instead, the sampler writes each batched forward's
outputs into a per-module tape (one slice assignment per key and step),
remembers per agent only the tape row of each step, and at the episode's end
(or cut, or before any other step recording) fills the agent's buffers with one
fancy-index per key: already numpy, so ``to_numpy`` has nothing left to do for
them. The finished episodes are equal to the per-step path's after ``to_numpy``.

Only used while nobody can look at an episode mid-run (no episode callbacks)
and the episodes are numpy'd afterwards (``episodes_to_numpy``); any step whose
outputs do not fit the tape (not plain arrays, changed keys, dtypes or shapes)
flushes everything and turns the deferral off for the rest of the run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

__all__ = ["SEQ_KEY", "ExtrasTape", "flush_agent_rows"]

SEQ_KEY = "weights_seq_no"
_MIN_CAPACITY = 256


class ExtrasTape:
    """One module's extra model outputs of one ``run()``, rows in forward-pass order.

    Rows are never overwritten (growing copies into new arrays), so views of
    them stay valid; each run starts a new tape.
    """

    __slots__ = ("cols", "shapes", "n")

    def __init__(self, out: dict[str, Any]):
        self.cols = {
            k: np.empty((_MIN_CAPACITY, *v.shape[1:]), dtype=v.dtype) for k, v in out.items()
        }
        #: Per key, the row shape (for the per-write check).
        self.shapes = {k: v.shape[1:] for k, v in out.items()}
        self.n = 0

    @classmethod
    def create(cls, out: dict[str, Any], batch_size: int) -> ExtrasTape | None:
        """A tape for ``out``'s keys, or None unless ``out`` is a non-empty dict of plain
        (non-object) arrays with ``batch_size`` rows (and no ``weights_seq_no``)."""
        if not out:
            return None
        for k, v in out.items():
            if (
                k == SEQ_KEY
                or type(v) is not np.ndarray
                or v.shape[:1] != (batch_size,)
                or v.dtype.hasobject
            ):
                return None
        return cls(out)

    def try_write(self, out: dict[str, Any], batch_size: int) -> int | None:
        """Append one forward pass's outputs; the tape row of its first row.

        None (and nothing appended) unless ``out`` has exactly this tape's keys in
        its order, each a plain array of ``batch_size`` rows with the tape's dtype and row shape.
        """
        cols = self.cols
        if len(out) != len(cols):
            return None
        shapes = self.shapes
        base = self.n
        end = base + batch_size
        for (k, v), (key, c) in zip(out.items(), cols.items()):
            if (
                k != key  # same keys in the same order (the buffers' order)
                or type(v) is not np.ndarray
                or (v.dtype is not c.dtype and v.dtype != c.dtype)
                or v.shape != (batch_size, *shapes[k])
            ):
                return None  # rows written past self.n so far are never read
            if end > len(c):
                grown = np.empty((max(2 * len(c), end), *c.shape[1:]), dtype=c.dtype)
                grown[:base] = c[:base]
                c = cols[k] = grown
            c[base:end] = v
        self.n = end
        return base

    def row(self, g: int, seq: Any) -> dict[str, Any]:
        """The extra outputs dict of tape row ``g`` (what the per-step path records)."""
        ext = {k: c[g] for k, c in self.cols.items()}
        ext[SEQ_KEY] = seq
        return ext


def _extend(bufs: dict, key: str, values: np.ndarray) -> None:
    """Append the rows ``values`` to ``bufs[key]`` (a new numpy buffer if absent)."""
    buf = bufs.get(key)
    if buf is None:  # = the list buffer the per-step path starts, after finalize()
        bufs[key] = InfiniteLookbackBuffer._raw(values, 0, None, None, True)
    elif buf.finalized:
        buf.extend(values)
    else:
        buf.data.extend(list(values))


def flush_agent_rows(episode: Any, pending: dict, modmap: dict, tapes: dict, seq: Any) -> None:
    """Fill ``episode``'s agents' extra outputs with their pending tape rows; clear them.

    Args:
        episode: The ``MultiAgentEpisode`` the rows belong to.
        pending: ``{agent_id: [tape row per recorded step]}`` (emptied).
        modmap: ``{agent_id: module_id}`` of the episode's agents.
        tapes: ``{module_id: ExtrasTape}`` of this run.
        seq: The ``weights_seq_no`` of this run.
    """
    agent_episodes = episode.agent_episodes
    seq_one = np.asarray([seq])  # .repeat(n) = np.asarray([seq] * n), dtype included
    for aid, ids in pending.items():
        tape = tapes[modmap[aid]]
        bufs = agent_episodes[aid].extra_model_outputs
        index = np.array(ids, dtype=np.intp)
        for key, col in tape.cols.items():
            _extend(bufs, key, col.take(index, axis=0))  # = col[ids], ~2x faster
        _extend(bufs, SEQ_KEY, seq_one.repeat(len(ids)))
    pending.clear()
