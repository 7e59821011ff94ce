"""Pausing Python's cyclic garbage collector around allocation-heavy work.

Why: sampling and unpickling episodes create many small container objects
(info dicts, per-agent lists) that live for an episode or longer. With the
collector on, every 700 of them start a young collection that walks all the
young survivors, and the promotions soon start older collections of the whole
heap (torch, Ray, gymnasium: ~200k objects). None of that finds garbage: the
objects die by reference count. In the multi-agent sampler (W3, 8 envs) those
collections were 4.7% of the sampling time and freed 10 objects in 10 calls.

Paused, only reference cycles made meanwhile wait (an env may make some); a
backstop collects the young generation once very many objects piled up, so
even a long call keeps that bounded.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator

__all__ = ["BACKSTOP_OBJECTS", "paused_gc"]

#: Young-generation objects (net allocations) after which a paused loop collects them.
BACKSTOP_OBJECTS = 500_000


def _backstop() -> None:
    if gc.get_count()[0] > BACKSTOP_OBJECTS:
        gc.collect(0)


def _nothing() -> None:
    pass


@contextlib.contextmanager
def paused_gc() -> Iterator[Callable[[], None]]:
    """Run the body with the cyclic collector off (if it was on); restore it after.

    Yields the backstop: a loop calls it once per iteration (one C call and a
    compare); it collects the young generation after ``BACKSTOP_OBJECTS``. If
    the collector was off already (the user's choice), the backstop does nothing.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield _backstop if enabled else _nothing
    finally:
        if enabled:
            gc.enable()
