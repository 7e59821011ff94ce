"""A single-file PPO learner for the new API stack, readable top to bottom.

Why: ``EnvRunnerGroup`` collects ``SingleAgentEpisode`` chunks; something has to
turn them into better weights so that ``envrunners train`` does real work. This
file is that something, in the spirit of CleanRL: no class hierarchy, no
connector pipeline, one pass from episodes to a loss:

1. **Batch**: flatten the episode chunks into arrays (observations, actions, the
   behaviour policy's log-probabilities, rewards).
2. **GAE**: one batched ``compute_values`` call over every observation gives the
   value estimates; each chunk is bootstrapped from the value of its last
   observation unless it ended with ``terminated`` (truncated episodes and
   in-progress chunks are bootstrapped). Advantages are computed for all chunks
   at once on a padded ``(num_chunks, max_len)`` grid, one vector step per time step.
3. **Loss**: clipped surrogate + ``vf_loss_coeff`` x value loss (squared error
   clipped at ``vf_clip_param``) - ``entropy_coeff`` x entropy (+ an adaptive KL
   penalty if ``use_kl_loss``).
4. **Optimise**: Adam (the ten-line ``Adam`` below), ``num_epochs`` passes of
   shuffled minibatches, with ``num_cpus_for_main_process`` torch threads (1 by
   default: tiny MLPs gain nothing from more, and the runners need the cores).
5. **Publish**: ``get_state(components="rl_module")`` returns the new weights and
   a bumped ``weights_seq_no``, which is what ``EnvRunnerGroup.sync_weights(
   from_worker_or_learner_group=learner)`` reads.

``PGLearner`` at the bottom reuses steps 1, 4 and 5 with REINFORCE's loss
(discounted returns, no critic, no clipping).

Example:
    >>> from envrunners.algorithms.ppo import PPOConfig
    >>> from envrunners.algorithms.ppo.ppo_learner import PPOLearner
    >>> from envrunners.env.env_runner_group import EnvRunnerGroup
    >>> config = PPOConfig().environment("CartPole-v1").training(lr=3e-4)
    >>> group = EnvRunnerGroup(config=config)              # local runner only
    >>> learner = PPOLearner.from_group(config, group)
    >>> group.sync_weights(from_worker_or_learner_group=learner)
    >>> episodes = group.local_env_runner.sample(num_timesteps=256)
    >>> stats = learner.update(episodes)
    >>> group.sync_weights(from_worker_or_learner_group=learner)
    >>> group.stop()
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from envrunners.core import DEFAULT_MODULE_ID
from envrunners.core.columns import Columns
from envrunners.policy.torch_policy import schedule_value

__all__ = ["Adam", "PGLearner", "PPOLearner", "compute_gae"]


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_values: np.ndarray,
    lengths: np.ndarray,
    *,
    gamma: float,
    lambda_: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation for a padded batch of trajectories.

    Args:
        rewards: ``(N, L)`` rewards; row ``i`` is valid up to ``lengths[i]``.
        values: ``(N, L)`` value estimates of the observations the actions were taken in.
        bootstrap_values: ``(N,)`` value of the observation after each row's last
            step (0 for a terminated episode).
        lengths: ``(N,)`` number of valid steps per row.
        gamma: Discount factor.
        lambda_: GAE's lambda (1: Monte-Carlo returns minus values; 0: TD(0)).

    Returns:
        ``(advantages, value_targets)``, both ``(N, L)`` float32 and 0 where padded.
    """
    n, horizon = rewards.shape
    valid = np.arange(horizon)[None, :] < lengths[:, None]
    # next_values[i, t] = V(s_{t+1}); at each row's last step it is the bootstrap value.
    next_values = np.zeros_like(values)
    next_values[:, :-1] = values[:, 1:]
    rows = np.arange(n)[lengths > 0]
    next_values[rows, lengths[rows] - 1] = bootstrap_values[rows]
    deltas = (rewards + gamma * next_values - values) * valid
    advantages = np.zeros_like(values)
    running = np.zeros(n, dtype=values.dtype)
    for t in range(horizon - 1, -1, -1):  # one vector step per time step, not per sample
        running = deltas[:, t] + gamma * lambda_ * running * valid[:, t]
        advantages[:, t] = running
    advantages *= valid
    return advantages.astype(np.float32), ((advantages + values) * valid).astype(np.float32)


class PPOLearner:
    """Proximal Policy Optimization on one torch module, fed with episode chunks.

    Reads these config keys (``PPOConfig`` names): ``lr`` (a float or a
    ``[[t, value], ...]`` schedule over trained env steps), ``gamma``,
    ``lambda_``, ``clip_param``, ``vf_clip_param``, ``vf_loss_coeff``,
    ``entropy_coeff`` (float or schedule), ``use_kl_loss``, ``kl_coeff``,
    ``kl_target``, ``num_epochs``, ``minibatch_size``, ``grad_clip``,
    ``model_config`` / ``rl_module_spec`` and ``seed``.

    Args:
        config: A ``PPOConfig`` (or any ``AlgorithmConfig`` with those keys).
        observation_space: The module's observation space (after env-to-module
            connectors, e.g. a filter).
        action_space: The module's action space.
    """

    def __init__(
        self, config: Any, *, observation_space: gym.Space, action_space: gym.Space
    ) -> None:
        from envrunners.env.runner_setup import build_module

        self.config = config
        if config.seed is not None:
            torch.manual_seed(int(config.seed))
        self._rng = np.random.default_rng(config.seed)
        # The learner's module is the full one (value head included); runners get
        # its inference-only part through sync_weights.
        self.module = build_module(config, (observation_space, action_space), inference_only=False)
        self.module.train()
        self.dist_cls = self.module.get_train_action_dist_cls()
        self.optimizer = Adam(self.module.parameters(), lr=self._lr(0))
        self.kl_coeff = float(getattr(config, "kl_coeff", 0.0))
        self.weights_seq_no = 0
        self.num_env_steps_trained = 0

    @classmethod
    def from_group(cls, config: Any, group: Any) -> PPOLearner:
        """Build a learner whose module matches the runners of ``group``."""
        obs_space, act_space = group.get_spaces()[DEFAULT_MODULE_ID]
        return cls(config, observation_space=obs_space, action_space=act_space)

    # ------------------------------------------------------------------ schedules
    def _lr(self, steps: int) -> float:
        return schedule_value(self.config.lr, steps)

    def _entropy_coeff(self, steps: int) -> float:
        return schedule_value(getattr(self.config, "entropy_coeff", 0.0), steps)

    # ------------------------------------------------------------------ 1. batch
    def build_batch(self, episodes: Sequence[Any]) -> dict[str, np.ndarray]:
        """Flatten episode chunks into training arrays, with advantages and value targets.

        Args:
            episodes: ``SingleAgentEpisode`` chunks (finished or in progress), as
                ``EnvRunnerGroup`` sampling returns them. Chunks of length 0 are skipped.

        Returns:
            ``obs``, ``actions``, ``action_logp``, ``advantages`` and
            ``value_targets`` (plus ``vf_preds``), one row per env step.

        Raises:
            ValueError: No chunk has a step.
        """
        chunks = [e for e in episodes if len(e) > 0]
        if not chunks:
            raise ValueError("PPOLearner.build_batch(): the episodes hold no env steps.")
        lengths = np.array([len(e) for e in chunks], dtype=np.int64)
        # Every chunk has len + 1 observations: the last one bootstraps the chunk.
        all_obs = np.concatenate([np.asarray(e.get_observations()) for e in chunks])
        all_values = self._value_estimates(all_obs)
        ends = np.cumsum(lengths + 1)
        starts = ends - (lengths + 1)
        step_rows = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)])
        # A terminated episode's last observation is worth 0; anything else bootstraps.
        terminated = np.array([bool(e.is_terminated) for e in chunks])
        bootstrap = np.where(terminated, 0.0, all_values[ends - 1]).astype(np.float32)

        horizon = int(lengths.max())
        valid = np.arange(horizon)[None, :] < lengths[:, None]
        rewards = np.zeros((len(chunks), horizon), np.float32)
        values = np.zeros((len(chunks), horizon), np.float32)
        rewards[valid] = np.concatenate([np.asarray(e.get_rewards()) for e in chunks])
        values[valid] = all_values[step_rows]
        gamma, lam = self._gae_params()
        advantages, targets = compute_gae(
            rewards, values, bootstrap, lengths, gamma=gamma, lambda_=lam
        )
        return {
            Columns.OBS: all_obs[step_rows],
            Columns.ACTIONS: np.concatenate([np.asarray(e.get_actions()) for e in chunks]),
            Columns.ACTION_LOGP: np.concatenate(
                [np.asarray(e.get_extra_model_outputs(Columns.ACTION_LOGP)) for e in chunks]
            ).astype(np.float32),
            Columns.VF_PREDS: values[valid],
            "advantages": advantages[valid],
            "value_targets": targets[valid],
        }

    def _value_estimates(self, obs: np.ndarray) -> np.ndarray:
        """``V(obs)`` from the module's value head, as float32 numpy (one batched call)."""
        with torch.no_grad():
            values = self.module.compute_values({Columns.OBS: torch.from_numpy(obs)})
        return values.numpy().astype(np.float32)

    def _gae_params(self) -> tuple[float, float]:
        return float(self.config.gamma), float(getattr(self.config, "lambda_", 1.0))

    # ------------------------------------------------------------------ 2. loss
    def loss(self, mb: dict[str, torch.Tensor], entropy_coeff: float) -> tuple[torch.Tensor, dict]:
        """PPO's loss on one minibatch; returns ``(loss, stats)``."""
        cfg = self.config
        out = self.module.forward_train({Columns.OBS: mb[Columns.OBS]})
        dist = self.dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
        logp = dist.logp(mb[Columns.ACTIONS])
        log_ratio = logp - mb[Columns.ACTION_LOGP]
        ratio = torch.exp(log_ratio)
        adv = mb["advantages"]
        clip = float(cfg.clip_param)
        surrogate = torch.min(adv * ratio, adv * ratio.clamp(1.0 - clip, 1.0 + clip))
        policy_loss = -surrogate.mean()
        vf_err = (out[Columns.VF_PREDS] - mb["value_targets"]) ** 2
        vf_loss = vf_err.clamp(max=float(cfg.vf_clip_param)).mean()
        entropy = dist.entropy().mean()
        # k3 estimator of KL(old || new): unbiased, always >= 0 (Schulman, 2020).
        kl = ((ratio - 1.0) - log_ratio).mean()
        total = policy_loss + float(cfg.vf_loss_coeff) * vf_loss - entropy_coeff * entropy
        if getattr(cfg, "use_kl_loss", False) and self.kl_coeff > 0.0:
            total = total + self.kl_coeff * kl
        stats = {
            "total_loss": total.item(),
            "policy_loss": policy_loss.item(),
            "vf_loss": vf_loss.item(),
            "entropy": entropy.item(),
            "mean_kl": kl.item(),
            "clip_fraction": ((ratio - 1.0).abs() > clip).float().mean().item(),
        }
        return total, stats

    # ------------------------------------------------------------------ 3. update
    def update(self, episodes: Sequence[Any]) -> dict[str, float]:
        """One PPO update on ``episodes``: GAE, then ``num_epochs`` of minibatch SGD.

        Args:
            episodes: The chunks sampled with the current weights.

        Returns:
            Mean loss terms over the minibatch steps, plus ``lr``,
            ``entropy_coeff``, ``explained_variance``, ``num_env_steps_trained``
            and the new ``weights_seq_no``.
        """
        with _torch_threads(self.config):
            return self._update(episodes)

    def _update(self, episodes: Sequence[Any]) -> dict[str, float]:
        batch = self.build_batch(episodes)
        n = len(batch[Columns.ACTIONS])
        adv = batch["advantages"]
        if n > 1:
            batch["advantages"] = (adv - adv.mean()) / max(float(adv.std()), 1e-4)
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
        lr = self._lr(self.num_env_steps_trained)
        entropy_coeff = self._entropy_coeff(self.num_env_steps_trained)
        self.optimizer.lr = lr
        size = min(int(self.config.minibatch_size or n), n)
        grad_clip = self.config.grad_clip
        totals: dict[str, float] = {}
        steps = 0
        self.module.train()
        for _ in range(int(self.config.num_epochs)):
            order = torch.from_numpy(self._rng.permutation(n))
            for start in range(0, n, size):
                idx = order[start : start + size]
                if len(idx) < max(2, size // 4):  # a tiny remainder adds noise, not signal
                    continue
                mb = {k: v[idx] for k, v in tensors.items()}
                loss, stats = self.loss(mb, entropy_coeff)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if grad_clip:
                    _clip_grad_norm(self.optimizer.params, float(grad_clip))
                self.optimizer.step()
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + v
                steps += 1
        result = {k: v / max(1, steps) for k, v in totals.items()}
        self._after_update(result)
        self.num_env_steps_trained += n
        self.weights_seq_no += 1
        result.update(
            lr=lr,
            entropy_coeff=entropy_coeff,
            explained_variance=explained_variance(batch["value_targets"], batch[Columns.VF_PREDS]),
            num_env_steps_trained=float(n),
            num_minibatch_steps=float(steps),
            weights_seq_no=float(self.weights_seq_no),
        )
        return result

    def _after_update(self, stats: dict[str, float]) -> None:
        """Adapt the KL coefficient towards ``kl_target`` (x1.5 / x0.5), as RLlib's PPO does."""
        cfg = self.config
        if not getattr(cfg, "use_kl_loss", False) or "mean_kl" not in stats:
            return
        target = float(cfg.kl_target)
        if stats["mean_kl"] > 2.0 * target:
            self.kl_coeff *= 1.5
        elif stats["mean_kl"] < 0.5 * target:
            self.kl_coeff *= 0.5
        stats["kl_coeff"] = self.kl_coeff

    # ------------------------------------------------------------------ 4. state
    def get_state(
        self,
        components: str | Sequence[str] | None = None,
        *,
        inference_only: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """The learner's state as plain numpy data (what ``sync_weights`` and checkpoints read).

        Args:
            components: ``"rl_module"`` (or a list holding it) for the weights and
                ``weights_seq_no`` only; None for everything (optimizer included).
            inference_only: Only the weights an inference-only module has.
            **kwargs: Ignored (RLlib call compatibility).
        """
        state: dict[str, Any] = {
            "rl_module": self.module.get_state(inference_only=inference_only),
            "weights_seq_no": self.weights_seq_no,
        }
        if components is None:
            state["optimizer"] = self.optimizer.get_state()
            state["kl_coeff"] = self.kl_coeff
            state["num_env_steps_trained"] = self.num_env_steps_trained
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state()`` returned (weights, optimizer, counters)."""
        if "rl_module" in state:
            self.module.set_state(state["rl_module"])
        if "optimizer" in state:
            self.optimizer.set_state(state["optimizer"])
        self.kl_coeff = float(state.get("kl_coeff", self.kl_coeff))
        self.weights_seq_no = int(state.get("weights_seq_no", self.weights_seq_no))
        self.num_env_steps_trained = int(
            state.get("num_env_steps_trained", self.num_env_steps_trained)
        )


class PGLearner(PPOLearner):
    """Vanilla policy gradient (REINFORCE) with the same batching and state as ``PPOLearner``.

    Advantages are the discounted returns of each chunk (``build_batch`` with all
    values 0 and ``lambda_=1``: no critic, no bootstrap), standardised over the batch; the loss is
    ``-mean(logp * advantage) - entropy_coeff * entropy``. The value head is
    unused. ``num_epochs`` and ``minibatch_size`` apply as for PPO (1 and the
    whole batch are the classic choice).
    """

    def _value_estimates(self, obs: np.ndarray) -> np.ndarray:
        """No critic: all values 0, so GAE with lambda 1 gives the discounted returns."""
        return np.zeros(len(obs), np.float32)

    def _gae_params(self) -> tuple[float, float]:
        return float(self.config.gamma), 1.0

    def loss(self, mb: dict[str, torch.Tensor], entropy_coeff: float) -> tuple[torch.Tensor, dict]:
        """``-mean(logp * advantage) - entropy_coeff * entropy``."""
        out = self.module.forward_train({Columns.OBS: mb[Columns.OBS]})
        dist = self.dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
        logp = dist.logp(mb[Columns.ACTIONS])
        policy_loss = -(logp * mb["advantages"]).mean()
        entropy = dist.entropy().mean()
        total = policy_loss - entropy_coeff * entropy
        log_ratio = logp.detach() - mb[Columns.ACTION_LOGP]
        kl = (torch.exp(log_ratio) - 1.0 - log_ratio).mean()
        stats = {
            "total_loss": total.item(),
            "policy_loss": policy_loss.item(),
            "entropy": entropy.item(),
            "mean_kl": kl.item(),
        }
        return total, stats

    def _after_update(self, stats: dict[str, float]) -> None:
        """No KL adaptation for PG."""


# ---------------------------------------------------------------------- helpers
class Adam:
    """Adam (Kingma & Ba, 2015) in a few lines, with plain numpy state.

    Same update rule as ``torch.optim.Adam``; written out because torch's
    optimizers import ``torch._dynamo`` on first use, seconds of start-up that a
    command-line run notices, and because its state then checkpoints as plain arrays.
    """

    def __init__(
        self,
        params: Any,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-5,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr, self.betas, self.eps = float(lr), betas, eps
        self.step_count = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step on the current gradients."""
        self.step_count += 1
        beta1, beta2 = self.betas
        correction1 = 1.0 - beta1**self.step_count
        correction2_sqrt = math.sqrt(1.0 - beta2**self.step_count)
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq):
            if p.grad is None:
                continue
            m.mul_(beta1).add_(p.grad, alpha=1.0 - beta1)
            v.mul_(beta2).addcmul_(p.grad, p.grad, value=1.0 - beta2)
            denom = (v.sqrt() / correction2_sqrt).add_(self.eps)
            p.addcdiv_(m, denom, value=-self.lr / correction1)

    def get_state(self) -> dict[str, Any]:
        """Moments and step count as numpy arrays and numbers."""
        return {
            "step": self.step_count,
            "lr": self.lr,
            "exp_avg": [m.numpy().copy() for m in self.exp_avg],
            "exp_avg_sq": [v.numpy().copy() for v in self.exp_avg_sq],
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state`` returned."""
        self.step_count = int(state["step"])
        self.lr = float(state.get("lr", self.lr))
        for target, value in zip(self.exp_avg, state["exp_avg"]):
            target.copy_(torch.from_numpy(np.asarray(value)))
        for target, value in zip(self.exp_avg_sq, state["exp_avg_sq"]):
            target.copy_(torch.from_numpy(np.asarray(value)))


@torch.no_grad()
def _clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> None:
    """Scale all gradients down so that their global L2 norm is at most ``max_norm``."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    if norm > max_norm:
        for g in grads:
            g.mul_(max_norm / (float(norm) + 1e-6))


@contextlib.contextmanager
def _torch_threads(config: Any) -> Iterator[None]:
    """Run with ``config.num_cpus_for_main_process`` torch threads (at least 1), then restore."""
    wanted = max(1, int(getattr(config, "num_cpus_for_main_process", 1) or 1))
    before = torch.get_num_threads()
    if wanted != before:
        torch.set_num_threads(wanted)
    try:
        yield
    finally:
        if wanted != before:
            torch.set_num_threads(before)


def explained_variance(targets: np.ndarray, preds: np.ndarray) -> float:
    """``1 - Var(targets - preds) / Var(targets)`` (NaN when the targets are constant)."""
    var = float(np.var(targets))
    return math.nan if var == 0 else 1.0 - float(np.var(targets - preds)) / var
