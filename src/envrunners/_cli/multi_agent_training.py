"""``envrunners train`` on multi-agent envs: ``--env`` specs, ``--policies`` and ``--policy-mapping``.

Why: a PettingZoo module or a ``MultiAgentEnv`` class is named on the command
line as text, and the run must be rebuilt from ``run.json`` on ``--resume`` and
by ``evaluate``; so the env creator and the policy mapping here are picklable
classes made from plain settings (the spec string, the mode, the mapping rules).
Accepted specs: ``pettingzoo:<module>`` (``pettingzoo:mpe2.simple_spread_v3``),
a dotted module path with a ``parallel_env()``/``env()`` factory
(``pettingzoo.classic.rps_v2``) and ``module:attr`` where ``attr`` is a factory
or ``MultiAgentEnv`` class. Policies: ``shared`` (one module ``shared`` for all
agents), ``per-agent`` (module id = agent id) or a mapping file
``{agent id or glob: policy id}``.
"""

from __future__ import annotations

import fnmatch
import importlib
import os
import sys
from typing import Any

from envrunners.errors import CliError

__all__ = [
    "POLICY_MODES",
    "SHARED_POLICY",
    "MultiAgentEnvFactory",
    "PolicyMapping",
    "agent_ids",
    "apply_multi_agent",
    "is_multi_agent_spec",
    "load_mapping_file",
    "multi_agent_settings",
]

#: ``--policies`` values.
POLICY_MODES = ("shared", "per-agent")
#: The module id every agent maps to with ``--policies shared``.
SHARED_POLICY = "shared"
_PREFIX = "pettingzoo:"


def is_multi_agent_spec(spec: str) -> bool:
    """True for the ``--env`` forms this module handles (not gymnasium ids).

    ``pettingzoo:<module>``; a dotted path with no ``/`` that gymnasium does not
    know; ``module:attr`` whose module has ``attr`` and does not register it as a
    gymnasium id (``ale_py:ALE/Pong-v5`` is gymnasium's ``module:Id`` form and
    stays single-agent).
    """
    import gymnasium as gym

    if spec.startswith(_PREFIX):
        return True
    if spec in gym.registry or "/" in spec:
        return False
    module, sep, attr = spec.partition(":")
    if sep:
        if not attr.isidentifier() or attr in gym.registry:
            return False
        try:  # gymnasium's `module:Id` registers Id when the module is imported
            found = importlib.import_module(module)
        except ImportError:
            return False
        return attr not in gym.registry and hasattr(found, attr)
    return "." in module and all(part.isidentifier() for part in module.split("."))


def _import_factory(spec: str) -> Any:
    """The env factory (a function or class) that ``spec`` names."""
    if os.getcwd() not in sys.path:  # `module:attr` of the user's own files
        sys.path.insert(0, os.getcwd())
    path = spec[len(_PREFIX) :] if spec.startswith(_PREFIX) else spec
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise CliError(f"--env {spec!r}: cannot import {module_name!r} ({err})") from None
    if attr:
        if not hasattr(module, attr):
            raise CliError(f"--env {spec!r}: module {module_name!r} has no attribute {attr!r}")
        return getattr(module, attr)
    for name in ("parallel_env", "env"):
        if callable(getattr(module, name, None)):
            return getattr(module, name)
    raise CliError(
        f"--env {spec!r}: module {module_name!r} has no parallel_env() or env() factory "
        "(expected a PettingZoo env module, or module:attr naming a factory or MultiAgentEnv)"
    )


class MultiAgentEnvFactory:
    """Env creator ``(env_config) -> env`` of a multi-agent ``--env`` spec (picklable).

    A ``MultiAgentEnv`` class gets the env config; a PettingZoo factory gets its
    keys as keyword arguments (``env_config: {N: 2}`` in a ``--config`` file).
    """

    def __init__(self, spec: str) -> None:
        self.spec = spec

    def __call__(self, env_config: Any = None) -> Any:
        factory = _import_factory(self.spec)
        kwargs = dict(env_config or {})
        if isinstance(factory, type) and any(
            c.__name__ == "MultiAgentEnv" for c in factory.__mro__
        ):
            return factory(env_config if env_config is not None else {})
        return factory(**kwargs)

    def __repr__(self) -> str:
        return f"MultiAgentEnvFactory({self.spec!r})"


def agent_ids(spec: str, env_config: dict | None = None) -> list[str]:
    """The agent ids of one env built from ``spec`` (its ``possible_agents``).

    Raises:
        CliError: The env cannot be built or is not a multi-agent env (exit code 2).
    """
    from envrunners.env.registry import is_multi_agent_env

    try:
        env = MultiAgentEnvFactory(spec)(env_config or {})
    except CliError:
        raise
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise CliError(
            f"--env {spec!r}: cannot create the env: {type(err).__name__}: {first}"
        ) from None
    try:
        if not is_multi_agent_env(env):
            raise CliError(
                f"--env {spec!r} built {type(env).__name__}, not a multi-agent env "
                "(expected a PettingZoo env or a MultiAgentEnv)"
            )
        ids = getattr(env, "possible_agents", None)
        if not ids and hasattr(env, "get_agent_ids"):
            ids = env.get_agent_ids()
        return [str(a) for a in (ids or [])]
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


# ---------------------------------------------------------------------- mapping
class PolicyMapping:
    """``policy_mapping_fn``: an agent id -> the policy of its first matching rule (picklable).

    Args:
        rules: ``[(agent id or glob pattern, policy id)]``; an exact id wins over
            a pattern, then patterns go in file order.
    """

    def __init__(self, rules: list[tuple[str, str]]) -> None:
        self.rules = [(str(p), str(policy)) for p, policy in rules]
        self._exact = {p: policy for p, policy in self.rules}

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
        return self.lookup(str(agent_id))

    def lookup(self, agent: str) -> str:
        if agent in self._exact:
            return self._exact[agent]
        for pattern, policy in self.rules:
            if fnmatch.fnmatchcase(agent, pattern):
                return policy
        raise CliError(f"agent {agent!r} matches no entry of the policy mapping")

    def __repr__(self) -> str:
        return f"PolicyMapping({self.rules!r})"


def load_mapping_file(file: str) -> list[tuple[str, str]]:
    """The ``[(agent id or glob, policy id)]`` rules of a YAML or TOML mapping file.

    Raises:
        CliError: Missing or unparsable file, not a mapping, or a value that is not
            a policy id string (exit code 2).
    """
    from envrunners._cli.config_file import parse_file

    data, where = parse_file(file, "--policy-mapping")
    if not isinstance(data, dict) or not data:
        raise CliError(
            f"{where}: expected a mapping of agent ids (or globs) to policy ids, "
            f"got {type(data).__name__ if data is not None else 'an empty file'}"
        )
    rules = []
    for pattern, policy in data.items():
        if not isinstance(policy, str) or not policy.strip():
            raise CliError(
                f"{where}: the policy of {pattern!r} must be a policy id string, got {policy!r}"
            )
        rules.append((str(pattern), policy.strip()))
    return rules


def multi_agent_settings(
    spec: str,
    policies: str | None,
    mapping_file: str | None,
    env_config: dict | None,
) -> dict[str, Any]:
    """The run settings of a multi-agent env: agents, mapping rules and policy ids.

    Raises:
        CliError: ``--policies`` together with ``--policy-mapping``, a mapping entry
            that names no agent, or an agent the mapping leaves out (exit code 2).
    """
    if policies and mapping_file:
        raise CliError("--policies and --policy-mapping exclude each other; give one")
    agents = agent_ids(spec, env_config)
    if not agents:
        raise CliError(f"--env {spec!r}: the env has no possible_agents")
    if mapping_file:
        rules = load_mapping_file(mapping_file)
        where = f"--policy-mapping {mapping_file!r}"
        for pattern, _ in rules:
            if not any(fnmatch.fnmatchcase(a, pattern) for a in agents):
                raise CliError(
                    f"{where}: unknown agent {pattern!r}; the env's agents are {', '.join(agents)}"
                )
        mode = "mapping"
    elif (policies or "shared") == "shared":
        rules, mode = [("*", SHARED_POLICY)], "shared"
    else:
        rules, mode = [(a, a) for a in agents], "per-agent"
    mapping = PolicyMapping(rules)
    assigned = {}
    for agent in agents:
        try:
            assigned[agent] = mapping.lookup(agent)
        except CliError:
            raise CliError(
                f"--policy-mapping {mapping_file!r}: agent {agent!r} matches no entry "
                f"(add it or a glob such as '*')"
            ) from None
    return {
        "multi_agent": True,
        "policies_mode": mode,
        "policy_rules": [list(r) for r in rules],
        "agents": agents,
        "policy_ids": sorted(set(assigned.values())),
    }


def apply_multi_agent(config: Any, run: dict[str, Any]) -> Any:
    """``config`` with the run's multi-agent env, policies and mapping."""
    rules = [tuple(r) for r in run["policy_rules"]]
    return config.environment(MultiAgentEnvFactory(run["env"])).multi_agent(
        policies=set(run["policy_ids"]), policy_mapping_fn=PolicyMapping(rules)
    )
