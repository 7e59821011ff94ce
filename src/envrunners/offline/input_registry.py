"""A registry of named input creators: ``config.offline_data(input_="my_input")``.

Why: RLlib lets users register an input factory under a name
(``ray.tune.registry.register_input``) and select it by that name; this is the
same registry without Tune. Names registered with Ray Tune's registry are found
too when Tune is installed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["register_input", "registry_contains_input", "registry_get_input"]

_INPUTS: dict[str, Callable[[Any], Any]] = {}


def register_input(name: str, input_creator: Callable[[Any], Any]) -> None:
    """Register ``input_creator(ioctx) -> InputReader`` under ``name``.

    Raises:
        TypeError: if ``name`` is not a str or ``input_creator`` is not callable.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_input: name must be a non-empty str, got {name!r}")
    if not callable(input_creator):
        raise TypeError(
            f"register_input({name!r}): input_creator must be callable (ioctx) -> InputReader, "
            f"got {type(input_creator).__name__}"
        )
    _INPUTS[name] = input_creator


def _tune_registry() -> Any:
    try:
        from ray.tune.registry import _global_registry
    except Exception:  # Ray Tune is optional
        return None
    return _global_registry


def registry_contains_input(name: str) -> bool:
    """Whether an input creator is registered under ``name`` (here or in Ray Tune)."""
    if name in _INPUTS:
        return True
    reg = _tune_registry()
    try:
        return bool(reg is not None and reg.contains("rllib_input", name))
    except Exception:
        return False


def registry_get_input(name: str) -> Callable[[Any], Any]:
    """Return the input creator registered under ``name``.

    Raises:
        KeyError: if no creator is registered under ``name``.
    """
    if name in _INPUTS:
        return _INPUTS[name]
    reg = _tune_registry()
    if reg is not None and registry_contains_input(name):
        return reg.get("rllib_input", name)
    raise KeyError(f"no input registered under {name!r}; known: {sorted(_INPUTS)}")
