"""How RLlib's modules act inside our multi-agent loop, and when they cannot.

``ModuleActing`` is the ``act_fn`` of ``envrunners.sampling.multi_agent``: one
call per module and vector step, on the stacked observations of every agent
mapped to that module. It does what RLlib's default connector pipelines do
around ``MultiRLModule.forward_exploration`` / ``forward_inference`` (numpy to
tensor, ``GetActions``: sample from the module's action-distribution class and
record ``action_logp``, tensors back to numpy), batched per module instead of
per agent. ``action_transforms`` is RLlib's ``NormalizeAndClipActions`` as a
per-module numpy transform (the episode keeps the module's actions, the env gets
the unsquashed / clipped ones). ``why_not_ours`` says when RLlib's own pipelines
must run instead (custom connectors, recurrent modules).
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.numpy import convert_to_numpy
from ray.rllib.utils.spaces.space_utils import (
    clip_action,
    get_base_struct_from_space,
    unsquash_action,
)
from ray.rllib.utils.torch_utils import convert_to_torch_tensor

__all__ = ["ModuleActing", "action_transforms", "why_not_ours"]

_ACTIONS = Columns.ACTIONS
_DIST_INPUTS = Columns.ACTION_DIST_INPUTS
_LOGP = Columns.ACTION_LOGP
_FOR_ENV = Columns.ACTIONS_FOR_ENV


def why_not_ours(config: Any, module: Any) -> str | None:
    """Why RLlib's own ``_sample`` must run for this config and module (None: ours can).

    Our loop replaces RLlib's default env-to-module / module-to-env pipelines;
    anything a user added to them, or took out, only runs in RLlib's loop.
    """
    if config._env_to_module_connector is not None:
        return "a custom env_to_module_connector is configured"
    if config._module_to_env_connector is not None:
        return "a custom module_to_env_connector is configured"
    if not config.add_default_connectors_to_env_to_module_pipeline:
        return "add_default_connectors_to_env_to_module_pipeline is False"
    if not config.add_default_connectors_to_module_to_env_pipeline:
        return "add_default_connectors_to_module_to_env_pipeline is False"
    if module is None:
        return "no MultiRLModule was built"
    stateful = [mid for mid, m in module.items() if m.is_stateful()]
    if stateful:
        return f"module(s) {stateful} are stateful (recurrent)"
    return None


def _to_tensor(obs: Any, device: Any) -> Any:
    """RLlib's ``NumpyToTensor`` for one module's batch (floats as float32)."""
    if type(obs) is np.ndarray and obs.dtype != object:
        tensor = torch.from_numpy(obs)
        if tensor.is_floating_point() and tensor.dtype not in (torch.float32, torch.float16):
            tensor = tensor.float()
        return tensor if device is None else tensor.to(device)
    return convert_to_torch_tensor(obs, device=device)


def _to_numpy(value: Any) -> Any:
    if type(value) is torch.Tensor:
        return value.numpy(force=True)
    return convert_to_numpy(value)


class ModuleActing:
    """The ``act_fn`` for one ``sample()`` call: RLlib's modules, batched per module.

    Args:
        modules: ``{module_id: RLModule}`` (the runner's ``MultiRLModule`` items).
        device: The torch device of the modules (None or CPU: no copy).
        t_base: ``num_env_steps_sampled_lifetime // num_env_runners``.
        num_runners: ``num_env_runners or 1``; ``forward_exploration`` gets
            ``t = (t_base + env steps of this call) * num_runners`` as in RLlib.
    """

    __slots__ = (
        "modules",
        "device",
        "t_base",
        "num_runners",
        "inference_s",
        "forwards",
        "_forwards",
        "_eval_once",
        "_was_training",
    )

    def __init__(self, modules: dict, device: Any, t_base: int, num_runners: int):
        self.modules = modules
        self.device = None if device is None or str(device) == "cpu" else device
        self.t_base = t_base
        self.num_runners = num_runners
        #: Seconds spent in forward passes and action sampling, and how many passes.
        self.inference_s = 0.0
        self.forwards = 0
        # Per module, (exploration forward, inference forward). A torch module that keeps
        # TorchRLModule's wrappers (eval() for the call, then train() back, per call)
        # is put in eval mode once for the whole ``sample()`` (see ``__enter__``) and its
        # ``_forward_*`` methods called directly: the same forward, without walking the
        # module tree twice per step.
        self._forwards: dict[Any, tuple[Any, Any]] = {}
        self._eval_once: list[Any] = []
        self._was_training: list[bool] = []
        for mid, m in modules.items():
            cls = type(m)
            if (
                isinstance(m, TorchRLModule)
                and cls.forward_exploration is TorchRLModule.forward_exploration
                and cls.forward_inference is TorchRLModule.forward_inference
            ):
                self._forwards[mid] = (m._forward_exploration, m._forward_inference)
                self._eval_once.append(m)
            else:
                self._forwards[mid] = (m.forward_exploration, m.forward_inference)

    def __enter__(self) -> ModuleActing:
        self._was_training = [m.training for m in self._eval_once]
        for m in self._eval_once:
            m.eval()
        return self

    def __exit__(self, *exc: Any) -> None:
        for m, was_training in zip(self._eval_once, self._was_training):
            if was_training:
                m.train()

    def __call__(self, module_id: Any, obs: Any, explore: bool, t: int) -> dict[str, Any]:
        """One forward of ``module_id``'s module for all agents mapped to it."""
        start = time.perf_counter()
        module = self.modules[module_id]
        batch = {Columns.OBS: _to_tensor(obs, self.device)}
        explore_fn, inference_fn = self._forwards[module_id]
        with torch.no_grad():
            if explore:
                out = explore_fn(batch, t=(self.t_base + t) * self.num_runners)
            else:
                out = inference_fn(batch)
            out = dict(out)
            if _ACTIONS not in out and _DIST_INPUTS in out:  # RLlib's GetActions
                if explore:
                    dist_cls = module.get_exploration_action_dist_cls()
                else:
                    dist_cls = module.get_inference_action_dist_cls()
                dist = dist_cls.from_logits(out[_DIST_INPUTS])
                if not explore:
                    dist = dist.to_deterministic()
                actions = dist.sample()
                out[_ACTIONS] = actions
                if _LOGP not in out:
                    out[_LOGP] = dist.logp(actions)
        result = {_ACTIONS: _to_numpy(out.pop(_ACTIONS))}
        out.pop(_FOR_ENV, None)
        for key, value in out.items():
            result[key] = _to_numpy(value)
        self.inference_s += time.perf_counter() - start
        self.forwards += 1
        return result


def action_transforms(config: Any, action_spaces: dict[Any, gym.Space]) -> dict[Any, Any]:
    """Per module, RLlib's ``NormalizeAndClipActions`` on a batch of its actions.

    Only modules whose action space has a ``Box`` get one (the others' actions go
    to the env as they are); ``action_spaces``: ``{module_id: action space}``.
    """
    if not (config.normalize_actions or config.clip_actions):
        return {}
    fns = {}
    for mid, space in action_spaces.items():
        if not _has_box(space):
            continue
        struct = get_base_struct_from_space(space)
        if config.normalize_actions:
            fns[mid] = lambda a, s=struct: unsquash_action(a, s)
        else:
            fns[mid] = lambda a, s=struct: clip_action(a, s)
    return fns


def _has_box(space: gym.Space) -> bool:
    if isinstance(space, gym.spaces.Box):
        return True
    if isinstance(space, gym.spaces.Dict):
        return any(_has_box(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return any(_has_box(s) for s in space.spaces)
    return False
