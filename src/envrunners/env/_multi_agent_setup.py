"""Building blocks of ``MultiAgentEnvRunner``: its vector env, module spaces, modules,
how each module acts, and its checked ``policy_mapping_fn``.

Why: kept apart from the runner so the runner module reads as RLlib's API on top
of the sampler, and each piece fails with its own clear error.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.core.columns import Columns
from envrunners.core.rl_module._acting import act
from envrunners.env import runner_setup
from envrunners.env._multi_agent_env_fns import multi_agent_env_fn
from envrunners.env.env_context import EnvContext
from envrunners.env.vector import (
    AsyncVectorMultiAgentEnv,
    SyncVectorMultiAgentEnv,
    VectorMultiAgentEnv,
)
from envrunners.env.vector.shared_memory_vector_multi_agent_env import (
    SharedMemoryVectorMultiAgentEnv,
)
from envrunners.errors import (
    ConfigError,
    SpaceError,
    UnknownPolicyError,
    suggest,
)
from envrunners.sampling._agent_batching import stack
from envrunners.sampling._agent_states import ModuleStates

__all__ = [
    "CheckedMappingFn",
    "act_with_module",
    "build_modules",
    "check_mapping_fn",
    "check_reset_observations",
    "fast_acting",
    "make_vector_env",
    "module_spaces",
    "timing_forward",
]

logger = logging.getLogger("envrunners")


def make_vector_env(
    config: Any,
    worker_index: int | None,
    num_workers: int | None,
    *,
    batch_size: int | None = None,
) -> tuple[VectorMultiAgentEnv, EnvContext]:
    """The runner's vector env: sync by default, worker processes for ``"async"`` and
    ``"shared_memory"``.

    ``gym_env_vectorize_mode="async"`` or ``remote_worker_envs=True`` selects
    ``AsyncVectorMultiAgentEnv`` (each answer waited for at most
    ``sample_timeout_s``); ``"shared_memory"`` selects
    ``SharedMemoryVectorMultiAgentEnv`` (sub-envs shared out over one worker per core),
    asynchronous (stepped ready-first) for a ready-first batch below ``num_envs``:
    ``batch_size`` (the runner's ``overlap_inference="auto"`` choice), else the
    config's ``ready_first_batch_size`` / ``overlap_inference=True``. With
    ``restart_failed_sub_environments`` a sub-env whose ``step`` raises is recreated
    on its own; the others go on.

    Raises:
        ConfigError: A mode other than ``sync``/``async``/``shared_memory``, or a
            ready-first batch the mode cannot step (``runner_setup.ready_first_batch_size``).
    """
    ctx = runner_setup.make_env_context(config, worker_index, num_workers)
    n = int(config.num_envs_per_env_runner)
    mode = str(getattr(config.gym_env_vectorize_mode, "value", config.gym_env_vectorize_mode))
    mode = mode.lower()
    if mode not in ("sync", "async", "shared_memory"):
        raise ConfigError(
            f"gym_env_vectorize_mode={config.gym_env_vectorize_mode!r} is not supported for "
            "multi-agent envs; use 'sync' (default), 'async' (one worker process per "
            "sub-env) or 'shared_memory' (sub-envs shared out over worker processes, "
            "stepped ready-first with ready_first_batch_size / overlap_inference)."
        )
    if batch_size is None:
        batch_size = runner_setup.ready_first_batch_size(config, n, ctx)
    fns = [
        multi_agent_env_fn(config.env, ctx.copy_with_overrides(vector_index=i)) for i in range(n)
    ]
    restart = bool(config.restart_failed_sub_environments)
    # A worker that does not answer within sample_timeout_s is killed and reported (or
    # replaced), not waited on: the same deadline as the single-agent shared-memory env.
    timeout = getattr(config, "sample_timeout_s", None) or None
    if mode == "shared_memory":
        env = SharedMemoryVectorMultiAgentEnv(
            fns, batch_size=batch_size, restart_failed=restart, timeout_s=timeout
        )
        return env, ctx
    if mode == "async" or config.remote_worker_envs:
        env = AsyncVectorMultiAgentEnv(fns, timeout_s=timeout, restart_failed=restart)
        return env, ctx
    return SyncVectorMultiAgentEnv(fns, restart_failed=restart), ctx


def check_mapping_fn(fn: Any) -> None:
    """Raise ``ConfigError`` unless ``fn`` can be called as ``fn(agent_id, episode)``."""
    if not callable(fn):
        raise ConfigError(f"policy_mapping_fn must be callable, got {fn!r}")
    try:
        inspect.signature(fn).bind("agent", None)
    except TypeError as err:
        raise ConfigError(
            f"policy_mapping_fn {fn!r} cannot be called as fn(agent_id, episode): {err}. "
            "Define it as `def mapping(agent_id, episode, **kwargs): return module_id`."
        ) from None
    except ValueError:  # no signature (builtins): trust it
        pass


class CheckedMappingFn:
    """``policy_mapping_fn`` wrapper that rejects module ids the runner does not have.

    Why: a typo in the mapping fn otherwise surfaces as a KeyError deep in the
    sampler; this names the agent, the returned id, the known ids and the fix.
    Picklable (the episodes carry it through Ray's object store).
    """

    def __init__(self, fn: Callable[..., Any], module_ids: Any):
        self.fn = fn
        self.module_ids = frozenset(module_ids)

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> Any:
        module_id = self.fn(agent_id, episode, **kwargs)
        if module_id not in self.module_ids:
            known = sorted(map(str, self.module_ids))
            raise UnknownPolicyError(
                f"policy_mapping_fn returned module id {module_id!r} for agent {agent_id!r}, "
                f"but the known module (policy) ids are {known}.{suggest(module_id, known)} "
                f"Fix: return one of {known} from policy_mapping_fn, or add {module_id!r} to "
                "config.multi_agent(policies=...)."
            )
        return module_id


def _maps_to(fn: Callable[..., Any], agent_id: Any) -> Any:
    try:
        return fn(agent_id, None)
    except Exception:  # noqa: BLE001 - fns that need a real episode
        return None


def module_spaces(
    config: Any, agent_obs: dict, agent_act: dict, agents: list
) -> dict[str, tuple[gym.Space, gym.Space]]:
    """Env-side (obs, action) spaces per module id.

    A ``PolicySpec``'s spaces win; otherwise the spaces of the first agent that
    ``policy_mapping_fn(agent_id, None)`` maps to the module; otherwise, if every
    agent has the same spaces, those.

    Raises:
        ConfigError: A module's spaces cannot be determined (names the module and the fix).
    """
    fn = config.policy_mapping_fn
    mapped: dict[Any, Any] = {}
    for aid in agents:
        mid = _maps_to(fn, aid)
        if mid is not None:
            mapped.setdefault(mid, aid)
    distinct_obs = {repr(s) for s in agent_obs.values()}
    distinct_act = {repr(s) for s in agent_act.values()}
    first = agents[0] if agents else None
    out = {}
    for mid, spec in config.policies.items():
        obs = getattr(spec, "observation_space", None)
        act = getattr(spec, "action_space", None)
        aid = mapped.get(mid)
        if aid is not None:
            obs = obs if obs is not None else agent_obs.get(aid)
            act = act if act is not None else agent_act.get(aid)
        elif first is not None:
            if obs is None and len(distinct_obs) == 1:
                obs = agent_obs[first]
            if act is None and len(distinct_act) == 1:
                act = agent_act[first]
        if obs is None or act is None:
            raise ConfigError(
                f"Cannot tell the spaces of module {mid!r}: policy_mapping_fn(agent_id, None) "
                f"maps none of the env's agents {agents} to it and the agents' spaces differ. "
                f"Give it explicit spaces: policies={{{mid!r}: PolicySpec(observation_space=..., "
                "action_space=...)}."
            )
        out[mid] = (obs, act)
    return out


def build_modules(config: Any, spaces: dict[str, tuple[gym.Space, gym.Space]]) -> Any:
    """A ``MultiRLModule`` with one inference module per module id in ``spaces``."""
    from envrunners.core.rl_module.multi_rl_module import MultiRLModule, MultiRLModuleSpec
    from envrunners.core.rl_module.rl_module import RLModuleSpec

    spec = getattr(config, "rl_module_spec", None)
    container = MultiRLModule
    overrides = dict(getattr(config, "algorithm_config_overrides_per_module", None) or {})
    modules = {}
    for mid, mid_spaces in spaces.items():
        sub = spec
        if isinstance(spec, MultiRLModuleSpec):
            container = spec.multi_rl_module_class
            specs = spec.rl_module_specs
            sub = specs.get(mid) if isinstance(specs, dict) else specs
        elif spec is not None and not isinstance(spec, RLModuleSpec):
            raise ConfigError(
                "config.rl_module_spec must be an RLModuleSpec or a MultiRLModuleSpec, got "
                f"{type(spec).__name__}."
            )
        policy = config.policies.get(mid)
        extra = dict(overrides.get(mid, {}) or {})
        extra.update(getattr(policy, "config", None) or {})
        model_config = {**(config.model_config or {}), **(extra.get("model_config") or {})}
        proxy = SimpleNamespace(rl_module_spec=sub, model_config=model_config)
        modules[mid] = runner_setup.build_module(proxy, mid_spaces)
    multi = container.from_modules(modules)
    multi.eval()
    return multi


def check_reset_observations(
    env: VectorMultiAgentEnv, obs: list[dict], env_ids: Any = None
) -> None:
    """Raise ``SpaceError`` if a reset observation lies outside its agent's space.

    ``env_ids``: the sub-env index of each entry of ``obs`` (default: its position).
    """
    spaces = env.single_observation_spaces
    for i, obs_i in zip(range(len(obs)) if env_ids is None else env_ids, obs):
        for aid, o in obs_i.items():
            space = spaces.get(aid)
            if space is not None and not space.contains(o):
                raise SpaceError(
                    f"sub-environment {i} returned observation {o!r} for agent {aid!r}, which is "
                    f"not in its observation space {space}. Fix the env (or its "
                    "observation_spaces), or set config.environment(disable_env_checking=True)."
                )


def fast_acting(module: Any) -> Callable[..., dict] | None:
    """The module's ``compute_actions_numpy`` if it is stateless (the default MLP / CNN).

    Why: that numpy path is the multi-agent loop's fast path (W3); every other
    module (user modules, the default LSTM) acts through ``act_with_module``.
    """
    fast = getattr(module, "compute_actions_numpy", None)
    if fast is None or module.is_stateful():
        return None
    return fast


def act_with_module(
    module: Any, obs: Any, explore: bool, t: int, state: Any, extra_inputs: dict | None = None
) -> dict:
    """One forward of any RLModule (``_acting.act``) as the sampler's one output dict.

    ``state`` / ``extra_inputs``: for a stateful module, the batch's state in and its
    ``prev_actions`` / ``prev_rewards`` (None for stateless modules).

    Returns:
        ``actions``, the extra model outputs and, for a stateful module, the next
        state under ``Columns.STATE_OUT`` (recorded per agent step, as RLlib does).
    """
    actions, out, state_out = act(module, obs, explore, state, extra_inputs=extra_inputs, t=t)
    out[Columns.ACTIONS] = actions
    if state_out is not None:
        out[Columns.STATE_OUT] = state_out
    return out


def timing_forward(multi_module: Any, mapping_fn: Callable[..., Any]) -> Callable[[list], None]:
    """``forward(obs per sub-env)``: one forward per module for every agent's raw
    observation, as a vector step's inference costs (``overlap_inference="auto"``).

    Agents go to ``mapping_fn(agent_id, None)``'s module; a stateful module gets
    initial-state rows.
    """
    modules = dict(multi_module.items())
    states = {mid: ModuleStates(m) for mid, m in modules.items() if m.is_stateful()}
    fast = {mid: fast_acting(m) for mid, m in modules.items()}

    def forward(obs_l: list[dict]) -> None:
        groups: dict[Any, list] = {}
        for obs_i in obs_l:
            for aid, o in obs_i.items():
                groups.setdefault(mapping_fn(aid, None), []).append(o)
        for mid, items in groups.items():
            batch = stack(items)
            if fast[mid] is not None:
                fast[mid](batch, explore=True)
                continue
            state = inputs = None
            store = states.get(mid)
            if store is not None:
                store.clear()
                state, inputs = store.gather(np.array([store.acquire() for _ in items]))
            act_with_module(modules[mid], batch, True, 0, state, inputs)

    return forward
