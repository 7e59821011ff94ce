"""Building one multi-agent sub-env from ``config.env``: what worker processes run.

Why a module of its own: the env functions of the shared-memory and async vector
envs travel to worker processes (by cloudpickle), and unpickling them imports the
module of every function they name. Here that is gymnasium and the registry only;
from ``_multi_agent_setup`` (acting, torch) it cost each worker ~1 s of imports at
start, so a multi-agent runner with shared-memory workers took 1-2.5 s to build
(a replaced runner too) against 0.1 s single-agent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from envrunners.env.multi_agent_env import MultiAgentEnv
from envrunners.env.registry import check_is_env, resolve_env_creator
from envrunners.errors import EnvCreatorError

__all__ = ["as_multi_agent_env", "multi_agent_env_fn"]


def _mro_names(obj: Any) -> set[str]:
    """Class names of ``obj``'s PettingZoo API: its own class first, then ``unwrapped``'s.

    A parallel wrapper around a turn-based env (``aec_to_parallel``) unwraps to the
    ``AECEnv``; its own class says which API it speaks.
    """
    names = {cls.__name__ for cls in type(obj).__mro__}
    if names & {"AECEnv", "ParallelEnv", "MultiAgentEnv"}:
        return names
    return {cls.__name__ for cls in type(getattr(obj, "unwrapped", obj)).__mro__}


def as_multi_agent_env(env: Any, env_desc: Any) -> Any:
    """Return ``env`` as a ``MultiAgentEnv``: PettingZoo envs get their adapter.

    Raises:
        EnvCreatorError: ``env`` is a single-agent env or not an env at all.
    """
    names = _mro_names(env)
    if "AECEnv" in names and not isinstance(env, MultiAgentEnv):
        from envrunners.env.wrappers.pettingzoo_env import PettingZooEnv

        return PettingZooEnv(env)
    if "ParallelEnv" in names and not isinstance(env, MultiAgentEnv):
        from envrunners.env.wrappers.pettingzoo_env import ParallelPettingZooEnv

        return ParallelPettingZooEnv(env)
    check_is_env(env, env_desc, multi_agent=True)
    if "MultiAgentEnv" not in names:
        raise EnvCreatorError(
            f"The env created from {env_desc!r} is a single-agent env ({type(env).__name__}), "
            "but MultiAgentEnvRunner needs a MultiAgentEnv (or a PettingZoo env). Wrap it "
            "with envrunners.env.multi_agent_env.make_multi_agent(...), or use "
            "SingleAgentEnvRunner with a single-policy config."
        )
    return env


def _build(creator: Callable[[], Any], env_desc: Any) -> Any:
    return as_multi_agent_env(creator(), env_desc)


def multi_agent_env_fn(env_desc: Any, ctx: Any) -> Callable[[], Any]:
    """A zero-argument function building one multi-agent sub-env of ``env_desc`` with
    the env context ``ctx`` (a PettingZoo env gets its adapter)."""
    return functools.partial(_build, resolve_env_creator(env_desc, ctx), env_desc)
