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
Nested outputs (a recurrent module's ``state_out``, e.g. ``{"h": (B, 1, cell),
"c": (B, 1, cell)}``) get one tape column per leaf and are rebuilt, nested like
the forward's output, when rows are read.

Only used while nobody can look at an episode mid-run (no episode callbacks)
and the episodes are numpy'd afterwards (``episodes_to_numpy``); any step whose
outputs do not fit the tape (not plain arrays, changed keys, dtypes or shapes)
flushes everything and turns the deferral off for the rest of the run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envrunners.core import _nested
from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

__all__ = ["SEQ_KEY", "ExtrasTape", "NestedColumn", "flush_agent_rows"]

SEQ_KEY = "weights_seq_no"
_MIN_CAPACITY = 256


class ExtrasTape:
    """One module's extra model outputs of one ``run()``, rows in forward-pass order.

    Rows are never overwritten (growing copies into new arrays), so views of
    them stay valid; each run starts a new tape.
    """

    __slots__ = ("cols", "shapes", "n")

    def __init__(self, out: dict[str, Any]):
        #: Per key, a column (plain outputs) or a ``NestedColumn`` (nested outputs).
        self.cols: dict[str, Any] = {
            k: np.empty((_MIN_CAPACITY, *v.shape[1:]), dtype=v.dtype)
            if type(v) is np.ndarray
            else NestedColumn(v)
            for k, v in out.items()
        }
        #: Per key, the row shape (for the per-write check; None for nested outputs).
        self.shapes = {k: v.shape[1:] if type(v) is np.ndarray else None for k, v in out.items()}
        self.n = 0

    @classmethod
    def create(cls, out: dict[str, Any], batch_size: int) -> ExtrasTape | None:
        """A tape for ``out``'s keys, or None unless ``out`` is a non-empty dict of plain
        (non-object) arrays with ``batch_size`` rows, or nested dicts / tuples of such
        arrays (and no ``weights_seq_no``)."""
        if not out:
            return None
        for k, v in out.items():
            if k == SEQ_KEY:
                return None
            leaves = _nested.flatten(v) if isinstance(v, (dict, tuple)) else [v]
            if not leaves:
                return None
            for leaf in leaves:
                if (
                    type(leaf) is not np.ndarray
                    or leaf.shape[:1] != (batch_size,)
                    or leaf.dtype.hasobject
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
            if type(c) is NestedColumn:
                if k != key or not c.try_write(v, base, end):
                    return None
                continue
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


class NestedColumn:
    """The tape column of one nested output: one array per leaf, rows rebuilt on read.

    Args:
        first: The first forward's output for this key (nested dict / tuple of
            ``(B, ...)`` arrays): its structure, leaf dtypes and row shapes are
            what later writes must match.
    """

    __slots__ = ("template", "paths", "leaves")

    def __init__(self, first: Any):
        self.template = _nested.map_structure(lambda _: None, first)  # the structure only
        self.paths = _nested.paths(first)
        self.leaves = [
            np.empty((_MIN_CAPACITY, *v.shape[1:]), dtype=v.dtype) for v in _nested.flatten(first)
        ]

    def try_write(self, value: Any, base: int, end: int) -> bool:
        """Write ``value``'s rows at ``base:end``; False if its structure, dtypes or shapes differ."""
        if not isinstance(value, (dict, tuple)) or _nested.paths(value) != self.paths:
            return False
        leaves = self.leaves
        new = _nested.flatten(value)
        rows = end - base
        for col, v in zip(leaves, new):
            if (
                type(v) is not np.ndarray
                or v.dtype != col.dtype
                or v.shape != (rows, *col.shape[1:])
            ):
                return False
        for j, (col, v) in enumerate(zip(leaves, new)):
            if end > len(col):
                grown = np.empty((max(2 * len(col), end), *col.shape[1:]), dtype=col.dtype)
                grown[:base] = col[:base]
                col = leaves[j] = grown
            col[base:end] = v
        return True

    def __getitem__(self, g: int) -> Any:
        """Row ``g``, nested like the forward's output (views)."""
        return _nested.unflatten_as(self.template, [leaf[g] for leaf in self.leaves])

    def take(self, index: np.ndarray, axis: int = 0) -> Any:
        """The rows ``index``, nested like the forward's output (copies)."""
        return _nested.unflatten_as(
            self.template, [leaf.take(index, axis=axis) for leaf in self.leaves]
        )


def _extend(bufs: dict, key: str, values: Any) -> None:
    """Append the rows ``values`` to ``bufs[key]`` (a new numpy buffer if absent).

    ``values``: an array, or for nested outputs a nested structure of arrays.
    """
    buf = bufs.get(key)
    if buf is None:  # = the list buffer the per-step path starts, after finalize()
        bufs[key] = InfiniteLookbackBuffer._raw(values, 0, None, None, True)
    elif buf.finalized or type(values) is not np.ndarray:
        buf.extend(values)  # (a list buffer unbatches nested values itself)
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
