"""Building blocks of the default MLP module: space checks, config defaults, MLP stacks.

Kept apart from ``default_torch_rl_module`` so that module reads as the module and its
acting path; nothing here is public.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from envrunners.core.rl_module.default_model_config import DefaultModelConfig
from envrunners.errors import ConfigError

_ACTIVATIONS = {
    "tanh": torch.tanh,
    "relu": torch.relu,
    "swish": F.silu,
    "silu": F.silu,
    "elu": F.elu,
    "linear": None,
    None: None,
}
_HOW_TO_CUSTOMIZE = (
    "Supported by the default module: observations Box (flattened), Discrete, "
    "MultiDiscrete (one-hot) and MultiBinary; actions Discrete, MultiDiscrete and 1-D Box. "
    "Flatten the space with a gymnasium wrapper (e.g. FlattenObservation) or supply your "
    "own module: config.rl_module(rl_module_spec=RLModuleSpec(module_class=MyModule))."
)


def _check_spaces(observation_space: gym.Space, action_space: gym.Space) -> None:
    """Raise ConfigError unless the default module supports both spaces."""
    obs_ok = isinstance(
        observation_space,
        (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary),
    )
    if not obs_ok:
        raise ConfigError(
            f"The default RLModule cannot read observation space {observation_space!r}. "
            + _HOW_TO_CUSTOMIZE
        )
    if isinstance(action_space, gym.spaces.Box):
        ok = len(action_space.shape) == 1
    elif isinstance(action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        ok = bool(np.all(action_space.start == 0))
    else:
        ok = False
    if not ok:
        raise ConfigError(
            f"The default RLModule cannot act in action space {action_space!r} "
            "(Discrete/MultiDiscrete need start=0, Box must be 1-D). " + _HOW_TO_CUSTOMIZE
        )


def _resolve_model_config(model_config: dict[str, Any]) -> dict[str, Any]:
    """``DefaultModelConfig`` defaults overlaid with the known keys of ``model_config``."""
    known = {f.name for f in DefaultModelConfig.__dataclass_fields__.values()}
    if model_config.get("use_lstm") or model_config.get("conv_filters"):
        raise ConfigError(
            "The default RLModule is an MLP: model_config use_lstm/conv_filters are not "
            "supported; supply a custom RLModuleSpec."
        )
    cfg = {**vars(DefaultModelConfig()), **{k: v for k, v in model_config.items() if k in known}}
    for key in ("fcnet_activation", "head_fcnet_activation"):
        if cfg[key] not in _ACTIVATIONS:
            raise ConfigError(
                f"model_config[{key!r}]={cfg[key]!r} is not one of "
                f"{sorted(str(a) for a in _ACTIVATIONS)}."
            )
    return cfg


class _MLP(nn.Module):
    """Linear layers with an activation after each (the last one only if ``activate_last``)."""

    def __init__(self, sizes: list[int], activation: str | None, activate_last: bool):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.activation = activation
        self.activate_last = activate_last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = _ACTIVATIONS[self.activation]
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if act is not None and (i < last or self.activate_last):
                x = act(x)
        return x

    def plan(self, numpy_tanh: bool) -> list[tuple[torch.Tensor, torch.Tensor, Any]]:
        """``(weight, bias, in-place activation or None)`` per layer, for the fast path."""
        last = len(self.layers) - 1
        out = []
        for i, layer in enumerate(self.layers):
            act = None
            if self.activation not in ("linear", None) and (i < last or self.activate_last):
                act = _inplace_activation(self.activation, numpy_tanh)
            out.append((layer.weight, layer.bias, act))
        return out


def _np_tanh_(x: torch.Tensor) -> None:
    """In-place tanh through numpy's SIMD kernel (this torch CPU build's tanh is scalar)."""
    array = x.numpy()
    np.tanh(array, out=array)


def _inplace_activation(name: str, numpy_tanh: bool) -> Any:
    """An in-place activation callable for the acting path."""
    if name == "tanh":
        return _np_tanh_ if numpy_tanh else torch.Tensor.tanh_
    if name == "relu":
        return torch.Tensor.relu_
    if name in ("swish", "silu"):
        return lambda x: F.silu(x, inplace=True)
    return lambda x: F.elu(x, inplace=True)


def _run(plan: list[tuple[torch.Tensor, torch.Tensor, Any]], x: torch.Tensor) -> torch.Tensor:
    """Apply a ``_MLP.plan()`` to ``x`` (no autograd bookkeeping beyond the caller's mode)."""
    for weight, bias, act in plan:
        x = F.linear(x, weight, bias)
        if act is not None:
            act(x)
    return x
