"""``ShuffledInput``: decorrelate consecutive batches of a reader with a reservoir buffer.

Why: consecutive lines of an offline file come from the same episodes; sampling
from a buffer of ``n`` batches mixes them (``config.shuffle_buffer_size``).
"""

from __future__ import annotations

import random
from typing import Any

from envrunners.offline.input_reader import InputReader

__all__ = ["ShuffledInput"]


class ShuffledInput(InputReader):
    """Return batches of ``child`` in random order, through a buffer of ``n`` batches.

    With ``n <= 1`` batches pass through unchanged. Otherwise the first ``next()``
    fills the buffer with ``n`` batches; each call then replaces one random slot
    with a fresh batch and returns a random slot (the same batch can come twice).

    Args:
        child: The reader to shuffle (anything with ``next()``).
        n: Buffer size in batches.
        seed: Seed of the slot choices (unseeded if None).
    """

    def __init__(self, child: Any, n: int = 0, *, seed: int | None = None) -> None:
        self.child = child
        self.n = int(n)
        self.buffer: list[Any] = []
        self._rng = random.Random(seed)

    def next(self) -> Any:
        """Return the next (shuffled) batch."""
        if self.n <= 1:
            return self.child.next()
        while len(self.buffer) < self.n:
            self.buffer.append(self.child.next())
        self.buffer[self._rng.randrange(self.n)] = self.child.next()
        return self.buffer[self._rng.randrange(self.n)]

    def __repr__(self) -> str:
        return f"ShuffledInput({self.child!r}, n={self.n})"
