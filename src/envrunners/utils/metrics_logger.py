"""A small metrics logger with RLlib's reduce semantics, kept off the hot path.

Runners log once per ``sample()`` call or once per finished episode, never per
step. ``reduce()`` returns plain Python numbers, so results cross Ray cheaply.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Hashable
from typing import Any

__all__ = ["MetricsLogger"]

_REDUCES = ("mean", "min", "max", "sum", "lifetime_sum", "last")


class _Stat:
    """One metric: a reduce method and what it needs, in bounded memory.

    A windowed ``mean``/``min``/``max`` keeps its last ``window`` values; every other
    metric keeps running numbers (total and count, or the extreme, or the last
    value), so a runner whose metrics are never reduced does not grow.
    """

    __slots__ = (
        "reduce",
        "window",
        "values",
        "total",
        "count",
        "lifetime",
        "with_throughput",
        "_t0",
        "_n0",
    )

    def __init__(self, reduce: str, window: int | None, with_throughput: bool):
        if reduce not in _REDUCES:
            raise ValueError(f"reduce={reduce!r} is not one of {_REDUCES}")
        self.reduce = reduce
        self.window = window
        windowed = window is not None and reduce in ("mean", "min", "max")
        self.values: deque | None = deque(maxlen=window) if windowed else None
        self.total = 0.0
        self.count = 0
        self.lifetime = 0.0
        self.with_throughput = with_throughput
        self._t0 = time.perf_counter()
        self._n0 = 0.0

    def push(self, value: float) -> None:
        reduce = self.reduce
        if reduce == "lifetime_sum":
            self.lifetime += value
        elif self.values is not None:
            self.values.append(value)
        elif reduce in ("sum", "mean"):
            self.total += value
            self.count += 1
        elif reduce == "last" or self.count == 0:
            self.total = value
            self.count = 1
        elif reduce == "min":
            self.total = min(self.total, value)
        else:  # max
            self.total = max(self.total, value)

    def peek(self) -> Any:
        reduce = self.reduce
        if reduce == "lifetime_sum":
            return self.lifetime
        values = self.values
        if values is not None:
            if not values:
                return math.nan
            if reduce == "mean":
                return sum(values) / len(values)
            return min(values) if reduce == "min" else max(values)
        if not self.count:
            return 0 if reduce == "sum" else math.nan
        return self.total / self.count if reduce == "mean" else self.total

    def reduce_and_clear(self) -> Any:
        value = self.peek()
        if self.reduce in ("sum", "last"):
            self.total = 0.0
            self.count = 0
        return value

    def throughput(self) -> float:
        now = time.perf_counter()
        dt = now - self._t0
        rate = (self.lifetime - self._n0) / dt if dt > 0 else 0.0
        self._t0, self._n0 = now, self.lifetime
        return rate


class MetricsLogger:
    """Collects scalar metrics keyed by a str or a tuple path and reduces them on demand.

    Reduce methods: ``mean``/``min``/``max`` over a sliding window, ``sum`` (reset at
    each ``reduce()``), ``lifetime_sum`` (never reset), ``last``. A tuple key such as
    ``("agent_episode_returns_mean", "a0")`` becomes a nested dict in the result.
    """

    def __init__(self) -> None:
        self._stats: dict[tuple[Hashable, ...], _Stat] = {}

    def log_value(
        self,
        key: Hashable | tuple,
        value: float,
        *,
        reduce: str = "mean",
        window: int | None = None,
        with_throughput: bool = False,
    ) -> None:
        """Add ``value`` to the metric ``key`` (created on first use with ``reduce``)."""
        path = key if isinstance(key, tuple) else (key,)
        stat = self._stats.get(path)
        if stat is None:
            stat = self._stats[path] = _Stat(reduce, window, with_throughput)
        stat.push(float(value))

    def log_dict(self, values: dict, *, key: Hashable | None = None, **kwargs: Any) -> None:
        """Log every entry of a (nested) dict, under the optional prefix ``key``."""
        for k, v in values.items():
            path = (key, k) if key is not None else k
            if isinstance(v, dict):
                self.log_dict(v, key=path, **kwargs)
            else:
                self.log_value(path, v, **kwargs)

    def peek(self, key: Hashable | tuple, default: Any = None) -> Any:
        """The current reduced value of ``key`` without clearing it."""
        stat = self._stats.get(key if isinstance(key, tuple) else (key,))
        return default if stat is None else stat.peek()

    def reduce(self) -> dict:
        """Return all metrics as a nested dict of numbers; clears per-call sums."""
        out: dict = {}
        for path, stat in self._stats.items():
            node = out
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = stat.reduce_and_clear()
            if stat.with_throughput:
                node[f"{path[-1]}_throughput"] = stat.throughput()
        return out

    def get_state(self) -> dict:
        """Lifetime counters as plain data (so a restarted runner can resume them)."""
        return {
            "/".join(map(str, p)): s.lifetime
            for p, s in self._stats.items()
            if s.reduce == "lifetime_sum"
        }

    def set_state(self, state: dict) -> None:
        """Restore lifetime counters written by ``get_state``."""
        for key, value in state.items():
            path = tuple(key.split("/"))
            stat = self._stats.get(path)
            if stat is None:
                stat = self._stats[path] = _Stat("lifetime_sum", None, False)
            stat.lifetime = float(value)
