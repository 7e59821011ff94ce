"""How a ``RolloutWorker`` turns ``config.policies`` into built policies.

Why: every ``PolicySpec`` may leave its class and spaces open; they are filled
from the default policy class and from the env (or from spaces another worker
reported), and each policy gets the main config with its own overrides merged
in. Pure functions of the config, spaces and env: the worker calls them when it
is built and in ``add_policy``; they import nothing back from ``rollout_worker``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import gymnasium as gym

from envrunners.core import INPUT_ENV_SPACES
from envrunners.env.registry import is_multi_agent_env
from envrunners.errors import ConfigError
from envrunners.policy.policy import merge_config
from envrunners.policy.policy_spec import PolicySpec, _coerce_policy_spec

__all__ = ["build_policy", "complete_policy_specs", "make_is_policy_to_train"]

IsPolicyToTrain = Callable[..., bool]


def _agent_candidates(env: Any) -> list[Any]:
    for name in ("possible_agents", "agents"):
        agents = list(getattr(env, name, None) or [])
        if agents:
            return agents
    spaces = getattr(env, "observation_spaces", None)
    if isinstance(spaces, dict):
        return list(spaces)
    space = getattr(env, "observation_space", None)
    if isinstance(space, gym.spaces.Dict):
        return list(space.spaces)
    return []


def _spaces_from_env(
    env: Any, policy_id: str, mapping_fn: Callable[..., Any] | None
) -> tuple[gym.Space | None, gym.Space | None]:
    """The (obs, action) spaces of an agent that ``mapping_fn`` maps to ``policy_id``."""
    if env is None:
        return None, None
    if not is_multi_agent_env(env):
        return getattr(env, "observation_space", None), getattr(env, "action_space", None)
    unwrapped = getattr(env, "unwrapped", env)
    agents = _agent_candidates(unwrapped)
    for agent_id in agents:
        # Mapping functions may be random: ask a few times before giving up on an agent.
        hits = {mapping_fn(agent_id, None, worker=None) for _ in range(8)} if mapping_fn else set()
        if policy_id in hits:
            return unwrapped.get_observation_space(agent_id), unwrapped.get_action_space(agent_id)
    return None, None


def complete_policy_specs(
    config: Any,
    *,
    env: Any = None,
    spaces: dict[str, tuple[gym.Space, gym.Space]] | None = None,
    default_policy_class: type | None = None,
    policies: dict[str, Any] | None = None,
    policy_mapping_fn: Callable[..., Any] | None = None,
) -> dict[str, PolicySpec]:
    """Fill every open class and space of ``policies`` (default: ``config.policies``).

    Spaces come from the spec, then ``spaces[policy_id]`` (reported by another
    worker), then the env (for multi-agent envs: an agent mapped to the policy),
    then ``config.observation_space``/``action_space``.

    Raises:
        ConfigError: A policy class or a space cannot be determined (names the policy).
    """
    specs = config.policies if policies is None else policies
    mapping_fn = policy_mapping_fn or config.policy_mapping_fn
    out: dict[str, PolicySpec] = {}
    for pid, raw in specs.items():
        spec = _coerce_policy_spec(pid, raw)
        cls = spec.policy_class or default_policy_class
        if cls is None:
            raise ConfigError(
                f"policy {pid!r} has no policy class: give it in the PolicySpec "
                "(PolicySpec(policy_class=...)) or pass default_policy_class= to the worker."
            )
        obs, act = spec.observation_space, spec.action_space
        if (obs is None or act is None) and spaces:
            known = spaces.get(pid) or (spaces.get(INPUT_ENV_SPACES) if len(specs) == 1 else None)
            if known:
                obs, act = obs or known[0], act or known[1]
        if obs is None or act is None:
            env_obs, env_act = _spaces_from_env(env, pid, mapping_fn)
            obs, act = obs or env_obs, act or env_act
        obs = obs or config.observation_space
        act = act or config.action_space
        if obs is None or act is None:
            missing = "observation_space" if obs is None else "action_space"
            raise ConfigError(
                f"policy {pid!r}: {missing} is not given in its PolicySpec, the env does not "
                "provide one (no env on this worker, or no agent maps to this policy), no "
                "other worker reported spaces, and config.environment("
                f"{missing}=...) is not set. Give the spaces in the PolicySpec."
            )
        out[pid] = PolicySpec(cls, obs, act, spec.config)
    return out


def build_policy(
    policy_id: str, spec: PolicySpec, base_config: dict[str, Any], worker_index: int
) -> Any:
    """Instantiate ``spec.policy_class`` with the base config plus the spec's overrides."""
    overrides = spec.config
    if overrides is not None and not isinstance(overrides, dict):
        overrides = overrides.to_dict() if hasattr(overrides, "to_dict") else dict(overrides)
    config = merge_config(base_config, overrides)
    config["worker_index"] = worker_index
    config["__policy_id"] = policy_id
    return spec.policy_class(spec.observation_space, spec.action_space, config)


def make_is_policy_to_train(
    value: Collection[str] | IsPolicyToTrain | None,
) -> IsPolicyToTrain | None:
    """``None`` (train all), a callable as is, or a membership test for a collection of ids.

    Raises:
        ConfigError: ``value`` is neither (e.g. a str).
    """
    if value is None or callable(value):
        return value
    if not isinstance(value, list | set | tuple | frozenset):
        raise ConfigError(
            "is_policy_to_train must be a list/set/tuple of policy ids or a callable "
            f"(policy_id, batch) -> bool, got {value!r}."
        )
    ids = frozenset(value)

    def is_policy_to_train(policy_id: str, batch: Any = None) -> bool:
        return policy_id in ids

    return is_policy_to_train
