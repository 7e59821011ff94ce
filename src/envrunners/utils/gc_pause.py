"""Pausing Python's cyclic garbage collector around allocation-heavy work.

Why: sampling and unpickling episodes create many small container objects
(info dicts, per-agent lists) that live for an episode or longer. With the
collector on, every 700 of them start a young collection that walks all the
young survivors, and the promotions soon start older collections of the whole
heap (torch, Ray, gymnasium: ~200k objects). None of that finds garbage: the
objects die by reference count. In the multi-agent sampler (W3, 8 envs) those
collections were 4.7% of the sampling time and freed 10 objects in 10 calls;
in the single-agent runner (W1, 16 and 128 envs) 4-10%.

Two tools. ``paused_gc``: the collector off around a loop that calls the
yielded backstop once per iteration; only reference cycles made meanwhile wait
(an env may make some), and the backstop collects the young generation once
very many objects piled up, so even a long call keeps that bounded.
``DeferredGC``: the runners' whole ``sample()`` call (config key
``pause_gc_during_sample``) runs with the young-generation threshold raised to
``DEFERRED_GEN0_THRESHOLD``, which bounds the waiting garbage by itself (no
loop has to call anything); nested and concurrent calls share one raised
threshold and the last one out restores what the first one found.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator
from types import TracebackType

__all__ = [
    "BACKSTOP_OBJECTS",
    "DEFERRED_GEN0_THRESHOLD",
    "DeferredGC",
    "gc_deferred_now",
    "paused_gc",
]

#: Young-generation objects (net allocations) after which a paused loop collects them.
BACKSTOP_OBJECTS = 500_000


def _backstop() -> None:
    if gc.get_count()[0] > BACKSTOP_OBJECTS:
        gc.collect(0)


def _nothing() -> None:
    pass


@contextlib.contextmanager
def paused_gc(pause: bool = True) -> Iterator[Callable[[], None]]:
    """Run the body with the cyclic collector off (if it was on); restore it after.

    Yields the backstop: a loop calls it once per iteration (one C call and a
    compare); it collects the young generation after ``BACKSTOP_OBJECTS``. If
    the collector was off already (the user's choice), the backstop does nothing.
    ``pause=False`` leaves the collector alone (and yields the no-op backstop).
    """
    if not pause:
        yield _nothing
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield _backstop if enabled else _nothing
    finally:
        if enabled:
            gc.enable()


#: Young-generation threshold during a runner's ``sample()``: net new tracked objects
#: before a young collection (a CartPole call of 8,192 steps makes 5-6k; the default is 700).
DEFERRED_GEN0_THRESHOLD = 100_000

_lock = threading.Lock()
#: How many ``DeferredGC`` bodies run now (threads of one actor, nested runners).
_depth = 0
#: The thresholds the first one in found, and the ones it set.
_found: tuple[int, int, int] | None = None
_raised: tuple[int, int, int] | None = None


class DeferredGC:
    """Context manager: young collections wait for ``DEFERRED_GEN0_THRESHOLD`` objects.

    Re-entrant and thread-safe: nested or concurrent bodies share one raised
    threshold; the last one out restores the thresholds the first one found (also
    when a body raises), unless someone set others meanwhile. A threshold of 0 (no
    automatic collection) stays 0; ``gc.isenabled()`` is never touched, so a
    collector the user turned off stays off. ``DeferredGC(False)`` does nothing.
    """

    __slots__ = ("active",)

    def __init__(self, enabled: bool = True):
        self.active = bool(enabled)

    def __enter__(self) -> DeferredGC:
        global _depth, _found, _raised
        if self.active:
            with _lock:
                if _depth == 0:
                    _found = gc.get_threshold()
                    gen0, *older = _found
                    if gen0 and gen0 < DEFERRED_GEN0_THRESHOLD:
                        gc.set_threshold(DEFERRED_GEN0_THRESHOLD, *older)
                    _raised = gc.get_threshold()
                _depth += 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _depth, _found, _raised
        if self.active:
            with _lock:
                _depth -= 1
                if _depth == 0:
                    if gc.get_threshold() == _raised:  # else the user set others meanwhile
                        gc.set_threshold(*_found)
                    _found = _raised = None


def gc_deferred_now() -> bool:
    """Whether a ``DeferredGC`` body (a runner's ``sample()``) runs at this moment."""
    return _depth > 0
