"""How RLlib's modules act inside our multi-agent loop, and when they cannot.

``ModuleActing`` is the ``act_fn`` of ``envrunners.sampling.multi_agent``: one
call per module and vector step, on the stacked observations of every agent
mapped to that module. It does what RLlib's default connector pipelines do
around ``MultiRLModule.forward_exploration`` / ``forward_inference`` (numpy to
tensor, ``GetActions``: sample from the module's action-distribution class and
record ``action_logp``, tensors back to numpy; for a stateful module also
``AddTimeDimToBatchAndZeroPad``'s time rank of 1 and ``STATE_IN`` from the
sampler's per-agent state rows), batched per module instead of per agent.
``action_transforms`` is RLlib's ``NormalizeAndClipActions`` as a
per-module numpy transform (the episode keeps the module's actions, the env gets
the unsquashed / clipped ones). ``why_not_ours`` says when RLlib's own pipelines
must run instead (user connector pieces in them, or RLlib's defaults switched off).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from ray.rllib.connectors.env_to_module import AgentToModuleMapping
from ray.rllib.connectors.module_to_env import ModuleToAgentUnmapping
from ray.rllib.core.columns import Columns

from envrunners.rllib._module_acting import (
    DEFAULT_ENV_TO_MODULE,
    DEFAULT_MODULE_TO_ENV,
    ModuleActor,
    action_fn_for,
    custom_connectors,
)

__all__ = [
    "MULTI_AGENT_ENV_TO_MODULE",
    "MULTI_AGENT_MODULE_TO_ENV",
    "ModuleActing",
    "action_transforms",
    "user_connectors",
    "why_not_ours",
]


#: The pieces RLlib's default multi-agent pipelines hold (the single-agent ones plus
#: the agent <-> module mapping), whose work our loop and ``ModuleActing`` do.
MULTI_AGENT_ENV_TO_MODULE = (*DEFAULT_ENV_TO_MODULE, AgentToModuleMapping)
MULTI_AGENT_MODULE_TO_ENV = (*DEFAULT_MODULE_TO_ENV, ModuleToAgentUnmapping)


def user_connectors(env_to_module: Any, module_to_env: Any) -> str | None:
    """Which user pieces the runner's connector pipelines hold (None: only RLlib's defaults).

    They only run in RLlib's loop (they read and write RLlib's per-step episodes).
    """
    custom = custom_connectors(env_to_module, MULTI_AGENT_ENV_TO_MODULE)
    if custom:
        return f"the env_to_module_connector pipeline holds custom connectors {custom}"
    custom = custom_connectors(module_to_env, MULTI_AGENT_MODULE_TO_ENV)
    if custom:
        return f"the module_to_env_connector pipeline holds custom connectors {custom}"
    return None


def why_not_ours(config: Any, module: Any, env_to_module: Any, module_to_env: Any) -> str | None:
    """Why RLlib's own ``_sample`` must run for this config and module (None: ours can).

    Our loop replaces RLlib's default env-to-module / module-to-env pipelines;
    anything a user added to them, or took out, only runs in RLlib's loop.
    """
    if not config.add_default_connectors_to_env_to_module_pipeline:
        return "add_default_connectors_to_env_to_module_pipeline is False"
    if not config.add_default_connectors_to_module_to_env_pipeline:
        return "add_default_connectors_to_module_to_env_pipeline is False"
    reason = user_connectors(env_to_module, module_to_env)
    if reason is not None:
        return reason
    if module is None:
        return "no MultiRLModule was built"
    return None


class ModuleActing:
    """The ``act_fn`` for one ``sample()`` call: RLlib's modules, batched per module.

    One ``ModuleActor`` (the single-agent runner's acting) per module does the work;
    this dispatches by module id and sums their forward timers.

    Args:
        modules: ``{module_id: RLModule}`` (the runner's ``MultiRLModule`` items).
        device: The torch device of the modules (None or CPU: no copy).
        t_base: ``num_env_steps_sampled_lifetime // num_env_runners``.
        num_runners: ``num_env_runners or 1``; ``forward_exploration`` gets
            ``t = (t_base + env steps of this call) * num_runners`` as in RLlib.
    """

    __slots__ = ("actors",)

    def __init__(self, modules: dict, device: Any, t_base: int, num_runners: int):
        def t_fn(t: int) -> int:
            return (t_base + t) * num_runners

        self.actors = {mid: ModuleActor(m, device, t_fn) for mid, m in modules.items()}

    @property
    def inference_s(self) -> float:
        """Seconds spent in forward passes and action sampling (all modules)."""
        return sum(a.forward_s for a in self.actors.values())

    @property
    def forwards(self) -> int:
        """How many forward passes ran (all modules)."""
        return sum(a.forward_calls for a in self.actors.values())

    def __enter__(self) -> ModuleActing:
        for actor in self.actors.values():  # eval mode once for the whole sample()
            actor.begin()
        return self

    def __exit__(self, *exc: Any) -> None:
        for actor in self.actors.values():
            actor.end()

    def __call__(
        self,
        module_id: Any,
        obs: Any,
        explore: bool,
        t: int,
        state: Any = None,
        extra_inputs: Any = None,
    ) -> dict[str, Any]:
        """One forward of ``module_id``'s module for all agents mapped to it.

        The sampler passes ``state`` (the acting agents' ``STATE_IN`` rows) for a
        stateful module; its ``STATE_OUT`` then comes back with the extra outputs,
        which the episodes record per agent step, as RLlib's runner does.
        """
        actor = self.actors[module_id]
        if state is None:
            actions, extras = actor.act(obs, explore, t)
            return {Columns.ACTIONS: actions, **extras}
        actions, extras, state_out = actor.act_stateful(obs, explore, t, state, extra_inputs)
        return {Columns.ACTIONS: actions, **extras, Columns.STATE_OUT: state_out}


def action_transforms(config: Any, action_spaces: dict[Any, gym.Space]) -> dict[Any, Any]:
    """Per module, RLlib's ``NormalizeAndClipActions`` on a batch of its actions.

    Only modules whose action space has a ``Box`` get one (the others' actions go
    to the env as they are); ``action_spaces``: ``{module_id: action space}``.
    """
    fns = {mid: action_fn_for(config, space) for mid, space in action_spaces.items()}
    return {mid: fn for mid, fn in fns.items() if fn is not None and _has_box(action_spaces[mid])}


def _has_box(space: gym.Space) -> bool:
    if isinstance(space, gym.spaces.Box):
        return True
    if isinstance(space, gym.spaces.Dict):
        return any(_has_box(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return any(_has_box(s) for s in space.spaces)
    return False
