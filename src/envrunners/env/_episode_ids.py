"""Random episode ids (32 hex digits, like ``uuid4().hex``), drawn in bulk.

Why: the samplers start many episodes (the multi-agent one, one per agent per
env episode); one ``os.urandom`` system call per id showed up in its profile. The ids are the same
kind (128 random bits as hex); a forked child starts with an empty pool, so it
never hands out ids its parent also holds.
"""

from __future__ import annotations

import os

__all__ = ["new_episode_id"]

_BATCH = 64
_pool: list[str] = []


def new_episode_id() -> str:
    """Return a fresh random 32-hex-digit id."""
    try:
        return _pool.pop()
    except IndexError:
        raw = os.urandom(16 * _BATCH).hex()
        ids = [raw[j : j + 32] for j in range(0, 32 * _BATCH, 32)]
        _pool.extend(ids[1:])
        return ids[0]


def _forget() -> None:
    _pool.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)
