"""Test helper: wait for a condition with a deadline (no test sleeps without one)."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    predicate: Callable[[], object], timeout: float = 30.0, interval: float = 0.05
) -> bool:
    """Poll ``predicate`` every ``interval`` s until it is true or ``timeout`` s have passed.

    Returns:
        Whether it became true (it is asked once more at the deadline).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
