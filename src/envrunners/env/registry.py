"""Env resolution: registered names, gymnasium ids, classes and creator callables.

One place turns ``config.env`` into a zero-argument function that builds one
sub-environment, and checks that what it builds really is an env, so every
runner (single-agent, multi-agent, old stack) fails the same clear way.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import sys
import uuid
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from envrunners.errors import EnvCreatorError, UnknownEnvError

__all__ = [
    "check_is_env",
    "has_gym_vector_entry_point",
    "is_multi_agent_env",
    "register_env",
    "resolve_env_creator",
    "unregister_env",
]

logger = logging.getLogger("envrunners")

_REGISTRY: dict[str, Callable[[Any], Any]] = {}
#: This process's identity for ``_EnvRegistration``: a registration pickled here and
#: unpickled here again (a ``config.copy()``) changes nothing.
_PROCESS_TOKEN = uuid.uuid4().hex
#: Names whose unpicklable creator was warned about (see ``_EnvRegistration``).
_WARNED_UNPICKLABLE: set[str] = set()

# Example envs shipped in envrunners.examples, usable by id (the entry point loads lazily).
if "envrunners/StatelessCartPole-v1" not in gym.registry:
    gym.register(
        "envrunners/StatelessCartPole-v1",
        entry_point="envrunners.examples.envs.classes.stateless_cartpole:StatelessCartPole",
        max_episode_steps=500,
    )


def register_env(name: str, env_creator: Callable[[Any], Any]) -> None:
    """Register ``env_creator(env_context) -> env`` under ``name`` (like ``tune.register_env``)."""
    if not isinstance(name, str) or not name:
        raise EnvCreatorError(f"register_env: name must be a non-empty str, got {name!r}")
    if not callable(env_creator):
        raise EnvCreatorError(
            f"register_env({name!r}, ...): env_creator must be callable, got {env_creator!r}"
        )
    _REGISTRY[name] = env_creator


def unregister_env(name: str) -> None:
    """Remove a name added by ``register_env`` (no error if absent)."""
    _REGISTRY.pop(name, None)


class _EnvRegistration:
    """A registered env name and its creator, carried by a config to other processes.

    Why: ``register_env`` fills a registry of the calling process, but a config
    naming the env is built into runners in other processes (Ray actors, a Tune
    trial), where the name would be unknown. RLlib keeps its registry in the Ray
    cluster; here the config carries the creator of the env it names (see
    ``AlgorithmConfig.__getstate__``), and unpickling it registers the name in the
    receiving process. The creator travels by value (cloudpickle), so a lambda or a
    function of the user's script works; pickling it is tried once per send.
    """

    __slots__ = ("creator", "name")

    def __init__(self, name: str, creator: Callable[[Any], Any]) -> None:
        self.name, self.creator = name, creator

    def __reduce__(self) -> tuple:
        from ray import cloudpickle

        try:
            payload = cloudpickle.dumps(self.creator)
        except Exception as err:  # noqa: BLE001 - any pickling failure: say it, send the name
            if self.name not in _WARNED_UNPICKLABLE:  # (once: a config is copied often)
                _WARNED_UNPICKLABLE.add(self.name)
                logger.warning(
                    "The env creator registered as %r cannot be pickled (%s: %s): processes "
                    "other than this one will not know the name. Register a picklable "
                    "creator (a module-level function or class).",
                    self.name,
                    type(err).__name__,
                    err,
                )
            payload = None
        return (_restore_registration, (self.name, payload, _PROCESS_TOKEN))

    def __repr__(self) -> str:
        return f"_EnvRegistration({self.name!r}, {self.creator!r})"


def _restore_registration(name: str, payload: bytes | None, token: str) -> None:
    """Unpickling an ``_EnvRegistration``: register its creator here (unless pickled here).

    Returns None: the registration has done its work once unpickled (the config
    drops it from its state)."""
    if token == _PROCESS_TOKEN or payload is None:  # (this process's registry stays)
        return
    from ray import cloudpickle

    try:
        creator = cloudpickle.loads(payload)
    except Exception as err:  # noqa: BLE001 - e.g. its module is not importable here
        creator = _UnloadableCreator(name, f"{type(err).__name__}: {err}")
    _REGISTRY[name] = creator


class _UnloadableCreator:
    """Stands for a registered creator this process could not load: building the env
    raises an ``EnvCreatorError`` that says why (not an unknown-name error)."""

    def __init__(self, name: str, why: str) -> None:
        self.name, self.why = name, why

    def __call__(self, *_: Any, **__: Any) -> Any:
        raise EnvCreatorError(
            f"The env {self.name!r} was registered with register_env() in the driver, but "
            f"its creator cannot be loaded in this process ({self.why}). Make the creator's "
            "module importable here (e.g. ray.init(runtime_env={'py_modules': [...]}) or "
            "install it), or register a creator defined in the script itself."
        )


def env_registrations(*envs: Any) -> list[_EnvRegistration]:
    """The registrations (``register_env`` or ``tune.register_env``) of the names in ``envs``."""
    out = []
    for env in envs:
        if isinstance(env, str) and env not in {r.name for r in out}:
            creator = _REGISTRY.get(env) or _tune_registered(env)
            if creator is not None:
                out.append(_EnvRegistration(env, creator))
    return out


def _tune_registered(name: str) -> Callable[[Any], Any] | None:
    """A creator registered through ``ray.tune.register_env``, if tune is already imported."""
    if "ray.tune" not in sys.modules:
        return None
    try:
        from ray.tune.registry import ENV_CREATOR, _global_registry

        if _global_registry.contains(ENV_CREATOR, name):
            return _global_registry.get(ENV_CREATOR, name)
    except Exception:  # pragma: no cover - tune internals vary by version
        return None
    return None


def _call_creator(creator: Callable[..., Any], env_context: Any) -> Any:
    """Call ``creator(env_context)``; fall back to ``creator(**env_config)`` if it takes kwargs only."""
    try:
        return creator(env_context)
    except TypeError as err:
        try:
            sig = inspect.signature(creator)
        except (TypeError, ValueError):
            raise err from None
        params = list(sig.parameters.values())
        positional = [
            p
            for p in params
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
        takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params)
        if not positional and (takes_kwargs or not params):
            return creator(**dict(env_context)) if params else creator()
        raise


def _unknown_id_error(env_id: str) -> UnknownEnvError:
    known = list(gym.registry.keys()) + list(_REGISTRY)
    close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return UnknownEnvError(
        f"Unknown env {env_id!r}: it is neither a gymnasium id nor a name given to "
        f"envrunners.env.registry.register_env().{hint} Pass a registered gymnasium id "
        f"(e.g. 'CartPole-v1'), an env class, or a callable env_creator(env_context)."
    )


def resolve_env_creator(env: Any, env_context: Any) -> Callable[[], Any]:
    """Return a zero-arg function building one env from ``config.env`` and its context.

    ``env`` may be a name given to ``register_env`` (or ``tune.register_env``), a
    gymnasium id (``env_config`` becomes ``gym.make`` kwargs), a ``gym.Env``
    subclass (called with the context) or any callable ``creator(env_context)``.
    """
    if env is None:
        raise EnvCreatorError(
            "config.env is not set: call config.environment(env=...) with a gymnasium id, "
            "an env class or a callable env_creator(env_context)."
        )
    if isinstance(env, str):
        creator = _REGISTRY.get(env) or _tune_registered(env)
        if creator is not None:
            return lambda: _call_creator(creator, env_context)
        if env not in gym.registry:
            # gym.make also resolves "module:Env-v0" style ids; try before failing.
            if ":" not in env:
                raise _unknown_id_error(env)
        kwargs = dict(env_context)
        # Runners check observations and actions themselves (first reset and step);
        # gymnasium's passive checker would only add a wrapper call to every step.
        kwargs.setdefault("disable_env_checker", True)
        # The id's spec, looked up here: a worker process that did not run this
        # script (a forkserver's) does not know ids the script registered.
        spec = gym.registry.get(env)

        def make() -> Any:
            try:
                return gym.make(env if spec is None else spec, **kwargs)
            except gym.error.Error as err:
                raise _unknown_id_error(env) from err

        return make
    if callable(env):
        return lambda: _call_creator(env, env_context)
    raise EnvCreatorError(
        f"config.env={env!r} (type {type(env).__name__}) is not usable: expected a gymnasium "
        "id or registered name (str), an env class, or a callable env_creator(env_context)."
    )


def has_gym_vector_entry_point(env: Any) -> bool:
    """True when ``env`` names a gymnasium id (not a registered name) with a vector entry point.

    Such an env is built by ``gym.make_vec(..., vectorization_mode="vector_entry_point")``,
    as RLlib does for ``gym_env_vectorize_mode="vector_entry_point"``.
    """
    if not isinstance(env, str) or env in _REGISTRY or _tune_registered(env) is not None:
        return False
    spec = gym.registry.get(env)
    return spec is not None and getattr(spec, "vector_entry_point", None) is not None


def is_multi_agent_env(obj: Any) -> bool:
    """True for RLlib-style ``MultiAgentEnv`` instances and PettingZoo envs."""
    unwrapped = getattr(obj, "unwrapped", obj)
    names = {cls.__name__ for cls in type(unwrapped).__mro__}
    return bool(names & {"MultiAgentEnv", "ParallelEnv", "AECEnv"})


def check_is_env(obj: Any, env_desc: Any, *, multi_agent: bool = False) -> Any:
    """Raise ``EnvCreatorError`` unless ``obj`` looks like a (multi-agent) gymnasium env."""
    has_api = all(hasattr(obj, name) for name in ("reset", "step", "action_space"))
    if isinstance(obj, gym.vector.VectorEnv):
        raise EnvCreatorError(
            f"The env creator for {env_desc!r} returned a vector env ({type(obj).__name__}); "
            "expected a single env. To bring your own vector env, set "
            "config.env_runners(gym_env_vectorize_mode='vector_entry_point')."
        )
    if not has_api:
        raise EnvCreatorError(
            f"The env creator for {env_desc!r} returned {obj!r} (type {type(obj).__name__}), "
            "which is not an environment: expected a gymnasium.Env with reset(), step(), "
            "observation_space and action_space."
        )
    if not multi_agent and is_multi_agent_env(obj):
        raise EnvCreatorError(
            f"The env created from {env_desc!r} is a multi-agent env ({type(obj).__name__}); "
            "use MultiAgentEnvRunner, e.g. set config.multi_agent(policies=..., "
            "policy_mapping_fn=...) so the multi-agent runner is chosen."
        )
    return obj
