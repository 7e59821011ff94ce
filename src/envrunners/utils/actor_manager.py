"""Fault-aware remote calls (``ray.rllib.utils.actor_manager``).

``FaultAwareApply`` is the mixin every runner class inherits, so a Ray actor made
from a runner can be pinged and can run arbitrary functions on itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

__all__ = ["FaultAwareApply"]

logger = logging.getLogger("envrunners")


class FaultAwareApply:
    """Mixin giving an actor ``ping()`` and ``apply(func, *args, **kwargs)``.

    Unlike RLlib, an exception raised by ``func`` is not turned into a sleep and a
    process exit: it propagates to the caller unchanged (as a ``RayTaskError`` that
    is also an instance of the original class), so the user sees their own error.
    """

    def ping(self) -> str:
        """Answer ``"pong"``: the cheapest proof that the actor is alive."""
        return "pong"

    def apply(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``func(self, *args, **kwargs)`` and return its result."""
        return func(self, *args, **kwargs)
