"""How the default module reads observation spaces and acts in action spaces.

``ObservationLayout`` turns a batch of observations into the encoder's input:
an image (3-D ``Box``) goes to the CNN as is; anything else becomes one float
vector per row (``Box`` flattened, ``Discrete``/``MultiDiscrete`` one-hot,
``MultiBinary`` as floats, ``Dict``/``Tuple`` the concatenation of their leaves,
so the default module reads them without a FlattenObservations connector).
``ActionLayout`` names the distribution (and its input width) for an action
space, one ``TorchMultiDistribution`` child per leaf of a ``Dict``/``Tuple``.
Both reject, at build time, a space they cannot handle, naming it and its path.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from envrunners.core import _nested
from envrunners.core.distribution.torch.torch_distribution import (
    TorchCategorical,
    TorchDiagGaussian,
    TorchMultiCategorical,
    TorchMultiDistribution,
)
from envrunners.errors import ConfigError

__all__ = ["ActionLayout", "ObservationLayout", "cast_to_space", "is_image_space"]

_HOW_TO_CUSTOMIZE = (
    "Supported by the default module: observations Box (images: 3-D H x W x C), "
    "Discrete, MultiDiscrete, MultiBinary and Dict/Tuple of those; actions Discrete, "
    "MultiDiscrete, 1-D Box and Dict/Tuple of those. Convert the space with a gymnasium "
    "wrapper or supply your own module: "
    "config.rl_module(rl_module_spec=RLModuleSpec(module_class=MyModule))."
)


def is_image_space(space: gym.Space) -> bool:
    """A 3-D ``Box``: RLlib's default module reads it with a CNN."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3


def _what(kind: str, leaf: gym.Space, path: tuple, whole: gym.Space) -> str:
    """``"<kind> space X"`` at the top level, else ``"the <kind> leaf X at ['a'][0] of ..."``."""
    if not path:
        return f"{kind} space {leaf!r}"
    where = "".join(f"[{p!r}]" for p in path)
    return f"the {kind} leaf {leaf!r} at {where} of {kind} space {whole!r}"


def _space_leaves(space: gym.Space, path: tuple = ()) -> list[tuple[tuple, gym.Space]]:
    """``(path, leaf space)`` of a possibly nested ``Dict``/``Tuple`` space."""
    if isinstance(space, gym.spaces.Dict):
        return [leaf for k, s in space.spaces.items() for leaf in _space_leaves(s, (*path, k))]
    if isinstance(space, gym.spaces.Tuple):
        return [leaf for i, s in enumerate(space.spaces) for leaf in _space_leaves(s, (*path, i))]
    return [(path, space)]


def space_structure(space: gym.Space) -> Any:
    """The space's nesting with its leaf spaces at the leaves (dicts and tuples)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: space_structure(s) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(space_structure(s) for s in space.spaces)
    return space


class _LeafEncoder:
    """One observation leaf as ``(N, width)`` float32."""

    def __init__(self, space: gym.Space, path: tuple, whole: gym.Space):
        self.space = space
        if isinstance(space, gym.spaces.Discrete):
            self.kind, self.width = "one_hot", int(space.n)
            self.start = int(space.start)
        elif isinstance(space, gym.spaces.MultiDiscrete):
            self.kind, self.width = "multi_one_hot", int(space.nvec.sum())
            offsets = np.concatenate([[0], np.cumsum(space.nvec.ravel())[:-1]])
            self.offsets_np = (offsets - space.start.ravel()).astype(np.int64)
            self.offsets = torch.as_tensor(self.offsets_np)
        elif isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary)):
            self.kind = "flat"
            self.width = int(np.prod(space.shape)) if space.shape else 1
        else:
            raise ConfigError(
                f"The default RLModule cannot read {_what('observation', space, path, whole)}. "
                + _HOW_TO_CUSTOMIZE
            )

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        rows = obs.shape[0]
        if self.kind == "one_hot":
            return F.one_hot(obs.long().reshape(-1) - self.start, self.width).float()
        if self.kind == "multi_one_hot":
            index = obs.long().reshape(rows, -1) + self.offsets.to(obs.device)
            out = torch.zeros(rows, self.width, device=obs.device)
            return out.scatter_(1, index, 1.0)
        x = obs.reshape(rows, -1)
        return x if x.dtype == torch.float32 else x.float()

    def write_numpy(self, obs: Any, out: np.ndarray) -> None:
        """What ``__call__`` returns, for numpy ``obs``, written into the ``(N, width)``
        float32 ``out`` (the same numbers: one-hot, or the values cast to float32)."""
        obs = np.asarray(obs)
        rows = out.shape[0]
        if self.kind == "flat":
            out[:] = obs.reshape(rows, -1)
            return
        out[:] = 0.0
        if self.kind == "one_hot":
            out[np.arange(rows), obs.reshape(-1).astype(np.int64) - self.start] = 1.0
        else:
            index = obs.reshape(rows, -1).astype(np.int64) + self.offsets_np
            out[np.arange(rows)[:, None], index] = 1.0


class ObservationLayout:
    """The encoder input for an observation space (see the module docstring).

    Attributes:
        image: The space is an image; :meth:`encode` returns it unchanged (the CNN casts).
        nested: The space is a ``Dict``/``Tuple``; observations are nested too.
        flat: The space is a non-image ``Box``/``MultiBinary``: each observation,
            flattened, already is the encoder input (others are encoded: one-hot,
            leaves concatenated).
        in_dim: Width of the flat encoding (``None`` for images).
    """

    def __init__(self, space: gym.Space):
        self.space = space
        self.image = is_image_space(space)
        self.nested = isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))
        self.flat = isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary)) and not self.image
        if self.image:
            self.leaves: list[_LeafEncoder] = []
            self.in_dim: int | None = None
            return
        self.leaves = [_LeafEncoder(s, p, space) for p, s in _space_leaves(space)]
        self.in_dim = sum(leaf.width for leaf in self.leaves)

    def to_tensor(self, obs: Any, device: torch.device | None = None) -> Any:
        """Observations (numpy, nested numpy or tensors) as tensors, dtypes kept."""
        return _nested.map_structure(lambda x: _as_tensor(x, device), obs)

    def encode(self, obs: Any) -> torch.Tensor:
        """``(N, ...)`` observations (tensors, nested like the space) -> encoder input."""
        if self.image:
            return obs
        if not self.nested:
            return self.leaves[0](obs)
        parts = _nested.flatten(obs)
        if len(parts) != len(self.leaves):
            raise ValueError(
                f"The observation has {len(parts)} leaves, its space {self.space!r} "
                f"{len(self.leaves)}."
            )
        return torch.cat([leaf(x) for leaf, x in zip(self.leaves, parts)], dim=-1)

    def encode_numpy(self, obs: Any) -> np.ndarray:
        """:meth:`encode` on numpy: ``(N, ...)`` observations (numpy, nested like the
        space) -> the ``(N, in_dim)`` float32 encoder input (not for images)."""
        parts = _nested.flatten(obs) if self.nested else [obs]
        if len(parts) != len(self.leaves):
            raise ValueError(
                f"The observation has {len(parts)} leaves, its space {self.space!r} "
                f"{len(self.leaves)}."
            )
        out = np.empty((len(np.asarray(parts[0])), self.in_dim), np.float32)
        col = 0
        for leaf, x in zip(self.leaves, parts, strict=True):
            leaf.write_numpy(x, out[:, col : col + leaf.width])
            col += leaf.width
        return out


def _as_tensor(x: Any, device: torch.device | None) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x if device is None else x.to(device)
    array = np.asarray(x)
    if not array.flags.writeable:
        array = array.copy()
    tensor = torch.from_numpy(array)
    return tensor if device is None else tensor.to(device)


def _leaf_distribution(space: gym.Space, path: tuple, whole: gym.Space) -> tuple[type, int]:
    """``(distribution class, input width)`` for one action leaf."""
    if isinstance(space, gym.spaces.Discrete) and int(space.start) == 0:
        return TorchCategorical, int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete) and bool(np.all(space.start == 0)):
        nvec = [int(n) for n in space.nvec.ravel()]
        return TorchMultiCategorical.get_partial_dist_cls(input_lens=nvec), sum(nvec)
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return TorchDiagGaussian, 2 * int(space.shape[0])
    raise ConfigError(
        f"The default RLModule cannot act in {_what('action', space, path, whole)} "
        "(Discrete/MultiDiscrete need start=0, Box must be 1-D). " + _HOW_TO_CUSTOMIZE
    )


class ActionLayout:
    """The action distribution for an action space.

    Attributes:
        kind: ``"categorical"``, ``"multi_categorical"``, ``"gaussian"`` or ``"multi"``
            (a ``Dict``/``Tuple`` space).
        dist_cls: The distribution class (a bound ``get_partial_dist_cls`` where needed).
        dist_dim: Width of ``ACTION_DIST_INPUTS``.
        log_std_mask: ``"multi"`` only: True at the inputs that are Gaussian log-stds.
        one_hot_dim: Width of a previous action's encoding (one-hot for discrete parts).
    """

    def __init__(self, space: gym.Space):
        self.space = space
        leaves = _space_leaves(space)
        children = [_leaf_distribution(s, p, space) for p, s in leaves]
        if not isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            self.dist_cls, self.dist_dim = children[0]
            self.kind = {
                gym.spaces.Discrete: "categorical",
                gym.spaces.MultiDiscrete: "multi_categorical",
            }.get(type(space), "gaussian")
            self.log_std_mask = None
        else:
            self.kind = "multi"
            structure = space_structure(space)
            lens = [w for _, w in children]
            self.dist_cls = TorchMultiDistribution.get_partial_dist_cls(
                child_distribution_cls_struct=_nested.unflatten_as(
                    structure, [c for c, _ in children]
                ),
                input_lens=lens,
            )
            self.dist_dim = sum(lens)
            mask = []
            for (_, leaf), width in zip(leaves, lens):
                gaussian = isinstance(leaf, gym.spaces.Box)
                mask += [False] * (width // 2 if gaussian else width)
                mask += [True] * (width // 2 if gaussian else 0)
            self.log_std_mask = torch.tensor(mask) if any(mask) else None
        self._prev_action_encoders = [_LeafEncoder(s, p, space) for p, s in leaves]
        self.one_hot_dim = sum(e.width for e in self._prev_action_encoders)

    def prev_action_encoding(self, actions: Any) -> torch.Tensor:
        """``(N, one_hot_dim)`` float encoding of previous actions (for the LSTM input)."""
        parts = _nested.flatten(actions) if self.kind == "multi" else [actions]
        encoders = self._prev_action_encoders
        return torch.cat([encode(x) for encode, x in zip(encoders, parts)], dim=-1)


def cast_to_space(actions: Any, space: gym.Space | None) -> Any:
    """Numpy actions in the space's dtypes (leaf by leaf for ``Dict`` / ``Tuple`` spaces)."""
    if space is None:
        return actions
    if isinstance(space, gym.spaces.Dict):
        return {k: cast_to_space(actions[k], s) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(cast_to_space(a, s) for a, s in zip(actions, space.spaces))
    actions = np.asarray(actions)
    dtype = getattr(space, "dtype", None)
    return actions if dtype is None or actions.dtype == dtype else actions.astype(dtype)
