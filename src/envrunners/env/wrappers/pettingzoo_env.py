"""PettingZoo adapters: ``PettingZooEnv`` (AEC, turn-based) and ``ParallelPettingZooEnv``.

Why: PettingZoo is the common home of multi-agent envs; these adapters let its
envs run unchanged under the multi-agent runner (``ray.rllib.env.wrappers.pettingzoo_env``).

AEC (turn-based) semantics: only the agent whose turn it is (``agent_selection``)
gets an observation and must act. Every step reports the instantaneous rewards
of *all* live agents (PettingZoo's ``rewards``), so an agent waiting for its turn
collects the rewards of the others' moves; the multi-agent episode adds them to
that agent's next step. An agent that terminates or truncates is reported once,
with its final observation, and PettingZoo's "dead steps" (``step(None)``) are
taken here, so the caller never sees them. The episode ends (``"__all__"``) when
no live agent is left.
"""

from __future__ import annotations

from typing import Any

from envrunners.env.multi_agent_env import MultiAgentEnv
from envrunners.errors import MultiAgentEnvError

__all__ = ["ParallelPettingZooEnv", "PettingZooEnv"]

MultiAgentDict = dict[Any, Any]
_ALL = "__all__"


def _spaces(env: Any, agents: list[Any]) -> tuple[dict, dict]:
    obs = {a: env.observation_space(a) for a in agents}
    act = {a: env.action_space(a) for a in agents}
    return obs, act


def _all_flags(done_terms: dict, done_truncs: dict, all_done: bool) -> tuple[bool, bool]:
    """``(terminated, truncated)`` for ``"__all__"``: truncated only if every ending was."""
    if not all_done:
        return False, False
    truncated = bool(done_truncs) and not any(done_terms.values())
    return not truncated, truncated


class PettingZooEnv(MultiAgentEnv):
    """Runs a PettingZoo ``AECEnv`` (agents act one at a time) as a ``MultiAgentEnv``.

    Args:
        env: A PettingZoo AEC env (wrapped or not).

    Example:
        >>> env = PettingZooEnv(my_aec_env)  # doctest: +SKIP
        >>> obs, infos = env.reset(seed=0)  # {first agent: obs}
        >>> obs, rew, term, trunc, infos = env.step({next(iter(obs)): action})  # doctest: +SKIP
    """

    def __init__(self, env: Any):
        self.env = env
        self.possible_agents = list(env.possible_agents)
        self.agents = list(self.possible_agents)
        self.observation_spaces, self.action_spaces = _spaces(env, self.possible_agents)
        self._done: set[Any] = set()
        self._ever_terminated: dict[Any, bool] = {}
        self._ever_truncated: dict[Any, bool] = {}
        super().__init__()

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Reset; return the observation (and info) of the agent to act first only."""
        self.env.reset(seed=seed, options=options)
        self._done = set()
        self._ever_terminated, self._ever_truncated = {}, {}
        obs: MultiAgentDict = {}
        infos: MultiAgentDict = {}
        self._report_done(obs, infos)
        self._take_dead_steps(obs, infos)
        self._add_selected(obs, infos)
        self.agents = list(self.env.agents)
        return obs, infos

    def step(self, action_dict: MultiAgentDict) -> tuple:
        """Play the acting agent's move; report who acts next and every agent that ended.

        Raises:
            MultiAgentEnvError: ``action_dict`` lacks the acting agent.
        """
        env = self.env
        agent = env.agent_selection
        if agent not in action_dict:
            raise MultiAgentEnvError(
                f"Turn-based env {env}: it is {agent!r}'s turn, but step() got actions for "
                f"{list(action_dict)}. Send exactly the agents that received an observation."
            )
        env.step(action_dict[agent])
        done_before = self._done
        rewards = {a: r for a, r in env.rewards.items() if a not in done_before}
        obs: MultiAgentDict = {}
        infos: MultiAgentDict = {}
        terms, truncs = self._report_done(obs, infos)
        self._take_dead_steps(obs, infos)
        self._add_selected(obs, infos)
        self.agents = list(env.agents)
        all_done = not env.agents or all(a in self._done for a in env.agents)
        terms[_ALL], truncs[_ALL] = _all_flags(
            self._ever_terminated, self._ever_truncated, all_done
        )
        return obs, rewards, terms, truncs, infos

    def _report_done(self, obs: MultiAgentDict, infos: MultiAgentDict) -> tuple[dict, dict]:
        """Report each newly ended agent once: final obs, info and its flags."""
        env = self.env
        terms, truncs = {}, {}
        for a in env.agents:
            if a in self._done:
                continue
            term = bool(env.terminations.get(a, False))
            trunc = bool(env.truncations.get(a, False))
            if term or trunc:
                obs[a] = env.observe(a)
                infos[a] = env.infos.get(a, {})
                terms[a], truncs[a] = term, trunc
                self._done.add(a)
                if term:
                    self._ever_terminated[a] = True
                else:
                    self._ever_truncated[a] = True
        return terms, truncs

    def _take_dead_steps(self, obs: MultiAgentDict, infos: MultiAgentDict) -> None:
        """Remove ended agents with PettingZoo's ``step(None)`` while they hold the turn."""
        env = self.env
        for _ in range(len(self.possible_agents) + len(env.agents) + 1):
            if not env.agents:
                return
            agent = env.agent_selection
            if not (env.terminations.get(agent, False) or env.truncations.get(agent, False)):
                return
            env.step(None)

    def _add_selected(self, obs: MultiAgentDict, infos: MultiAgentDict) -> None:
        env = self.env
        if env.agents:
            agent = env.agent_selection
            if agent not in self._done:
                obs[agent] = env.observe(agent)
                infos[agent] = env.infos.get(agent, {})

    def observe(self, agent: Any) -> Any:
        """The current observation of ``agent``."""
        return self.env.observe(agent)

    def render(self) -> Any:
        """Render the PettingZoo env."""
        return self.env.render()

    def close(self) -> None:
        """Close the PettingZoo env."""
        self.env.close()

    def get_sub_environments(self) -> Any:
        """The unwrapped PettingZoo env."""
        return self.env.unwrapped


class ParallelPettingZooEnv(MultiAgentEnv):
    """Runs a PettingZoo ``ParallelEnv`` (all live agents act together) as a ``MultiAgentEnv``.

    Ended agents are reported with their final observation and then leave; the
    episode ends when no live agent is left (``"__all__"`` truncated only if
    every agent was truncated).

    Args:
        env: A PettingZoo parallel env.
    """

    def __init__(self, env: Any):
        self.par_env = env
        self.possible_agents = list(env.possible_agents)
        self.agents = list(self.possible_agents)
        self.observation_spaces, self.action_spaces = _spaces(env, self.possible_agents)
        self._terminated: dict[Any, bool] = {}
        self._truncated: dict[Any, bool] = {}
        super().__init__()

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[MultiAgentDict, MultiAgentDict]:
        """Reset; return every agent's observation and info."""
        obs, infos = self.par_env.reset(seed=seed, options=options)
        self._terminated, self._truncated = {}, {}
        self.agents = list(self.par_env.agents)
        infos = infos or {}
        return obs, {a: infos.get(a, {}) for a in obs}

    def step(self, action_dict: MultiAgentDict) -> tuple:
        """Step all live agents; add ``"__all__"`` once no agent is left."""
        obs, rewards, terms, truncs, infos = self.par_env.step(action_dict)
        terms, truncs = dict(terms), dict(truncs)
        for a, flag in terms.items():
            if flag:
                self._terminated[a] = True
        for a, flag in truncs.items():
            if flag and not terms.get(a, False):
                self._truncated[a] = True
        live = self.par_env.agents
        self.agents = list(live)
        all_done = not live or all(terms.get(a, False) or truncs.get(a, False) for a in live)
        terms[_ALL], truncs[_ALL] = _all_flags(self._terminated, self._truncated, all_done)
        infos = infos or {}
        return obs, rewards, terms, truncs, {a: infos.get(a, {}) for a in obs}

    def render(self) -> Any:
        """Render the PettingZoo env."""
        return self.par_env.render()

    def close(self) -> None:
        """Close the PettingZoo env."""
        self.par_env.close()

    def get_sub_environments(self) -> Any:
        """The unwrapped PettingZoo env."""
        return self.par_env.unwrapped
