"""``PPOTorchPolicy``: the old API stack's PPO on the sampling core's RLModule.

Why: the learner the old-stack ``RolloutWorker`` is benchmarked and tested with.
It reads top to bottom: GAE postprocessing per trajectory, the clipped surrogate
loss with a clipped value loss, an entropy bonus and a KL penalty whose
coefficient adapts to ``kl_target`` after every ``learn_on_batch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from envrunners.algorithms.ppo.ppo import PPOConfig
from envrunners.core.columns import Columns
from envrunners.evaluation.postprocessing import Postprocessing, compute_gae_for_sample_batch
from envrunners.policy.torch_policy import TorchPolicy, schedule_value

__all__ = ["PPOTorchPolicy"]


class PPOTorchPolicy(TorchPolicy):
    """PPO with GAE, clipped surrogate, clipped value loss, entropy bonus and adaptive KL.

    Config keys (``PPOConfig`` defaults, overridden by the given config):
    ``gamma``, ``lambda``, ``use_gae``, ``use_critic``, ``clip_param``,
    ``vf_clip_param``, ``vf_loss_coeff``, ``entropy_coeff`` (or a schedule),
    ``use_kl_loss``, ``kl_coeff``, ``kl_target``, ``lr``, ``num_epochs``,
    ``minibatch_size``, ``shuffle_batch_per_epoch``, ``grad_clip``.
    Advantages are standardised over each ``learn_on_batch`` batch.
    """

    config_class = PPOConfig
    loss_columns = (
        Columns.OBS,
        Columns.ACTIONS,
        Columns.ACTION_LOGP,
        Columns.ACTION_DIST_INPUTS,
        Columns.VF_PREDS,
        Postprocessing.ADVANTAGES,
        Postprocessing.VALUE_TARGETS,
    )

    def __init__(self, observation_space: Any, action_space: Any, config: Any, **kwargs: Any):
        super().__init__(observation_space, action_space, config, **kwargs)
        self.kl_coeff = float(self.config.get("kl_coeff", 0.2))
        self.kl_target = float(self.config.get("kl_target", 0.01))
        self.entropy_coeff = schedule_value(self.config.get("entropy_coeff", 0.0), 0)
        self._stats: dict[str, torch.Tensor] = {}

    # -- postprocessing ------------------------------------------------------------
    def postprocess_trajectory(
        self,
        sample_batch: Any,
        other_agent_batches: dict | None = None,
        episode: Any = None,
    ) -> Any:
        """Add GAE ``advantages`` and ``value_targets`` (bootstrapping unfinished chunks)."""
        return compute_gae_for_sample_batch(self, sample_batch, other_agent_batches, episode)

    def _prepare_train_batch(self, samples: Any) -> dict[str, Any]:
        batch = super()._prepare_train_batch(samples)
        adv = batch.get(Postprocessing.ADVANTAGES)
        if adv is not None and len(adv) > 1:
            batch[Postprocessing.ADVANTAGES] = (adv - adv.mean()) / adv.std().clamp_min(1e-4)
        return batch

    # -- loss ----------------------------------------------------------------------
    def loss(self, model: Any, dist_class: type, train_batch: Mapping[str, Any]) -> torch.Tensor:
        """Clipped surrogate + ``vf_loss_coeff`` * clipped value loss - entropy + KL penalty."""
        cfg = self.config
        out = self.train_forward(model, train_batch)
        curr = dist_class.from_logits(out[Columns.ACTION_DIST_INPUTS])
        prev = dist_class.from_logits(train_batch[Columns.ACTION_DIST_INPUTS])
        ratio = torch.exp(
            curr.logp(train_batch[Columns.ACTIONS]) - train_batch[Columns.ACTION_LOGP]
        )
        adv = train_batch[Postprocessing.ADVANTAGES]
        clip = float(cfg.get("clip_param", 0.3))
        surrogate = torch.min(adv * ratio, adv * torch.clamp(ratio, 1.0 - clip, 1.0 + clip))
        entropy = curr.entropy()
        use_kl = bool(cfg.get("use_kl_loss", True)) and self.kl_coeff > 0.0
        kl = prev.kl(curr).mean() if use_kl else torch.zeros(())
        if cfg.get("use_critic", True):
            vf_err = (out[Columns.VF_PREDS] - train_batch[Postprocessing.VALUE_TARGETS]) ** 2
            vf_loss = torch.clamp(vf_err, 0.0, float(cfg.get("vf_clip_param", 10.0)))
        else:
            vf_loss = torch.zeros_like(surrogate)
        total = torch.mean(
            -surrogate
            + float(cfg.get("vf_loss_coeff", 1.0)) * vf_loss
            - self.entropy_coeff * entropy
        )
        if use_kl:
            total = total + self.kl_coeff * kl
        self._stats = {
            "total_loss": total.detach(),
            "policy_loss": -surrogate.detach().mean(),
            "vf_loss": vf_loss.detach().mean(),
            "entropy": entropy.detach().mean(),
            "kl": kl.detach(),
        }
        if cfg.get("use_critic", True):
            # RLlib's explained_variance(value targets, current value predictions).
            targets = train_batch[Postprocessing.VALUE_TARGETS]
            var = torch.var(targets, unbiased=False)
            residual = torch.var(targets - out[Columns.VF_PREDS].detach(), unbiased=False)
            # (RLlib adds 1e-6 to the variance: constant targets give 1 or -1, never NaN)
            self._stats["vf_explained_var"] = torch.clamp(1.0 - residual / (var + 1e-6), min=-1.0)
        return total

    def stats_fn(self, train_batch: Mapping[str, Any]) -> dict[str, Any]:
        """Loss terms of the last SGD step plus the current coefficients."""
        return {
            **self._stats,
            "cur_kl_coeff": self.kl_coeff,
            "entropy_coeff": self.entropy_coeff,
        }

    # -- coefficient updates -------------------------------------------------------
    def update_kl(self, sampled_kl: float) -> float:
        """Adapt ``kl_coeff``: x1.5 above twice the target, x0.5 below half of it."""
        if sampled_kl > 2.0 * self.kl_target:
            self.kl_coeff *= 1.5
        elif sampled_kl < 0.5 * self.kl_target:
            self.kl_coeff *= 0.5
        return self.kl_coeff

    def after_learn(self, learner_stats: dict[str, float]) -> None:
        """Update the KL coefficient from the mean KL of this ``learn_on_batch``."""
        if "kl" in learner_stats and self.config.get("use_kl_loss", True):
            self.update_kl(learner_stats["kl"])

    def on_global_var_update(self, global_vars: Mapping[str, Any]) -> None:
        """Also follow an ``entropy_coeff`` schedule."""
        super().on_global_var_update(global_vars)
        self.entropy_coeff = schedule_value(
            self.config.get("entropy_coeff", 0.0), self.global_timestep
        )

    def get_state(self) -> dict[str, Any]:
        """Adds the current KL coefficient."""
        state = super().get_state()
        state["current_kl_coeff"] = self.kl_coeff
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores the KL coefficient too."""
        super().set_state(state)
        if "current_kl_coeff" in state:
            self.kl_coeff = float(state["current_kl_coeff"])
