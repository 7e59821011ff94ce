"""``ObservationPreprocessor``: write a transform of one observation, get a batch piece.

As RLlib's ``SingleAgentObservationPreprocessor`` (also exported as
``ObservationPreprocessor``): a subclass implements ``preprocess(observation,
episode)`` for one sub-env's observation and ``recompute_output_observation_space``.
Here the piece receives the whole ``(N, ...)`` batch; ``preprocess_batch`` calls
``preprocess`` once per sub-env (with that sub-env's ``SubEnvEpisodeView``, or
None when the caller gave no views) and stacks the results. Override
``preprocess_batch`` for a vectorised transform.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.connectors.vector_episodes import row_of

__all__ = ["ObservationPreprocessor", "SingleAgentObservationPreprocessor"]


def _stack(items: list[Any]) -> Any:
    first = items[0]
    if isinstance(first, dict):
        return {k: _stack([x[k] for x in items]) for k in first}
    if isinstance(first, tuple):
        return tuple(_stack([x[j] for x in items]) for j in range(len(first)))
    return np.stack([np.asarray(x) for x in items])


def _rows(value: Any) -> int:
    while isinstance(value, (dict, tuple)):
        value = next(iter(value.values())) if isinstance(value, dict) else value[0]
    return len(value)


class SingleAgentObservationPreprocessor(ConnectorV2, abc.ABC):
    """Transforms each sub-env's newest observation with ``preprocess``.

    Works on ready-first batches: each row is preprocessed with its own sub-env's
    view. A subclass that keeps per-sub-env state in ``preprocess_batch`` indexed by
    row sets ``supports_ready_first = False``.
    """

    supports_ready_first = True

    @abc.abstractmethod
    def preprocess(self, observation: Any, episode: Any) -> Any:
        """Return the new observation for one sub-env.

        Args:
            observation: One (unbatched) observation.
            episode: That sub-env's ``SubEnvEpisodeView`` (None if the caller gave none).
        """

    def preprocess_batch(self, observations: Any, episodes: Any) -> Any:
        """The whole batch: ``preprocess`` per row, stacked. Override to vectorise."""
        rows = _rows(observations)
        views = episodes if episodes is not None and len(episodes) == rows else [None] * rows
        return _stack([self.preprocess(row_of(observations, i), views[i]) for i in range(rows)])

    def __call__(self, *, batch: dict[str, Any], episodes: Any = None, **kwargs: Any) -> Any:
        """Replace ``batch["obs"]`` by its preprocessed form."""
        batch["obs"] = self.preprocess_batch(batch["obs"], episodes)
        return batch


ObservationPreprocessor = SingleAgentObservationPreprocessor
