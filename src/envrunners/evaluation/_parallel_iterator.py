"""``ParallelIteratorWorker``: the base that gives ``RolloutWorker`` its ``par_iter_*`` methods.

Why: RLlib's ``RolloutWorker`` subclasses ``ray.util.iter.ParallelIteratorWorker``
(deprecated in Ray, still there), and old drivers pulled sample batches through
Ray's parallel iterators, which call these methods remotely. It is a class of its
own with its own state (the item generator and the iterator over it); this is its
worker side only (transforms, sharded or time-batched pulls), without importing Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["ParallelIteratorWorker"]


def _gather_for(batch_ms: int, pull: Callable[[], Any]) -> list[Any]:
    """``pull()`` items for ``batch_ms`` milliseconds (one item if 0; at least one).

    ``StopIteration`` ends the batch early; it propagates only if nothing was pulled.
    """
    if not batch_ms:
        return [pull()]
    deadline = time.monotonic() + batch_ms / 1000.0
    batch: list[Any] = []
    try:
        while time.monotonic() < deadline or not batch:
            batch.append(pull())
    except StopIteration:
        if not batch:
            raise
    return batch


class ParallelIteratorWorker:
    """Serves items of a generator to remote ``par_iter_*`` calls.

    Args:
        item_generator: An iterable, or a zero-arg callable returning one.
        repeat: Cycle through the items forever (re-creating the iterable).
    """

    def __init__(self, item_generator: Iterable[Any] | Callable[[], Iterable[Any]], repeat: bool):
        self._item_generator = item_generator
        self._repeat = repeat
        self._local_it: Iterator[Any] | None = None
        self._next_slices: dict[int, list[Any]] = {}

    def _items(self) -> Iterator[Any]:
        used = False
        while True:
            source = self._item_generator
            if callable(source):
                source = source()
            elif used and not self._repeat:
                return
            elif used and iter(source) is source:
                raise ValueError(
                    "Cannot iterate over a generator twice; pass a callable returning a "
                    "new generator to repeat it."
                )
            used = True
            yield from source
            if not self._repeat:
                return

    def par_iter_init(self, transforms: list[Callable[[Iterator[Any]], Iterator[Any]]]) -> None:
        """Start iterating, applying each transform to the item iterator in order."""
        it: Iterator[Any] = self._items()
        for transform in transforms or []:
            it = transform(it)
            if it is None:
                raise ValueError(f"par_iter_init: transform {transform!r} returned None")
        self._local_it = iter(it)
        self._next_slices = {}

    def _require_init(self) -> Iterator[Any]:
        assert self._local_it is not None, "par_iter_init() must be called first"
        return self._local_it

    def par_iter_next(self) -> Any:
        """The next item (``StopIteration`` at the end)."""
        return next(self._require_init())

    def par_iter_next_batch(self, batch_ms: int) -> list[Any]:
        """Items gathered for ``batch_ms`` milliseconds (one item if 0)."""
        return _gather_for(batch_ms, self.par_iter_next)

    def par_iter_slice(self, step: int, start: int) -> Any:
        """The next item of shard ``start`` when items are dealt round-robin to ``step`` shards."""
        it = self._require_init()
        buffered = self._next_slices.setdefault(start, [])
        if not buffered:
            for i in range(step):
                item = next(it)  # StopIteration ends every shard
                self._next_slices.setdefault(i, []).append(item)
        buffered = self._next_slices[start]
        if not buffered:
            raise StopIteration
        return buffered.pop(0)

    def par_iter_slice_batch(self, step: int, start: int, batch_ms: int) -> list[Any]:
        """``par_iter_slice`` items gathered for ``batch_ms`` milliseconds."""
        return _gather_for(batch_ms, lambda: self.par_iter_slice(step, start))
