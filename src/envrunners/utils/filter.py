"""Observation filters (``ray.rllib.utils.filter``): running mean/std normalisation.

Why: old-stack workers normalise observations with statistics that every worker
updates locally and the driver merges (``FilterManager``). ``RunningStat`` keeps
Welford moments and merges whole batches with Chan et al.'s parallel formula, so a
``(num_envs, *shape)`` batch costs a handful of numpy ops, never a per-row loop.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from envrunners.errors import ConfigError, suggest
from envrunners.utils._running_stat import RunningStat, _as_shape, _as_tree, _is_leaf, _map

__all__ = [
    "ConcurrentMeanStdFilter",
    "Filter",
    "MeanStdFilter",
    "NoFilter",
    "RunningStat",
    "get_filter",
]

_STD_EPS = 1e-8
_FILTER_NAMES = ("MeanStdFilter", "ConcurrentMeanStdFilter", "NoFilter")


class Filter:
    """Base class of observation filters; every method must be overridden.

    Why: ``RolloutWorker`` and ``FilterManager`` only rely on this interface, so any
    filter (including user ones from ``get_filter(callable)``) can be synced.
    """

    is_concurrent = False

    def __call__(self, x: Any, update: bool = True) -> Any:
        """Filter ``x`` (optionally updating the statistics)."""
        raise NotImplementedError

    def apply_changes(self, other: Filter, *args: Any, **kwargs: Any) -> None:
        """Absorb the delta buffer of ``other`` into this filter's statistics."""
        raise NotImplementedError

    def copy(self) -> Filter:
        """Return an independent copy of this filter."""
        raise NotImplementedError

    def sync(self, other: Filter) -> None:
        """Copy all state (statistics and buffer) from ``other``."""
        raise NotImplementedError

    def reset_buffer(self) -> None:
        """Clear the delta accumulated since the last sync."""
        raise NotImplementedError

    def clear_buffer(self) -> None:
        """Old name of ``reset_buffer``, kept as an alias."""
        self.reset_buffer()

    def as_serializable(self) -> Filter:
        """Return a copy safe to pickle and ship to another process."""
        raise NotImplementedError


class NoFilter(Filter):
    """The identity filter: returns observations unchanged (as arrays)."""

    is_concurrent = True

    def __call__(self, x: Any, update: bool = True) -> Any:
        """Return ndarrays, dicts and tuples as is; convert anything else to an array."""
        if isinstance(x, (np.ndarray, dict, tuple)):
            return x
        try:
            return np.asarray(x)
        except Exception as e:
            raise ValueError(f"Failed to convert to array: {x!r}") from e

    def apply_changes(self, other: Filter, *args: Any, **kwargs: Any) -> None:
        """Do nothing: there are no statistics."""

    def copy(self) -> NoFilter:
        """Return self: a NoFilter has no state."""
        return self

    def sync(self, other: Filter) -> None:
        """Do nothing: there is no state to copy."""

    def reset_buffer(self) -> None:
        """Do nothing: there is no buffer."""

    def as_serializable(self) -> NoFilter:
        """Return self: it pickles as is."""
        return self

    def get_state(self) -> dict[str, Any]:
        """Return an empty state, so NoFilter fits the same checkpoint code as MeanStdFilter."""
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Ignore ``state``: there is nothing to restore."""


def _canon(shape: Any) -> Any:
    return _map(lambda s: None if s is None else _as_shape(s), shape)


def _new_stats(shape: Any) -> Any:
    return _map(lambda s: None if s is None else RunningStat(s), shape)


def _copy_stats(shape: Any, stats: Any) -> Any:
    return _map(lambda s, rs: None if s is None else rs.copy(), shape, stats)


class MeanStdFilter(Filter):
    """Normalise observations to zero mean and unit std with running statistics.

    Why: the standard old-stack observation filter. ``running_stats`` hold all data
    seen (locally and merged from other workers); ``buffer`` holds only what this
    filter saw since the last sync, which is what gets shipped and merged.

    ``shape`` is a shape tuple or a dict/tuple structure of shapes (``None`` leaves
    for discrete parts, which pass through). ``__call__`` accepts one observation
    or a batch ``(N, *shape)``. An observation (row) holding a NaN or inf is
    normalised but never enters the statistics, which it would poison for good.
    """

    is_concurrent = False

    def __init__(
        self, shape: Any, demean: bool = True, destd: bool = True, clip: float | None = 10.0
    ):
        """Create a filter for observations of ``shape`` (see the class docstring)."""
        self.no_preprocessor = shape is None or not _is_leaf(shape)
        self.shape = _canon(shape)
        self.demean = demean
        self.destd = destd
        self.clip = clip
        self.running_stats: Any = _new_stats(self.shape)
        self.buffer: Any = _new_stats(self.shape)

    def __call__(self, x: Any, update: bool = True) -> Any:
        """Update the statistics with ``x`` (if ``update``), then return ``x`` normalised.

        The update comes first, so the very first observation maps to 0. Floating
        dtypes are preserved; other inputs come back as float64.
        """
        if not self.no_preprocessor:
            return self._leaf(self.shape, self.running_stats, self.buffer, x, update)
        return _map(
            lambda s, rs, buf, v: self._leaf(s, rs, buf, v, update),
            self.shape,
            self.running_stats,
            self.buffer,
            x,
        )

    def _leaf(
        self, shape: Any, rs: RunningStat | None, buf: RunningStat | None, x: Any, update: bool
    ) -> Any:
        if shape is None:
            return x
        x = np.asarray(x)
        if x.shape == shape:
            if update:
                mb = x.astype(np.float64)
                if np.isfinite(mb).all():  # a NaN/inf would poison the statistics for good
                    rs._add(1, mb, None)
                    buf._add(1, mb, None)
        elif x.ndim == len(shape) + 1 and x.shape[1:] == shape:
            nb = x.shape[0]
            if update and nb:
                x64 = x.astype(np.float64)
                mb = np.add.reduce(x64, 0) / nb
                if not math.isfinite(np.vdot(mb, mb)):
                    # Leave out the rows with a NaN/inf (the mean of finite values is finite).
                    x64 = x64[np.isfinite(x64.reshape(nb, -1)).all(axis=1)]
                    nb = x64.shape[0]
                    mb = np.add.reduce(x64, 0) / nb if nb else mb
                if nb:
                    dev = x64 - mb
                    dev *= dev
                    sb = np.add.reduce(dev, 0)
                    rs._add(nb, mb, sb)
                    buf._add(nb, mb, sb)
        else:
            raise ValueError(
                f"Unexpected input shape {x.shape}, expected {shape} or (N, *{shape}) for a batch"
            )
        dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
        # Work in the output dtype: mixed-precision ufuncs cost twice as much on small arrays.
        if self.demean:
            y = x - rs._mean.astype(dtype)  # a fresh array: the input is never modified
        else:
            y = x.astype(dtype)
        if self.destd:
            n = rs.num_pushes
            std = np.sqrt(rs._ssd * (1.0 / (n - 1))) if n > 1 else np.zeros(shape)
            std += _STD_EPS
            y /= std.astype(dtype)
        if type(y) is not np.ndarray:  # 0-d arithmetic gives numpy scalars
            y = np.asarray(y)
        if self.clip:
            np.minimum(y, self.clip, out=y)
            np.maximum(y, -self.clip, out=y)
        return y

    def apply_changes(
        self, other: MeanStdFilter, with_buffer: bool = False, *args: Any, **kwargs: Any
    ) -> None:
        """Merge ``other.buffer`` into ``running_stats``; with ``with_buffer`` also copy that buffer."""
        _map(
            lambda s, rs, ob: None if s is None else rs.update(ob),
            self.shape,
            self.running_stats,
            other.buffer,
        )
        if with_buffer:
            self.buffer = _copy_stats(self.shape, other.buffer)

    def copy(self) -> MeanStdFilter:
        """Return an independent filter with the same settings, statistics and buffer."""
        other = MeanStdFilter.__new__(MeanStdFilter)
        other.sync(self)
        return other

    def as_serializable(self) -> MeanStdFilter:
        """Return a plain (lock-free) copy to ship to other processes."""
        return self.copy()

    def sync(self, other: MeanStdFilter) -> None:
        """Become a copy of ``other``: settings, statistics and buffer."""
        self.no_preprocessor = other.no_preprocessor
        self.shape = other.shape
        self.demean, self.destd, self.clip = other.demean, other.destd, other.clip
        self.running_stats = _copy_stats(other.shape, other.running_stats)
        self.buffer = _copy_stats(other.shape, other.buffer)

    def reset_buffer(self) -> None:
        """Start a fresh (empty) delta buffer."""
        self.buffer = _new_stats(self.shape)

    # -- plain state -----------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Return settings and statistics as a dict of plain values and ndarrays."""

        def dump(stats: Any) -> Any:
            return _map(lambda s, rs: None if s is None else rs._numpy_state(), self.shape, stats)

        return {
            "shape": _map(lambda s: None if s is None else list(s), self.shape),
            "demean": self.demean,
            "destd": self.destd,
            "clip": self.clip,
            "running_stats": dump(self.running_stats),
            "buffer": dump(self.buffer),
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned (from any filter of this class)."""
        shape = _as_tree(state["shape"])
        self.no_preprocessor = shape is None or not _is_leaf(shape)
        self.shape = _canon(shape)
        self.demean, self.destd, self.clip = state["demean"], state["destd"], state["clip"]

        def load(s: Any, st: Any) -> RunningStat | None:
            return None if s is None else RunningStat.from_state(st)

        self.running_stats = _map(load, self.shape, state["running_stats"])
        self.buffer = _map(load, self.shape, state["buffer"])

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> MeanStdFilter:
        """Build a filter from ``get_state`` output."""
        f = cls.__new__(cls)
        f.set_state(state)
        return f

    @staticmethod
    def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Merge several filters' states into one, with an empty buffer.

        Why: a group gathers ``get_state()`` from its runners and broadcasts one
        result. ``states[0]`` is the base (the local runner's or the last broadcast
        state: its ``running_stats`` already include its own buffer); the buffers of
        the other states (what each runner saw since the last sync) are added to
        it. The result's buffer is empty so no delta is counted twice.
        """
        if not states:
            raise ValueError("merge_states needs at least one state")
        merged = MeanStdFilter.from_state(states[0])
        for state in states[1:]:
            merged.apply_changes(MeanStdFilter.from_state(state))
        merged.reset_buffer()
        return merged.get_state()

    def __repr__(self) -> str:
        n = _map(lambda s, rs: None if s is None else rs.n, self.shape, self.running_stats)
        b = _map(lambda s, rs: None if s is None else rs.n, self.shape, self.buffer)
        return (
            f"{type(self).__name__}(shape={self.shape}, demean={self.demean}, "
            f"destd={self.destd}, clip={self.clip}, n={n}, buffer_n={b})"
        )


def _locked(name: str) -> Callable[..., Any]:
    parent = getattr(MeanStdFilter, name)

    def method(self: ConcurrentMeanStdFilter, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return parent(self, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"Thread-safe ``MeanStdFilter.{name}`` (holds the filter's lock)."
    return method


class ConcurrentMeanStdFilter(MeanStdFilter):
    """A ``MeanStdFilter`` whose methods hold a re-entrant lock.

    Why: for filters shared by several sampler threads. It pickles without its
    lock (a new one is made on load); ``as_serializable`` gives a plain filter.
    """

    is_concurrent = True

    def __init__(self, *args: Any, **kwargs: Any):
        """Same arguments as ``MeanStdFilter``."""
        self._lock = threading.RLock()
        super().__init__(*args, **kwargs)

    __call__ = _locked("__call__")
    apply_changes = _locked("apply_changes")
    sync = _locked("sync")
    reset_buffer = _locked("reset_buffer")
    get_state = _locked("get_state")
    set_state = _locked("set_state")

    def copy(self) -> ConcurrentMeanStdFilter:
        """Return an independent concurrent copy."""
        other = ConcurrentMeanStdFilter.__new__(ConcurrentMeanStdFilter)
        other._lock = threading.RLock()
        with self._lock:
            MeanStdFilter.sync(other, self)
        return other

    def as_serializable(self) -> MeanStdFilter:
        """Return a plain ``MeanStdFilter`` copy (no lock)."""
        with self._lock:
            return MeanStdFilter.copy(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ConcurrentMeanStdFilter:
        """Build a concurrent filter from ``get_state`` output."""
        f = cls.__new__(cls)
        f._lock = threading.RLock()
        f.set_state(state)
        return f

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()


def get_filter(filter_config: str | Callable[[Any], Filter], shape: Any) -> Filter:
    """Build the observation filter named by ``filter_config`` for ``shape``.

    Why: ``AlgorithmConfig.observation_filter`` is a name or a factory. Names give
    filters without clipping (``clip=None``), like RLlib.

    Raises:
        ConfigError: ``filter_config`` is neither a known name nor a callable.
    """
    if filter_config == "MeanStdFilter":
        return MeanStdFilter(shape, clip=None)
    if filter_config == "ConcurrentMeanStdFilter":
        return ConcurrentMeanStdFilter(shape, clip=None)
    if filter_config == "NoFilter":
        return NoFilter()
    if callable(filter_config):
        return filter_config(shape)
    names = ", ".join(repr(n) for n in _FILTER_NAMES)
    raise ConfigError(
        f"Unknown observation_filter: {filter_config!r}; expected one of {names} "
        f"or a callable(shape) returning a Filter.{suggest(filter_config, _FILTER_NAMES)}"
    )
