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

Stateful modules (``use_lstm``) train by backpropagation through time, as RLlib's
PPO does with ``AddStatesFromEpisodesToBatch`` and ``AddTimeDimToBatchAndZeroPad``:
each chunk's ``len + 1`` observations are cut into ``max_seq_len`` sequences,
zero-padded to ``(num_sequences, max_seq_len)``; each sequence starts from
``STATE_IN`` = the ``STATE_OUT`` the sampler recorded one step before its first
step (the chunk's lookback holds the previous chunk's last one; the module's
initial state at an episode's first step). Step 2 runs ``compute_values`` on
these sequences, and every loss term of step 3 is a mean over the real steps only
(a loss mask drops the padding and each chunk's bootstrap observation).
Minibatches are whole sequences, about ``minibatch_size`` time steps each.
5. **Publish**: ``get_state(components="rl_module")`` returns the new weights and
   a bumped ``weights_seq_no``, which is what ``EnvRunnerGroup.sync_weights(
   from_worker_or_learner_group=learner)`` reads.

``PGLearner`` at the bottom reuses steps 1, 4 and 5 with REINFORCE's loss
(discounted returns, no critic, no clipping).

Example:
    >>> from envrunners.algorithms.ppo import PPOConfig
    >>> from envrunners.algorithms.ppo.ppo_learner import PPOLearner
    >>> from envrunners.env.env_runner_group import EnvRunnerGroup
    >>> config = (
    ...     PPOConfig()
    ...     .environment("CartPole-v1")
    ...     .env_runners(num_env_runners=0)  # PPO's default is 2 remote runners
    ...     .training(lr=3e-4)
    ... )
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

from envrunners.core import DEFAULT_MODULE_ID, _nested
from envrunners.core.columns import Columns
from envrunners.core.rl_module.default_torch_rl_module import PREV_ACTIONS, PREV_REWARDS
from envrunners.policy.torch_policy import schedule_value

__all__ = ["Adam", "PGLearner", "PPOLearner", "compute_gae", "sequence_layout"]


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


def sequence_layout(
    num_positions: np.ndarray, max_seq_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each position of each chunk goes when chunks are cut into ``max_seq_len`` sequences.

    Chunk ``i``'s ``num_positions[i]`` positions fill ``ceil(num_positions[i] / max_seq_len)``
    sequences, chunk after chunk; position ``p`` lands in its chunk's sequence
    ``p // max_seq_len`` at time ``p % max_seq_len``. The last sequence of a chunk is
    zero-padded (RLlib's ``AddTimeDimToBatchAndZeroPad``).

    Args:
        num_positions: ``(N,)`` positions per chunk (the learner passes ``len + 1``:
            every step plus the bootstrap observation).
        max_seq_len: The sequence length ``T``.

    Returns:
        ``(rows, cols, seq_lens)``: for every position, chunk by chunk, its sequence
        row and time column in the ``(S, T)`` grid; and each sequence's number of
        real positions (``(S,)``).
    """
    counts = np.asarray(num_positions, dtype=np.int64)
    per_chunk = -(-counts // max_seq_len)  # ceil
    first_row = np.cumsum(per_chunk) - per_chunk
    pos = np.concatenate([np.arange(n) for n in counts]) if len(counts) else np.zeros(0, np.int64)
    rows = np.repeat(first_row, counts) + pos // max_seq_len
    cols = pos % max_seq_len
    seq_lens = np.bincount(rows, minlength=int(per_chunk.sum())).astype(np.int64)
    return rows, cols, seq_lens


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
    def build_batch(self, episodes: Sequence[Any]) -> dict[str, Any]:
        """Flatten episode chunks into training arrays, with advantages and value targets.

        Args:
            episodes: ``SingleAgentEpisode`` chunks (finished or in progress), as
                ``EnvRunnerGroup`` sampling returns them. Chunks of length 0 are skipped.

        Returns:
            ``obs``, ``actions``, ``action_logp``, ``advantages`` and
            ``value_targets`` (plus ``vf_preds``), one row per env step. For a
            stateful module ``(S, max_seq_len)`` sequence grids instead, plus
            ``state_in`` (one row per sequence) and ``loss_mask`` (see ``_to_sequences``).

        Raises:
            ValueError: No chunk has a step.
        """
        chunks = [e for e in episodes if len(e) > 0]
        if not chunks:
            raise ValueError("PPOLearner.build_batch(): the episodes hold no env steps.")
        lengths = np.array([len(e) for e in chunks], dtype=np.int64)
        # Every chunk has len + 1 observations: the last one bootstraps the chunk.
        ends = np.cumsum(lengths + 1)
        starts = ends - (lengths + 1)
        step_rows = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)])
        seqs = None
        if self.module.is_stateful():
            seqs = self._sequence_inputs(chunks, lengths)
            rows, cols = seqs.pop("positions")
            all_values = self._value_estimates(seqs)[rows, cols]
        else:  # (Dict / Tuple observations: one array per leaf)
            all_obs = _joined([e.get_observations() for e in chunks])
            all_values = self._value_estimates({Columns.OBS: all_obs})
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
        steps = {
            Columns.ACTIONS: _joined([e.get_actions() for e in chunks]),
            Columns.ACTION_LOGP: np.concatenate(
                [np.asarray(e.get_extra_model_outputs(Columns.ACTION_LOGP)) for e in chunks]
            ).astype(np.float32),
            Columns.VF_PREDS: values[valid],
            "advantages": advantages[valid],
            "value_targets": targets[valid],
        }
        if seqs is None:
            return {Columns.OBS: _nested.map_structure(lambda a: a[step_rows], all_obs), **steps}
        return self._to_sequences(seqs, steps, rows[step_rows], cols[step_rows])

    def _max_seq_len(self) -> int:
        """The module's ``model_config["max_seq_len"]`` (RLlib's default, 20, if unset)."""
        return int((getattr(self.module, "model_config", None) or {}).get("max_seq_len", 20))

    def _sequence_inputs(self, chunks: list[Any], lengths: np.ndarray) -> dict[str, Any]:
        """Every chunk's ``len + 1`` observations as zero-padded sequences, with ``STATE_IN``.

        Sequence ``k`` of a chunk covers its positions ``[k * T, (k + 1) * T)``
        (``T = max_seq_len``) and starts from the state before position ``k * T``:
        the ``STATE_OUT`` recorded at step ``k * T - 1``; for ``k = 0`` the lookback's
        last ``STATE_OUT`` if the chunk continues an episode, else the module's initial
        state. Chunks without ``STATE_OUT`` use the initial state throughout (RLlib's
        fallback).

        With ``lstm_use_prev_action`` / ``lstm_use_prev_reward`` each position also
        gets the action / reward of the step before it (the lookback's at a chunk
        start, zeros at an episode's start), as the sampler fed them.

        Returns:
            ``obs`` (``(S, T, ...)``), ``state_in`` (``(S, ...)`` leaves), maybe
            ``prev_actions`` / ``prev_rewards`` (``(S, T, ...)``), and ``positions``
            (the ``(rows, cols)`` of ``sequence_layout`` over ``len + 1``).
        """
        horizon = self._max_seq_len()
        rows, cols, seq_lens = sequence_layout(lengths + 1, horizon)
        initial = _nested.map_structure(
            lambda t: np.asarray(t.detach().cpu() if torch.is_tensor(t) else t),
            self.module.get_initial_state(),
        )
        model_config = getattr(self.module, "model_config", None) or {}
        # The LSTM may also read the previous action / reward of every position.
        prev_keys = [
            (key, getter)
            for key, flag, getter in (
                (PREV_ACTIONS, "lstm_use_prev_action", "get_actions"),
                (PREV_REWARDS, "lstm_use_prev_reward", "get_rewards"),
            )
            if model_config.get(flag)
        ]
        obs_parts, state_parts = [], []
        prev_parts: dict[str, list] = {key: [] for key, _ in prev_keys}
        for episode, n in zip(chunks, lengths):
            obs_parts.append(_nested.as_arrays(episode.get_observations()))
            for key, getter in prev_keys:
                prev_parts[key].append(_previous(episode, getattr(episode, getter)))
            if Columns.STATE_OUT in episode.extra_model_outputs:
                outs = _nested.as_arrays(episode.get_extra_model_outputs(Columns.STATE_OUT))
                before = initial
                if episode.t_started > 0:
                    before = _nested.as_arrays(
                        episode.get_extra_model_outputs(
                            Columns.STATE_OUT, indices=-1, neg_index_as_lookback=True
                        )
                    )
                # prev[p] = the state before position p: the one before the chunk, then
                # the outputs of steps 0..n-1; every T-th of them starts a sequence.
                starts = _nested.map_structure(
                    lambda b, o: np.concatenate([np.asarray(b)[None], o])[::horizon], before, outs
                )
            else:
                count = -(-(int(n) + 1) // horizon)
                starts = _nested.map_structure(lambda i, c=count: np.repeat(i[None], c, 0), initial)
            state_parts.append(starts)
        grid = (len(seq_lens), horizon)
        obs = _nested.map_structure(
            lambda *parts: _scatter(np.concatenate(parts), rows, cols, grid), *obs_parts
        )
        state_in = _nested.map_structure(
            lambda *parts: np.concatenate(parts).astype(np.float32), *state_parts
        )
        inputs = {Columns.OBS: obs, Columns.STATE_IN: state_in, "positions": (rows, cols)}
        for key, parts in prev_parts.items():
            inputs[key] = _nested.map_structure(
                lambda *p: _scatter(np.concatenate(p), rows, cols, grid), *parts
            )
        if PREV_REWARDS in inputs:  # float32, as the sampler feeds them
            inputs[PREV_REWARDS] = inputs[PREV_REWARDS].astype(np.float32)
        return inputs

    @staticmethod
    def _to_sequences(
        seqs: dict[str, Any], steps: dict[str, np.ndarray], rows: np.ndarray, cols: np.ndarray
    ) -> dict[str, Any]:
        """The per-step columns scattered onto the sequence grid, with the loss mask.

        ``loss_mask`` is True at real steps only (not at padding, not at a chunk's
        bootstrap observation). Sequences without any real step (a chunk's bootstrap
        observation alone) are dropped.
        """
        grid = _nested.flatten(seqs[Columns.OBS])[0].shape[:2]
        mask = _scatter(np.ones(len(rows), bool), rows, cols, grid)
        batch = {k: _scatter(v, rows, cols, grid) for k, v in steps.items()}
        batch.update(seqs)
        batch[Columns.LOSS_MASK] = mask
        keep = mask.any(axis=1)
        return _nested.map_structure(lambda v: v[keep], batch)

    def _value_estimates(self, inputs: dict[str, Any]) -> np.ndarray:
        """``V(obs)`` from the module's value head, as float32 numpy (one batched call).

        ``inputs`` holds ``obs`` (``(N, ...)``), or for a stateful module ``obs``
        sequences ``(S, T, ...)``, their ``state_in`` (and ``prev_actions`` /
        ``prev_rewards`` if the LSTM reads them); the result is ``(N,)`` or ``(S, T)``.
        """
        with torch.no_grad():
            values = self.module.compute_values(_nested.map_structure(torch.from_numpy, inputs))
        return values.numpy().astype(np.float32)

    def _gae_params(self) -> tuple[float, float]:
        return float(self.config.gamma), float(getattr(self.config, "lambda_", 1.0))

    # ------------------------------------------------------------------ 2. loss
    def loss(self, mb: dict[str, torch.Tensor], entropy_coeff: float) -> tuple[torch.Tensor, dict]:
        """PPO's loss on one minibatch; returns ``(loss, stats)``."""
        cfg = self.config
        mean = _mean_fn(mb)
        out = self.module.forward_train(_forward_inputs(mb))
        dist = self.dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
        logp = dist.logp(mb[Columns.ACTIONS])
        log_ratio = logp - mb[Columns.ACTION_LOGP]
        ratio = torch.exp(log_ratio)
        adv = mb["advantages"]
        clip = float(cfg.clip_param)
        surrogate = torch.min(adv * ratio, adv * ratio.clamp(1.0 - clip, 1.0 + clip))
        policy_loss = -mean(surrogate)
        vf_err = (out[Columns.VF_PREDS] - mb["value_targets"]) ** 2
        vf_loss = mean(vf_err.clamp(max=float(cfg.vf_clip_param)))
        entropy = mean(dist.entropy())
        # k3 estimator of KL(old || new): unbiased, always >= 0 (Schulman, 2020).
        kl = mean((ratio - 1.0) - log_ratio)
        total = policy_loss + float(cfg.vf_loss_coeff) * vf_loss - entropy_coeff * entropy
        if getattr(cfg, "use_kl_loss", False) and self.kl_coeff > 0.0:
            total = total + self.kl_coeff * kl
        stats = {
            "total_loss": total.item(),
            "policy_loss": policy_loss.item(),
            "vf_loss": vf_loss.item(),
            "vf_loss_unclipped": mean(vf_err).item(),
            "entropy": entropy.item(),
            "mean_kl": kl.item(),
            "clip_fraction": mean(((ratio - 1.0).abs() > clip).float()).item(),
        }
        return total, stats

    # ------------------------------------------------------------------ 3. update
    def update(self, episodes: Sequence[Any]) -> dict[str, float]:
        """One PPO update on ``episodes``: GAE, then ``num_epochs`` of minibatch SGD.

        Args:
            episodes: The chunks sampled with the current weights.

        Returns:
            Mean loss terms over the minibatch steps (PPO's ``vf_loss`` clipped at
            ``vf_clip_param``, ``vf_loss_unclipped`` not), plus ``lr``,
            ``entropy_coeff``, ``explained_variance``, ``num_env_steps_trained``,
            ``num_minibatch_steps``, ``module_train_batch_size_mean`` (env steps per
            minibatch) and the new ``weights_seq_no``.
        """
        with _torch_threads(self.config):
            return self._update(episodes)

    def _update(self, episodes: Sequence[Any]) -> dict[str, float]:
        batch = self.build_batch(episodes)
        # Rows are env steps, or for a stateful module whole sequences (masked).
        mask = batch.get(Columns.LOSS_MASK)
        n = len(batch[Columns.ACTIONS]) if mask is None else int(mask.sum())
        rows = len(batch[Columns.ACTIONS])
        adv = batch["advantages"]
        if n > 1:
            real = adv if mask is None else adv[mask]
            normalised = (adv - real.mean()) / max(float(real.std()), 1e-4)
            batch["advantages"] = normalised if mask is None else normalised * mask
        tensors = _nested.map_structure(lambda v: torch.from_numpy(np.ascontiguousarray(v)), batch)
        lr = self._lr(self.num_env_steps_trained)
        entropy_coeff = self._entropy_coeff(self.num_env_steps_trained)
        self.optimizer.lr = lr
        size = min(int(self.config.minibatch_size or n), n)
        smallest = max(2, size // 4)  # a tiny remainder adds noise, not signal
        if mask is not None:  # whole sequences, about `size` time steps each
            size = max(1, -(-size // mask.shape[1]))
            smallest = max(1, size // 4)
        grad_clip = self.config.grad_clip
        totals: dict[str, float] = {}
        steps = minibatch_steps = 0
        self.module.train()
        for _ in range(int(self.config.num_epochs)):
            order = torch.from_numpy(self._rng.permutation(rows))
            for start in range(0, rows, size):
                idx = order[start : start + size]
                if len(idx) < smallest:
                    continue
                mb = _nested.map_structure(lambda v, idx=idx: v[idx], tensors)
                loss, stats = self.loss(mb, entropy_coeff)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if grad_clip:
                    _clip_grad_norm(self.optimizer.params, float(grad_clip))
                self.optimizer.step()
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + v
                steps += 1
                minibatch_steps += len(idx) if mask is None else int(mask[idx.numpy()].sum())
        result = {k: v / max(1, steps) for k, v in totals.items()}
        self._after_update(result)
        self.num_env_steps_trained += n
        self.weights_seq_no += 1
        result.update(
            lr=lr,
            entropy_coeff=entropy_coeff,
            explained_variance=explained_variance(
                *(
                    (batch["value_targets"], batch[Columns.VF_PREDS])
                    if mask is None
                    else (batch["value_targets"][mask], batch[Columns.VF_PREDS][mask])
                )
            ),
            num_env_steps_trained=float(n),
            num_minibatch_steps=float(steps),
            module_train_batch_size_mean=minibatch_steps / max(1, steps),
            weights_seq_no=float(self.weights_seq_no),
        )
        lag = weights_lag(episodes, self.weights_seq_no)
        if lag is not None:
            result["diff_num_grad_updates_vs_sampler_policy"] = lag
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

    def _value_estimates(self, inputs: dict[str, Any]) -> np.ndarray:
        """No critic: all values 0, so GAE with lambda 1 gives the discounted returns."""
        rank = 2 if Columns.STATE_IN in inputs else 1  # (S, T) sequences or (N,) steps
        return np.zeros(_nested.flatten(inputs[Columns.OBS])[0].shape[:rank], np.float32)

    def _gae_params(self) -> tuple[float, float]:
        return float(self.config.gamma), 1.0

    def loss(self, mb: dict[str, torch.Tensor], entropy_coeff: float) -> tuple[torch.Tensor, dict]:
        """``-mean(logp * advantage) - entropy_coeff * entropy``."""
        mean = _mean_fn(mb)
        out = self.module.forward_train(_forward_inputs(mb))
        dist = self.dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
        logp = dist.logp(mb[Columns.ACTIONS])
        policy_loss = -mean(logp * mb["advantages"])
        entropy = mean(dist.entropy())
        total = policy_loss - entropy_coeff * entropy
        log_ratio = logp.detach() - mb[Columns.ACTION_LOGP]
        kl = mean(torch.exp(log_ratio) - 1.0 - log_ratio)
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
def weights_lag(episodes: Sequence[Any], seq_no: int) -> float | None:
    """How many weight versions ``seq_no`` is ahead of the weights the steps of
    ``episodes`` were sampled with, on average over the steps (RLlib's
    ``diff_num_grad_updates_vs_sampler_policy``: 1 for synchronous sampling right
    after an update, more for data sampled continuously); None if the episodes do
    not record their ``weights_seq_no`` (offline data)."""
    total = count = 0
    for episode in episodes:
        if not len(episode) or "weights_seq_no" not in episode.extra_model_outputs:
            continue
        used = np.asarray(episode.get_extra_model_outputs("weights_seq_no"))
        total += int(seq_no) * len(used) - int(used.sum())
        count += len(used)
    return total / count if count else None


def _joined(columns: list[Any]) -> Any:
    """Episode columns (one per chunk; nested for Dict / Tuple spaces) joined along time."""
    return _nested.map_structure(
        lambda *parts: np.concatenate(parts), *[_nested.as_arrays(c) for c in columns]
    )


def _scatter(values: np.ndarray, rows: np.ndarray, cols: np.ndarray, grid: Any) -> np.ndarray:
    """A zero ``(S, T, ...)`` array with ``values[i]`` at ``(rows[i], cols[i])``."""
    out = np.zeros((*grid, *values.shape[1:]), dtype=values.dtype)
    out[rows, cols] = values
    return out


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


def _forward_inputs(mb: dict[str, Any]) -> dict[str, Any]:
    """What ``forward_train`` reads from a minibatch: ``obs``, and the recurrent inputs if any."""
    if Columns.STATE_IN not in mb:
        return {Columns.OBS: mb[Columns.OBS]}
    keys = (Columns.OBS, Columns.STATE_IN, PREV_ACTIONS, PREV_REWARDS)
    return {k: mb[k] for k in keys if k in mb}


def _previous(episode: Any, getter: Any) -> Any:
    """Per position ``0..len``, the action (or reward) of the step before it.

    Position 0 gets the lookback's last one when the chunk continues an episode, else
    zeros (an episode's first step has none); position ``p`` gets step ``p - 1``'s.
    """
    values = _nested.as_arrays(getter())
    if episode.t_started > 0:
        before = _nested.as_arrays(getter(-1, neg_index_as_lookback=True, fill=0))
    else:
        before = _nested.map_structure(lambda v: np.zeros_like(v[0]), values)
    return _nested.map_structure(
        lambda b, v: np.concatenate([np.asarray(b, v.dtype)[None], v]), before, values
    )


def _mean_fn(mb: dict[str, Any]) -> Any:
    """``torch.mean``, or for sequence batches the mean over the loss mask's real steps."""
    mask = mb.get(Columns.LOSS_MASK)
    if mask is None:
        return torch.mean
    num_valid = mask.sum()
    return lambda x: x[mask].sum() / num_valid


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
    """``max(-1, 1 - Var(targets - preds) / (Var(targets) + 1e-6))``, RLlib's formula: constant
    targets give 1 (exact predictions) or -1, never NaN."""
    var = float(np.var(targets))
    return max(-1.0, 1.0 - float(np.var(targets - preds)) / (var + 1e-6))
