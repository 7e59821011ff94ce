"""``MultiRLModule``: several RLModules under module ids, and ``MultiRLModuleSpec`` to build one.

Multi-agent runners act with one module per policy; the container routes each
module id's batch to its module and keeps their states apart (nested by id), so a
learner can sync one policy without touching the others.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Collection, Iterator, KeysView, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from torch import nn

from envrunners.core.rl_module.rl_module import (
    RLModule,
    RLModuleSpec,
    StateDict,
    _import_qualname,
    _model_config_dict,
    _qualname,
    _unflatten_state,
)
from envrunners.errors import ConfigError, UnknownPolicyError, suggest

__all__ = ["MultiRLModule", "MultiRLModuleSpec"]


def _as_list(value: str | Collection[str] | None) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def _selected(
    module_id: str, components: list[str] | None, not_components: list[str] | None
) -> bool:
    """Checkpointable-style selection: ``"p0"`` or ``"p0/..."`` picks module ``p0``."""
    if not_components and module_id in not_components:
        return False
    if components is None:
        return True
    return any(c == module_id or c.startswith(module_id + "/") for c in components)


def _torch_name(module_id: str) -> str:
    """A torch-legal submodule name for any module id (ids may contain dots)."""
    return "m_" + module_id.replace("%", "%25").replace(".", "%2E")


class MultiRLModule(RLModule):
    """A dict-like container of RLModules keyed by module (policy) id.

    Sub-modules are registered with torch, so ``.to(device)``, ``.parameters()`` and
    ``.eval()`` reach all of them. Forward passes take ``{module_id: batch}`` and
    return ``{module_id: outputs}``.

    Args:
        rl_module_specs: ``{module_id: RLModuleSpec}`` to build the sub-modules from.
        observation_space, action_space, inference_only, learner_only, model_config,
        catalog_class: As for :class:`RLModule`; describe the container itself.
    """

    def __init__(
        self,
        *,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        inference_only: bool = False,
        learner_only: bool = False,
        model_config: Any = None,
        catalog_class: type | None = None,
        rl_module_specs: Mapping[str, RLModuleSpec] | None = None,
    ):
        self._init_specs = dict(rl_module_specs or {})
        super().__init__(
            observation_space=observation_space,
            action_space=action_space,
            inference_only=inference_only,
            learner_only=learner_only,
            model_config=model_config,
            catalog_class=catalog_class,
        )

    def setup(self) -> None:
        """Build one sub-module per spec given to the constructor."""
        self._rl_modules: dict[str, RLModule] = {}
        self._torch_container = nn.Module()
        for module_id, spec in self._init_specs.items():
            if not isinstance(spec, RLModuleSpec):
                raise ConfigError(
                    f"MultiRLModule: rl_module_specs[{module_id!r}] must be an RLModuleSpec, "
                    f"got {type(spec).__name__}; use MultiRLModule.from_modules() for instances."
                )
            self.add_module(module_id, spec.build())
        del self._init_specs

    @classmethod
    def from_modules(cls, modules: Mapping[str, RLModule]) -> MultiRLModule:
        """Build a container around already constructed modules."""
        multi = cls()
        for module_id, module in modules.items():
            multi.add_module(module_id, module)
        return multi

    # ------------------------------------------------------------------ dict-like API
    def add_module(self, module_id: str, module: RLModule, *, override: bool = False) -> None:  # type: ignore[override]
        """Add ``module`` under ``module_id``.

        Raises:
            ValueError: The id exists and ``override`` is False.
            TypeError: ``module`` is not an RLModule.
        """
        if not isinstance(module, RLModule):
            raise TypeError(f"add_module: expected an RLModule, got {type(module).__name__}.")
        if not isinstance(module_id, str) or not module_id or "/" in module_id:
            raise ValueError(
                f"add_module: module id must be a non-empty str without '/', got {module_id!r}."
            )
        if module_id in self._rl_modules and not override:
            raise ValueError(
                f"Module id {module_id!r} already exists; pass override=True to replace it."
            )
        self._rl_modules[module_id] = module
        nn.Module.add_module(self._torch_container, _torch_name(module_id), module)
        self._refresh_spaces()

    def remove_module(self, module_id: str, *, raise_err_if_not_found: bool = True) -> None:
        """Remove the module under ``module_id``.

        Raises:
            UnknownPolicyError: The id is unknown and ``raise_err_if_not_found``.
        """
        if module_id not in self._rl_modules:
            if raise_err_if_not_found:
                self._unknown(module_id)
            return
        del self._rl_modules[module_id]
        delattr(self._torch_container, _torch_name(module_id))
        self._refresh_spaces()

    def _refresh_spaces(self) -> None:
        modules = self._rl_modules.values()
        if modules and all(m.observation_space is not None for m in modules):
            self.observation_space = gym.spaces.Dict(
                {mid: m.observation_space for mid, m in self._rl_modules.items()}
            )
        if modules and all(m.action_space is not None for m in modules):
            self.action_space = gym.spaces.Dict(
                {mid: m.action_space for mid, m in self._rl_modules.items()}
            )

    def _unknown(self, module_id: Any) -> None:
        raise UnknownPolicyError(
            f"Module id {module_id!r} is not in this MultiRLModule (has: "
            f"{sorted(self._rl_modules)}).{suggest(module_id, self._rl_modules)}"
        )

    def __getitem__(self, module_id: str) -> RLModule:
        module = self._rl_modules.get(module_id)
        if module is None:
            self._unknown(module_id)
        return module  # type: ignore[return-value]

    def get(self, module_id: str, default: Any = None) -> Any:
        """The module under ``module_id`` or ``default``."""
        return self._rl_modules.get(module_id, default)

    def __contains__(self, module_id: object) -> bool:
        return module_id in self._rl_modules

    def __len__(self) -> int:
        return len(self._rl_modules)

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]
        return iter(self._rl_modules)

    def keys(self) -> KeysView[str]:
        """The module ids."""
        return self._rl_modules.keys()

    def values(self) -> Any:
        """The modules."""
        return self._rl_modules.values()

    def items(self) -> Any:
        """``(module_id, module)`` pairs."""
        return self._rl_modules.items()

    def foreach_module(
        self, func: Callable[..., Any], *, return_dict: bool = False, **kwargs: Any
    ) -> list[Any] | dict[str, Any]:
        """Call ``func(module_id, module, **kwargs)`` for each module; list (or dict) of results."""
        results = {mid: func(mid, m.unwrapped(), **kwargs) for mid, m in self._rl_modules.items()}
        return results if return_dict else list(results.values())

    # ------------------------------------------------------------------ forward passes
    def _dispatch(
        self, method: str, batch: Mapping[str, Any], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        outputs = {}
        for module_id, sub_batch in batch.items():
            outputs[module_id] = getattr(self[module_id], method)(sub_batch, **kwargs)
        return outputs

    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._dispatch("forward_inference", batch, kwargs)

    def _forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._dispatch("forward_exploration", batch, kwargs)

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._dispatch("forward_train", batch, kwargs)

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._dispatch("forward_train", batch, kwargs)

    def get_initial_state(self) -> dict[str, Any]:
        """``{module_id: initial state}`` for the stateful sub-modules."""
        return {
            mid: m.get_initial_state() for mid, m in self._rl_modules.items() if m.is_stateful()
        }

    # ------------------------------------------------------------------ state
    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        inference_only: bool = False,
        copy: bool = True,
        **kwargs: Any,
    ) -> StateDict:
        """``{module_id: module.get_state(...)}`` for the selected modules.

        Args:
            components: Module ids (or ``"id/..."`` paths) to include; ``None``: all.
            not_components: Module ids to leave out.
            inference_only: Passed to each module (drop learner-only weights).
            copy: Passed to each module.
        """
        comps, not_comps = _as_list(components), _as_list(not_components)
        return {
            mid: m.get_state(inference_only=inference_only, copy=copy, **kwargs)
            for mid, m in self._rl_modules.items()
            if _selected(mid, comps, not_comps)
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Set the modules named in ``state`` (``{module_id: module_state}``).

        Ids this container lacks are skipped, so a state with more policies can be
        loaded; a non-empty state naming none of the modules is an error.

        Raises:
            UnknownPolicyError: No key of a non-empty ``state`` is a module id here.
        """
        known = [mid for mid in state if mid in self._rl_modules]
        if state and not known:
            raise UnknownPolicyError(
                f"MultiRLModule.set_state: none of the state's keys {sorted(state)[:5]} is a "
                f"module id of this MultiRLModule {sorted(self._rl_modules)}."
            )
        for mid in known:
            self._rl_modules[mid].set_state(state[mid])


@dataclasses.dataclass
class MultiRLModuleSpec:
    """What to build: a ``MultiRLModule`` class and one ``RLModuleSpec`` per module id."""

    multi_rl_module_class: type[MultiRLModule] = MultiRLModule
    observation_space: gym.Space | None = None
    action_space: gym.Space | None = None
    inference_only: bool | None = None
    learner_only: bool | None = None
    model_config: dict[str, Any] | None = None
    rl_module_specs: dict[str, RLModuleSpec] | RLModuleSpec | None = None
    load_state_path: str | None = None
    modules_to_load: set[str] | None = None

    def __post_init__(self) -> None:
        if self.rl_module_specs is None:
            self.rl_module_specs = {}
        if isinstance(self.rl_module_specs, dict):
            self.rl_module_specs = dict(self.rl_module_specs)
            for mid, spec in self.rl_module_specs.items():
                if not isinstance(spec, RLModuleSpec):
                    raise ConfigError(
                        f"MultiRLModuleSpec: rl_module_specs[{mid!r}] must be an RLModuleSpec, "
                        f"got {type(spec).__name__}."
                    )
            if self.inference_only is None and self.rl_module_specs:
                self.inference_only = all(s.inference_only for s in self.rl_module_specs.values())

    @property
    def module_specs(self) -> dict[str, RLModuleSpec] | RLModuleSpec | None:
        """Older name of ``rl_module_specs``."""
        return self.rl_module_specs

    def _specs(self) -> dict[str, RLModuleSpec]:
        if not isinstance(self.rl_module_specs, dict):
            raise ConfigError(
                "MultiRLModuleSpec holds one shared RLModuleSpec; give a dict "
                "{module_id: RLModuleSpec} before building or adding modules."
            )
        return self.rl_module_specs

    def build(self, module_id: str | None = None) -> RLModule:
        """Build the whole ``MultiRLModule``, or only ``module_id``'s module."""
        specs = self._specs()
        if module_id is not None:
            return self[module_id].build()
        multi = self.multi_rl_module_class(
            observation_space=self.observation_space,
            action_space=self.action_space,
            inference_only=bool(self.inference_only),
            learner_only=bool(self.learner_only),
            model_config=_model_config_dict(self.model_config),
            rl_module_specs=specs,
        )
        if self.load_state_path is not None:
            self._load_state(multi)
        return multi

    def _load_state(self, multi: MultiRLModule) -> None:
        path = self.load_state_path
        file = os.path.join(path, "module_state.npz") if os.path.isdir(path) else path  # type: ignore[arg-type]
        with np.load(file, allow_pickle=False) as data:
            state = _unflatten_state({k: data[k] for k in data.files})
        if self.modules_to_load is not None:
            state = {mid: s for mid, s in state.items() if mid in self.modules_to_load}
        multi.set_state(state)

    def __contains__(self, module_id: object) -> bool:
        return isinstance(self.rl_module_specs, dict) and module_id in self.rl_module_specs

    def __getitem__(self, module_id: str) -> RLModuleSpec:
        specs = self._specs()
        if module_id not in specs:
            raise UnknownPolicyError(
                f"Module id {module_id!r} is not in this MultiRLModuleSpec (has: "
                f"{sorted(specs)}).{suggest(module_id, specs)}"
            )
        return specs[module_id]

    def add_modules(self, module_specs: Mapping[str, RLModuleSpec], override: bool = True) -> None:
        """Add specs; an existing id is replaced (``override``) or updated where unset."""
        specs = self._specs()
        for mid, spec in module_specs.items():
            if override or mid not in specs:
                specs[mid] = spec
            else:
                specs[mid].update(spec, override=False)

    def remove_modules(self, module_ids: str | Collection[str]) -> None:
        """Drop the specs of ``module_ids`` (unknown ids are ignored)."""
        for mid in _as_list(module_ids) or []:
            self._specs().pop(mid, None)

    def update(self, other: MultiRLModuleSpec | RLModuleSpec, override: bool = False) -> None:
        """Merge ``other``'s module specs into this one (see :meth:`add_modules`)."""
        if isinstance(other, RLModuleSpec):
            for spec in self._specs().values():
                spec.update(other, override=override)
            return
        if not isinstance(other, MultiRLModuleSpec):
            raise ConfigError(f"MultiRLModuleSpec.update() got {type(other).__name__}.")
        self.add_modules(other._specs(), override=override)

    def as_multi_rl_module_spec(self) -> MultiRLModuleSpec:
        """Already a multi spec."""
        return self

    def to_serializable_dict(self) -> dict[str, Any]:
        """Encode as JSON-able data (see ``RLModuleSpec.to_serializable_dict``)."""
        from envrunners.core.rl_module._space_codec import space_to_dict

        return {
            "multi_rl_module_class": _qualname(self.multi_rl_module_class),
            "observation_space": space_to_dict(self.observation_space),
            "action_space": space_to_dict(self.action_space),
            "inference_only": self.inference_only,
            "learner_only": self.learner_only,
            "model_config": self.model_config,
            "rl_module_specs": {m: s.to_serializable_dict() for m, s in self._specs().items()},
            "load_state_path": self.load_state_path,
            "modules_to_load": sorted(self.modules_to_load) if self.modules_to_load else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MultiRLModuleSpec:
        """Decode what :meth:`to_serializable_dict` produced."""
        from envrunners.core.rl_module._space_codec import space_from_dict

        to_load = data.get("modules_to_load")
        return cls(
            multi_rl_module_class=_import_qualname(data["multi_rl_module_class"]),
            observation_space=space_from_dict(data.get("observation_space")),
            action_space=space_from_dict(data.get("action_space")),
            inference_only=data.get("inference_only"),
            learner_only=data.get("learner_only"),
            model_config=data.get("model_config"),
            rl_module_specs={
                m: RLModuleSpec.from_dict(s) for m, s in data["rl_module_specs"].items()
            },
            load_state_path=data.get("load_state_path"),
            modules_to_load=set(to_load) if to_load else None,
        )
