"""Failure logging that stays readable when envs fail many times a second.

The first failure of each kind (where it happened and the exception type) is
logged in full, with its traceback; later ones of that kind are only counted,
and the counts are logged as one line at most every ``interval_s`` seconds. The
exact numbers are in the runners' metrics (``num_env_step_failures_lifetime``,
``num_episodes_dropped_lifetime``); this log says what went wrong and how often.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

__all__ = ["FAILURE_LOG", "FailureLog"]


class FailureLog:
    """Logs the first failure of each kind in full, then rate-limited counts.

    Args:
        logger: Where the lines go.
        interval_s: Least time between two count lines.
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0):
        self.logger = logger
        self.interval_s = interval_s
        self._seen: set[tuple[str, str]] = set()
        self._unreported: Counter[tuple[str, str]] = Counter()
        #: Every failure reported in this process, by ``(where, exception type)``.
        self.totals: Counter[tuple[str, str]] = Counter()
        self._last_summary = time.monotonic()
        self._lock = threading.Lock()

    def report(
        self,
        where: str,
        error: BaseException | str,
        message: str,
        *args: object,
        traceback_text: str | None = None,
    ) -> bool:
        """Note one failure at ``where`` (e.g. ``"sub-env step"``); log it if it is new.

        ``message % args`` is the log line; the traceback comes from ``error`` (an
        exception) or ``traceback_text`` (one formatted in another process). Returns
        whether this failure was logged in full.
        """
        kind = error if isinstance(error, str) else type(error).__name__
        key = (where, kind)
        with self._lock:
            self.totals[key] += 1
            first = key not in self._seen
            if first:
                self._seen.add(key)
            else:
                self._unreported[key] += 1
        if first:
            note = " [first %s failure with %s; later ones are counted, not logged]"
            if traceback_text is not None:
                self.logger.error(
                    message + note + "\n%s", *args, where, kind, traceback_text.rstrip()
                )
            else:
                exc_info = error if isinstance(error, BaseException) else None
                self.logger.error(message + note, *args, where, kind, exc_info=exc_info)
            return True
        if time.monotonic() - self._last_summary >= self.interval_s:
            self.flush()
        return False

    def reset(self) -> None:
        """Forget what was seen: the next failure of every kind is logged in full again."""
        with self._lock:
            self._seen.clear()
            self._unreported.clear()
            self.totals.clear()
            self._last_summary = time.monotonic()

    def flush(self) -> None:
        """Log the counts of failures not logged since the last count line (if any)."""
        with self._lock:
            counts, self._unreported = self._unreported, Counter()
            self._last_summary = time.monotonic()
        if counts:
            parts = ", ".join(f"{n} x {kind} in {where}" for (where, kind), n in counts.items())
            self.logger.warning("More env failures since the last report: %s", parts)


#: The one failure log of this process (runners and vector envs share it).
FAILURE_LOG = FailureLog(logging.getLogger("envrunners"))
