"""``RLModule``: the neural network a runner acts with, and ``RLModuleSpec``, its recipe.

A module maps a batch dict (``Columns.OBS`` ...) to outputs such as
``Columns.ACTION_DIST_INPUTS``; runners call ``forward_exploration`` or
``forward_inference`` once per vector step, learners call ``forward_train``. Its
state is a flat dict of plain numpy arrays so that it crosses Ray cheaply and can be
written to disk without pickle. A spec is the picklable, JSON-able description from
which every runner builds its own copy of the module.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import warnings
from collections.abc import Collection, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from envrunners.core import DEFAULT_MODULE_ID
from envrunners.core.distribution.torch.torch_distribution import (
    TorchCategorical,
    TorchDiagGaussian,
    TorchMultiCategorical,
)
from envrunners.core.rl_module._flat_storage import (
    UNSET,
    FlatState,
    adopt_flat,
    flat_storage,
    flatten,
    matches,
    refused,
)
from envrunners.core.rl_module._space_codec import space_from_dict, space_to_dict
from envrunners.core.rl_module._state_entries import (
    drop_numpy_views,
    numpy_views,
    prefer_huge_pages,
    state_entries,
)
from envrunners.errors import ConfigError
from envrunners.utils.cow_arrays import AdoptableState

__all__ = ["RLModule", "RLModuleSpec"]

StateDict = dict[str, Any]
_STATE_FILE = "module_state.npz"


def _model_config_dict(model_config: Any) -> dict[str, Any]:
    """Normalise a model config (None, dict or dataclass such as DefaultModelConfig) to a dict."""
    if model_config is None:
        return {}
    if dataclasses.is_dataclass(model_config) and not isinstance(model_config, type):
        return dataclasses.asdict(model_config)
    if isinstance(model_config, Mapping):
        return dict(model_config)
    raise ConfigError(
        f"model_config must be a dict or a dataclass (e.g. DefaultModelConfig), "
        f"got {type(model_config).__name__}."
    )


def _flatten_state(state: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    flat: dict[str, np.ndarray] = {}
    for key, value in state.items():
        if isinstance(value, Mapping):
            flat.update(_flatten_state(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = np.asarray(value)
    return flat


def _unflatten_state(flat: Mapping[str, np.ndarray]) -> StateDict:
    state: StateDict = {}
    for key, value in flat.items():
        *parents, leaf = key.split("/")
        node = state
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return state


#: Whether torch has warned (once per process, under ``set_state``'s filter) that a
#: numpy array it wraps is read-only: later calls need no warnings filter.
_read_only_warned = False


def _can_adopt(array: Any, value: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether ``target`` may use ``value``'s memory (a writable numpy array) as its own."""
    return (
        isinstance(array, np.ndarray)
        and array.flags.writeable
        and value.dtype == target.dtype
        and target.device.type == "cpu"
        and target.layout == torch.strided
    )


def _qualname(obj: type | None) -> str | None:
    return None if obj is None else f"{obj.__module__}.{obj.__qualname__}"


def _import_qualname(path: str | None) -> Any:
    if path is None:
        return None
    module_name, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"Cannot import {path!r} named in an RLModuleSpec: {exc}") from exc


class RLModule(nn.Module):
    """Base class of all envrunners modules (a ``torch.nn.Module``).

    Subclasses build their layers in :meth:`setup` and compute in ``_forward`` (or
    in ``_forward_inference`` / ``_forward_exploration`` / ``_forward_train`` where
    those differ). They name the distribution their ``Columns.ACTION_DIST_INPUTS``
    parameterise through the ``get_*_action_dist_cls`` methods, which is all the
    runner needs to sample actions from any module.

    Args:
        observation_space: The (single-env) observation space the module reads.
        action_space: The (single-env) action space it acts in.
        inference_only: Build only what acting needs (runners set this).
        learner_only: The module only exists on learners (never on runners).
        model_config: Hyper-parameters, a dict or a dataclass like ``DefaultModelConfig``.
        catalog_class: Accepted for RLlib compatibility; stored, not used.
    """

    framework: str = "torch"

    def __init__(
        self,
        *,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        inference_only: bool = False,
        learner_only: bool = False,
        model_config: Any = None,
        catalog_class: type | None = None,
    ):
        nn.Module.__init__(self)
        self.observation_space = observation_space
        self.action_space = action_space
        self.inference_only = bool(inference_only)
        self.learner_only = bool(learner_only)
        self.model_config = _model_config_dict(model_config)
        self.catalog_class = catalog_class
        self.setup()

    def setup(self) -> None:
        """Build layers and other attributes; called at the end of ``__init__``."""

    # ------------------------------------------------------------------ forward passes
    def forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Outputs for greedy acting (``explore=False``); no gradients needed."""
        return self._forward_inference(batch, **kwargs)

    def forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Outputs for exploratory acting; runners pass the global timestep as ``t``."""
        return self._forward_exploration(batch, **kwargs)

    def forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Outputs a learner's loss needs (with gradients)."""
        return self._forward_train(batch, **kwargs)

    def forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """``nn.Module`` entry point: the training forward pass."""
        return self.forward_train(batch, **kwargs)

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """The one forward pass shared by all three modes unless a mode overrides it."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement _forward (or _forward_inference, "
            "_forward_exploration and _forward_train)."
        )

    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._forward(batch, **kwargs)

    def _forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._forward(batch, **kwargs)

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._forward(batch, **kwargs)

    # ------------------------------------------------------------------ distributions
    def get_inference_action_dist_cls(self) -> type:
        """Distribution class for ``forward_inference`` outputs (made deterministic by callers).

        Defaults (as for the other two): ``self.action_dist_cls`` if the module sets
        one, else categorical / multi-categorical / diagonal Gaussian by action space.
        """
        return self._default_action_dist_cls()

    def get_exploration_action_dist_cls(self) -> type:
        """Distribution class for ``forward_exploration`` outputs."""
        return self._default_action_dist_cls()

    def get_train_action_dist_cls(self) -> type:
        """Distribution class for ``forward_train`` outputs."""
        return self._default_action_dist_cls()

    def _default_action_dist_cls(self) -> type:
        """``self.action_dist_cls`` if set, else the usual family for the action space."""
        dist_cls = getattr(self, "action_dist_cls", None)
        if dist_cls is not None:
            return dist_cls
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            return TorchCategorical
        if isinstance(space, gym.spaces.MultiDiscrete):
            return TorchMultiCategorical.get_partial_dist_cls(input_lens=list(space.nvec.ravel()))
        if isinstance(space, gym.spaces.Box):
            return TorchDiagGaussian
        raise NotImplementedError(
            f"{type(self).__name__} names no action distribution for action space {space!r}: "
            "set `self.action_dist_cls` in setup() or override get_*_action_dist_cls()."
        )

    # ------------------------------------------------------------------ misc API
    def get_initial_state(self) -> dict[str, Any]:
        """Recurrent state for a new episode; ``{}`` for stateless modules."""
        return {}

    def is_stateful(self) -> bool:
        """Whether the module carries recurrent state between steps."""
        return bool(self.get_initial_state())

    def unwrapped(self) -> RLModule:
        """The module itself (wrappers such as DDP return the wrapped module)."""
        return self

    def as_multi_rl_module(self) -> Any:
        """Wrap this module into a ``MultiRLModule`` under ``DEFAULT_MODULE_ID``."""
        # The one import cycle of the package (allow-listed in tests/test_import_graph.py):
        # RLlib's API has the module return its own container, a subclass of RLModule.
        from envrunners.core.rl_module.multi_rl_module import MultiRLModule

        return MultiRLModule.from_modules({DEFAULT_MODULE_ID: self})

    def get_ctor_args_and_kwargs(self) -> tuple[tuple, dict[str, Any]]:
        """Arguments that rebuild an equal (untrained) module."""
        return (), {
            "observation_space": self.observation_space,
            "action_space": self.action_space,
            "inference_only": self.inference_only,
            "learner_only": self.learner_only,
            "model_config": dict(self.model_config),
            "catalog_class": self.catalog_class,
        }

    # ------------------------------------------------------------------ state
    def _apply(self, *args: Any, **kwargs: Any) -> Any:
        drop_numpy_views(self)  # ``.to()``, ``.float()``: new storage; the views keep the old
        return super()._apply(*args, **kwargs)

    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        inference_only: bool = False,
        copy: bool = True,
        **kwargs: Any,
    ) -> StateDict:
        """Return the weights (and buffers) as ``{name: numpy array}``.

        Once the module keeps its entries in one buffer (the first ``copy=False``
        read, as a weight sync does), this is a ``FlatState``: the same dict, whose
        arrays are views of one array that crosses Ray as one buffer.

        Args:
            components: Ignored by single modules (``MultiRLModule`` selects by id).
            not_components: Ignored by single modules.
            inference_only: Leave out what an ``inference_only`` copy of this module
                does not have (e.g. the value branch), for syncing to runners.
            copy: Return snapshots (default). ``False`` returns views of CPU weights
                that change when the module trains, saving a copy for immediate sends.
            **kwargs: Accepted and ignored, for RLlib call compatibility.
        """
        entries = state_entries(self)
        flat = self._flat_get_state(entries, inference_only, copy)
        if flat is not None:
            return flat
        targets = numpy_views(self, entries)
        state: StateDict
        if targets is not None:  # all on CPU: the cached views (new array objects of them)
            if not copy:  # (views are read for sending: large ones read faster from huge pages)
                prefer_huge_pages(self, targets)
            state = {name: view.copy() if copy else view.view() for name, view in targets[0]}
        else:
            state = {}
            for name, tensor in entries.items():
                array = tensor.detach().cpu().numpy()
                state[name] = array.copy() if copy and tensor.device.type == "cpu" else array
        if inference_only and not self.inference_only:
            state = self._inference_only_get_state_hook(state)
        return state

    def _inference_only_get_state_hook(self, state: StateDict) -> StateDict:
        """Drop the entries an ``inference_only`` copy lacks; the base keeps everything."""
        return state

    def _flat_get_state(
        self, entries: dict[str, torch.Tensor], inference_only: bool, copy: bool
    ) -> FlatState | None:
        """The state as a ``FlatState`` (one array), or None where the entries are not flat.

        A read for sending (``copy=False``) first moves the (CPU) entries into one
        buffer, the ``inference_only`` ones first, so both the full and the inference
        state are one slice of it (see ``_flat_storage``).
        """
        record = flat_storage(self, entries)
        if record is None:
            if copy or refused(self, entries) or numpy_views(self, entries) is None:
                return None  # (numpy_views: the entries are cached and on the CPU)
            kept = self._inference_names(entries)
            order = list(entries)
            if kept is not None:
                order = list(kept) + [name for name in entries if name not in set(kept)]
            record = flatten(self, entries, order)
            if record is None:  # (not tried again until the entries change)
                return None
            record.inference_names = kept
            drop_numpy_views(self)
        names = record.layout[1]
        if inference_only and not self.inference_only:
            if record.inference_names is UNSET:
                record.inference_names = self._inference_names(entries)
            names = record.inference_names
            if names is None:
                return None
        return record.state_of(names, copy)

    def _inference_names(self, entries: dict[str, torch.Tensor]) -> tuple[str, ...] | None:
        """The names ``get_state(inference_only=True)`` returns; None if the hook cannot say."""
        if self.inference_only:
            return tuple(entries)
        try:
            return tuple(self._inference_only_get_state_hook(dict(entries)))
        except Exception:  # a hook that needs numpy values: no flat inference state
            return None

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Load weights from ``{name: numpy array or tensor}``, as ``get_state`` returns.

        Extra entries are ignored (a full learner state may load into an
        ``inference_only`` copy); a missing entry or a wrong shape is an error.
        An ``AdoptableState`` (copy-on-write views a remote runner made of pushed
        weights, see ``envrunners.utils.cow_arrays``) is not copied: its CPU arrays
        become the parameters' storage; the previous storage is dropped.

        Raises:
            ValueError: ``state`` lacks some of this module's entries or has wrong shapes.
        """
        own = state_entries(self)
        if type(state) is FlatState and state.flat is not None and self._set_flat_state(own, state):
            return
        missing = [k for k in own if k not in state]
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ValueError(
                f"{type(self).__name__}.set_state: the state lacks {len(missing)} of the "
                f"module's {len(own)} entries ({shown}); state keys: {sorted(state)[:5]}..."
            )
        adopt = isinstance(state, AdoptableState)
        # Copying into adopted (copy-on-write) storage would fault in every page;
        # fresh memory is faster and drops the object-store pages at once.
        fresh = getattr(self, "_adopted_storage", False)
        if not adopt and not fresh and self._copy_numpy(own, state):
            # Plain flags: ``object.__setattr__`` skips nn.Module's parameter/buffer checks.
            object.__setattr__(self, "_adopted_storage", False)
            #: Whether this call gave some parameter new storage (views of the old are stale).
            object.__setattr__(self, "_storage_replaced", False)
            return
        if _read_only_warned or adopt:  # (adoptable arrays are writable: no warning)
            pairs = self._state_pairs(own, state, adopt)
        else:  # (``catch_warnings`` costs ~0.1 ms: only until torch has warned once)
            with warnings.catch_warnings():
                # Read-only arrays (from Ray's object store) are only read from here.
                warnings.filterwarnings("ignore", message=".*not writable.*")
                pairs = self._state_pairs(own, state, adopt)
        adopted = False
        targets, values = [], []
        with torch.no_grad():  # all checked first, so a bad state changes nothing
            for target, value, take in pairs:
                if take:
                    target.data = value
                    adopted = True
                elif fresh:
                    target.data = torch.empty_like(target).copy_(value)
                else:
                    targets.append(target)
                    values.append(value)
            if targets:
                # One dispatch for all in-place copies (a small module's dozen copy_
                # calls cost more than the bytes they move).
                torch._foreach_copy_(targets, values)
        replaced = adopted or (fresh and bool(pairs))
        if replaced:
            drop_numpy_views(self)  # (its views would keep the old storage alive)
        object.__setattr__(self, "_adopted_storage", adopted)
        object.__setattr__(self, "_storage_replaced", replaced)

    def _set_flat_state(self, own: dict[str, torch.Tensor], state: FlatState) -> bool:
        """Load a ``FlatState`` with one copy (or adopt its array); False: not flat here.

        A module whose entries are exactly the state's (names, shapes, dtype) is
        moved into one buffer of that layout the first time (see ``_flat_storage``).
        """
        record = flat_storage(self, own)
        same = record is not None and record.layout == state.layout
        if not same and (
            refused(self, own) or numpy_views(self, own) is None or not matches(own, state.layout)
        ):
            return False
        # (No ``torch.no_grad()``: nothing here records autograd operations.)
        replaced = True
        if state.adoptable:
            adopt_flat(self, own, state)
        elif not same or getattr(self, "_adopted_storage", False):
            # (Copying into adopted, copy-on-write pages would fault in every page:
            # fresh memory is faster and lets go of the object store's pages.)
            if flatten(self, own, state.layout[1], source=state.flat) is None:
                return False
        else:
            np.copyto(record.array, state.flat)
            torch.autograd.graph.increment_version(record.tensors)
            replaced = False
        if replaced:
            drop_numpy_views(self)
        object.__setattr__(self, "_adopted_storage", state.adoptable)
        object.__setattr__(self, "_storage_replaced", replaced)
        return True

    def _copy_numpy(self, own: dict[str, torch.Tensor], state: Mapping[str, Any]) -> bool:
        """Copy ``state`` into the module with ``np.copyto`` if every entry is a numpy
        array of the parameter's dtype and shape on CPU (else change nothing); whether it did.

        Why: the same bytes as ``torch._foreach_copy_``, without a tensor per entry and
        torch's dispatch (about 45 us against 180 us in an idle runner, default module).
        """
        targets = numpy_views(self, own)
        if targets is None:
            return False
        views, tensors = targets
        values = []
        for name, view in views:
            value = state[name]
            if type(value) is not np.ndarray or value.dtype != view.dtype:
                return False
            if value.shape != view.shape:
                return False  # (the torch path raises the error)
            values.append(value)
        for (_, view), value in zip(views, values):
            np.copyto(view, value)
        torch.autograd.graph.increment_version(tensors)  # as ``copy_`` would: autograd sees it
        return True

    def _state_pairs(
        self, own: Mapping[str, torch.Tensor], state: Mapping[str, Any], adopt: bool
    ) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
        """``(target, value as a tensor, adopt it)`` per entry; raises on a wrong shape."""
        global _read_only_warned
        pairs = []
        for name, target in own.items():
            array = state[name]
            value = array
            if not isinstance(value, torch.Tensor):
                value = torch.from_numpy(np.asarray(value))
                if isinstance(array, np.ndarray) and not array.flags.writeable:
                    _read_only_warned = True  # (only called under the filter while False)
            if value.shape != target.shape:
                raise ValueError(
                    f"{type(self).__name__}.set_state: {name!r} has shape "
                    f"{tuple(value.shape)}, the module expects {tuple(target.shape)}."
                )
            pairs.append((target, value, adopt and _can_adopt(array, value, target)))
        return pairs

    def save_to_path(self, path: str | os.PathLike) -> str:
        """Write the state as ``<path>/module_state.npz`` (numpy's format, no pickle).

        Returns:
            The directory written to.
        """
        path = os.fspath(path)
        os.makedirs(path, exist_ok=True)
        np.savez(os.path.join(path, _STATE_FILE), **_flatten_state(self.get_state()))
        return path

    def restore_from_path(self, path: str | os.PathLike) -> None:
        """Load a state written by :meth:`save_to_path` (a directory or the ``.npz`` file)."""
        path = os.fspath(path)
        file = os.path.join(path, _STATE_FILE) if os.path.isdir(path) else path
        with np.load(file, allow_pickle=False) as data:
            self.set_state(_unflatten_state({k: data[k] for k in data.files}))


@dataclasses.dataclass
class RLModuleSpec:
    """What to build: a module class plus its spaces and config.

    Runners receive the spec (not the module) and call :meth:`build`, so every
    process owns an independent module.
    """

    module_class: type[RLModule] | None = None
    observation_space: gym.Space | None = None
    action_space: gym.Space | None = None
    inference_only: bool = False
    learner_only: bool = False
    model_config: dict[str, Any] | Any | None = None
    catalog_class: type | None = None
    load_state_path: str | None = None

    def build(self) -> RLModule:
        """Instantiate the module (and load ``load_state_path`` if set).

        Raises:
            ConfigError: The class or a space is missing, or ``model_config`` asks for
                ``use_lstm`` but the built module is not stateful (a custom module
                class that ignores the key).
        """
        missing = [
            name
            for name in ("module_class", "observation_space", "action_space")
            if getattr(self, name) is None
        ]
        if missing:
            raise ConfigError(
                f"RLModuleSpec.build(): {', '.join(missing)} not set; a spec needs a module "
                "class and both spaces (the runner fills the spaces from its env)."
            )
        module = self.module_class(  # type: ignore[misc]
            observation_space=self.observation_space,
            action_space=self.action_space,
            inference_only=self.inference_only,
            learner_only=self.learner_only,
            model_config=_model_config_dict(self.model_config),
            catalog_class=self.catalog_class,
        )
        if module.model_config.get("use_lstm") and not module.is_stateful():
            raise ConfigError(
                f"model_config['use_lstm']=True, but {self.module_class.__qualname__} is not "
                "stateful (its get_initial_state() is empty): use_lstm only wraps the default "
                "module's encoder in an LSTM. Drop use_lstm, use the default module "
                "(RLModuleSpec without module_class), or give the custom module its own "
                "recurrence (get_initial_state(), Columns.STATE_IN / STATE_OUT)."
            )
        if self.load_state_path is not None:
            module.restore_from_path(self.load_state_path)
        return module

    def update(self, other: RLModuleSpec, override: bool = True) -> None:
        """Fill this spec from ``other``.

        Args:
            other: The spec to take values from.
            override: ``True``: every value ``other`` sets wins (booleans always,
                ``model_config`` dicts are merged key by key). ``False``: only fields
                still ``None`` here are filled.
        """
        if not isinstance(other, RLModuleSpec):
            raise ConfigError(
                f"RLModuleSpec.update() needs another RLModuleSpec, got {type(other).__name__}."
            )
        for field in dataclasses.fields(self):
            mine, theirs = getattr(self, field.name), getattr(other, field.name)
            if not override:
                if mine is None:
                    setattr(self, field.name, theirs)
            elif field.name in ("inference_only", "learner_only"):
                setattr(self, field.name, theirs)
            elif field.name == "model_config" and theirs is not None:
                merged = {**_model_config_dict(mine), **_model_config_dict(theirs)}
                setattr(self, field.name, merged)
            elif theirs is not None:
                setattr(self, field.name, theirs)

    def as_multi_rl_module_spec(self) -> Any:
        """This spec as the only entry (``DEFAULT_MODULE_ID``) of a ``MultiRLModuleSpec``."""
        # Same allow-listed cycle as ``RLModule.as_multi_rl_module``: RLlib's API returns
        # the container spec from the single-module spec.
        from envrunners.core.rl_module.multi_rl_module import MultiRLModuleSpec

        return MultiRLModuleSpec(rl_module_specs={DEFAULT_MODULE_ID: self})

    def to_serializable_dict(self) -> dict[str, Any]:
        """Encode as JSON-able data: classes by import path, spaces as plain dicts."""
        return {
            "module_class": _qualname(self.module_class),
            "observation_space": space_to_dict(self.observation_space),
            "action_space": space_to_dict(self.action_space),
            "inference_only": self.inference_only,
            "learner_only": self.learner_only,
            "model_config": _model_config_dict(self.model_config),
            "catalog_class": _qualname(self.catalog_class),
            "load_state_path": self.load_state_path,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RLModuleSpec:
        """Decode what :meth:`to_serializable_dict` produced."""
        return cls(
            module_class=_import_qualname(data.get("module_class")),
            observation_space=space_from_dict(data.get("observation_space")),
            action_space=space_from_dict(data.get("action_space")),
            inference_only=bool(data.get("inference_only", False)),
            learner_only=bool(data.get("learner_only", False)),
            model_config=data.get("model_config"),
            catalog_class=_import_qualname(data.get("catalog_class")),
            load_state_path=data.get("load_state_path"),
        )

    def to_json(self) -> str:
        """The serializable dict as a JSON string."""
        return json.dumps(self.to_serializable_dict())
