"""Preallocated time-major column buffers ``(T, num_envs, *shape)`` for the sampler.

Each vector step writes one row per column with a single numpy assignment;
episodes are cut out of the buffers at the end of ``sample()`` by slicing.
Columns may be nested (dict/tuple of arrays, for Dict/Tuple spaces). Buffers
grow by doubling, so an episode-mode call of unknown length never overflows.
``RecurrentState`` is the one column that is not time-major: a stateful
module's current state, one row per sub-env, carried from step to step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from envrunners.core import _nested
from envrunners.core._nested import map_structure

__all__ = ["ColumnBuffer", "RecurrentState", "cell_writer"]


def _with_rows(leaf: np.ndarray, value: Any, rows: list[int]) -> np.ndarray:
    """A copy of ``leaf`` with ``leaf[rows] = value``."""
    leaf = np.array(leaf)
    leaf[rows] = value
    return leaf


def _leaf_alloc(example: np.ndarray, capacity: int) -> np.ndarray:
    """A ``(capacity, *example.shape)`` zero array of ``example``'s dtype."""
    example = np.asarray(example)
    return np.zeros((capacity, *example.shape), dtype=example.dtype)


def cell_writer(flat: np.ndarray) -> Callable[[np.ndarray, Any], None]:
    """``write(cells, value)``, the same as ``flat[cells] = value`` for a flat column
    (:meth:`ColumnBuffer.cells`) and a batch ``value`` of rows.

    Why: numpy assigns the rows of a 2-D array by fancy index about twice as slowly as
    the items of a 1-D one; a 2-D ``value`` of the column's dtype is written as one
    opaque (void) item per row instead. Any other value takes the plain assignment.
    """
    dtype = flat.dtype
    if flat.ndim != 2 or not flat.flags.c_contiguous or not flat.shape[1] or dtype.hasobject:
        return flat.__setitem__
    width = flat.shape[1]
    row = np.dtype((np.void, width * dtype.itemsize))
    items = flat.view(row).reshape(-1)

    def write(cells: np.ndarray, value: Any) -> None:
        if (
            type(value) is np.ndarray
            and value.ndim == 2
            and value.shape[1] == width
            and value.dtype == dtype
        ):
            try:
                as_items = value.view(row)  # (rows, 1); raises if a row is not contiguous
            except ValueError:
                pass
            else:
                items[cells] = as_items[:, 0]
                return
        flat[cells] = value

    return write


class ColumnBuffer:
    """One time-major column: rows of batch-first arrays (or nested structures of them)."""

    __slots__ = ("data", "capacity", "_cells")

    def __init__(self, example_row: Any, capacity: int):
        self.capacity = capacity
        self.data = map_structure(lambda x: _leaf_alloc(x, capacity), example_row)
        self._cells: Any = None

    def ensure(self, rows: int) -> None:
        """Grow (by doubling) so that at least ``rows`` rows fit; keeps the contents."""
        if rows <= self.capacity:
            return
        new_cap = max(rows, 2 * self.capacity)

        def grow(old: np.ndarray) -> np.ndarray:
            new = np.zeros((new_cap, *old.shape[1:]), dtype=old.dtype)
            new[: self.capacity] = old
            return new

        self.data = map_structure(grow, self.data)
        self.capacity = new_cap
        self._cells = None

    def write(self, row: int, value: Any) -> None:
        """Set row ``row`` to the batch ``value`` (cast to the column dtype)."""
        if isinstance(self.data, np.ndarray):
            self.data[row] = value
        else:
            map_structure(lambda buf, v: buf.__setitem__(row, v), self.data, value)

    def row(self, row: int) -> Any:
        """A view of row ``row`` (all sub-envs)."""
        if isinstance(self.data, np.ndarray):
            return self.data[row]
        return map_structure(lambda buf: buf[row], self.data)

    def cells(self) -> Any:
        """The buffer as ``(capacity * num_envs, *shape)`` views: cell ``row * num_envs + env``.

        Why: a ready-first batch touches one cell per sub-env; one flat index per cell
        makes each write and read a 1-D fancy index (``take`` for reads), several times
        cheaper than indexing with a ``(rows, envs)`` pair. Rebuilt after ``ensure``.
        """
        cells = self._cells
        if cells is None:
            cells = self._cells = map_structure(lambda a: a.reshape(-1, *a.shape[2:]), self.data)
        return cells

    def write_at(self, cells: np.ndarray, value: Any) -> None:
        """Set cell ``cells[j]`` (``row * num_envs + env``, see :meth:`cells`) to ``value[j]``:
        one ready-first batch, each sub-env at its own row."""
        flat = self.cells()
        if type(flat) is np.ndarray:
            flat[cells] = value
        else:
            map_structure(lambda buf, v: buf.__setitem__(cells, v), flat, value)

    def gather(self, cells: np.ndarray) -> Any:
        """The batch of cells ``cells[j]`` (a copy), in their order (see :meth:`cells`)."""
        flat = self.cells()
        if type(flat) is np.ndarray:
            return flat.take(cells, axis=0)
        return map_structure(lambda buf: buf.take(cells, axis=0), flat)

    @classmethod
    def for_envs(cls, example_batch: Any, num_envs: int, capacity: int) -> ColumnBuffer:
        """A buffer of ``num_envs`` columns shaped like the rows of ``example_batch``
        (a batch of any size, e.g. the first ready-first batch)."""
        example = map_structure(
            lambda a: np.zeros((num_envs, *np.shape(a)[1:]), np.asarray(a).dtype), example_batch
        )
        return cls(example, capacity)


class RecurrentState:
    """A stateful module's state for every sub-env, plus its previous action and reward.

    ``state`` is nested like ``module.get_initial_state()`` with ``num_envs`` rows
    per leaf; the sampler feeds it to the module, replaces it with the module's
    ``state_out`` after every forward and puts a sub-env's rows back to ``initial``
    when that sub-env starts a new episode. It lives as long as the sampler, so it
    is carried across ``sample()`` calls. ``extra_inputs`` holds ``prev_actions``
    / ``prev_rewards`` (zeros at an episode start) when the module reads them, as
    RLlib's ``PrevActionsPrevRewards`` connector provides them.

    Args:
        initial: One sub-env's initial state (numpy leaves, e.g. ``(1, cell)``).
        num_envs: Rows per leaf.
        prev_action_example: One action (e.g. ``action_space.sample()``) to feed
            ``prev_actions`` of its shape and dtype (``lstm_use_prev_action``); None: no.
        prev_rewards: Feed ``prev_rewards`` (``lstm_use_prev_reward``).
    """

    __slots__ = (
        "initial",
        "num_envs",
        "state",
        "extra_inputs",
        "_prev_action",
        "_prev_rewards",
        "_owned",
        "_flat",
        "_initial_leaves",
    )

    def __init__(
        self,
        initial: Any,
        num_envs: int,
        *,
        prev_action_example: Any = None,
        prev_rewards: bool = False,
    ):
        self.initial = map_structure(np.asarray, initial)
        self.num_envs = num_envs
        self.state: Any = None
        self._prev_action = prev_action_example
        self._prev_rewards = prev_rewards
        #: ``{"prev_actions": ..., "prev_rewards": ...}`` (B rows) or None.
        self.extra_inputs: dict[str, Any] | None = None
        self._owned: Any = None  # the ``state`` that ``own()`` made (written in place)
        self._flat: Any = None  # (state, its leaves): see ``_leaves``
        self._initial_leaves: Any = None  # (initial, its leaves): flattened once, not per reset
        self.reset()

    def reset(self, rows: list[int] | None = None) -> None:
        """Put the given sub-envs (all if None) back to the initial state and zero inputs."""
        if rows is None or self.state is None:
            n = self.num_envs
            self.state = map_structure(lambda v: np.repeat(v[None], n, axis=0), self.initial)
            if self._prev_rewards or self._prev_action is not None:
                self.extra_inputs = {}
            if self._prev_action is not None:
                self.extra_inputs["prev_actions"] = map_structure(
                    lambda a: np.zeros((n, *np.shape(a)), np.asarray(a).dtype), self._prev_action
                )
            if self._prev_rewards:
                self.extra_inputs["prev_rewards"] = np.zeros(n, np.float32)
            return
        if self.state is self._owned:  # ours (ready-first): in place
            index = np.asarray(rows, np.intp)  # (a list is converted again per leaf)
            cached = self._initial_leaves
            if cached is None or cached[0] is not self.initial:
                cached = self._initial_leaves = (self.initial, _nested.flatten(self.initial))
            initial = cached[1]
            for leaf, init in zip(self._leaves(), initial, strict=True):
                leaf[index] = init
        else:  # copies: ``state`` is the module's ``state_out``, which it may still hold
            self.state = map_structure(
                lambda leaf, init: _with_rows(leaf, init, rows), self.state, self.initial
            )
        if self.extra_inputs is not None:
            for value in self.extra_inputs.values():
                map_structure(lambda leaf: leaf.__setitem__(rows, 0), value)

    def own(self) -> None:
        """Make ``state`` (and the extra inputs) arrays this object owns, so that rows can
        be written in place (``state`` may be a module's output)."""
        self.state = self._owned = map_structure(np.array, self.state)
        if self.extra_inputs is not None:
            self.extra_inputs = {
                k: map_structure(np.array, v) for k, v in self.extra_inputs.items()
            }

    def rows(self, envs: np.ndarray) -> tuple[Any, dict[str, Any] | None]:
        """The state and extra inputs of the sub-envs ``envs`` (a ready-first batch)."""
        state = _nested.unflatten_as(
            self.state, [leaf.take(envs, axis=0) for leaf in self._leaves()]
        )
        inputs = self.extra_inputs
        if inputs is None:
            return state, None
        return state, {k: map_structure(lambda leaf: leaf[envs], v) for k, v in inputs.items()}

    def set_rows(self, envs: np.ndarray, state_out: Any) -> None:
        """Store the module's ``state_out`` for the sub-envs ``envs`` (after ``own()``)."""
        for leaf, value in zip(self._leaves(), _nested.flatten(state_out), strict=True):
            leaf[envs] = value

    def _leaves(self) -> list[np.ndarray]:
        """``state``'s leaves (``_nested.flatten``), remade when ``state`` is replaced. Why:
        a ready-first batch reads and writes every leaf's rows, and walking the tree each
        time cost ~10 us of the ~3 us of indexing (the default LSTM's state has four)."""
        flat = self._flat
        if flat is None or flat[0] is not self.state:
            flat = self._flat = (self.state, _nested.flatten(self.state))
        return flat[1]

    def after_step_rows(self, envs: np.ndarray, actions: Any, rewards: np.ndarray) -> None:
        """``after_step`` for the sub-envs ``envs`` only (their results just arrived)."""
        inputs = self.extra_inputs
        if inputs is None:
            return
        if self._prev_action is not None:
            map_structure(
                lambda leaf, a: leaf.__setitem__(envs, a), inputs["prev_actions"], actions
            )
        if self._prev_rewards:
            inputs["prev_rewards"][envs] = rewards

    def after_step(self, actions: Any, rewards: np.ndarray) -> None:
        """Remember this step's actions / rewards as the next step's previous ones."""
        inputs = self.extra_inputs
        if inputs is None:
            return
        if self._prev_action is not None:
            inputs["prev_actions"] = map_structure(np.copy, actions)
        if self._prev_rewards:
            inputs["prev_rewards"] = rewards.astype(np.float32)
