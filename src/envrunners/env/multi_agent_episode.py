"""``MultiAgentEpisode``: one multi-agent env episode chunk (``ray.rllib.env.multi_agent_episode``).

Why: in a multi-agent env not every agent observes or acts at every env step
(turn-based games, agents that join late or finish early). The episode keeps one
``SingleAgentEpisode`` per agent (its own timeline: observation, action, reward
per *agent* step) plus, per agent, the mapping ``env_t_to_agent_t`` from env step
to agent step ("S" where the agent did not observe). Data that arrives between an
agent's observations is held in *hanging* caches until its next observation:

- ``_hanging_actions_end`` / ``_hanging_extra_model_outputs_end``: the agent acted
  but has not observed the result yet;
- ``_hanging_rewards_end``: rewards received since its last observation;
- ``_hanging_rewards_begin``: rewards received before its first observation in
  this chunk; in a ``cut()`` successor it holds the predecessor's
  ``_hanging_rewards_end`` and is added to the step that completes there.

``add_env_step`` touches only the agents named in that step (O(agents in the
step)); the "S" entries of agents that did not take part are filled in lazily.
Private helpers: ``_multi_agent_episode_index`` (env-step <-> agent-step
indexing, splitting per-step data by agent), ``_multi_agent_episode_access``
(getters and setters), ``_multi_agent_episode_ops`` (construction from
recorded data, ``cut``, ``slice``, ``concat_episode``, ``get_state``,
``validate``, ``print``) and ``_multi_agent_episode_fast`` (the sampler's
``try_add_plain_env_step``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from envrunners.core import DEFAULT_MODULE_ID
from envrunners.env._episode_ids import new_episode_id
from envrunners.env._multi_agent_episode_access import MultiAgentAccessMixin
from envrunners.env._multi_agent_episode_fast import MultiAgentFastStepMixin, new_agent_episode
from envrunners.env._multi_agent_episode_index import (
    _M,
    SKIP_ENV_TS_TAG,
    space_for,
    truncated_without_obs,
)
from envrunners.env._multi_agent_episode_ops import MultiAgentOpsMixin
from envrunners.env.single_agent_episode import SingleAgentEpisode
from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from envrunners.errors import MultiAgentEnvError

if TYPE_CHECKING:
    from envrunners.policy.sample_batch import MultiAgentBatch

__all__ = ["SKIP_ENV_TS_TAG", "MultiAgentEpisode"]

MultiAgentDict = dict[Any, Any]
_ALL = "__all__"
_DONE_MSG = "Cannot call `add_env_step` on a MultiAgentEpisode that is already done!"


def _default_agent_to_module(agent_id: Any, episode: Any = None, **kwargs: Any) -> str:
    """Map every agent to ``DEFAULT_MODULE_ID`` (the default mapping function)."""
    return DEFAULT_MODULE_ID


def _flags(value: Any) -> tuple[dict, bool]:
    """Split a ``terminateds``/``truncateds`` argument into (per-agent dict, ``__all__``)."""
    if isinstance(value, dict):
        return value, bool(value.get(_ALL, False))
    return {}, bool(value)


class MultiAgentEpisode(MultiAgentAccessMixin, MultiAgentOpsMixin, MultiAgentFastStepMixin):
    """A chunk of a multi-agent episode: one ``SingleAgentEpisode`` per agent.

    Why: the unit ``MultiAgentEnvRunner.sample()`` returns; see the module
    docstring for the hanging-data rules.

    Attributes:
        id_: The episode id, shared by all chunks of one episode.
        agent_to_module_mapping_fn: ``fn(agent_id, episode) -> module_id``.
        observation_space: Per-agent observation spaces (a dict, maybe empty).
        action_space: Per-agent action spaces (a dict, maybe empty).
        env_t_started: The env step at which this chunk starts.
        env_t: The env step of the chunk's last observation.
        agent_t_started: Per agent, its own step at which this chunk starts.
        agent_episodes: Per agent, its ``SingleAgentEpisode``.
        is_terminated: Whether the episode ended in a terminal state.
        is_truncated: Whether the episode was cut off.
    """

    SKIP_ENV_TS_TAG = SKIP_ENV_TS_TAG

    def __init__(
        self,
        id_: str | None = None,
        *,
        observations: list[MultiAgentDict] | None = None,
        observation_space: Any = None,
        infos: list[MultiAgentDict] | None = None,
        actions: list[MultiAgentDict] | None = None,
        action_space: Any = None,
        rewards: list[MultiAgentDict] | None = None,
        terminateds: MultiAgentDict | bool = False,
        truncateds: MultiAgentDict | bool = False,
        extra_model_outputs: list[MultiAgentDict] | None = None,
        env_t_started: int | None = None,
        agent_t_started: dict[Any, int] | None = None,
        len_lookback_buffer: int | str = "auto",
        agent_episode_ids: dict[Any, str] | None = None,
        agent_module_ids: dict[Any, str] | None = None,
        agent_to_module_mapping_fn: Callable[..., Any] | None = None,
    ):
        """Create an episode chunk, optionally from recorded per-env-step data.

        Args:
            id_: The episode id; 32 random hex digits (like uuid4().hex) if None.
            observations: ``T + 1`` dicts ``{agent_id: obs}``, one per env step
                (lookback included); only the agents that observed appear.
            observation_space: Per-agent observation spaces.
            infos: ``T + 1`` dicts ``{agent_id: info}``; empty by default.
            actions: ``T`` dicts ``{agent_id: action}``; action ``j`` was sent on
                observation ``j``.
            action_space: Per-agent action spaces.
            rewards: ``T`` dicts ``{agent_id: reward}`` (partial rewards allowed:
                they add up to the agent's step reward).
            terminateds: A bool, or per-agent flags plus ``"__all__"``.
            truncateds: A bool, or per-agent flags plus ``"__all__"``.
            extra_model_outputs: ``T`` dicts ``{agent_id: {key: value}}``.
            env_t_started: The env step of the first non-lookback observation.
            agent_t_started: Per agent, its own step at the chunk start (0 default).
            len_lookback_buffer: How many leading env steps are lookback;
                ``"auto"`` makes all given data lookback (``len == 0``).
            agent_episode_ids: Per agent, the id its ``SingleAgentEpisode`` gets.
            agent_module_ids: Per agent, a fixed module id (skips the mapping fn).
            agent_to_module_mapping_fn: ``fn(agent_id, episode) -> module_id``;
                everything maps to ``"default_policy"`` by default.

        Raises:
            MultiAgentEnvError: The data is inconsistent (lengths, or an agent
                acting without observing).
        """
        self.id_ = id_ or new_episode_id()
        self.agent_to_module_mapping_fn = agent_to_module_mapping_fn or _default_agent_to_module
        self._agent_to_module_mapping: dict[Any, Any] = dict(agent_module_ids or {})
        self.observation_space = observation_space or {}
        self.action_space = action_space or {}
        self.env_t_started = int(env_t_started or 0)
        self.env_t = self.env_t_started
        self.agent_t_started: defaultdict[Any, int] = defaultdict(int, agent_t_started or {})
        self._agent_episode_ids: dict[Any, str] = dict(agent_episode_ids or {})
        self.agent_episodes: dict[Any, SingleAgentEpisode] = {}
        self._env_t_to_agent_t: dict[Any, InfiniteLookbackBuffer] = {}
        self._hanging_actions_end: dict[Any, Any] = {}
        self._hanging_extra_model_outputs_end: dict[Any, dict] = {}
        self._hanging_rewards_end: dict[Any, Any] = {}
        self._hanging_rewards_begin: dict[Any, Any] = {}
        # Agents whose `_hanging_rewards_begin` is a predecessor's pending reward that
        # belongs to the agent's next completed step (see `cut()`).
        self._carried_begin: set[Any] = set()
        self._done_agent_ids: set[Any] = set()
        # The agents that observed at the last env step (None: derive from the mapping).
        self._stepped_cache: list[Any] | None = None
        self._len_lookback_buffers = 0
        self._start_time: float | None = None
        self._last_step_time: float | None = None
        self._custom_data: dict[str, Any] = {}
        term_flags, self.is_terminated = _flags(terminateds)
        trunc_flags, self.is_truncated = _flags(truncateds)
        if observations:
            self._init_from_data(
                observations,
                infos,
                actions,
                rewards,
                extra_model_outputs,
                term_flags,
                trunc_flags,
                len_lookback_buffer,
            )

    # ------------------------------------------------------------ properties
    @property
    def env_t_to_agent_t(self) -> dict[Any, InfiniteLookbackBuffer]:
        """Per agent, its step at every env step of the chunk ("S" = did not observe)."""
        for aid in self._env_t_to_agent_t:
            self._mapping_data(aid)
        return self._env_t_to_agent_t

    @property
    def is_reset(self) -> bool:
        """Whether any agent has an observation (the env was reset)."""
        return any(sa.is_reset for sa in self.agent_episodes.values())

    @property
    def is_numpy(self) -> bool:
        """Whether the agents' step data is numpy (all agents must agree).

        Agents without any step data (only an observation) do not count.

        Raises:
            RuntimeError: Some agent episodes are numpy and others are not.
        """
        stepped = [sa for sa in self.agent_episodes.values() if sa.rewards.len_incl_lookback()]
        if stepped:
            flags = {sa.is_numpy for sa in stepped}
        else:
            flags = {sa.observations.finalized for sa in self.agent_episodes.values()}
        if len(flags) > 1:
            raise RuntimeError(
                "The agents of this MultiAgentEpisode disagree on `is_numpy`: call "
                "`to_numpy()` on the MultiAgentEpisode, not on single agent episodes."
            )
        return flags.pop() if flags else False

    @property
    def is_done(self) -> bool:
        """Whether the episode is terminated or truncated."""
        return self.is_terminated or self.is_truncated

    @property
    def agent_ids(self) -> set[Any]:
        """The ids of all agents that have observed in this chunk (or its lookback)."""
        return set(self.agent_episodes)

    @property
    def agent_episode_ids(self) -> dict[Any, str]:
        """Per agent, the id of its ``SingleAgentEpisode``."""
        return {aid: sa.id_ for aid, sa in self.agent_episodes.items()}

    @property
    def custom_data(self) -> dict[str, Any]:
        """A free-form dict for user data (deep-copied by ``cut``, merged by ``concat``)."""
        return self._custom_data

    def module_for(self, agent_id: Any) -> Any:
        """Return the module id acting for ``agent_id`` (fixed for the whole episode)."""
        mid = self._agent_to_module_mapping.get(agent_id, _M)
        if mid is _M:
            mid = self.agent_to_module_mapping_fn(agent_id, self)
            self._agent_to_module_mapping[agent_id] = mid
        return mid

    # ------------------------------------------------------------ adding data
    def add_env_reset(self, *, observations: MultiAgentDict, infos: MultiAgentDict | None = None):
        """Record the env's reset: each observing agent's episode starts here.

        Raises:
            MultiAgentEnvError: The episode is done or already has data.
        """
        if self.is_done:
            raise MultiAgentEnvError(
                "Cannot call `add_env_reset` on a MultiAgentEpisode that is already done!"
            )
        if self.env_t != 0 or self.env_t_started != 0 or self.is_reset:
            raise MultiAgentEnvError(
                "Cannot call `add_env_reset` on a MultiAgentEpisode that already has data "
                f"(env_t={self.env_t}, env_t_started={self.env_t_started}); start a new "
                "MultiAgentEpisode for a new env episode."
            )
        infos = infos or {}
        self._stepped_cache = []
        for aid, obs in observations.items():
            self._new_agent(aid, obs, infos.get(aid), self._len_lookback_buffers)
        self._start_time = time.perf_counter()

    def add_env_step(
        self,
        observations: MultiAgentDict,
        actions: MultiAgentDict,
        rewards: MultiAgentDict,
        infos: MultiAgentDict | None = None,
        *,
        terminateds: MultiAgentDict | None = None,
        truncateds: MultiAgentDict | None = None,
        extra_model_outputs: MultiAgentDict | None = None,
    ) -> None:
        """Record one ``env.step()``: the actions sent and everything the env returned.

        Why: this is the sampler's per-step call, so it costs O(agents named in
        the step); agents not named get their "S" mapping entries lazily.

        Per agent (see the module docstring for the caches):

        1. observation and action: a normal step; a reward is required.
        2. observation only: completes a hanging action (reward = hanging + now),
           or is the agent's first observation (the reward goes to
           ``_hanging_rewards_begin``); a first observation that is already
           terminal is dropped.
        3. action only: the action hangs until the next observation; if the agent
           terminates now, the step closes on a copy of its last observation.
        4. neither: rewards wait in the hanging caches; a termination closes a
           hanging action as in 3.

        Args:
            observations: ``{agent_id: obs}`` for the agents that observe now.
            actions: ``{agent_id: action}`` sent in this step.
            rewards: ``{agent_id: reward}`` received in this step.
            infos: ``{agent_id: info}``.
            terminateds: ``{agent_id: bool}`` plus ``"__all__"``.
            truncateds: ``{agent_id: bool}`` plus ``"__all__"``.
            extra_model_outputs: ``{agent_id: {key: value}}`` for the actions.

        Raises:
            MultiAgentEnvError: The step breaks the multi-agent protocol (the
                episode or an agent is already done, an observation and action
                without reward, a truncation without observation, acting without
                or twice before observing, observing twice without acting). The
                episode is unchanged then.
        """
        if self.is_done:
            raise MultiAgentEnvError(_DONE_MSG)
        infos = infos or {}
        terminateds = terminateds or {}
        truncateds = truncateds or {}
        extra = extra_model_outputs or {}
        all_term = bool(terminateds.get(_ALL, False))
        all_trunc = bool(truncateds.get(_ALL, False))
        env_t = self.env_t + 1
        # A dict (not a set) keeps the agents' order deterministic.
        agent_ids = {**observations, **actions, **rewards, **terminateds, **truncateds}
        if all_term or all_trunc:
            agent_ids.update(self.agent_episodes)
            agent_ids.update(self._hanging_rewards_begin)
        agent_ids.pop(_ALL, None)

        # Pass 1: check every agent before changing anything.
        plan = []
        for aid in agent_ids:
            obs = observations.get(aid, _M)
            act = actions.get(aid, _M)
            rew = rewards.get(aid, _M)
            term = all_term or bool(terminateds.get(aid, False))
            trunc = all_trunc or bool(truncateds.get(aid, False))
            sa = self.agent_episodes.get(aid)
            self._check_agent(aid, sa, obs, act, rew, term, trunc, env_t)
            if sa is None or not sa.is_done:
                plan.append((aid, sa, obs, act, rew, term, trunc))

        # Pass 2: apply.
        self.env_t = env_t
        self._stepped_cache = []
        pos = self._len_lookback_buffers + env_t - self.env_t_started
        hanging_actions = self._hanging_actions_end
        for aid, sa, obs, act, rew, term, trunc in plan:
            if sa is None:
                if rew is not _M:
                    self._hanging_rewards_begin[aid] = (
                        self._hanging_rewards_begin.get(aid, 0.0) + rew
                    )
                if term or trunc:
                    self._drop(aid)  # never observed before its end: it never stepped
                elif obs is not _M:
                    self._new_agent(aid, obs, infos.get(aid), pos)
                continue
            if act is not _M:
                if obs is not _M:  # case 1
                    self._complete(
                        aid, sa, obs, infos.get(aid), act, extra.get(aid), rew, term, trunc, pos
                    )
                elif term:  # case 3, terminated without a last observation
                    self._complete_on_last_obs(aid, sa, act, extra.get(aid), rew, trunc, pos)
                else:  # case 3: the action hangs
                    hanging_actions[aid] = act
                    self._hanging_extra_model_outputs_end[aid] = extra.get(aid) or {}
                    if rew is not _M:
                        self._hanging_rewards_end[aid] = (
                            self._hanging_rewards_end.get(aid, 0.0) + rew
                        )
            elif aid in hanging_actions:
                if obs is not _M:  # case 2
                    act = hanging_actions.pop(aid)
                    ext = self._hanging_extra_model_outputs_end.pop(aid, None)
                    self._complete(aid, sa, obs, infos.get(aid), act, ext, rew, term, trunc, pos)
                elif term:  # case 4, terminated while waiting
                    act = hanging_actions.pop(aid)
                    ext = self._hanging_extra_model_outputs_end.pop(aid, None)
                    self._complete_on_last_obs(aid, sa, act, ext, rew, trunc, pos)
                elif rew is not _M:  # case 4
                    self._hanging_rewards_end[aid] = self._hanging_rewards_end.get(aid, 0.0) + rew
            elif term or trunc:
                # Done while its last observation still waits for an action: that
                # observation becomes its last; pending rewards have no step to go to.
                sa.is_terminated = sa.is_terminated or term
                sa.is_truncated = sa.is_truncated or trunc
                self._hanging_rewards_end.pop(aid, None)
                if aid in self._carried_begin:
                    self._carried_begin.discard(aid)
                    self._hanging_rewards_begin.pop(aid, None)
                self._done_agent_ids.add(aid)
            elif rew is not _M:  # case 4: waiting to act
                self._hanging_rewards_end[aid] = self._hanging_rewards_end.get(aid, 0.0) + rew

        self.is_terminated = all_term
        self.is_truncated = all_trunc
        self._update_all_done()
        self._last_step_time = time.perf_counter()
        if self._start_time is None:
            self._start_time = self._last_step_time

    def _check_agent(
        self,
        aid: Any,
        sa: SingleAgentEpisode | None,
        obs: Any,
        act: Any,
        rew: Any,
        term: bool,
        trunc: bool,
        env_t: int,
    ) -> None:
        """Raise ``MultiAgentEnvError`` if this agent's part of a step breaks the protocol."""
        has_obs, has_act, has_rew = obs is not _M, act is not _M, rew is not _M
        if sa is not None and sa.is_done:
            if has_obs or has_act or has_rew:
                what = [
                    n for n, h in (("obs", has_obs), ("action", has_act), ("reward", has_rew)) if h
                ]
                raise MultiAgentEnvError(
                    f"Agent {aid!r} is already done (terminated or truncated) but received "
                    f"{'/'.join(what)} at env step {env_t}: a done agent must not get any "
                    "more data in this episode."
                )
            return
        hanging = aid in self._hanging_actions_end
        if has_act:
            if sa is None:
                raise MultiAgentEnvError(
                    f"Agent {aid!r} sent an action at env step {env_t} but has not received "
                    "any observation in this episode; an agent can only act on an observation."
                )
            if hanging:
                raise MultiAgentEnvError(
                    f"Agent {aid!r} sent an action at env step {env_t} while its previous "
                    "action still waits for the next observation; an agent cannot act twice "
                    "without observing in between."
                )
            if has_obs and not has_rew:
                raise MultiAgentEnvError(
                    f"Agent {aid!r} received an observation and sent an action at env step "
                    f"{env_t} but did NOT receive any reward! Give it a reward (0.0 if none)."
                )
            if not has_obs and trunc and not term:
                raise MultiAgentEnvError(truncated_without_obs(aid, env_t))
        elif sa is not None:
            if has_obs and not hanging:
                raise MultiAgentEnvError(
                    f"Agent {aid!r} received an observation at env step {env_t} without having "
                    "acted on its previous one; send an action for every agent in "
                    "`get_agents_to_act()`."
                )
            if not has_obs and hanging and trunc and not term:
                raise MultiAgentEnvError(truncated_without_obs(aid, env_t))

    def _new_agent(self, aid: Any, obs: Any, info: Any, pos: int) -> None:
        """Start ``aid``'s episode with its first observation at mapping position ``pos``."""
        sa = new_agent_episode(
            self._agent_episode_ids.get(aid),
            obs,
            info if info is not None else {},
            space_for(self.observation_space, aid),
            space_for(self.action_space, aid),
            aid,
            self.module_for(aid),
            self.id_,
        )
        self.agent_episodes[aid] = sa
        self.agent_t_started[aid] = 0
        data: list[Any] = [SKIP_ENV_TS_TAG] * pos
        data.append(0)
        if self._stepped_cache is not None:
            self._stepped_cache.append(aid)
        # = InfiniteLookbackBuffer(data=data, lookback=...), minus its checks
        lookback = min(int(self._len_lookback_buffers), len(data))
        self._env_t_to_agent_t[aid] = InfiniteLookbackBuffer._raw(data, lookback, None, None, False)

    def _complete(
        self,
        aid: Any,
        sa: SingleAgentEpisode,
        obs: Any,
        info: Any,
        act: Any,
        ext: dict | None,
        rew: Any,
        term: bool,
        trunc: bool,
        pos: int,
    ) -> None:
        """Add one agent step (all pending rewards included) and its mapping entry."""
        reward = 0.0 if rew is _M else rew
        pending = self._hanging_rewards_end.pop(aid, _M)
        if pending is not _M:
            reward = pending + reward
        if aid in self._carried_begin:
            self._carried_begin.discard(aid)
            reward = self._hanging_rewards_begin.pop(aid, 0.0) + reward
        sa.add_env_step(
            obs,
            act,
            reward,
            info if info is not None else {},
            terminated=term,
            truncated=trunc,
            extra_model_outputs=ext,
        )
        data = self._env_t_to_agent_t[aid].data
        missing = pos - len(data)
        if missing > 0:
            data.extend([SKIP_ENV_TS_TAG] * missing)
        data.append(sa.t)
        if self._stepped_cache is not None:
            self._stepped_cache.append(aid)
        if term or trunc:
            self._done_agent_ids.add(aid)

    def _complete_on_last_obs(
        self,
        aid: Any,
        sa: SingleAgentEpisode,
        act: Any,
        ext: dict | None,
        rew: Any,
        trunc: bool,
        pos: int,
    ) -> None:
        """Close a terminated agent's last step on a copy of its last observation and info."""
        last_obs = sa.observations.get(-1)
        last_info = sa.infos.get(-1)
        self._complete(aid, sa, last_obs, last_info, act, ext, rew, True, trunc, pos)

    def _drop(self, aid: Any) -> None:
        """Forget every hanging value of an agent that never got its own episode."""
        for cache in (
            self._hanging_actions_end,
            self._hanging_extra_model_outputs_end,
            self._hanging_rewards_end,
            self._hanging_rewards_begin,
        ):
            cache.pop(aid, None)
        self._carried_begin.discard(aid)

    def _update_all_done(self) -> None:
        """Mark the episode terminated once every known agent is done; then tidy up.

        At the end, rewards of agents that never observed belong to no step and
        are dropped (like every other hanging value of a finished agent).
        """
        if (
            not self.is_done
            and self.agent_episodes
            and len(self._done_agent_ids) >= len(self.agent_episodes)
            and all(sa.is_done for sa in self.agent_episodes.values())  # rarely reached
        ):
            self.is_terminated = True
        if self.is_done and self._hanging_rewards_begin:
            for aid in [a for a in self._hanging_rewards_begin if a not in self.agent_episodes]:
                self._drop(aid)

    def _mapping_data(self, aid: Any) -> list[Any]:
        """Return ``aid``'s mapping list, padded with "S" up to the current env step."""
        data = self._env_t_to_agent_t[aid].data
        missing = self._len_lookback_buffers + self.env_t - self.env_t_started + 1 - len(data)
        if missing > 0:
            data.extend([SKIP_ENV_TS_TAG] * missing)
        return data

    # ------------------------------------------------------------- queries
    def get_terminateds(self) -> MultiAgentDict:
        """Return ``{agent_id: terminated, "__all__": is_terminated}``."""
        out = {aid: sa.is_terminated for aid, sa in self.agent_episodes.items()}
        out[_ALL] = self.is_terminated
        return out

    def get_truncateds(self) -> MultiAgentDict:
        """Return ``{agent_id: truncated, "__all__": is_truncated}`` (RLlib's ``__all__`` bug fixed)."""
        out = {aid: sa.is_truncated for aid, sa in self.agent_episodes.items()}
        out[_ALL] = self.is_truncated
        return out

    def get_agents_that_stepped(self) -> set[Any]:
        """Return the agents that observed at the last env step.

        O(agents in the last step) after ``add_env_step``/``add_env_reset``.
        """
        if self._stepped_cache is None:
            target = self._len_lookback_buffers + len(self) + 1
            self._stepped_cache = [
                aid
                for aid, buf in self._env_t_to_agent_t.items()
                if len(buf.data) == target and buf.data[-1] != SKIP_ENV_TS_TAG
            ]
        return {aid for aid in self._stepped_cache if aid in self.agent_episodes}

    def get_agents_to_act(self) -> set[Any]:
        """Return the agents that observed at the last env step and are not done."""
        episodes = self.agent_episodes
        return {
            aid
            for aid in self.get_agents_that_stepped()
            if aid in episodes and not episodes[aid].is_done
        }

    def get_return(self, include_hanging_rewards: bool = False) -> float:
        """Return the sum of all agents' step rewards in this chunk.

        Args:
            include_hanging_rewards: Also add the rewards waiting in the hanging
                caches (before an agent's first observation, or since its last).
        """
        ret = sum(sa.get_return() for sa in self.agent_episodes.values())
        if include_hanging_rewards:
            ret += sum(self._hanging_rewards_begin.values())
            ret += sum(self._hanging_rewards_end.values())
        return float(ret)

    def get_duration_s(self) -> float:
        """Return wall-clock seconds from the chunk's start to its last step (0.0 if none)."""
        if self._start_time is None or self._last_step_time is None:
            return 0.0
        return self._last_step_time - self._start_time

    def env_steps(self) -> int:
        """Return the number of env steps in this chunk (``len(self)``)."""
        return self.env_t - self.env_t_started

    def agent_steps(self) -> int:
        """Return the number of agent steps in this chunk (summed over agents)."""
        return sum(len(sa) for sa in self.agent_episodes.values())

    def __len__(self) -> int:
        """Return the number of env steps in this chunk."""
        return self.env_t - self.env_t_started

    def get_sample_batch(self) -> MultiAgentBatch:
        """Return ``MultiAgentBatch({agent_id: SampleBatch}, env_steps=len(self))``.

        Keyed by agent id (not module id), like RLlib; agents without steps are left out.
        """
        from envrunners.policy.sample_batch import MultiAgentBatch

        batches = {aid: sa.get_sample_batch() for aid, sa in self.agent_episodes.items() if len(sa)}
        return MultiAgentBatch(batches, env_steps=len(self))
