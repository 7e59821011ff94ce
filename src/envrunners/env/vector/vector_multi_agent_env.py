"""``VectorMultiAgentEnv``: the common surface of vectorised multi-agent envs.

Why: the multi-agent runner steps ``num_envs`` copies of a ``MultiAgentEnv``
together; the sync and async implementations share this surface. Observations,
rewards, flags and infos come back as lists (one per-agent dict per sub-env);
actions go in as a list of per-agent dicts. A sub-env whose episode ended is
reset on the *next* ``step`` (gymnasium's ``NEXT_STEP`` autoreset): its action
is ignored and its reset observation is returned with zero rewards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from envrunners.env.vector._sub_env_lifecycle import recreate_sub_env, sub_env_seeds
from envrunners.errors import MultiAgentEnvError

__all__ = ["ALL", "VectorMultiAgentEnv", "restart_sub_env", "single_spaces_of"]

ALL = "__all__"
#: Attempts to rebuild a failed multi-agent sub-env before giving up.
MAX_RESTART_ATTEMPTS = 5


def _unwrapped(env: Any) -> Any:
    return getattr(env, "unwrapped", env)


def single_spaces_of(env: Any) -> tuple[dict, dict, list]:
    """Per-agent observation and action spaces of one sub-env, plus its possible agents.

    Reads ``observation_spaces`` (else a ``Dict`` ``observation_space``, else
    ``get_observation_space(aid)`` per possible agent), likewise for actions.

    Raises:
        MultiAgentEnvError: A possible agent has no space (names it and the known agents).
    """
    env = _unwrapped(env)
    agents = list(getattr(env, "possible_agents", None) or getattr(env, "agents", None) or [])

    def spaces(per_agent: str, legacy: str, getter: str) -> dict:
        found = getattr(env, per_agent, None)
        if found is None:
            space = getattr(env, legacy, None)
            if isinstance(space, gym.spaces.Dict):
                found = dict(space.spaces)
            elif hasattr(env, getter):
                found = {aid: getattr(env, getter)(aid) for aid in agents}
            else:
                found = {}
        found = dict(found)
        missing = [aid for aid in agents if aid not in found]
        if missing:
            raise MultiAgentEnvError(
                f"{type(env).__name__}: agent(s) {missing} of possible_agents have no entry in "
                f"`{per_agent}` (known agents: {list(found)}). Give every possible agent a space."
            )
        return found

    obs = spaces("observation_spaces", "observation_space", "get_observation_space")
    act = spaces("action_spaces", "action_space", "get_action_space")
    return obs, act, agents or list(obs)


class VectorMultiAgentEnv:
    """Base of vectorised multi-agent envs (``num_envs`` copies of one ``MultiAgentEnv``).

    Attributes:
        num_envs: Number of sub-envs.
        single_observation_spaces: ``{agent_id: Space}`` of one sub-env.
        single_action_spaces: ``{agent_id: Space}`` of one sub-env.
        single_observation_space: The same as a ``gymnasium.spaces.Dict``.
        single_action_space: The same as a ``gymnasium.spaces.Dict``.
        possible_agents: All agents that may appear in a sub-env.
        closed: Whether ``close()`` was called.
    """

    metadata: dict[str, Any] = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
    num_envs: int = 0
    closed: bool = False
    render_mode: str | None = None
    spec: Any = None

    def _set_spaces(self, obs_spaces: dict, act_spaces: dict, possible_agents: list) -> None:
        self.single_observation_spaces = obs_spaces
        self.single_action_spaces = act_spaces
        self.possible_agents = list(possible_agents)
        self.single_observation_space = _as_dict_space(obs_spaces)
        self.single_action_space = _as_dict_space(act_spaces)
        # Legacy batched spaces: a Tuple of the per-sub-env Dict spaces.
        self.observation_space = gym.spaces.Tuple([self.single_observation_space] * self.num_envs)
        self.action_space = gym.spaces.Tuple([self.single_action_space] * self.num_envs)

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict | None = None
    ) -> tuple[list[dict], list[dict]]:
        """Reset every sub-env; return ``(obs per sub-env, infos per sub-env)``."""
        raise NotImplementedError

    def step(self, actions: list[dict]) -> tuple[list, list, list, list, list]:
        """Step every sub-env with its action dict; return the five per-sub-env lists."""
        raise NotImplementedError

    def close(self, **kwargs: Any) -> None:
        """Close all sub-envs (idempotent)."""
        if self.closed:
            return
        self.close_extras(**kwargs)
        self.closed = True

    def close_extras(self, **kwargs: Any) -> None:
        """Release what the subclass holds (sub-envs, processes)."""

    @property
    def unwrapped(self) -> VectorMultiAgentEnv:
        """The vector env itself (it is never wrapped)."""
        return self

    def _seeds(self, seed: int | list[int | None] | None) -> list[int | None]:
        return sub_env_seeds(seed, self.num_envs)

    def _check_autoreset_mode(self, autoreset_mode: Any) -> None:
        """Raise ``ValueError`` unless ``autoreset_mode`` is ``next_step`` (all we support)."""
        mode = str(getattr(autoreset_mode, "value", autoreset_mode)).lower()
        if mode not in ("next_step", "nextstep"):
            raise ValueError(
                f"{type(self).__name__} only supports autoreset_mode='next_step', got "
                f"{autoreset_mode!r}."
            )

    def __del__(self) -> None:
        try:
            if not getattr(self, "closed", True):
                self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_envs={self.num_envs})"


def _as_dict_space(spaces: dict) -> gym.spaces.Space:
    try:
        return gym.spaces.Dict(spaces)
    except Exception:  # noqa: BLE001 - unsortable/odd keys: keep insertion order
        space = gym.spaces.Dict()
        space.spaces = dict(spaces)
        return space


def autoreset_step(env: Any, possible_agents: list, actions: dict, needs_reset: bool) -> tuple:
    """One sub-env step with NEXT_STEP autoreset; returns the 5-tuple and the new flag.

    Shared by the sync vector env and the async worker processes so they behave
    identically.
    """
    if needs_reset:
        obs, infos = env.reset()
        rewards = dict.fromkeys(possible_agents, 0.0)
        terms = dict.fromkeys(possible_agents, False)
        truncs = dict.fromkeys(possible_agents, False)
        terms[ALL] = truncs[ALL] = False
        return (obs, rewards, terms, truncs, infos), False
    obs, rewards, terms, truncs, infos = env.step(actions)
    done = bool(terms.get(ALL, False)) or bool(truncs.get(ALL, False))
    return (obs, rewards, terms, truncs, infos), done


def restart_sub_env(
    env_fn: Callable[[], Any], old_env: Any, index: int, error: BaseException, *, log: bool = True
) -> tuple[Any, tuple]:
    """Replace a sub-env whose ``step`` raised (``recreate_sub_env``), as a step result.

    Returns the new env and a step result holding its reset observation (no
    rewards, no flags), so the caller can report it like an autoreset.

    Raises:
        RuntimeError: The env could not be rebuilt and reset in a few attempts.
    """
    env, (obs, infos) = recreate_sub_env(
        env_fn, old_env, index, error, attempts=MAX_RESTART_ATTEMPTS, log=log
    )
    return env, (obs, {}, {ALL: False}, {ALL: False}, infos)
