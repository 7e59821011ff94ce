"""Vanilla policy gradient (REINFORCE): ``PG``, ``PGConfig`` and ``PGTorchPolicy``.

Why: the simplest real learner for the old API stack. Each trajectory's
advantages are its discounted returns (no critic, no bootstrap); the loss is
``-mean(log pi(a|s) * return)``. It reads top to bottom: postprocess, loss, stats.
``PG`` is the new-stack ``Algorithm`` (``PGConfig().build_algo()``) training with ``PGLearner``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from envrunners.algorithms.algorithm import Algorithm
from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.columns import Columns
from envrunners.evaluation.postprocessing import Postprocessing, compute_advantages
from envrunners.policy.torch_policy import TorchPolicy

__all__ = ["PG", "PGConfig", "PGTorchPolicy"]


class PGConfig(AlgorithmConfig):
    """Config of vanilla policy gradient: ``AlgorithmConfig`` with PG's defaults.

    Defaults differing from ``AlgorithmConfig``: ``lr=4e-4``,
    ``train_batch_size=200``, ``rollout_fragment_length="auto"``.
    """

    lr: float | list = 0.0004
    train_batch_size: int = 200
    rollout_fragment_length: int | str = "auto"

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or PG)


class PG(Algorithm):
    """Vanilla policy gradient: ``Algorithm`` with ``PGLearner`` (``PGTorchPolicy`` on the old stack)."""

    @classmethod
    def get_default_config(cls) -> PGConfig:
        """A fresh ``PGConfig`` that builds this class."""
        return PGConfig(algo_class=cls)

    @classmethod
    def _learner_class(cls) -> type:
        from envrunners.algorithms.ppo.ppo_learner import PGLearner

        return PGLearner

    @classmethod
    def get_default_policy_class(cls, config: Any = None) -> type:
        """The old stack's policy: ``PGTorchPolicy``."""
        return PGTorchPolicy


class PGTorchPolicy(TorchPolicy):
    """REINFORCE on the default (or configured) RLModule.

    Config keys: ``gamma`` (discount of the returns), ``lr``, ``num_epochs`` and
    ``minibatch_size`` (1 and the whole batch by default), ``grad_clip``.
    """

    config_class = PGConfig
    compute_values_when_acting = False
    loss_columns = (Columns.OBS, Columns.ACTIONS, Postprocessing.ADVANTAGES)

    def postprocess_trajectory(
        self,
        sample_batch: Any,
        other_agent_batches: dict | None = None,
        episode: Any = None,
    ) -> Any:
        """Advantages = discounted returns of the trajectory (``last_r = 0``)."""
        return compute_advantages(
            sample_batch,
            0.0,
            gamma=float(self.config.get("gamma", 0.99)),
            use_gae=False,
            use_critic=False,
        )

    def loss(self, model: Any, dist_class: type, train_batch: Mapping[str, Any]) -> torch.Tensor:
        """``-mean(log pi(actions | obs) * advantages)``."""
        out = self.train_forward(model, train_batch)
        dist = dist_class.from_logits(out[Columns.ACTION_DIST_INPUTS])
        logp = dist.logp(train_batch[Columns.ACTIONS])
        loss = -torch.mean(logp * train_batch[Postprocessing.ADVANTAGES])
        self._policy_loss = loss.detach()
        return loss

    def stats_fn(self, train_batch: Mapping[str, Any]) -> dict[str, Any]:
        """``policy_loss`` of the last step."""
        return {"policy_loss": self._policy_loss}
