"""Running moments and shape trees behind the observation filters (private module).

Why: ``RunningStat`` (re-exported by ``envrunners.utils.filter``, its public path)
keeps Welford moments and merges whole batches with Chan et al.'s parallel
formula, so a ``(N, *shape)`` batch costs a few numpy ops; the helpers map a
function over a dict/tuple structure of shapes for filters of nested spaces.
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Callable
from typing import Any

import numpy as np

from envrunners.errors import ConfigError

__all__ = ["RunningStat"]


def _merge(mean: np.ndarray, ssd: np.ndarray, n: int, nb: int, mb: Any, sb: Any) -> None:
    """Merge moments (nb, mb, sb) into (n, mean, ssd) in place (Chan et al.); sb may be None."""
    total = n + nb
    d = mb - mean
    mean += d * (nb / total)
    d *= d
    d *= n * nb / total
    if sb is not None:
        d += sb
    ssd += d


class RunningStat:
    """Running count, mean and variance of arrays of one shape (Welford / Chan et al.).

    Why: filters need statistics that can be updated one batch at a time and merged
    across workers exactly. Besides the totals it keeps a *delta*: the moments of
    the values pushed into this object (not merged from others), which is what
    ``update`` reads from the other side of a merge.

    Internals are float64; ``var``/``std`` are float32 like RLlib's.
    """

    def __init__(self, shape: Any = ()):
        """Create empty statistics for arrays of ``shape`` (a tuple, an int or ``()``)."""
        self._shape = _as_shape(shape)
        self.num_pushes = 0
        self.num_pushes_delta = 0
        self._mean = np.zeros(self._shape)
        self._ssd = np.zeros(self._shape)
        # While nothing was merged in by update(), the delta equals the totals; the
        # delta arrays stay None then, so push() pays for one merge, not two.
        self._dmean: np.ndarray | None = None
        self._dssd: np.ndarray | None = None

    # -- updates -----------------------------------------------------------------
    def push(self, x: Any) -> None:
        """Add one value of ``shape`` or a batch of shape ``(N, *shape)``."""
        x = np.asarray(x)
        if x.shape == self._shape:
            self._add(1, x.astype(np.float64), None)
        elif x.shape[1:] == self._shape and x.ndim == len(self._shape) + 1:
            nb = x.shape[0]
            if nb == 0:
                return
            mb = np.add.reduce(x, 0, dtype=np.float64) / nb
            dev = x - mb
            dev *= dev
            self._add(nb, mb, np.add.reduce(dev, 0))
        else:
            raise ValueError(
                f"Unexpected input shape {x.shape}, expected {self._shape} "
                f"(or (N, *{self._shape}) for a batch), value = {x}"
            )

    def _add(self, nb: int, mb: Any, sb: Any) -> None:
        """Merge a batch's moments into the totals and the delta."""
        if self._dmean is not None:
            _merge(self._dmean, self._dssd, self.num_pushes_delta, nb, mb, sb)
        _merge(self._mean, self._ssd, self.num_pushes, nb, mb, sb)
        self.num_pushes += nb
        self.num_pushes_delta += nb

    def update(self, other: RunningStat) -> None:
        """Merge ``other``'s delta (what was pushed into it) into this object's totals.

        This object's own delta is left unchanged.
        """
        if other._shape != self._shape:
            raise ValueError(f"Cannot merge RunningStat of shape {other._shape} into {self._shape}")
        n2 = other.num_pushes_delta
        if n2 == 0:
            return
        if self._dmean is None:  # totals and delta diverge from here on
            self._dmean, self._dssd = self._mean.copy(), self._ssd.copy()
        _, mb, sb = other._delta()
        _merge(self._mean, self._ssd, self.num_pushes, n2, mb, sb)
        self.num_pushes += n2

    def _delta(self) -> tuple[int, np.ndarray, np.ndarray]:
        if self._dmean is None:
            return self.num_pushes_delta, self._mean, self._ssd
        return self.num_pushes_delta, self._dmean, self._dssd

    # -- properties --------------------------------------------------------------
    @property
    def n(self) -> int:
        """Total number of values (pushed plus merged in)."""
        return self.num_pushes

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one value."""
        return self._shape

    @property
    def mean(self) -> np.ndarray:
        """Mean of all values (float64, read-only view)."""
        return _readonly(self._mean)

    @property
    def var(self) -> np.ndarray:
        """Sample variance (ddof=1) as float32; zeros while ``n <= 1``."""
        if self.num_pushes <= 1:
            return np.zeros(self._shape, dtype=np.float32)
        return (self._ssd / (self.num_pushes - 1)).astype(np.float32)

    @property
    def std(self) -> np.ndarray:
        """Square root of ``var`` (float32)."""
        return np.sqrt(np.maximum(self.var, 0.0))

    mean_array = mean

    @property
    def sum_sq_diff_array(self) -> np.ndarray:
        """Sum of squared deviations from the mean (read-only view)."""
        return _readonly(self._ssd)

    @property
    def mean_delta_array(self) -> np.ndarray:
        """Mean of the pushed values only (read-only view)."""
        return _readonly(self._delta()[1])

    @property
    def sum_sq_diff_delta_array(self) -> np.ndarray:
        """Sum of squared deviations of the pushed values only (read-only view)."""
        return _readonly(self._delta()[2])

    # -- copies and state ----------------------------------------------------------
    def copy(self) -> RunningStat:
        """Return an independent copy."""
        other = RunningStat.__new__(RunningStat)
        other.__dict__.update(_copy.deepcopy(self.__dict__))
        return other

    def to_state(self) -> dict[str, Any]:
        """Return the state as plain Python data (ints and nested lists), JSON-safe."""
        _, dmean, dssd = self._delta()
        return {
            "shape": list(self._shape),
            "num_pushes": int(self.num_pushes),
            "num_pushes_delta": int(self.num_pushes_delta),
            "mean_array": self._mean.tolist(),
            "mean_delta_array": dmean.tolist(),
            "sum_sq_diff_array": self._ssd.tolist(),
            "sum_sq_diff_delta_array": dssd.tolist(),
        }

    def _numpy_state(self) -> dict[str, Any]:
        """Like ``to_state`` but with (copied) ndarrays, for cheap in-process transfer."""
        _, dmean, dssd = self._delta()
        return {
            "shape": list(self._shape),
            "num_pushes": int(self.num_pushes),
            "num_pushes_delta": int(self.num_pushes_delta),
            "mean_array": self._mean.copy(),
            "mean_delta_array": dmean.copy(),
            "sum_sq_diff_array": self._ssd.copy(),
            "sum_sq_diff_delta_array": dssd.copy(),
        }

    @staticmethod
    def from_state(state: dict[str, Any]) -> RunningStat:
        """Build a RunningStat from ``to_state()`` output (lists or ndarrays)."""
        rs = RunningStat(tuple(state["shape"]))
        rs.num_pushes = int(state["num_pushes"])
        rs.num_pushes_delta = int(state["num_pushes_delta"])
        arrays = {}
        for key in (
            "mean_array",
            "mean_delta_array",
            "sum_sq_diff_array",
            "sum_sq_diff_delta_array",
        ):
            arr = np.array(state[key], dtype=np.float64)
            if arr.shape != rs._shape:
                raise ValueError(
                    f"RunningStat state {key!r} has shape {arr.shape}, expected {rs._shape}"
                )
            arrays[key] = arr
        rs._mean, rs._ssd = arrays["mean_array"], arrays["sum_sq_diff_array"]
        dmean, dssd = arrays["mean_delta_array"], arrays["sum_sq_diff_delta_array"]
        same = rs.num_pushes == rs.num_pushes_delta
        if not (same and np.array_equal(dmean, rs._mean) and np.array_equal(dssd, rs._ssd)):
            rs._dmean, rs._dssd = dmean, dssd
        return rs

    def __repr__(self) -> str:
        return (
            f"RunningStat(shape={self._shape}, n={self.num_pushes}, "
            f"n_delta={self.num_pushes_delta}, mean={self._mean}, std={self.std})"
        )


def _readonly(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


# -- nested shapes -------------------------------------------------------------------
def _is_leaf(shape: Any) -> bool:
    """A leaf is None (a discrete space), an int, an int array or a tuple/list of ints."""
    if shape is None or isinstance(shape, (int, np.integer, np.ndarray)):
        return True
    if isinstance(shape, (tuple, list)):
        return all(isinstance(s, (int, np.integer)) for s in shape)
    return False


def _as_shape(shape: Any) -> tuple[int, ...]:
    """Normalise an int, tuple, list or int array to a tuple of ints."""
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    try:
        return tuple(int(s) for s in np.asarray(shape, dtype=np.int64).reshape(-1))
    except (TypeError, ValueError) as e:
        raise ValueError(f"Not an array shape: {shape!r}") from e


def _map(fn: Callable[..., Any], shape: Any, *trees: Any) -> Any:
    """Apply ``fn(leaf_shape, *leaves)`` over a dict/tuple structure of shapes."""
    if _is_leaf(shape):
        return fn(shape, *trees)
    if isinstance(shape, dict):
        return {k: _map(fn, s, *(t[k] for t in trees)) for k, s in shape.items()}
    if isinstance(shape, (tuple, list)):
        return tuple(_map(fn, s, *(t[i] for t in trees)) for i, s in enumerate(shape))
    raise ConfigError(
        f"Unsupported filter shape {shape!r}: use a shape tuple, None, or a dict/tuple of those"
    )


def _as_tree(shape: Any) -> Any:
    """Turn a JSON-ish shape (lists) back into leaves (tuples) and structures."""
    if _is_leaf(shape):
        return tuple(shape) if isinstance(shape, list) else shape
    if isinstance(shape, dict):
        return {k: _as_tree(v) for k, v in shape.items()}
    return tuple(_as_tree(v) for v in shape)
