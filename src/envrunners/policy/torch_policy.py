"""``TorchPolicy``: a ``Policy`` on the sampling core's RLModule, with an SGD loop.

Why: old-stack policies should act exactly as fast as the new-stack runners, so
``compute_actions`` uses the RLModule's numpy fast path (one batched forward for
all sub-envs, numpy in and out). Learning runs ``forward_train`` and a subclass's
``loss`` over ``num_epochs`` x minibatches; with ``distributed_world_size`` set
(``RolloutWorker.setup_torch_data_parallel``) the model is wrapped in
``DistributedDataParallel`` so gradients are averaged across workers in backward.

Recurrent models (``model={"use_lstm": True}`` or a stateful custom module) act
through ``_acting.act`` with the state as RLlib's old-stack list of arrays
(``state_batches`` in, ``state_outs`` out) and train by BPTT: the batch's
``seq_lens`` cut it into zero-padded ``(sequences, T)`` blocks that start from
their ``state_in_*``, minibatches are whole sequences, and the loss sees only
the real rows.
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
from envrunners.core import _nested
from envrunners.core.columns import Columns
from envrunners.core.rl_module import default_torch_rl_module as default_model
from envrunners.core.rl_module._acting import act
from envrunners.core.rl_module.rl_module import RLModule, RLModuleSpec
from envrunners.errors import BatchArgumentError, ConfigError, ModuleActingError
from envrunners.policy._optimizer_state import (
    optimizer_state_from_plain,
    optimizer_state_to_plain,
)
from envrunners.policy._seq_ops import padded_row_index
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


#: Key of the (sequences, T) validity mask in a recurrent training minibatch.
VALID_MASK = "_valid_mask"
#: Columns a recurrent model reads time-ranked ``(sequences, T, ...)``; the rest are flat.
_TIME_RANKED = (Columns.OBS, default_model.PREV_ACTIONS, default_model.PREV_REWARDS)


def _leaf_numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


class _StateLayout:
    """A module's nested recurrent state <-> RLlib's old-stack list of per-row arrays.

    The module keeps ``{"h": (B, 1, cell), "c": (B, 1, cell)}`` (nested deeper when
    the critic has its own LSTM); the old stack lists the leaves in order, each
    ``(B, cell)``: a leading axis of size one per row (the LSTM's layer axis) is
    dropped, as RLlib's ``[h, c]`` state of ``(cell,)`` arrays has none.
    """

    def __init__(self, module: Any):
        self.structure = module.get_initial_state()
        leaves = [_leaf_numpy(leaf) for leaf in _nested.flatten(self.structure)]
        self.row_shapes = [leaf.shape for leaf in leaves]
        self.initial = [
            leaf.reshape(leaf.shape[1:]) if leaf.ndim > 1 and leaf.shape[0] == 1 else leaf
            for leaf in leaves
        ]

    def to_module(self, states: list[Any]) -> Any:
        """The nested module state from one ``(B, ...)`` array (or tensor) per leaf."""
        if len(states) != len(self.initial):
            raise ModuleActingError(
                f"got {len(states)} state batches; this policy's model has "
                f"{len(self.initial)} state tensors (see get_initial_state())."
            )
        leaves = [
            (s if isinstance(s, torch.Tensor) else np.asarray(s)).reshape(len(s), *shape)
            for s, shape in zip(states, self.row_shapes)
        ]
        return _nested.unflatten_as(self.structure, leaves)

    def from_module(self, state: Any) -> list[np.ndarray]:
        """One ``(B, ...)`` numpy array per leaf of a nested (batched) module state."""
        return [
            _leaf_numpy(leaf).reshape(len(leaf), *init.shape)
            for leaf, init in zip(_nested.flatten(state), self.initial)
        ]

    def initial_batch(self, rows: int) -> Any:
        """The nested initial state repeated for ``rows`` rows (fresh numpy arrays)."""
        return self.to_module([np.repeat(init[None], rows, axis=0) for init in self.initial])


class _Sequences:
    """A recurrent training batch cut into zero-padded ``(sequences, T)`` blocks.

    Why: BPTT runs the model over whole sequences from their ``state_in_*``; the
    loss must see only the real rows. :meth:`take` returns a minibatch of whole
    sequences: model inputs time-ranked, ``Columns.STATE_IN`` nested, every other
    column flattened to its valid rows, plus the ``(sequences, T)`` mask under
    ``VALID_MASK`` that :meth:`TorchPolicy.train_forward` applies to the outputs.
    """

    def __init__(self, batch: dict[str, Any], seq_lens: Any, layout: _StateLayout):
        lens = np.asarray(_leaf_numpy(seq_lens), dtype=np.int64)
        if len(lens) == 0 or lens.min() < 1:
            raise BatchArgumentError(f"recurrent training batch with bad seq_lens {lens}")
        self.num_seqs, self.T = len(lens), int(lens.max())
        rows = int(lens.sum())
        index = torch.from_numpy(padded_row_index(lens, self.T))
        width = self.num_seqs * self.T
        self.mask = torch.zeros(width, dtype=torch.bool)
        self.mask[index] = True
        self.mask = self.mask.reshape(self.num_seqs, self.T)
        self.layout = layout
        self.states = [batch[f"state_in_{i}"] for i in range(len(layout.initial))]

        def pad(t: torch.Tensor) -> torch.Tensor:
            if len(t) != rows:
                raise BatchArgumentError(
                    f"recurrent training batch: a column has {len(t)} rows, seq_lens sum to {rows}"
                )
            out = torch.zeros((width, *t.shape[1:]), dtype=t.dtype)
            out[index] = t
            return out.reshape(self.num_seqs, self.T, *t.shape[1:])

        self.padded = {
            k: _nested.map_structure(pad, v)
            for k, v in batch.items()
            if not str(k).startswith("state_in_")
        }

    def take(self, seq_index: torch.Tensor) -> dict[str, Any]:
        """The minibatch of sequences ``seq_index`` (see the class docstring)."""
        mask = self.mask[seq_index]
        out: dict[str, Any] = {}
        for key, value in self.padded.items():
            if key in _TIME_RANKED:
                out[key] = _nested.map_structure(lambda t: t[seq_index], value)
            else:
                out[key] = _nested.map_structure(lambda t: t[seq_index][mask], value)
        out[Columns.STATE_IN] = self.layout.to_module([s[seq_index] for s in self.states])
        out[VALID_MASK] = mask
        return out


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
        self._stateful = bool(self.model.is_stateful())
        self._state_layout = _StateLayout(self.model) if self._stateful else None
        model_cfg = self._model_config()
        self.max_seq_len = int(model_cfg.get("max_seq_len") or 20)
        #: The model reads ``prev_actions`` / ``prev_rewards`` (``lstm_use_prev_*``).
        self.prev_inputs: tuple[str, ...] = tuple(
            key
            for key, flag in (
                (default_model.PREV_ACTIONS, "lstm_use_prev_action"),
                (default_model.PREV_REWARDS, "lstm_use_prev_reward"),
            )
            if self._stateful and model_cfg.get(flag)
        )
        if self._stateful:
            for i in range(self.num_state_tensors()):
                self.view_requirements[f"state_in_{i}"] = {
                    "data_col": f"state_out_{i}",
                    "shift": -1,
                    "batch_repeat_value": self.max_seq_len,
                }
                self.view_requirements[f"state_out_{i}"] = {}

    @classmethod
    def get_default_config(cls) -> dict[str, Any]:
        """``config_class().to_dict()``; here Adam at ``lr=1e-3``, one epoch over the batch."""
        return cls.config_class().to_dict()

    # -- construction --------------------------------------------------------------
    def _model_config(self) -> dict[str, Any]:
        """The ``model`` / ``model_config`` dict (old-stack keys; unknown ones are ignored)."""
        return dict(self.config.get("model_config") or self.config.get("model") or {})

    def make_rl_module(self) -> RLModule:
        """Build the model from ``config["rl_module_spec"]`` or the default module's spec.

        The default module follows the ``model`` dict: an MLP, a CNN for image
        observations (``conv_filters``; uint8 frames stay uint8), an LSTM on top with
        ``use_lstm`` (``lstm_cell_size``, ``max_seq_len``, ``lstm_use_prev_*``).
        """
        spec = self.config.get("rl_module_spec")
        model_config = self._model_config()
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
        """Act for a batch; returns ``(actions, state_outs, extras)``.

        Stateless modules take the numpy fast path and return ``state_outs == []``.
        A recurrent policy reads ``state_batches`` (one ``(B, ...)`` array per state
        tensor, as :meth:`get_initial_state` lists them; the initial state if None)
        and returns the next state in the same form. Extras hold ``action_logp``,
        ``action_prob``, ``action_dist_inputs`` and ``vf_preds``.
        """
        explore = bool(self.config.get("explore", True)) if explore is None else bool(explore)
        obs = _stack_obs(obs_batch)
        if self._stateful:
            return self._compute_recurrent(
                obs, state_batches, prev_action_batch, prev_reward_batch, explore
            )
        out = default_model.compute_actions_numpy(
            self.model, obs, explore, with_values=self._with_values
        )
        actions = out.pop(Columns.ACTIONS)
        if Columns.ACTION_LOGP in out:
            out[Columns.ACTION_PROB] = np.exp(out[Columns.ACTION_LOGP])
        self.global_timestep += len(actions)
        return actions, [], out

    def _compute_recurrent(
        self,
        obs: Any,
        state_batches: list[Any] | None,
        prev_actions: Any,
        prev_rewards: Any,
        explore: bool,
    ) -> tuple[Any, list[np.ndarray], dict[str, np.ndarray]]:
        """One recurrent step through :func:`_acting.act` (state list in, state list out)."""
        layout = self._state_layout
        rows = len(_nested.flatten(obs)[0])
        state = layout.initial_batch(rows) if not state_batches else layout.to_module(state_batches)
        extra_inputs = None
        if self.prev_inputs:
            extra_inputs = {}
            for key, value in (
                (default_model.PREV_ACTIONS, prev_actions),
                (default_model.PREV_REWARDS, prev_rewards),
            ):
                if key in self.prev_inputs:
                    if value is None:
                        raise ModuleActingError(
                            f"This policy's model reads {key!r} (model config "
                            "lstm_use_prev_action/lstm_use_prev_reward): pass "
                            f"{'prev_action_batch' if key == default_model.PREV_ACTIONS else 'prev_reward_batch'}."
                        )
                    extra_inputs[key] = (
                        np.asarray(value) if not isinstance(value, dict | tuple) else value
                    )
        actions, out, state_out = act(
            self.model,
            obs,
            explore,
            state,
            extra_inputs=extra_inputs,
            with_values=self._with_values,
        )
        if Columns.ACTION_LOGP in out:
            out[Columns.ACTION_PROB] = np.exp(out[Columns.ACTION_LOGP])
        self.global_timestep += rows
        return actions, layout.from_module(state_out), out

    def get_initial_state(self) -> list[np.ndarray]:
        """The module's initial state as RLlib's old-stack list: one numpy array per tensor.

        The default LSTM gives ``[h, c]``, each ``(lstm_cell_size,)`` (both actor and
        critic states, ``[h, c, h, c]``, when the value branch has its own LSTM).
        """
        if not self._stateful:
            return []
        return [leaf.copy() for leaf in self._state_layout.initial]

    def is_recurrent(self) -> bool:
        """Whether the model is stateful (``use_lstm`` or a stateful custom module)."""
        return self._stateful

    def num_state_tensors(self) -> int:
        """How many ``state_in_*`` / ``state_out_*`` columns the policy uses."""
        return len(self._state_layout.initial) if self._stateful else 0

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
        if not todo or not self._with_values or self._stateful:
            # A recurrent policy's values need the state: they come with its actions.
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
        """``log pi(actions | obs)`` from the training forward pass.

        A recurrent policy scores each row as one step from its row of
        ``state_batches`` (the initial state if None), as RLlib does.
        """
        obs = _stack_obs(obs_batch)
        batch: dict[str, Any] = {Columns.OBS: _to_tensor(obs)}
        if self._stateful:
            for key, value in (
                (default_model.PREV_ACTIONS, prev_action_batch),
                (default_model.PREV_REWARDS, prev_reward_batch),
            ):
                if key in self.prev_inputs:
                    batch[key] = _to_tensor(np.asarray(value))
            batch = _nested.map_structure(lambda t: t.unsqueeze(1), batch)
            rows = len(_nested.flatten(obs)[0])
            layout = self._state_layout
            state = layout.initial_batch(rows) if not state_batches else None
            batch[Columns.STATE_IN] = _to_tensor(state or layout.to_module(state_batches))
        with torch.no_grad():
            out = self.model.forward_train(batch)
            logits = out[Columns.ACTION_DIST_INPUTS]
            dist = self.dist_class.from_logits(logits[:, 0] if self._stateful else logits)
            return dist.logp(_to_tensor(actions))

    def _value(self, obs: Any, state: list[Any] | None = None, **prev: Any) -> float:
        """``V(obs)`` for one observation (bootstrapping truncated trajectories).

        A recurrent policy needs ``state`` (one unbatched array per state tensor,
        e.g. the trajectory's last ``state_out_*``) and, if its model reads them,
        ``prev_actions`` / ``prev_rewards``.
        """
        batch = batch_of_one(obs)
        if self._stateful:
            if state is None:
                raise ModuleActingError("a recurrent policy's _value() needs the `state`")
            inputs = {Columns.OBS: batch}
            for key in self.prev_inputs:
                inputs[key] = batch_of_one(prev[key])
            with torch.inference_mode():
                inputs = _nested.map_structure(lambda t: t.unsqueeze(1), _to_tensor(inputs))
                inputs[Columns.STATE_IN] = _to_tensor(
                    self._state_layout.to_module([np.asarray(s)[None] for s in state])
                )
                return float(self.model.compute_values(inputs).reshape(-1)[0])
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
        """The loss columns of ``samples`` as tensors (subclasses may normalise here).

        A recurrent policy also takes the ``state_in_*`` columns (one row per
        sequence) and the ``prev_*`` columns its model reads; rows stay unpadded.
        """
        keys = self.loss_columns
        if self._stateful:
            states = tuple(f"state_in_{i}" for i in range(self.num_state_tensors()))
            keys = (*keys, *self.prev_inputs, *states)
            missing = [k for k in (Columns.SEQ_LENS, *states) if k not in samples]
            if missing:
                raise BatchArgumentError(
                    f"a recurrent policy trains on sequences: the batch lacks {missing} "
                    "(sample it with this policy, which adds state_in_*/state_out_*/seq_lens)."
                )
        return {k: _to_tensor(samples[k]) for k in keys if k in samples}

    def train_forward(self, model: Any, train_batch: Mapping[str, Any]) -> dict[str, Any]:
        """``model(train_batch)`` with outputs row-aligned to the batch's loss columns.

        For a recurrent minibatch (see ``_Sequences``) the model runs over the
        padded sequences and its outputs are reduced to the valid rows, so losses
        average over real timesteps only (RLlib masks its means alike).
        """
        out = model(train_batch)
        mask = train_batch.get(VALID_MASK)
        if mask is None:
            return out
        return {
            k: v[mask]
            for k, v in out.items()
            if isinstance(v, torch.Tensor) and v.dim() >= 2 and k != Columns.STATE_OUT
        }

    def _units(self, samples: Any, batch: dict[str, Any]) -> tuple[int, Any]:
        """``(number of units, take(index) -> minibatch)``: rows, or whole sequences."""
        if not self._stateful:
            return len(samples), lambda index: _take(batch, index)
        seqs = _Sequences(batch, samples[Columns.SEQ_LENS], self._state_layout)
        return seqs.num_seqs, seqs.take

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
        units, take = self._units(samples, batch)
        if self._stateful:  # minibatches of whole sequences, about `size` rows each
            size = max(1, size // max(1, int(samples[Columns.SEQ_LENS].max())))
        stats: dict[str, list[float]] = defaultdict(list)
        self.model.train(True)
        threads = torch.get_num_threads()
        torch.set_num_threads(self._learner_threads())
        try:
            for _ in range(epochs):
                order = torch.randperm(units) if shuffle else torch.arange(units)
                for start in range(0, units, size):
                    index = order[start : start + size]
                    whole = len(index) == units and not shuffle and not self._stateful
                    mb = batch if whole else take(index)
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
        units, take = self._units(postprocessed_batch, batch)
        if self._stateful:
            batch = take(torch.arange(units))
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
