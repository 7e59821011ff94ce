"""``TorchPolicy``: a ``Policy`` on the sampling core's RLModule, with an SGD loop.

Why: old-stack policies should act exactly as fast as the new-stack runners, so
``compute_actions`` uses the RLModule's numpy fast path (one batched forward for
all sub-envs, numpy in and out). Learning runs ``forward_train`` and a subclass's
``loss`` over ``num_epochs`` x minibatches; with ``distributed_world_size`` set
(``RolloutWorker.setup_torch_data_parallel``) the model is wrapped in
``DistributedDataParallel`` so gradients are averaged across workers in backward.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.columns import Columns
from envrunners.core.rl_module import default_torch_rl_module as default_model
from envrunners.core.rl_module.rl_module import RLModule, RLModuleSpec
from envrunners.errors import ConfigError
from envrunners.policy._optimizer_state import (
    optimizer_state_from_plain,
    optimizer_state_to_plain,
)
from envrunners.policy.policy import Policy, batch_of_one

__all__ = ["TorchPolicy", "TorchPolicyV2"]


def schedule_value(schedule: Any, t: int) -> float:
    """A constant, or ``[[t0, v0], [t1, v1], ...]`` linearly interpolated at ``t``."""
    if not isinstance(schedule, list | tuple):
        return float(schedule)
    points = np.asarray(schedule, dtype=np.float64)
    return float(np.interp(t, points[:, 0], points[:, 1]))


def _stack_obs(obs_batch: Any) -> Any:
    if isinstance(obs_batch, np.ndarray | dict | tuple):
        return obs_batch
    if isinstance(obs_batch, list) and obs_batch and isinstance(obs_batch[0], dict):
        return {k: np.stack([o[k] for o in obs_batch]) for k in obs_batch[0]}
    return np.asarray(obs_batch)


def _last_rows(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _last_rows(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_last_rows(v) for v in x)
    return np.asarray(x)[-1:]


def _concat_obs(parts: list[Any]) -> Any:
    first = parts[0]
    if isinstance(first, dict):
        return {k: _concat_obs([p[k] for p in parts]) for k in first}
    if isinstance(first, tuple):
        return tuple(_concat_obs([p[i] for p in parts]) for i in range(len(first)))
    return np.concatenate(parts)


def _to_tensor(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, dict):
        return {k: _to_tensor(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_to_tensor(v) for v in x)
    array = np.asarray(x)
    if array.dtype == np.float64:
        array = array.astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(array))


def _take(x: Any, index: torch.Tensor) -> Any:
    if isinstance(x, dict):
        return {k: _take(v, index) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_take(v, index) for v in x)
    return x.index_select(0, index)


class TorchPolicy(Policy):
    """A torch policy whose model is an ``RLModule`` (the default MLP unless configured).

    Subclasses implement :meth:`loss` (and usually :meth:`postprocess_trajectory`
    and :meth:`stats_fn`). Config keys read here: ``model``/``model_config``,
    ``rl_module_spec``, ``lr`` (or ``lr_schedule``), ``grad_clip``, ``num_epochs``,
    ``minibatch_size``, ``shuffle_batch_per_epoch``, ``explore``.

    Args:
        observation_space: Observation space of the agents of this policy.
        action_space: Their action space.
        config: The policy config (dict or ``AlgorithmConfig``).
        model: A ready ``RLModule`` to use instead of building one.
    """

    #: Ask the module for value predictions while acting (``vf_preds`` column).
    compute_values_when_acting = True
    #: Columns the loss reads; ``learn_on_batch`` converts only these to tensors.
    loss_columns: tuple[str, ...] = (Columns.OBS, Columns.ACTIONS)
    #: The algorithm's config class; its defaults are this policy's (``get_default_config``).
    config_class: type[AlgorithmConfig] = AlgorithmConfig

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        config: Any,
        *,
        model: RLModule | None = None,
        **kwargs: Any,
    ):
        super().__init__(observation_space, action_space, config)
        self.device = torch.device("cpu")
        self.model: RLModule = model if model is not None else self.make_rl_module()
        self.dist_class = self.model.get_train_action_dist_cls()
        self._train_model: nn.Module = self.model
        self._with_values = bool(
            self.compute_values_when_acting
            and not getattr(self.model, "inference_only", False)
            and hasattr(self.model, "compute_values")
        )
        self.cur_lr = schedule_value(self.config.get("lr_schedule") or self.config["lr"], 0)
        self._optimizer = self.optimizer()

    @classmethod
    def get_default_config(cls) -> dict[str, Any]:
        """``config_class().to_dict()``; here Adam at ``lr=1e-3``, one epoch over the batch."""
        return cls.config_class().to_dict()

    # -- construction --------------------------------------------------------------
    def make_rl_module(self) -> RLModule:
        """Build the model from ``config["rl_module_spec"]`` or the default MLP spec."""
        spec = self.config.get("rl_module_spec")
        model_config = dict(self.config.get("model_config") or self.config.get("model") or {})
        obs, act = self.observation_space, self.action_space
        if spec is None:
            spec = default_model.default_rl_module_spec(obs, act, model_config=model_config)
        elif isinstance(spec, RLModuleSpec):
            spec = RLModuleSpec(
                module_class=spec.module_class or default_model.DefaultTorchRLModule,
                observation_space=spec.observation_space or obs,
                action_space=spec.action_space or act,
                inference_only=False,
                model_config={**model_config, **(spec.model_config or {})},
                catalog_class=spec.catalog_class,
            )
        else:
            raise ConfigError(
                f"config['rl_module_spec'] must be an RLModuleSpec, got {type(spec).__name__}"
            )
        module = spec.build()
        module.train(False)
        return module

    def optimizer(self) -> torch.optim.Optimizer:
        """The optimizer over the model's parameters (Adam at ``cur_lr``)."""
        return torch.optim.Adam(self.model.parameters(), lr=self.cur_lr)

    # -- acting --------------------------------------------------------------------
    def compute_actions(
        self,
        obs_batch: Any,
        state_batches: list[Any] | None = None,
        prev_action_batch: Any = None,
        prev_reward_batch: Any = None,
        info_batch: Any = None,
        episodes: list[Any] | None = None,
        explore: bool | None = None,
        timestep: int | None = None,
        **kwargs: Any,
    ) -> tuple[np.ndarray, list[Any], dict[str, np.ndarray]]:
        """Act with the module's numpy fast path; extras hold logp, probs, dist inputs, values."""
        explore = bool(self.config.get("explore", True)) if explore is None else bool(explore)
        obs = _stack_obs(obs_batch)
        out = default_model.compute_actions_numpy(
            self.model, obs, explore, with_values=self._with_values
        )
        actions = out.pop(Columns.ACTIONS)
        if Columns.ACTION_LOGP in out:
            out[Columns.ACTION_PROB] = np.exp(out[Columns.ACTION_LOGP])
        self.global_timestep += len(actions)
        return actions, [], out

    def compute_actions_for_sampling(self, obs_batch: Any, explore: bool) -> tuple[Any, dict]:
        """``(actions, extras)`` for the sampler: like ``compute_actions`` but without values.

        Value predictions are added afterwards for whole trajectories at once by
        :meth:`add_value_predictions` (one batched forward instead of one per step).
        """
        out = default_model.compute_actions_numpy(self.model, obs_batch, explore)
        actions = out.pop(Columns.ACTIONS)
        if Columns.ACTION_LOGP in out:
            out[Columns.ACTION_PROB] = np.exp(out[Columns.ACTION_LOGP])
        self.global_timestep += len(actions)
        return actions, out

    def add_value_predictions(self, batches: list[Any]) -> None:
        """Set ``vf_preds`` and ``values_bootstrapped`` of trajectory batches in one forward.

        ``values_bootstrapped[t]`` is ``V(new_obs[t])`` (the next row's prediction,
        and at the last row ``V(new_obs[-1])``, or 0 if the trajectory terminated).
        Batches that already have ``vf_preds`` are left alone; without a value head
        nothing is added.
        """
        todo = [b for b in batches if Columns.VF_PREDS not in b and len(b)]
        if not todo or not self._with_values:
            return
        parts = [b[Columns.OBS] for b in todo] + [_last_rows(b[Columns.NEXT_OBS]) for b in todo]
        with torch.inference_mode():  # value branch only: one batched forward
            values = self.model.compute_values({Columns.OBS: _to_tensor(_concat_obs(parts))})
        values = values.numpy().astype(np.float32, copy=False)
        offset, n_rows = 0, sum(len(b) for b in todo)
        for i, batch in enumerate(todo):
            n = len(batch)
            vf = values[offset : offset + n]
            offset += n
            last = 0.0 if bool(batch[Columns.TERMINATEDS][-1]) else values[n_rows + i]
            batch[Columns.VF_PREDS] = vf
            boot = np.empty_like(vf)
            boot[:-1] = vf[1:]
            boot[-1] = last
            batch[Columns.VALUES_BOOTSTRAPPED] = boot

    def compute_log_likelihoods(
        self,
        actions: Any,
        obs_batch: Any,
        state_batches: list[Any] | None = None,
        prev_action_batch: Any = None,
        prev_reward_batch: Any = None,
        actions_normalized: bool = True,
        in_training: bool = True,
    ) -> torch.Tensor:
        """``log pi(actions | obs)`` from the training forward pass."""
        with torch.no_grad():
            out = self.model.forward_train({Columns.OBS: _to_tensor(_stack_obs(obs_batch))})
            dist = self.dist_class.from_logits(out[Columns.ACTION_DIST_INPUTS])
            return dist.logp(_to_tensor(actions))

    def _value(self, obs: Any) -> float:
        """``V(obs)`` for one observation (bootstrapping truncated trajectories)."""
        batch = batch_of_one(obs)
        if self._with_values:
            out = default_model.compute_actions_numpy(self.model, batch, False, with_values=True)
            return float(out[Columns.VF_PREDS][0])
        with torch.inference_mode():
            return float(self.model.compute_values({Columns.OBS: _to_tensor(batch)})[0])

    # -- learning ------------------------------------------------------------------
    def stats_fn(self, train_batch: Mapping[str, Any]) -> dict[str, Any]:
        """Scalars to report after each SGD step (set by ``loss`` on ``self``)."""
        return {}

    def _prepare_train_batch(self, samples: Any) -> dict[str, Any]:
        """The loss columns of ``samples`` as tensors (subclasses may normalise here)."""
        return {k: _to_tensor(samples[k]) for k in self.loss_columns if k in samples}

    def _loss_step(self, batch: Mapping[str, Any]) -> torch.Tensor:
        loss = self.loss(self._train_model, self.dist_class, batch)
        if isinstance(loss, list | tuple):
            loss = sum(loss)
        return loss

    def _clip_grads(self) -> None:
        clip = self.config.get("grad_clip")
        if clip:
            nn.utils.clip_grad_norm_(self.model.parameters(), float(clip))

    def learn_on_batch(
        self,
        samples: Any,
        *,
        num_epochs: int | None = None,
        minibatch_size: int | None = None,
    ) -> dict[str, Any]:
        """``num_epochs`` passes of minibatch SGD over ``samples``; returns learner stats.

        Minibatches have ``minibatch_size`` rows (the whole batch if unset), drawn
        from a fresh permutation per epoch if ``shuffle_batch_per_epoch``. Both
        default to the config's ``num_epochs`` and ``minibatch_size``.
        """
        batch = self._prepare_train_batch(samples)
        n = len(samples)
        if n == 0:
            return {"learner_stats": {}, "num_agent_steps_trained": 0}
        epochs = int(num_epochs or self.config.get("num_epochs") or 1)
        size = min(int(minibatch_size or self.config.get("minibatch_size") or n), n)
        shuffle = bool(self.config.get("shuffle_batch_per_epoch", True))
        stats: dict[str, list[float]] = defaultdict(list)
        self.model.train(True)
        threads = torch.get_num_threads()
        torch.set_num_threads(self._learner_threads())
        try:
            for _ in range(epochs):
                order = torch.randperm(n) if shuffle else torch.arange(n)
                for start in range(0, n, size):
                    index = order[start : start + size]
                    mb = batch if len(index) == n and not shuffle else _take(batch, index)
                    loss = self._loss_step(mb)
                    self._optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    self._clip_grads()
                    self._optimizer.step()
                    self.num_grad_updates += 1
                    for key, value in self.stats_fn(mb).items():
                        stats[key].append(float(value))
        finally:
            self.model.train(False)
            torch.set_num_threads(threads)
        learner_stats = {k: float(np.mean(v)) for k, v in stats.items()}
        learner_stats["cur_lr"] = self.cur_lr
        self.after_learn(learner_stats)
        return {
            "learner_stats": learner_stats,
            "num_agent_steps_trained": n,
            "num_grad_updates": self.num_grad_updates,
            "custom_metrics": {},
        }

    def _learner_threads(self) -> int:
        """Torch threads for SGD: the CPUs of this process's role (1 by default).

        More threads than CPUs slow small-matrix training down badly on busy hosts.
        """
        key = "num_cpus_for_main_process" if not self.config.get("worker_index") else None
        cpus = self.config.get(key or "num_cpus_per_env_runner") or 1
        return max(1, int(cpus))

    def after_learn(self, learner_stats: dict[str, float]) -> None:
        """Hook run after ``learn_on_batch`` with the mean stats (e.g. PPO's KL update)."""

    def compute_gradients(self, postprocessed_batch: Any) -> tuple[list[Any], dict[str, Any]]:
        """Gradients of the loss on the whole batch, as numpy arrays (one per parameter)."""
        batch = self._prepare_train_batch(postprocessed_batch)
        self.model.train(True)
        threads = torch.get_num_threads()
        torch.set_num_threads(self._learner_threads())
        try:
            self._optimizer.zero_grad(set_to_none=True)
            self._loss_step(batch).backward()
            self._clip_grads()
        finally:
            self.model.train(False)
            torch.set_num_threads(threads)
        grads = [
            None if p.grad is None else p.grad.detach().cpu().numpy().copy()
            for p in self.model.parameters()
        ]
        stats = {k: float(v) for k, v in self.stats_fn(batch).items()}
        return grads, {"learner_stats": stats, "batch_count": len(postprocessed_batch)}

    def apply_gradients(self, gradients: list[Any]) -> None:
        """Set the parameters' ``.grad`` from ``gradients`` and take one optimizer step."""
        params = list(self.model.parameters())
        if len(gradients) != len(params):
            raise ValueError(
                f"apply_gradients: got {len(gradients)} gradients for {len(params)} parameters"
            )
        for p, g in zip(params, gradients):
            p.grad = None if g is None else torch.as_tensor(np.asarray(g), dtype=p.dtype)
        self._optimizer.step()

    def on_global_var_update(self, global_vars: Mapping[str, Any]) -> None:
        """Take the timestep; follow the ``lr`` schedule if one is configured."""
        super().on_global_var_update(global_vars)
        schedule = self.config.get("lr_schedule") or self.config["lr"]
        if isinstance(schedule, list | tuple):
            self.cur_lr = schedule_value(schedule, self.global_timestep)
            for group in self._optimizer.param_groups:
                group["lr"] = self.cur_lr

    # -- distributed ---------------------------------------------------------------
    def enable_data_parallel(self, world_size: int) -> None:
        """Wrap the model in ``DistributedDataParallel`` (the process group must exist).

        DDP's constructor broadcasts rank 0's weights, so every worker of the group
        must call this at the same time; afterwards each backward pass averages the
        gradients across the group.
        """
        from torch.nn.parallel import DistributedDataParallel

        self.distributed_world_size = int(world_size)
        self._train_model = DistributedDataParallel(self.model, find_unused_parameters=True)

    # -- weights and state ---------------------------------------------------------
    def get_weights(self) -> dict[str, np.ndarray]:
        """The module's weights (numpy copies)."""
        return self.model.get_state()

    def set_weights(self, weights: Mapping[str, Any]) -> None:
        """Load module weights (a full state or one without the value branch)."""
        self.model.set_state(weights)

    def get_state(self) -> dict[str, Any]:
        """Spec, weights, counters and the optimizer's state (as plain data)."""
        state = super().get_state()
        state["_optimizer_variables"] = optimizer_state_to_plain(self._optimizer.state_dict())
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore weights, counters and (if present) the optimizer state."""
        super().set_state(state)
        optim = state.get("_optimizer_variables")
        if optim:
            self._optimizer.load_state_dict(optimizer_state_from_plain(optim))

    def export_model(self, export_dir: str | os.PathLike, onnx: int | None = None) -> None:
        """Write the module's weights to ``export_dir`` (``module_state.npz``)."""
        if onnx:
            raise NotImplementedError("ONNX export is not supported; the weights are saved.")
        self.model.save_to_path(export_dir)


TorchPolicyV2 = TorchPolicy  # RLlib's second torch policy base; one class here.
