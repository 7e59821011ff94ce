"""``PolicySpec``: what one policy of a (multi-agent) config is built from.

Why: ``AlgorithmConfig.multi_agent(policies=...)`` maps policy ids to these specs;
old-stack runners fill the ``None`` parts (class, spaces) from the env and the
algorithm's default policy class. RLlib also accepts a plain 4-tuple in place of a
spec, so :func:`_coerce_policy_spec` turns either form into a ``PolicySpec``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envrunners.errors import ConfigError

__all__ = ["PolicySpec"]

_TUPLE_LAYOUT = "(policy_class, observation_space, action_space, config)"


@dataclass
class PolicySpec:
    """Describes one policy: its class, spaces and per-policy config overrides.

    Why: a config lists policies before any env exists, so every part may be
    ``None`` and is completed later from the env (spaces) and from the
    algorithm (default policy class). Two specs are equal when all four parts are.

    Attributes:
        policy_class: The ``Policy`` subclass to build, or ``None`` for the
            algorithm's default policy class.
        observation_space: The policy's observation space, or ``None`` to infer it
            from the env.
        action_space: The policy's action space, or ``None`` to infer it from the env.
        config: Overrides merged over the main config for this policy only
            (e.g. ``AlgorithmConfig.overrides(gamma=0.95)``), or ``None``.
    """

    policy_class: type | None = None
    observation_space: Any = None
    action_space: Any = None
    config: dict | None = None


def _coerce_policy_spec(policy_id: str, value: Any) -> PolicySpec:
    """Return ``value`` as a ``PolicySpec``: a spec, a 4-tuple/list, or ``None``.

    Why: RLlib configs give policies as ``PolicySpec`` objects, as RLlib's
    4-tuples, or as ``None`` (all parts inferred); the runners want one form.

    Raises:
        ConfigError: A tuple of the wrong length (the message names the policy id,
            the tuple and the expected layout), parts of the wrong kind (e.g. a
            tuple in the wrong order), or any other type.
    """
    if value is None:
        return PolicySpec()
    if isinstance(value, PolicySpec):
        spec = value
    elif isinstance(value, (tuple, list)):
        if len(value) != 4:
            raise ConfigError(
                f"policies[{policy_id!r}] is a {type(value).__name__} of length {len(value)}: "
                f"{tuple(value)!r}; a policy given as a tuple must have 4 items "
                f"{_TUPLE_LAYOUT} (use None for the parts to infer), or use PolicySpec(...)."
            )
        spec = PolicySpec(*value)
    else:
        raise ConfigError(
            f"policies[{policy_id!r}] must be a PolicySpec, a 4-tuple {_TUPLE_LAYOUT} or None, "
            f"got {value!r} (type {type(value).__name__})."
        )
    _check_parts(policy_id, spec)
    return spec


def _check_parts(policy_id: str, spec: PolicySpec) -> None:
    """Reject parts of the wrong kind, which usually means a tuple in the wrong order."""
    where = f"policies[{policy_id!r}]"
    if spec.policy_class is not None and not isinstance(spec.policy_class, type):
        raise ConfigError(
            f"{where}: policy_class must be a Policy class or None, got {spec.policy_class!r} "
            f"(the layout is {_TUPLE_LAYOUT})."
        )
    for name in ("observation_space", "action_space"):
        space = getattr(spec, name)
        if space is not None:
            import gymnasium as gym

            if not isinstance(space, gym.spaces.Space):
                raise ConfigError(
                    f"{where}: {name} must be a gymnasium space or None, got {space!r} "
                    f"(the layout is {_TUPLE_LAYOUT})."
                )
    if spec.config is not None and not isinstance(spec.config, dict):
        if not hasattr(spec.config, "to_dict"):
            raise ConfigError(
                f"{where}: config must be a dict of config overrides or None, got {spec.config!r}."
            )
