"""Recurrent state of one stateful module in the multi-agent loop: one row per acting agent.

Each (sub-env, agent) mapped to a stateful module holds a slot, a row of
batch-first state arrays nested like ``module.get_initial_state()``. One vector
step gathers the rows of all agents that act (one fancy-index per leaf), the
module runs once on them, and the state out is scattered back; agents that do
not act in that step keep their rows untouched (turn-based envs). A slot starts
at the module's initial state and is released when the agent's episode ends,
its sub-env's episode ends or the sub-env is recreated.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envrunners.core import _nested

__all__ = ["ModuleStates"]

_MIN_CAPACITY = 16


class ModuleStates:
    """The state rows of one stateful module (slots reused after release).

    Args:
        module: The module, for ``get_initial_state()`` (tensors or numpy, one row
            without a batch axis, e.g. ``{"h": (1, cell), "c": (1, cell)}``).
    """

    __slots__ = ("module", "initial", "data", "free", "size")

    def __init__(self, module: Any):
        self.module = module
        self.initial = _nested.map_structure(_to_numpy, module.get_initial_state())
        self.data = _nested.map_structure(
            lambda v: np.repeat(v[None], _MIN_CAPACITY, axis=0), self.initial
        )
        self.free: list[int] = []
        #: Slots handed out so far (free ones included).
        self.size = 0

    def acquire(self) -> int:
        """A slot set to the initial state."""
        if self.free:
            slot = self.free.pop()
        else:
            slot = self.size
            self.size += 1
            leaves = _nested.flatten(self.data)
            if slot >= len(leaves[0]):
                self.data = _nested.map_structure(_grown, self.data)
        _nested.map_structure(lambda d, v: d.__setitem__(slot, v), self.data, self.initial)
        return slot

    def release(self, slot: int) -> None:
        """Give a slot back (its agent's episode ended)."""
        self.free.append(slot)

    def clear(self) -> None:
        """Release every slot (all sub-envs were reset)."""
        self.free.clear()
        self.size = 0

    def gather(self, slots: np.ndarray) -> Any:
        """The state rows of ``slots`` as a fresh ``(B, ...)`` batch (the module's state in)."""
        return _nested.map_structure(lambda d: d.take(slots, axis=0), self.data)

    def scatter(self, slots: np.ndarray, state_out: Any) -> None:
        """Store the module's ``(B, ...)`` state out in the rows of ``slots``."""
        _nested.map_structure(lambda d, v: d.__setitem__(slots, v), self.data, state_out)

    def fits(self, module: Any) -> bool:
        """Whether these rows belong to ``module`` (a rebuilt module gets new rows)."""
        return module is self.module


def _grown(leaf: np.ndarray) -> np.ndarray:
    grown = np.empty((2 * len(leaf), *leaf.shape[1:]), dtype=leaf.dtype)
    grown[: len(leaf)] = leaf
    return grown


def _to_numpy(value: Any) -> np.ndarray:
    detach = getattr(value, "detach", None)
    if detach is not None:
        return detach().cpu().numpy()
    return np.asarray(value)
