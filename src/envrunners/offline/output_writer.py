"""``OutputWriter`` and ``NoopOutput``: where a ``RolloutWorker`` records what it samples.

Why: a worker hands every batch it samples to one writer; the default writes
nothing (``NoopOutput``), ``config.offline_data(output=path)`` selects a
``JsonWriter`` (see ``envrunners.offline.io_selection``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["NoopOutput", "OutputWriter"]


class OutputWriter:
    """The interface of experience writers: ``write(sample_batch)``.

    Why: lets workers record batches without knowing where they go.
    """

    def write(self, sample_batch: Any) -> None:
        """Record one ``SampleBatch`` or ``MultiAgentBatch``.

        Raises:
            NotImplementedError: always, in this abstract base.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement write(sample_batch)")

    def close(self) -> None:
        """Finish writing (flush and publish files); a no-op unless a writer needs it."""


class NoopOutput(OutputWriter):
    """A writer that discards every batch (the default when ``config.output`` is None)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Accept and ignore any arguments (so it can stand in for any writer factory)."""

    def write(self, sample_batch: Any) -> None:
        """Do nothing."""
