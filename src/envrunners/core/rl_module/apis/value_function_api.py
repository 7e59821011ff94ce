"""``ValueFunctionAPI``: what a module offers to have its state values computed."""

from __future__ import annotations

import abc
from typing import Any

__all__ = ["ValueFunctionAPI"]


class ValueFunctionAPI(abc.ABC):
    """Mix-in for RLModules with a value function head (PPO's critic, GAE bootstrap).

    Learners (and the runner, for ``VF_PREDS``) call :meth:`compute_values`; a module
    that also outputs ``Columns.VF_PREDS`` from ``forward_train`` may reuse
    ``embeddings`` to skip a second encoder pass.
    """

    @abc.abstractmethod
    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> Any:
        """Value estimates for ``batch``: ``(B,)``, or ``(B, T)`` for time-ranked batches.

        Args:
            batch: The input batch (``Columns.OBS``, and ``Columns.STATE_IN`` for
                stateful modules).
            embeddings: Encoder outputs computed earlier for the same batch, if any.
        """
