"""``MultiAgentEnv`` and ``make_multi_agent`` (``ray.rllib.env.multi_agent_env``).

Why: a multi-agent env speaks gymnasium's API with one dict entry per agent, so
agents can observe, act and finish at different times (turn-based games, agents
that join or leave). ``reset`` returns ``(obs, infos)`` and ``step(actions)``
returns ``(obs, rewards, terminateds, truncateds, infos)``, each keyed by agent
id; ``terminateds`` must hold ``"__all__"`` (the whole episode ended) and
``truncateds`` may. Only the agents present in ``obs`` act next. An agent may get
a reward without an observation; it is added to its next step.

``make_multi_agent(env)`` turns a single-agent env into one where each of
``num_agents`` agents plays its own copy (RLlib's ``MultiAgentCartPole`` layout).
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from envrunners.errors import MultiAgentEnvError

__all__ = ["GroupAgentsWrapper", "MultiAgentEnv", "make_multi_agent"]

MultiAgentDict = dict[Any, Any]
_ALL = "__all__"


class MultiAgentEnv(gym.Env):
    """Base class of multi-agent envs: gymnasium's API with per-agent dicts.

    Subclasses set ``possible_agents`` (every agent that may ever appear),
    ``agents`` (the ones active now) and per-agent ``observation_spaces`` and
    ``action_spaces`` (dicts keyed by agent id), then implement ``reset`` and
    ``step``. Call ``super().reset(seed=seed)`` to seed ``self.np_random``.

    Attributes:
        observation_spaces: ``{agent_id: Space}`` or None (then the legacy
            ``observation_space`` is used, per agent if it is a ``Dict``).
        action_spaces: ``{agent_id: Space}`` or None (likewise).
        agents: The agents active now.
        possible_agents: All agents that may ever appear (fixed).
    """

    observation_spaces: dict[Any, gym.Space] | None = None
    action_spaces: dict[Any, gym.Space] | None = None
    observation_space: gym.Space | None = None  # type: ignore[assignment]
    action_space: gym.Space | None = None  # type: ignore[assignment]
    agents: list[Any] = []
    possible_agents: list[Any] = []

    def __init__(self) -> None:
        if not hasattr(self, "_agent_ids"):
            self._agent_ids: set[Any] = set()
        # Instance copies, so that subclasses never mutate the class-level defaults.
        self.agents = list(self.agents) if self.agents else list(self._agent_ids)
        if not self.possible_agents:
            self.possible_agents = list(self.agents)
        else:
            self.possible_agents = list(self.possible_agents)

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Reset the env; return ``({agent: obs}, {agent: info})`` for the agents to act.

        The base only seeds ``self.np_random``; subclasses return the dicts.
        """
        super().reset(seed=seed, options=options)
        return None  # type: ignore[return-value]

    def step(
        self, action_dict: MultiAgentDict
    ) -> tuple[MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict, MultiAgentDict]:
        """Apply ``{agent: action}``; return obs, rewards, terminateds, truncateds, infos."""
        raise NotImplementedError(f"{type(self).__name__} must implement step(action_dict)")

    def render(self) -> Any:
        """Render the env (nothing by default)."""
        return None

    # -- spaces -------------------------------------------------------------------
    def get_observation_space(self, agent_id: Any) -> gym.Space:
        """The observation space of ``agent_id``.

        Raises:
            MultiAgentEnvError: The agent has no observation space (names the known agents).
        """
        return self._space_for(agent_id, self.observation_spaces, self.observation_space, "obs")

    def get_action_space(self, agent_id: Any) -> gym.Space:
        """The action space of ``agent_id``.

        Raises:
            MultiAgentEnvError: The agent has no action space (names the known agents).
        """
        return self._space_for(agent_id, self.action_spaces, self.action_space, "action")

    def _space_for(self, agent_id: Any, per_agent: Any, legacy: Any, kind: str) -> gym.Space:
        attr = "observation_spaces" if kind == "obs" else "action_spaces"
        if per_agent is not None:
            space = per_agent.get(agent_id)
            if space is not None:
                return space
            raise MultiAgentEnvError(
                f"Agent {agent_id!r} is not in {type(self).__name__}.{attr} (known agents: "
                f"{list(per_agent)}). Add it to `{attr}` and `possible_agents`."
            )
        if isinstance(legacy, gym.spaces.Dict):
            if agent_id in legacy.spaces:
                return legacy.spaces[agent_id]
            raise MultiAgentEnvError(
                f"Agent {agent_id!r} is not a key of {type(self).__name__}'s Dict "
                f"{attr[:-1]} (known agents: {list(legacy.spaces)}). Set `{attr}` per agent."
            )
        if legacy is not None:
            return legacy
        raise MultiAgentEnvError(
            f"{type(self).__name__} defines neither `{attr}` nor `{attr[:-1]}`; set "
            f"`self.{attr} = {{agent_id: space}}` in __init__."
        )

    # -- agents -------------------------------------------------------------------
    @property
    def num_agents(self) -> int:
        """How many agents are active now (``len(agents)``)."""
        return len(self.agents)

    @property
    def max_num_agents(self) -> int:
        """How many agents may ever appear (``len(possible_agents)``)."""
        return len(self.possible_agents)

    def get_agent_ids(self) -> set[Any]:
        """Deprecated: the agent ids (use ``agents`` / ``possible_agents``)."""
        warnings.warn(
            "MultiAgentEnv.get_agent_ids() is deprecated; use `env.agents` or "
            "`env.possible_agents`.",
            DeprecationWarning,
            stacklevel=2,
        )
        return set(self._agent_ids) or set(self.agents)

    def with_agent_groups(
        self,
        groups: dict[str, list[Any]],
        obs_space: gym.Space | None = None,
        act_space: gym.Space | None = None,
    ) -> GroupAgentsWrapper:
        """Wrap this env so that each group of agents acts as one agent (tuple spaces)."""
        return GroupAgentsWrapper(self, groups, obs_space, act_space)


class GroupAgentsWrapper(MultiAgentEnv):
    """Presents groups of agents as single agents (``MultiAgentEnv.with_agent_groups``).

    A group observes and acts with tuples (its members in the given order), gets
    the sum of its members' rewards and is done when all members are done. Agents
    not in any group pass through unchanged. All members of a group must observe
    at the same env steps.

    Args:
        env: The env to wrap.
        groups: ``{group_id: [agent ids]}``.
        obs_space: The group observation space (default: a ``Tuple`` of the members').
        act_space: The group action space (default: a ``Tuple`` of the members').
    """

    def __init__(
        self,
        env: MultiAgentEnv,
        groups: dict[str, list[Any]],
        obs_space: gym.Space | None = None,
        act_space: gym.Space | None = None,
    ):
        self.env = env
        self.groups = {g: list(members) for g, members in groups.items()}
        self._group_of = {a: g for g, members in self.groups.items() for a in members}
        members_all = [a for members in self.groups.values() for a in members]
        overlap = sorted({str(a) for a in members_all if members_all.count(a) > 1})
        if overlap:
            raise MultiAgentEnvError(f"agents {overlap} are in more than one group")
        singles = [a for a in env.possible_agents if a not in self._group_of]
        self.possible_agents = singles + list(self.groups)
        self.observation_spaces = {a: env.get_observation_space(a) for a in singles}
        self.action_spaces = {a: env.get_action_space(a) for a in singles}
        for g, members in self.groups.items():
            self.observation_spaces[g] = obs_space or gym.spaces.Tuple(
                [env.get_observation_space(a) for a in members]
            )
            self.action_spaces[g] = act_space or gym.spaces.Tuple(
                [env.get_action_space(a) for a in members]
            )
        self.agents = list(self.possible_agents)
        super().__init__()

    def _group(
        self, data: MultiAgentDict, fill: Any = None, *, reduce: Any = None
    ) -> MultiAgentDict:
        out: MultiAgentDict = {}
        for key, value in data.items():
            if key not in self._group_of:
                out[key] = value
        for g, members in self.groups.items():
            present = [a for a in members if a in data]
            if not present:
                continue
            values = [data.get(a, fill) for a in members]
            out[g] = reduce(values) if reduce is not None else tuple(values)
        return out

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Reset the inner env and group its observations."""
        obs, infos = self.env.reset(seed=seed, options=options)
        return self._group(obs), self._group(infos, {}, reduce=lambda v: {"_group_info": v})

    def step(self, action_dict: MultiAgentDict) -> tuple:
        """Ungroup the actions, step the inner env, group what comes back."""
        actions: MultiAgentDict = {}
        for key, value in action_dict.items():
            if key in self.groups:
                actions.update(zip(self.groups[key], value))
            else:
                actions[key] = value
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        rewards = self._group(rewards, 0.0, reduce=sum)
        terms = self._group(terms, False, reduce=all)
        truncs = self._group(truncs, False, reduce=all)
        grouped_infos = self._group(infos, {}, reduce=lambda v: {"_group_info": v})
        return self._group(obs), rewards, terms, truncs, grouped_infos


def make_multi_agent(env_name_or_creator: str | Callable[[Any], Any]) -> type[MultiAgentEnv]:
    """Make a ``MultiAgentEnv`` class whose agents each play their own single-agent env.

    The class takes a config dict; its ``num_agents`` (default 1) is popped and the
    rest goes to ``gym.make(name, **config)`` (a gymnasium id) or ``creator(config)``.
    Agents are the ints ``0..num_agents-1``. ``reset`` resets every copy with the
    same seed; a copy that ends stops acting; the episode ends when all copies have
    ended (``terminateds["__all__"]``; ``truncateds["__all__"]`` only if all
    copies were truncated).

    Args:
        env_name_or_creator: A gymnasium id, or a callable ``creator(config) -> gym.Env``.

    Example:
        >>> MultiAgentCartPole = make_multi_agent("CartPole-v1")
        >>> env = MultiAgentCartPole({"num_agents": 2})
        >>> obs, infos = env.reset(seed=0)
        >>> sorted(obs)
        [0, 1]
    """

    class MultiEnv(MultiAgentEnv):
        def __init__(self, config: dict | None = None):
            config = copy.deepcopy(config) if config is not None else {}
            num = int(config.pop("num_agents", 1))
            if isinstance(env_name_or_creator, str):
                # Like the runners' own env creation: the runner checks the spaces of
                # the first reset and step itself, gymnasium's checker wrapper would
                # only add a layer to every step. This class enforces reset-before-step
                # for all copies at once, so they go without the OrderEnforcing layer.
                spec = gym.spec(env_name_or_creator)
                if spec.order_enforce:
                    spec = dataclasses.replace(spec, order_enforce=False)
                kwargs = {"disable_env_checker": True, **dict(config)}
                self.envs = [gym.make(spec, **kwargs) for _ in range(num)]
            else:
                self.envs = [env_name_or_creator(config) for _ in range(num)]
            self.possible_agents = list(range(num))
            self.agents = list(self.possible_agents)
            self.observation_spaces = {i: e.observation_space for i, e in enumerate(self.envs)}
            self.action_spaces = {i: e.action_space for i, e in enumerate(self.envs)}
            self._ended: set[int] = set()
            self._truncated: set[int] = set()
            self._was_reset = False
            super().__init__()

        def reset(
            self, *, seed: int | None = None, options: dict | None = None
        ) -> tuple[MultiAgentDict, MultiAgentDict]:
            self._ended = set()
            self._truncated = set()
            self.agents = list(self.possible_agents)
            self._was_reset = True
            obs, infos = {}, {}
            for i, env in enumerate(self.envs):
                obs[i], infos[i] = env.reset(seed=seed, options=options)
            return obs, infos

        def step(self, action_dict: MultiAgentDict) -> tuple:
            if not action_dict:
                raise ValueError(
                    "make_multi_agent env: step() needs at least one action, got an empty dict."
                )
            if not self._was_reset:
                raise gym.error.ResetNeeded(
                    "make_multi_agent env: call reset() before step() (as gymnasium's "
                    "OrderEnforcing wrapper requires of each copy)."
                )
            obs, rew, terms, truncs, infos = {}, {}, {}, {}, {}
            envs = self.envs
            for i, action in action_dict.items():
                obs[i], rew[i], te, tr, infos[i] = envs[i].step(action)
                terms[i], truncs[i] = te, tr
                if te or tr:
                    self._ended.add(i)
                    if tr:
                        self._truncated.add(i)
                    self.agents = [a for a in self.possible_agents if a not in self._ended]
            n = len(envs)
            terms[_ALL] = len(self._ended) == n
            truncs[_ALL] = len(self._truncated) == n
            return obs, rew, terms, truncs, infos

        def render(self) -> Any:
            return self.envs[0].render()

        def close(self) -> None:
            for env in self.envs:
                env.close()

    name = env_name_or_creator if isinstance(env_name_or_creator, str) else None
    if name is None:
        name = getattr(env_name_or_creator, "__name__", "Env")
    MultiEnv.__name__ = MultiEnv.__qualname__ = "MultiAgent" + "".join(
        ch for ch in str(name).split("-v")[0] if ch.isalnum()
    )
    return MultiEnv
