"""Batched acting with an RLlib RLModule: RLlib's default connector work, once per step.

RLlib's default env-to-module pipeline (observations from the episodes, a time rank
and ``STATE_IN`` for stateful modules, batching, numpy to tensor) and its default
module-to-env pipeline (``GetActions``: sample from the action-dist class with
``logp``, tensor to numpy, time rank removed, ``NormalizeAndClipActions``) come down
to a few whole-batch operations per vector step, done here for all sub-envs at
once. ``custom_connectors`` tells whether a runner's pipelines are only RLlib's
defaults; if not, the runner keeps RLlib's own sampling so the user's pieces run.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.connectors.env_to_module import (
    AddObservationsFromEpisodesToBatch,
    AddStatesFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    BatchIndividualItems,
    NumpyToTensor,
)
from ray.rllib.connectors.module_to_env import (
    GetActions,
    ListifyDataForVectorEnv,
    NormalizeAndClipActions,
    RemoveSingleTsTimeRankFromBatch,
    TensorToNumpy,
    UnBatchToIndividualItems,
)
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.core.models.torch.encoder import TorchActorCriticEncoder, TorchMLPEncoder
from ray.rllib.core.models.torch.heads import TorchMLPHead
from ray.rllib.core.models.torch.primitives import TorchMLP
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils import force_list
from ray.rllib.utils.numpy import convert_to_numpy
from ray.rllib.utils.spaces.space_utils import (
    clip_action,
    get_base_struct_from_space,
    unsquash_action,
)
from ray.rllib.utils.torch_utils import convert_to_torch_tensor

from envrunners.core.rl_module._numpy_forward import run_plan

__all__ = [
    "DirectMLPForward",
    "ModuleActor",
    "action_fn_for",
    "custom_connectors",
    "episode_callbacks_in_use",
]

#: The pieces ``AlgorithmConfig.build_env_to_module_connector`` adds by default
#: (single-agent), whose work ``ModuleActor`` does.
DEFAULT_ENV_TO_MODULE = (
    AddObservationsFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    AddStatesFromEpisodesToBatch,
    BatchIndividualItems,
    NumpyToTensor,
)
#: The pieces ``AlgorithmConfig.build_module_to_env_connector`` adds by default.
DEFAULT_MODULE_TO_ENV = (
    GetActions,
    TensorToNumpy,
    UnBatchToIndividualItems,
    RemoveSingleTsTimeRankFromBatch,
    NormalizeAndClipActions,
    ListifyDataForVectorEnv,
)
_EPISODE_CALLBACKS = ("on_episode_created", "on_episode_start", "on_episode_step", "on_episode_end")


def custom_connectors(pipeline: Any, defaults: tuple[type, ...]) -> list[str]:
    """Names of the pieces of ``pipeline`` that are not exactly one of ``defaults``."""
    pieces = getattr(pipeline, "connectors", None) or []
    return [type(c).__name__ for c in pieces if type(c) not in defaults]


def episode_callbacks_in_use(config: Any) -> list[str]:
    """The per-episode callbacks a config sets (methods overridden or functions given).

    These run per env step and per episode on RLlib's episode objects, which the
    batched path does not keep; a runner with any of them samples RLlib's way.
    """
    used = [w for w in _EPISODE_CALLBACKS if getattr(config, f"callbacks_{w}", None)]
    for cls in force_list(config.callbacks_class):
        used += [
            f"{cls.__name__}.{w}"
            for w in _EPISODE_CALLBACKS
            if getattr(cls, w, None) is not getattr(RLlibCallback, w)
        ]
    return used


def action_fn_for(config: Any, action_space: Any) -> Any:
    """``NormalizeAndClipActions`` on a whole action batch (None: actions go as they are).

    Unsquashing / clipping broadcast over the batch rank; the episodes keep the
    module's actions, the env gets these.
    """
    struct = get_base_struct_from_space(action_space)
    if config.normalize_actions:
        return lambda actions: unsquash_action(actions, struct)
    if config.clip_actions:
        return lambda actions: clip_action(actions, struct)
    return None


class ModuleActor:
    """Calls an RLlib RLModule for a whole batch of sub-envs, as RLlib's defaults would.

    ``act`` is a sampler ``ActFn``; ``act_stateful`` a ``StatefulActFn`` (a time rank
    of 1 around the forward, ``STATE_IN`` from the per-sub-env state, ``STATE_OUT``
    back). Outputs other than the actions become the episodes' extra model outputs
    (``action_dist_inputs``, ``action_logp``, a value head's outputs, ...).

    Args:
        module: The runner's (inference-only) RLModule.
        device: Where the module's tensors live.
        t_fn: Maps the sampler's step count of this call to the ``t`` passed to
            ``forward_exploration`` (exploration schedules, e.g. DQN's epsilon).
    """

    def __init__(self, module: RLModule, device: Any, t_fn: Any):
        self.module = module
        self.device = device
        self.t_fn = t_fn
        self._on_cpu = device is None or torch.device(device).type == "cpu"
        self._explore_dist = module.get_exploration_action_dist_cls()
        self._inference_dist = module.get_inference_action_dist_cls()
        self.stateful = bool(module.is_stateful())
        self._explore_fn, self._inference_fn = module.forward_exploration, module.forward_inference
        self._was_training: bool | None = None
        self._direct: DirectMLPForward | None = None
        #: Wall time spent in the module's forward and action sampling (RLlib's timer).
        self.forward_s = 0.0
        self.forward_calls = 0

    def begin(self) -> None:
        """Before a ``sample()`` call's forwards: the module in eval mode once for all.

        RLlib's ``TorchRLModule.forward_exploration`` / ``forward_inference`` switch the
        module to eval mode and back around every call (two walks over its submodules,
        a fifth of a CartPole step); where a module keeps those methods, the runner
        switches once per call and calls the ``_forward_*`` methods they wrap.
        """
        module = self.module
        self._was_training = bool(getattr(module, "training", False))
        if isinstance(module, TorchRLModule):
            module.eval()
            cls = type(module)
            if cls.forward_exploration is TorchRLModule.forward_exploration:
                self._explore_fn = module._forward_exploration
            if cls.forward_inference is TorchRLModule.forward_inference:
                self._inference_fn = module._forward_inference
        # Rebuilt per call: a restored or reloaded module may hold new parameter tensors.
        self._direct = DirectMLPForward.build(module) if self._direct_ok() else None

    def _direct_ok(self) -> bool:
        """Whether both forwards are RLlib's no-grad wrappers of the module's ``_forward``."""
        cls = type(self.module)
        return (
            not self.stateful
            and self._explore_fn == self.module._forward_exploration
            and self._inference_fn == self.module._forward_inference
            and cls._forward_exploration is TorchRLModule._forward_exploration
            and cls._forward_inference is TorchRLModule._forward_inference
        )

    def end(self) -> None:
        """After a ``sample()`` call: the module back in the mode ``begin`` found it in."""
        if self._was_training:
            self.module.train()
        self._was_training = None
        self._direct = None

    def initial_state(self) -> Any:
        """One sub-env's initial state, numpy leaves (e.g. ``{"h": (cell,), "c": (cell,)}``)."""
        return convert_to_numpy(self.module.get_initial_state())

    def _tensor(self, obs: Any) -> Any:
        if type(obs) is np.ndarray and self._on_cpu and obs.dtype != object:
            tensor = torch.from_numpy(obs)
            if tensor.is_floating_point() and tensor.dtype not in (torch.float32, torch.float16):
                tensor = tensor.float()
            return tensor
        return convert_to_torch_tensor(obs, device=self.device)

    def _forward(self, batch: dict, explore: bool, t: int) -> dict:
        start = time.perf_counter()
        with torch.no_grad():
            if explore:
                out = self._explore_fn(batch, t=self.t_fn(t))
            else:
                out = self._inference_fn(batch)
            out = dict(out)
            if self.stateful:  # drop the time rank of 1 (RemoveSingleTsTimeRankFromBatch)
                for key, value in out.items():
                    if key != Columns.STATE_OUT and torch.is_tensor(value):
                        out[key] = value.squeeze(1)
            if Columns.ACTIONS not in out and Columns.ACTION_DIST_INPUTS in out:  # GetActions
                dist_cls = self._explore_dist if explore else self._inference_dist
                dist = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
                if not explore:
                    dist = dist.to_deterministic()
                actions = dist.sample()
                out[Columns.ACTIONS] = actions
                if Columns.ACTION_LOGP not in out:
                    out[Columns.ACTION_LOGP] = dist.logp(actions)
        self.forward_s += time.perf_counter() - start
        self.forward_calls += 1
        return {k: _numpy(v) for k, v in out.items()}

    def act(self, obs: Any, explore: bool, t: int) -> tuple[Any, dict]:
        """One batched forward for ``obs`` (one row per sub-env) -> (actions, extras)."""
        if self._direct is not None:
            obs_t = self._tensor(obs)
            if type(obs_t) is torch.Tensor:
                return self._act_direct(obs_t, explore)
        out = self._forward({Columns.OBS: self._tensor(obs)}, explore, t)
        actions = out.pop(Columns.ACTIONS)
        out.pop(Columns.ACTIONS_FOR_ENV, None)
        return actions, out

    def _act_direct(self, obs: torch.Tensor, explore: bool) -> tuple[Any, dict]:
        """``act`` through ``DirectMLPForward``: the same torch ops, results and RNG draws.

        A ``TorchCategorical`` is sampled with the ops torch's ``Categorical`` runs
        (normalized logits, softmax, ``multinomial``, ``gather``); any other
        distribution class as in ``_forward``.
        """
        start = time.perf_counter()
        logits = self._direct(obs)
        dist_cls = self._explore_dist if explore else self._inference_dist
        if explore and dist_cls is TorchCategorical:
            normalized = logits - logits.logsumexp(-1, keepdim=True)
            probs = torch.softmax(normalized, -1).reshape(-1, normalized.shape[-1])
            actions = torch.multinomial(probs, 1, True).T.reshape(normalized.shape[:-1])
            logp = normalized.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        else:
            with torch.no_grad():
                dist = dist_cls.from_logits(logits)
                if not explore:
                    dist = dist.to_deterministic()
                actions = dist.sample()
                logp = dist.logp(actions)
        self.forward_s += time.perf_counter() - start
        self.forward_calls += 1
        extras = {Columns.ACTION_DIST_INPUTS: _numpy(logits), Columns.ACTION_LOGP: _numpy(logp)}
        return _numpy(actions), extras

    def act_stateful(
        self, obs: Any, explore: bool, t: int, state: Any, extra_inputs: Any
    ) -> tuple[Any, dict, Any]:
        """``act`` for a stateful module: time rank 1, ``STATE_IN`` in, ``STATE_OUT`` out."""
        obs_t = convert_to_torch_tensor(obs, device=self.device)
        batch = {
            Columns.OBS: _map_tensors(obs_t, lambda x: x.unsqueeze(1)),
            Columns.STATE_IN: convert_to_torch_tensor(state, device=self.device),
        }
        out = self._forward(batch, explore, t)
        actions = out.pop(Columns.ACTIONS)
        out.pop(Columns.ACTIONS_FOR_ENV, None)
        state_out = out.pop(Columns.STATE_OUT)
        return actions, out, state_out


class DirectMLPForward:
    """RLlib's default PPO/APPO MLP policy forward as its own torch ops, bitwise the same.

    ``DefaultPPOTorchRLModule._forward`` on an MLP encoder goes through four
    ``nn.Module`` calls and three output dicts per layer stack; this runs the same
    ``F.linear`` and (in-place) activation kernels on the parameters' detached
    tensors, so the action-distribution inputs are identical and no autograd graph
    is built. ``build`` returns None for anything else (hooks, LayerNorm, other
    activations, a stateful or customized module).
    """

    _ACTIVATIONS = {torch.nn.Tanh: torch.Tensor.tanh_, torch.nn.ReLU: torch.Tensor.relu_}

    def __init__(self, plan: list[tuple[Any, ...]]):
        #: ``(weight, bias, in-place activation or None)`` per Linear (``run_plan``'s form).
        self.plan = plan

    @classmethod
    def build(cls, module: Any) -> DirectMLPForward | None:
        """The plan for ``module``'s actor encoder and pi head, or None if not that shape."""
        if (
            not isinstance(module, DefaultPPOTorchRLModule)
            or type(module)._forward is not DefaultPPOTorchRLModule._forward
            or torch.nn.modules.module._global_forward_hooks
            or torch.nn.modules.module._global_forward_pre_hooks
            or any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())
        ):
            return None
        encoder = getattr(module, "encoder", None)
        pi = getattr(module, "pi", None)
        if type(encoder) is not TorchActorCriticEncoder or type(pi) is not TorchMLPHead:
            return None
        actor = encoder.encoder if encoder.config.shared else encoder.actor_encoder
        if type(actor) is not TorchMLPEncoder or pi.clip_log_std:
            return None
        actor_plan, pi_plan = cls._layers(actor.net), cls._layers(pi.net)
        if not actor_plan or pi_plan is None:
            return None
        return cls(actor_plan + pi_plan)

    @classmethod
    def _layers(cls, net: Any) -> list[list[Any]] | None:
        """``[weight, bias, in-place activation or None]`` per Linear of ``net``; None
        unless every activation directly follows a Linear (it then runs in place)."""
        if type(net) is not TorchMLP or type(net).forward is not TorchMLP.forward:
            return None
        out: list[list[Any]] = []
        for layer in net.mlp:
            if type(layer) is torch.nn.Linear:
                bias = None if layer.bias is None else layer.bias.detach()
                out.append([layer.weight.detach(), bias, None])
            elif type(layer) in cls._ACTIVATIONS and out and out[-1][2] is None:
                out[-1][2] = cls._ACTIVATIONS[type(layer)]
            else:
                return None
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The action-distribution inputs for a ``(B, obs_dim)`` batch."""
        return run_plan(self.plan, x)


def _numpy(value: Any) -> Any:
    """``TensorToNumpy`` for one output column: a tensor directly, a nested one leaf-wise."""
    if torch.is_tensor(value):
        return value.detach().cpu().numpy()
    return convert_to_numpy(value)


def _map_tensors(value: Any, fn: Any) -> Any:
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    return fn(value)
