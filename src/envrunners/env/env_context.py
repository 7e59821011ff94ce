"""``EnvContext``: the ``env_config`` dict handed to env creators, plus where it runs.

Why: one creator builds the env copies of every runner and sub-env; the context
tells it which copy it is building (``worker_index``, ``vector_index``), how
many runners there are, and whether this is a restart, so it can pick ports,
seeds or data shards without extra plumbing.
"""

from __future__ import annotations

import copy

__all__ = ["EnvContext"]


class EnvContext(dict):
    """The env config (a dict) with the identity of the env copy being built.

    Why: creators receive this instead of a bare dict, so per-copy settings are
    derived from ``worker_index`` / ``vector_index`` while keys are read as usual.

    Args:
        env_config: The user's env config; its keys become this dict's keys
            (a shallow copy).
        worker_index: 0 for the local runner, ``>0`` for remote runners.
        vector_index: Index of the sub-env inside the runner's vector env.
        remote: Whether sub-envs run as separate processes/actors.
        num_workers: Number of remote runners, if known.
        recreated_worker: Whether the runner was restarted after a failure.

    Example:
        >>> ctx = EnvContext({"size": 4}, worker_index=1, num_workers=2)
        >>> ctx["size"], ctx.worker_index
        (4, 1)
    """

    def __init__(
        self,
        env_config: dict,
        worker_index: int,
        vector_index: int = 0,
        remote: bool = False,
        num_workers: int | None = None,
        recreated_worker: bool = False,
    ) -> None:
        dict.__init__(self, env_config)
        self.worker_index = worker_index
        self.vector_index = vector_index
        self.remote = remote
        self.num_workers = num_workers
        self.recreated_worker = recreated_worker

    def copy_with_overrides(
        self,
        env_config: dict | None = None,
        worker_index: int | None = None,
        vector_index: int | None = None,
        remote: bool | None = None,
        num_workers: int | None = None,
        recreated_worker: bool | None = None,
    ) -> EnvContext:
        """Return a new context with every argument that is not ``None`` replaced.

        Why: sub-env creators need the same context with another
        ``vector_index`` (or config) without mutating the runner's context.
        A given ``env_config`` is deep-copied so the copies never share state.
        """
        return EnvContext(
            copy.deepcopy(env_config) if env_config is not None else self,
            worker_index=worker_index if worker_index is not None else self.worker_index,
            vector_index=vector_index if vector_index is not None else self.vector_index,
            remote=remote if remote is not None else self.remote,
            num_workers=num_workers if num_workers is not None else self.num_workers,
            recreated_worker=(
                recreated_worker if recreated_worker is not None else self.recreated_worker
            ),
        )

    def set_defaults(self, defaults: dict) -> None:
        """Add the keys of ``defaults`` that are missing; existing keys are kept.

        Why: env classes can declare their default settings without overriding
        what the user configured.
        """
        for key, value in defaults.items():
            if key not in self:
                self[key] = value

    def __str__(self) -> str:
        """Show the keys and ``worker=i/n, vector_idx=j, remote=r`` in one dict-like line."""
        return (
            dict.__repr__(self)[:-1]
            + f", worker={self.worker_index}/{self.num_workers}, "
            + f"vector_idx={self.vector_index}, remote={self.remote}"
            + "}"
        )
