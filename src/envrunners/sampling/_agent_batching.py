"""Per-agent items <-> one batch per module: the multi-agent loop's batching.

The multi-agent loop gathers the observations of all agents that map to one
module, across all sub-envs, into one batch (``stack``) for one forward pass,
and splits the module's outputs back into per-agent rows (``rows``,
``action_rows``). Pure functions on numpy (nested dict/tuple structures too).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["action_rows", "rows", "stack"]


def stack(items: list[Any], space: Any = None) -> Any:
    """Stack per-agent observations into one batch (nested dict/tuple obs supported).

    Args:
        items: One observation per agent (arrays, scalars, or dicts / tuples of them).
        space: The agents' observation space, if known: a ``Dict`` observation is
            batched in the space's key order (gymnasium sorts ``Dict`` keys; envs
            may return theirs in any order), as gymnasium's vector envs do.
    """
    first = items[0]
    if isinstance(first, np.ndarray):
        return np.array(items)  # = np.stack for equal shapes, ~5x faster for small batches
    if isinstance(first, dict):
        subs = getattr(space, "spaces", None)
        if isinstance(subs, dict) and subs.keys() == first.keys():
            return {k: stack([x[k] for x in items], sub) for k, sub in subs.items()}
        return {k: stack([x[k] for x in items]) for k in first}
    if isinstance(first, tuple):
        subs = getattr(space, "spaces", None)
        if not isinstance(subs, tuple) or len(subs) != len(first):
            subs = (None,) * len(first)
        return tuple(stack([x[j] for x in items], subs[j]) for j in range(len(first)))
    return np.asarray(items)


def rows(batch: Any) -> list[Any]:
    """Split a batch into per-row items (views for arrays): the inverse of ``stack``."""
    if isinstance(batch, np.ndarray):
        return list(batch)
    if isinstance(batch, dict):
        cols = {k: rows(v) for k, v in batch.items()}
        n = len(next(iter(cols.values()))) if cols else 0
        return [{k: c[j] for k, c in cols.items()} for j in range(n)]
    if isinstance(batch, tuple):
        cols_t = [rows(v) for v in batch]
        return [tuple(c[j] for c in cols_t) for j in range(len(cols_t[0]))]
    return list(np.asarray(batch))


def action_rows(actions: Any) -> list[Any]:
    """Per-row actions; integer (Discrete) actions as ``np.int64`` scalars.

    Why: gymnasium 1.4's ``Discrete.contains`` (which e.g. CartPole asserts per
    step) checks numpy integers faster than Python ints; RLlib also hands envs
    numpy scalars. Always int64, so finalized episodes keep the dtype they had.
    """
    if isinstance(actions, np.ndarray) and actions.ndim == 1 and actions.dtype.kind in "iu":
        if actions.dtype == np.uint64:  # may not fit int64
            return actions.tolist()
        return list(actions.astype(np.int64, copy=False))
    return rows(actions)
