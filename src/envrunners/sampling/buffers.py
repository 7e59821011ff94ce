"""Preallocated time-major column buffers ``(T, num_envs, *shape)`` for the sampler.

Each vector step writes one row per column with a single numpy assignment;
episodes are cut out of the buffers at the end of ``sample()`` by slicing.
Columns may be nested (dict/tuple of arrays, for Dict/Tuple spaces). Buffers
grow by doubling, so an episode-mode call of unknown length never overflows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["ColumnBuffer", "tree_map"]


def tree_map(fn: Callable[..., Any], tree: Any, *rest: Any) -> Any:
    """Apply ``fn`` to the array leaves of a dict/tuple/list structure (and its twins)."""
    if isinstance(tree, dict):
        return {k: tree_map(fn, v, *(r[k] for r in rest)) for k, v in tree.items()}
    if isinstance(tree, tuple | list):
        return type(tree)(tree_map(fn, v, *(r[i] for r in rest)) for i, v in enumerate(tree))
    return fn(tree, *rest)


def _leaf_alloc(example: np.ndarray, capacity: int) -> np.ndarray:
    """A ``(capacity, *example.shape)`` zero array of ``example``'s dtype."""
    example = np.asarray(example)
    return np.zeros((capacity, *example.shape), dtype=example.dtype)


class ColumnBuffer:
    """One time-major column: rows of batch-first arrays (or nested structures of them)."""

    __slots__ = ("data", "capacity")

    def __init__(self, example_row: Any, capacity: int):
        self.capacity = capacity
        self.data = tree_map(lambda x: _leaf_alloc(x, capacity), example_row)

    def ensure(self, rows: int) -> None:
        """Grow (by doubling) so that at least ``rows`` rows fit; keeps the contents."""
        if rows <= self.capacity:
            return
        new_cap = max(rows, 2 * self.capacity)

        def grow(old: np.ndarray) -> np.ndarray:
            new = np.zeros((new_cap, *old.shape[1:]), dtype=old.dtype)
            new[: self.capacity] = old
            return new

        self.data = tree_map(grow, self.data)
        self.capacity = new_cap

    def write(self, row: int, value: Any) -> None:
        """Set row ``row`` to the batch ``value`` (cast to the column dtype)."""
        if isinstance(self.data, np.ndarray):
            self.data[row] = value
        else:
            tree_map(lambda buf, v: buf.__setitem__(row, v), self.data, value)

    def row(self, row: int) -> Any:
        """A view of row ``row`` (all sub-envs)."""
        if isinstance(self.data, np.ndarray):
            return self.data[row]
        return tree_map(lambda buf: buf[row], self.data)
