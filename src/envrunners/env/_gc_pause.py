"""Automatic garbage collection deferred while a runner samples (``pause_gc_during_sample``).

Why: one ``sample()`` call allocates thousands of short-lived, GC-tracked objects
(episodes, their buffers and dicts). With CPython's default young-generation
threshold (700) that triggers a young collection every few hundred of them and,
every ~100 young ones, a full collection of the whole heap (torch, Ray and
gymnasium keep ~180k tracked objects: ~90 ms each), about a tenth of the call.
While any runner in the process samples, the young threshold is raised to
``PAUSED_GEN0_THRESHOLD``: a typical call runs without a collection, and cyclic
garbage can still not grow past that bound (a call that allocates more collects
as usual, only less often). The last sampler to leave restores the thresholds
it found, unless someone changed them meanwhile; ``gc.disable()`` by the user is
left alone (a disabled collector stays disabled).
"""

from __future__ import annotations

import gc
import threading
from types import TracebackType

__all__ = ["PAUSED_GEN0_THRESHOLD", "GCPause"]

#: Young-generation threshold while sampling: net new tracked objects before a collection
#: (a CartPole call of 8,192 steps makes ~15k; the default threshold is 700).
PAUSED_GEN0_THRESHOLD = 100_000

_lock = threading.Lock()
#: How many ``sample()`` calls are inside a pause now (threads of one actor, nested runners).
_depth = 0
#: The thresholds found by the first call in, and the ones it set.
_saved: tuple[int, int, int] | None = None
_raised: tuple[int, int, int] | None = None


class GCPause:
    """Context manager: young collections wait for ``PAUSED_GEN0_THRESHOLD`` objects inside.

    Re-entrant and thread-safe: nested or concurrent pauses share one raised
    threshold, restored when the last one exits (also when the body raises).
    ``GCPause(False)`` does nothing.
    """

    __slots__ = ("active",)

    def __init__(self, enabled: bool = True):
        self.active = bool(enabled)

    def __enter__(self) -> GCPause:
        global _depth, _saved, _raised
        if not self.active:
            return self
        with _lock:
            if _depth == 0:
                _saved = gc.get_threshold()
                gen0, *older = _saved
                # A threshold of 0 means "never collect": keep it (and anything higher).
                if gen0 and gen0 < PAUSED_GEN0_THRESHOLD:
                    gc.set_threshold(PAUSED_GEN0_THRESHOLD, *older)
                _raised = gc.get_threshold()
            _depth += 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _depth, _saved, _raised
        if not self.active:
            return
        with _lock:
            _depth -= 1
            if _depth == 0:
                if gc.get_threshold() == _raised:  # else the user set thresholds meanwhile
                    gc.set_threshold(*_saved)
                _saved = _raised = None


def gc_paused_now() -> bool:
    """Whether a runner's ``sample()`` holds the raised threshold at this moment."""
    return _depth > 0
