"""``IOContext``: what offline readers and writers need to know about their worker.

Why: readers and writers are built by a factory (``config.input_``/``output``)
that gets one argument; this object carries the log directory, the config, the
worker's index and the worker itself (for its policies and its sampler).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["IOContext"]


class IOContext:
    """Attributes passed to input/output class constructors.

    Args:
        log_dir: Default output directory (``config.output="logdir"``); the current
            working directory if not given.
        config: The ``AlgorithmConfig`` (or a plain dict). Defaults to an
            ``AlgorithmConfig`` with ``train_batch_size=1`` (readers return one
            line per ``next()``) and ``actions_in_input_normalized=(worker is None)``.
        worker_index: Index of the worker (0: local); spreads readers over files
            and names output files.
        worker: The ``RolloutWorker`` (gives ``policy_map`` and ``sampler``), or None.
        sampler: Optional explicit sampler input for ``default_sampler_input()``
            (envrunners extension: used when the worker has no ``sampler`` attribute yet).
    """

    def __init__(
        self,
        log_dir: str | None = None,
        config: Any = None,
        worker_index: int = 0,
        worker: Any = None,
        *,
        sampler: Any = None,
    ) -> None:
        self.log_dir = log_dir or os.getcwd()
        if config is None:
            from envrunners.algorithms.algorithm_config import AlgorithmConfig

            config = (
                AlgorithmConfig()
                .offline_data(actions_in_input_normalized=worker is None)
                .training(train_batch_size=1)
            )
        self.config = config
        self.worker_index = worker_index
        self.worker = worker
        self._sampler = sampler

    def default_sampler_input(self) -> Any:
        """Return the worker's ``SamplerInput`` (``worker.sampler``), or None if it has no env.

        Raises:
            AttributeError: if this context has neither a worker nor an explicit sampler.
        """
        if self._sampler is not None:
            return self._sampler
        if self.worker is None:
            raise AttributeError(
                "IOContext.default_sampler_input(): this context has no worker, so there is "
                "no sampler to read from; build it as IOContext(worker=rollout_worker) or "
                "IOContext(sampler=...), or do not use the 'sampler' input."
            )
        return self.worker.sampler

    @property
    def input_config(self) -> dict[str, Any]:
        """``config["input_config"]`` (options for the input reader), ``{}`` if unset."""
        return _get(self.config, "input_config", None) or {}

    @property
    def output_config(self) -> dict[str, Any]:
        """``config["output_config"]`` (options for the output writer), ``{}`` if unset."""
        return _get(self.config, "output_config", None) or {}

    def __repr__(self) -> str:
        return (
            f"IOContext(log_dir={self.log_dir!r}, worker_index={self.worker_index}, "
            f"worker={type(self.worker).__name__ if self.worker is not None else None})"
        )


def _get(config: Any, key: str, default: Any) -> Any:
    """``config.get(key, default)`` for AlgorithmConfig objects and plain dicts alike."""
    getter = getattr(config, "get", None)
    if getter is None:
        return default
    return getter(key, default)
