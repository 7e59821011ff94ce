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
``try_add_plain_env_step`` is the sampler's cheaper path for steps where nothing
hangs. Getters index env steps by default (``env_steps=True``): only agents that
observed at a requested env step appear there; with ``env_steps=False`` indices
are each agent's own steps. Setters always take each agent's own steps. The
env-step <-> agent-step index math lives in ``_agent_timeline`` (pure functions).

A successor (``cut``) or slice is built agent by agent with
``SingleAgentEpisode.cut``/``slice`` plus the matching window of the env-step
mapping, so single-agent data (numpy or not, custom data) carries over exactly.
"""

from __future__ import annotations

import copy
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from envrunners.core import DEFAULT_MODULE_ID
from envrunners.env._agent_timeline import (
    ACTIONS,
    EXTRA,
    INFOS,
    NOT_GIVEN,
    OBS,
    REWARDS,
    SKIP_ENV_TS_TAG,
    agent_index,
    as_agent_list,
    env_step_positions,
    last_obs_position,
    split_by_agent,
)
from envrunners.env._episode_ids import new_episode_id
from envrunners.env.single_agent_episode import (
    REWARD_SPACE,
    SingleAgentEpisode,
    check_successor,
    slice_only,
)
from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from envrunners.errors import MultiAgentEnvError
from envrunners.utils.spaces import (
    get_base_struct_from_space,
    gym_space_from_dict,
    gym_space_to_dict,
)

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


def _space_for(spaces: Any, agent_id: Any) -> Any:
    """Return the space of ``agent_id`` from a dict (or ``gym.spaces.Dict``) of spaces."""
    if not spaces:
        return None
    return spaces.get(agent_id) if hasattr(spaces, "get") else None


def _truncated_without_obs(aid: Any, env_t: int) -> str:
    """Return the error message for an agent truncated without a last observation."""
    return (
        f"Agent {aid!r} was truncated at env step {env_t} without a last observation! "
        "A truncated agent needs its final observation (for value bootstrapping): "
        "return one for it in that step's observations."
    )


def _buffer_of(sa: SingleAgentEpisode, what: str, key: str | None) -> InfiniteLookbackBuffer | None:
    """Return the single-agent buffer holding ``what`` (None for a missing extra key)."""
    if what == EXTRA:
        return sa.extra_model_outputs.get(key)
    return getattr(sa, what)


_REWARD_STRUCT = get_base_struct_from_space(REWARD_SPACE)
#: The attributes ``new_agent_episode`` sets; if ``SingleAgentEpisode`` changes
#: them, it uses the constructor instead.
_SA_SLOTS = frozenset(
    (
        "id_ agent_id module_id multi_agent_episode_id observations infos actions rewards "
        "extra_model_outputs is_terminated is_truncated t_started t _observation_space "
        "_action_space _last_added_observation _last_added_infos _start_time "
        "_last_step_time _custom_data"
    ).split()
)
_SA_FAST = frozenset(SingleAgentEpisode.__slots__) == _SA_SLOTS


def new_agent_episode(
    id_: str | None,
    observation: Any,
    info: dict,
    observation_space: Any,
    action_space: Any,
    agent_id: Any,
    module_id: Any,
    multi_agent_episode_id: str,
) -> SingleAgentEpisode:
    """``SingleAgentEpisode(...)`` followed by ``add_env_reset(observation, info)``.

    Why: a multi-agent episode starts one agent episode per agent; the generic
    constructor (argument checks, ``validate()``) costs several times this direct
    construction of the same empty, list-based, reset episode.
    """
    if not _SA_FAST:
        sa = SingleAgentEpisode(
            id_,
            observation_space=observation_space,
            action_space=action_space,
            agent_id=agent_id,
            module_id=module_id,
            multi_agent_episode_id=multi_agent_episode_id,
        )
        sa.add_env_reset(observation, info)
        return sa
    raw = InfiniteLookbackBuffer._raw
    sa = object.__new__(SingleAgentEpisode)
    sa.id_ = id_ or new_episode_id()
    sa.agent_id = agent_id
    sa.module_id = module_id
    sa.multi_agent_episode_id = multi_agent_episode_id
    obs_struct = (
        None if observation_space is None else get_base_struct_from_space(observation_space)
    )
    act_struct = None if action_space is None else get_base_struct_from_space(action_space)
    sa.observations = raw([observation], 0, observation_space, obs_struct, False)
    sa.infos = raw([info], 0, None, None, False)
    sa.actions = raw([], 0, action_space, act_struct, False)
    sa.rewards = raw([], 0, REWARD_SPACE, _REWARD_STRUCT, False)
    sa.extra_model_outputs = {}
    sa._observation_space = observation_space
    sa._action_space = action_space
    sa.is_terminated = sa.is_truncated = False
    sa.t_started = sa.t = 0
    sa._last_added_observation = observation
    sa._last_added_infos = info
    sa._start_time = time.perf_counter()
    sa._last_step_time = None
    sa._custom_data = {}
    return sa


class MultiAgentEpisode:
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

    def _init_from_data(
        self,
        observations: list[MultiAgentDict],
        infos: list[MultiAgentDict] | None,
        actions: list[MultiAgentDict] | None,
        rewards: list[MultiAgentDict] | None,
        extra_model_outputs: list[MultiAgentDict] | None,
        term_flags: dict,
        trunc_flags: dict,
        len_lookback_buffer: int | str,
    ) -> None:
        """Fill the episode from per-env-step lists (see ``__init__``)."""
        num_steps = len(rewards) if rewards is not None else len(observations) - 1
        actions = list(actions) if actions is not None else [{} for _ in range(num_steps)]
        rewards = list(rewards) if rewards is not None else [{} for _ in range(num_steps)]
        infos = list(infos) if infos is not None else [{} for _ in observations]
        extras = (
            list(extra_model_outputs)
            if extra_model_outputs is not None
            else [{} for _ in range(num_steps)]
        )
        sizes = {
            "observations": (len(observations), num_steps + 1),
            "infos": (len(infos), num_steps + 1),
            "actions": (len(actions), num_steps),
            "extra_model_outputs": (len(extras), num_steps),
        }
        bad = [
            f"len({k})={got} (expected {want})" for k, (got, want) in sizes.items() if got != want
        ]
        if bad:
            raise MultiAgentEnvError(
                f"Inconsistent MultiAgentEpisode data for {num_steps} env steps "
                f"(len(rewards)): " + ", ".join(bad) + "."
            )
        if len_lookback_buffer == "auto":
            lookback = num_steps
        elif isinstance(len_lookback_buffer, int) and len_lookback_buffer >= 0:
            lookback = min(len_lookback_buffer, num_steps)
        else:
            raise ValueError(
                f"len_lookback_buffer must be 'auto' or an int >= 0, got {len_lookback_buffer!r}."
            )
        self._len_lookback_buffers = lookback
        self.env_t = self.env_t_started + num_steps - lookback
        all_done = self.is_terminated or self.is_truncated
        columns = split_by_agent(observations, infos, actions, rewards, extras, lookback)
        for aid, c in columns.items():
            # An agent's own flags win; an agent not done by them ends with the episode.
            term = bool(term_flags.get(aid, False))
            trunc = bool(trunc_flags.get(aid, False))
            if not (term or trunc):
                term, trunc = self.is_terminated, self.is_truncated
            if not c.observations:
                if c.has_begin_reward and not (term or trunc or all_done):
                    self._hanging_rewards_begin[aid] = c.begin_reward
                continue
            if c.has_pending_action and (term or trunc):
                if not term:
                    raise MultiAgentEnvError(_truncated_without_obs(aid, self.env_t))
                # Terminated while waiting: close the step on a copy of the last obs.
                c.actions.append(c.pending_action)
                c.rewards.append(c.pending_reward)
                for k, v in c.pending_extras.items():
                    c.extras.setdefault(k, []).append(v)
                c.observations.append(c.observations[-1])
                c.infos.append(c.infos[-1])
                c.obs_positions.append(num_steps)
                c.has_pending_reward = False
                c.pending_action = NOT_GIVEN
            for k, v in c.extras.items():
                if len(v) != len(c.actions):
                    raise MultiAgentEnvError(
                        f"Agent {aid!r}: extra model output {k!r} is given for {len(v)} of "
                        f"its {len(c.actions)} steps; give it for every step or none."
                    )
            n_lb = max(sum(1 for p in c.obs_positions if p <= lookback) - 1, 0)
            t_started = int(self.agent_t_started[aid])
            sa = SingleAgentEpisode(
                self._agent_episode_ids.get(aid),
                observations=c.observations,
                observation_space=_space_for(self.observation_space, aid),
                infos=c.infos,
                actions=c.actions,
                action_space=_space_for(self.action_space, aid),
                rewards=c.rewards,
                terminated=term,
                truncated=trunc,
                extra_model_outputs=c.extras,
                t_started=t_started,
                len_lookback_buffer=n_lb,
                agent_id=aid,
                module_id=self.module_for(aid),
                multi_agent_episode_id=self.id_,
            )
            self.agent_episodes[aid] = sa
            mapping: list[Any] = [SKIP_ENV_TS_TAG] * (num_steps + 1)
            for k, p in enumerate(c.obs_positions):
                mapping[p] = t_started - n_lb + k
            self._env_t_to_agent_t[aid] = InfiniteLookbackBuffer(data=mapping, lookback=lookback)
            if c.has_begin_reward:
                self._hanging_rewards_begin[aid] = c.begin_reward
            if sa.is_done:
                self._done_agent_ids.add(aid)
                continue
            if c.has_pending_action:
                self._hanging_actions_end[aid] = c.pending_action
                self._hanging_extra_model_outputs_end[aid] = c.pending_extras
            if c.has_pending_reward:
                self._hanging_rewards_end[aid] = c.pending_reward
        self._update_all_done()

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
        mid = self._agent_to_module_mapping.get(agent_id, NOT_GIVEN)
        if mid is NOT_GIVEN:
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
            obs = observations.get(aid, NOT_GIVEN)
            act = actions.get(aid, NOT_GIVEN)
            rew = rewards.get(aid, NOT_GIVEN)
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
                if rew is not NOT_GIVEN:
                    self._hanging_rewards_begin[aid] = (
                        self._hanging_rewards_begin.get(aid, 0.0) + rew
                    )
                if term or trunc:
                    self._drop(aid)  # never observed before its end: it never stepped
                elif obs is not NOT_GIVEN:
                    self._new_agent(aid, obs, infos.get(aid), pos)
                continue
            if act is not NOT_GIVEN:
                if obs is not NOT_GIVEN:  # case 1
                    self._complete(
                        aid, sa, obs, infos.get(aid), act, extra.get(aid), rew, term, trunc, pos
                    )
                elif term:  # case 3, terminated without a last observation
                    self._complete_on_last_obs(aid, sa, act, extra.get(aid), rew, trunc, pos)
                else:  # case 3: the action hangs
                    hanging_actions[aid] = act
                    self._hanging_extra_model_outputs_end[aid] = extra.get(aid) or {}
                    if rew is not NOT_GIVEN:
                        self._hanging_rewards_end[aid] = (
                            self._hanging_rewards_end.get(aid, 0.0) + rew
                        )
            elif aid in hanging_actions:
                if obs is not NOT_GIVEN:  # case 2
                    act = hanging_actions.pop(aid)
                    ext = self._hanging_extra_model_outputs_end.pop(aid, None)
                    self._complete(aid, sa, obs, infos.get(aid), act, ext, rew, term, trunc, pos)
                elif term:  # case 4, terminated while waiting
                    act = hanging_actions.pop(aid)
                    ext = self._hanging_extra_model_outputs_end.pop(aid, None)
                    self._complete_on_last_obs(aid, sa, act, ext, rew, trunc, pos)
                elif rew is not NOT_GIVEN:  # case 4
                    self._hanging_rewards_end[aid] = self._hanging_rewards_end.get(aid, 0.0) + rew
            elif term or trunc:
                # Done while its last observation still waits for an action: that
                # observation becomes its last; pending rewards have no step to go to.
                sa.is_terminated = sa.is_terminated or term
                sa.is_truncated = sa.is_truncated or trunc
                self._drop_pending(aid)
                self._done_agent_ids.add(aid)
            elif rew is not NOT_GIVEN:  # case 4: waiting to act
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
        has_obs, has_act, has_rew = obs is not NOT_GIVEN, act is not NOT_GIVEN, rew is not NOT_GIVEN
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
                raise MultiAgentEnvError(_truncated_without_obs(aid, env_t))
        elif sa is not None:
            if has_obs and not hanging:
                raise MultiAgentEnvError(
                    f"Agent {aid!r} received an observation at env step {env_t} without having "
                    "acted on its previous one; send an action for every agent in "
                    "`get_agents_to_act()`."
                )
            if not has_obs and hanging and trunc and not term:
                raise MultiAgentEnvError(_truncated_without_obs(aid, env_t))

    def _new_agent(self, aid: Any, obs: Any, info: Any, pos: int) -> None:
        """Start ``aid``'s episode with its first observation at mapping position ``pos``."""
        sa = new_agent_episode(
            self._agent_episode_ids.get(aid),
            obs,
            info if info is not None else {},
            _space_for(self.observation_space, aid),
            _space_for(self.action_space, aid),
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
        reward = 0.0 if rew is NOT_GIVEN else rew
        pending = self._hanging_rewards_end.pop(aid, NOT_GIVEN)
        if pending is not NOT_GIVEN:
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
        self._drop_pending(aid)
        self._hanging_rewards_begin.pop(aid, None)

    def _drop_pending(self, aid: Any) -> None:
        """Forget what waits for ``aid``'s next step: a hanging action and its rewards.

        A reward carried from a predecessor (``_carried_begin``) waits for that step
        too and goes with them; rewards from before a first observation stay.
        """
        self._hanging_actions_end.pop(aid, None)
        self._hanging_extra_model_outputs_end.pop(aid, None)
        self._hanging_rewards_end.pop(aid, None)
        if aid in self._carried_begin:
            self._carried_begin.discard(aid)
            self._hanging_rewards_begin.pop(aid, None)

    def _pending_reward(self, aid: Any) -> Any:
        """Return the reward that ``aid``'s next completed step gets (NOT_GIVEN if none).

        The carry rule of ``cut`` and ``concat_episode``: rewards since the
        agent's last observation, plus a reward carried from a predecessor.
        """
        pending = self._hanging_rewards_end.get(aid, NOT_GIVEN)
        if aid in self._carried_begin:
            carried = self._hanging_rewards_begin[aid]
            pending = carried if pending is NOT_GIVEN else carried + pending
        return pending

    def _copy_hanging_action(self, source: MultiAgentEpisode, aid: Any) -> None:
        """Take over ``source``'s hanging action of ``aid`` (and its extra outputs), if any."""
        if aid in source._hanging_actions_end:
            self._hanging_actions_end[aid] = source._hanging_actions_end[aid]
            self._hanging_extra_model_outputs_end[aid] = dict(
                source._hanging_extra_model_outputs_end.get(aid) or {}
            )

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

    def try_add_plain_env_step(
        self,
        observations: dict,
        actions: dict,
        rewards: dict,
        infos: dict,
        terminateds: dict,
        truncateds: dict,
        extra_model_outputs: dict,
        now: float,
    ) -> bool:
        """Record the step like ``add_env_step`` if it is plain; else change nothing.

        Plain: the episode is ongoing and has no hanging actions or rewards; the
        agents that observe are exactly those that acted and got a reward, each
        has a (list-based, not done) agent episode; ``terminateds``/``truncateds``
        name exactly these agents (plus ``__all__``); if ``__all__`` ends the
        episode, every other agent is done already.

        Args:
            observations, actions, rewards, infos, terminateds, truncateds,
                extra_model_outputs: As for ``add_env_step`` (dicts, not None),
                except that an agent's extra model outputs may also be a pair
                ``(keys, values)`` (the sampler's cheaper form of a dict).
            now: ``time.perf_counter()`` of this step (the last-step timestamp).

        Returns:
            Whether the step was recorded.
        """
        if (
            self.is_terminated
            or self.is_truncated
            or self._hanging_actions_end
            or self._hanging_rewards_end
            or self._hanging_rewards_begin
            or self._carried_begin
        ):
            return False
        all_term = bool(terminateds.get(_ALL, False))
        all_trunc = bool(truncateds.get(_ALL, False))
        if not (
            isinstance(observations, dict)
            and isinstance(rewards, dict)
            and isinstance(terminateds, dict)
            and isinstance(truncateds, dict)
        ):
            return False  # add_env_step raises its own errors for odd types
        keys = observations.keys()
        # Same agents everywhere (C-level key-set comparisons); the flag dicts may
        # also hold "__all__", and name an agent only if it observed.
        if not (
            keys == actions.keys()
            and keys == rewards.keys()
            and terminateds.keys() >= keys
            and truncateds.keys() >= keys
            and len(terminateds) - (_ALL in terminateds) == len(keys)
            and len(truncateds) - (_ALL in truncateds) == len(keys)
        ):
            return False
        episodes = self.agent_episodes
        agents = []
        for aid in keys:
            sa = episodes.get(aid)
            if (
                sa is None
                or sa.is_terminated
                or sa.is_truncated
                or sa.observations.finalized
                or sa.actions.finalized
                or sa.rewards.finalized
                or sa.infos.finalized
            ):
                return False
            agents.append(sa)
        if (all_term or all_trunc) and len(agents) < len(episodes):
            # The episode ends: an agent that does not observe now must be done already.
            if not all(sa.is_done for aid, sa in episodes.items() if aid not in keys):
                return False

        env_t = self.env_t = self.env_t + 1
        stepped = self._stepped_cache = []
        pos = self._len_lookback_buffers + env_t - self.env_t_started
        mappings = self._env_t_to_agent_t
        new_buffer = InfiniteLookbackBuffer._raw
        for (aid, obs), sa in zip(observations.items(), agents):
            act, rew = actions[aid], rewards[aid]
            term = all_term or bool(terminateds[aid])
            trunc = all_trunc or bool(truncateds[aid])
            info = infos.get(aid)
            if info is None:
                info = {}
            # = SingleAgentEpisode.add_env_step on list buffers
            sa.observations.data.append(obs)
            sa.actions.data.append(act)
            sa.rewards.data.append(rew)
            sa.infos.data.append(info)
            t = sa.t = sa.t + 1
            ext = extra_model_outputs.get(aid)
            if ext:
                bufs = sa.extra_model_outputs
                for key, value in ext.items() if type(ext) is dict else zip(*ext):
                    buf = bufs.get(key)
                    if buf is None:  # = InfiniteLookbackBuffer([value])
                        bufs[key] = new_buffer([value], 0, None, None, False)
                    elif buf.finalized:
                        buf.append(value)
                    else:
                        buf.data.append(value)
            sa.is_terminated = term
            sa.is_truncated = trunc
            sa._last_added_observation = obs
            sa._last_added_infos = info
            sa._last_step_time = now
            # = the mapping entry of MultiAgentEpisode._complete
            data = mappings[aid].data
            missing = pos - len(data)
            if missing > 0:
                data.extend([SKIP_ENV_TS_TAG] * missing)
            data.append(t)
            stepped.append(aid)
            if term or trunc:
                self._done_agent_ids.add(aid)
        self.is_terminated = all_term
        self.is_truncated = all_trunc
        if all_term or all_trunc or len(self._done_agent_ids) >= len(episodes):
            self._update_all_done()  # (a no-op otherwise)
        self._last_step_time = now
        if self._start_time is None:
            self._start_time = now
        return True

    # --------------------------------------------------------------- getters
    def get_observations(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> MultiAgentDict | list[MultiAgentDict]:
        """Return observations by env step (default) or by each agent's own step.

        With ``env_steps=True`` only agents that observed at a requested env step
        appear there (unless ``fill`` is given, which pads every requested agent).

        Args:
            indices: None (the whole chunk), an int, a list of ints or a slice.
            agent_ids: None (all agents), one agent id or a collection of them.
            env_steps: Read ``indices`` as env steps (True) or agent steps.
            neg_index_as_lookback: Negative indices reach into the lookback.
            fill: Pad out-of-range or skipped positions with this value.
            one_hot_discrete: One-hot encode discrete observations.
            return_list: Return a list with one ``{agent_id: obs}`` per env step.

        Returns:
            ``{agent_id: obs or batch}``, or a list of ``{agent_id: obs}``.

        Example:
            After the reset ``{a: 0, b: 0}`` and a step in which only ``a``
            observed ``1``: ``get_observations(-1) == {"a": 1}`` and
            ``get_observations([0, 1]) == {"a": [0, 1], "b": [0]}``.
        """
        return self._get_data(
            OBS,
            indices,
            agent_ids,
            env_steps=env_steps,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            one_hot_discrete=one_hot_discrete,
            return_list=return_list,
        )

    def get_infos(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> MultiAgentDict | list[MultiAgentDict]:
        """Return infos (aligned with observations); see ``get_observations``."""
        return self._get_data(
            INFOS,
            indices,
            agent_ids,
            env_steps=env_steps,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            return_list=return_list,
        )

    def get_actions(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> MultiAgentDict | list[MultiAgentDict]:
        """Return actions; env step ``i`` holds the actions sent on observations ``i``.

        An action still hanging (no observation after it yet) is included at the env
        step of the observation it answered, and, with ``env_steps=False`` and explicit
        indices, one past the agent's last step (as in RLlib). See ``get_observations``.
        """
        return self._get_data(
            ACTIONS,
            indices,
            agent_ids,
            env_steps=env_steps,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            one_hot_discrete=one_hot_discrete,
            return_list=return_list,
        )

    def get_rewards(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> MultiAgentDict | list[MultiAgentDict]:
        """Return agent-step rewards; env step ``i`` holds those of agents observing at ``i+1``.

        With a hanging action, the rewards received since it are included with it (as
        in RLlib). See ``get_observations`` for the args.
        """
        return self._get_data(
            REWARDS,
            indices,
            agent_ids,
            env_steps=env_steps,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            return_list=return_list,
        )

    def get_extra_model_outputs(
        self,
        key: str,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> MultiAgentDict | list[MultiAgentDict]:
        """Return the extra model output ``key`` (aligned with actions); agents without it are left out."""
        return self._get_data(
            EXTRA,
            indices,
            agent_ids,
            key=key,
            env_steps=env_steps,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            return_list=return_list,
        )

    def _get_data(
        self,
        what: str,
        indices: Any,
        agent_ids: Any,
        *,
        key: str | None = None,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> Any:
        """Implement ``get_observations/infos/actions/rewards/extra_model_outputs``.

        Args:
            what: One of ``OBS``, ``INFOS``, ``ACTIONS``, ``REWARDS``, ``EXTRA``
                (then ``key`` names the extra model output).
            indices: None (all of this chunk), an int, a list of ints or a slice.
            agent_ids: None (all agents), one agent id or a collection of them.
            key: The extra model output key (``what == EXTRA``).
            env_steps: Indices are env steps (True) or each agent's own steps (False).
            neg_index_as_lookback: Negative indices reach into the lookback.
            fill: Pad out-of-range (and, with ``env_steps``, skipped) positions.
            one_hot_discrete: One-hot encode discrete observations/actions.
            return_list: Return a list (one multi-agent dict per env step).

        Returns:
            A dict ``{agent_id: item or batch}``, or a list of such dicts.
        """
        get_kw: dict[str, Any] = {"fill": fill}
        if what in (OBS, ACTIONS):
            get_kw["one_hot_discrete"] = one_hot_discrete
        agents = as_agent_list(agent_ids, self.agent_episodes.keys())

        if not env_steps:
            if return_list:
                raise ValueError(
                    "`return_list=True` needs `env_steps=True` (indices in env steps)."
                )
            out = {}
            for aid in agents:
                sa = self.agent_episodes.get(aid)
                buf = None if sa is None else _buffer_of(sa, what, key)
                if buf is not None:
                    # RLlib: explicit indices also reach a hanging value (one past the end).
                    hanging = NOT_GIVEN if indices is None else self._hanging_value(what, aid, key)
                    if hanging is not NOT_GIVEN:
                        get_kw["_add_last_ts_value"] = hanging
                    out[aid] = buf.get(
                        indices, neg_index_as_lookback=neg_index_as_lookback, **get_kw
                    )
                    get_kw.pop("_add_last_ts_value", None)
            return out

        lookback = self._len_lookback_buffers
        n_obs = lookback + len(self) + 1
        n = n_obs if what in (OBS, INFOS) else n_obs - 1
        positions = env_step_positions(indices, lookback, n, neg_index_as_lookback)
        single = isinstance(positions, int)
        if single and return_list:
            raise ValueError("`return_list=True` needs a list or slice of indices, not an int.")
        if single and not 0 <= positions < n and fill is None:
            raise IndexError(
                f"Env-step index {indices} is out of range: this chunk has {n - lookback} "
                f"{'observations' if n == n_obs else 'steps'} after a lookback of {lookback} "
                "(pass fill= to pad)."
            )
        if not single and fill is None:
            positions = [p for p in positions if 0 <= p < n]

        # Per agent: a relative index (or None for "absent") at every requested position.
        # A hanging value (see the module docstring) sits at the relative index ``len(sa)``,
        # one past the buffer's end, passed to ``buf.get`` as ``_add_last_ts_value``.
        per_agent: dict[Any, tuple[InfiniteLookbackBuffer, list[int | None], dict]] = {}
        plist = [positions] if single else positions
        for aid in agents:
            sa = self.agent_episodes.get(aid)
            if sa is None:
                continue
            buf = _buffer_of(sa, what, key)
            if buf is None:
                continue
            data = self._mapping_data(aid)
            t0, num, lb = sa.t_started, len(sa), buf.lookback
            rels = [agent_index(what, data, p, t0, num, lb) if 0 <= p < n else None for p in plist]
            kw = get_kw
            hanging = self._hanging_value(what, aid, key)
            if hanging is not NOT_GIVEN:
                at = last_obs_position(data)
                rels = [
                    num if r is None and p == at else r for p, r in zip(plist, rels, strict=True)
                ]
                kw = {**get_kw, "_add_last_ts_value": hanging}
            per_agent[aid] = (buf, rels, kw)

        far = 1 << 40  # a relative index that is out of range for every buffer (-> fill)
        if single or return_list:
            count = 1 if single else len(positions)
            rows: list[dict[Any, Any]] = [{} for _ in range(count)]
            for aid, (buf, rels, kw) in per_agent.items():
                for j, rel in enumerate(rels):
                    if rel is not None:
                        rows[j][aid] = buf.get(rel, neg_index_as_lookback=True, **kw)
                    elif fill is not None:
                        rows[j][aid] = buf.get(far, neg_index_as_lookback=True, **kw)
            return rows[0] if single else rows

        out = {}
        for aid, (buf, rels, kw) in per_agent.items():
            if fill is None:
                wanted = [r for r in rels if r is not None]
                if not wanted:
                    continue
            else:
                wanted = [far if r is None else r for r in rels]
            out[aid] = buf.get(wanted, neg_index_as_lookback=True, **kw)
        return out

    def _hanging_value(self, what: str, aid: Any, key: str | None) -> Any:
        """``aid``'s hanging action, reward or extra output ``key``, or ``NOT_GIVEN``.

        The agent acted on its last observation and has not observed since; the
        reward is what it received since then (as RLlib's getters report it).
        """
        if what not in (ACTIONS, REWARDS, EXTRA) or aid not in self._hanging_actions_end:
            return NOT_GIVEN
        if what == ACTIONS:
            return self._hanging_actions_end[aid]
        if what == REWARDS:
            return self._hanging_rewards_end.get(aid, 0.0)
        extras = self._hanging_extra_model_outputs_end.get(aid) or {}
        return extras.get(key, NOT_GIVEN)

    # --------------------------------------------------------------- setters
    def _sa(self, agent_id: Any) -> SingleAgentEpisode:
        """Return the agent's episode or raise a KeyError naming the known agents."""
        try:
            return self.agent_episodes[agent_id]
        except KeyError:
            raise KeyError(
                f"Agent {agent_id!r} has no episode here; agents: {sorted(map(str, self.agent_episodes))}."
            ) from None

    def set_observations(
        self,
        *,
        new_data: MultiAgentDict,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Overwrite observations per agent; ``at_indices`` are each agent's own steps."""
        self._set_data(OBS, new_data, at_indices, neg_index_as_lookback)

    def set_actions(
        self,
        *,
        new_data: MultiAgentDict,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Overwrite actions per agent; ``at_indices`` are each agent's own steps."""
        self._set_data(ACTIONS, new_data, at_indices, neg_index_as_lookback)

    def set_rewards(
        self,
        *,
        new_data: MultiAgentDict,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Overwrite rewards per agent; ``at_indices`` are each agent's own steps."""
        self._set_data(REWARDS, new_data, at_indices, neg_index_as_lookback)

    def set_extra_model_outputs(
        self,
        *,
        key: str,
        new_data: MultiAgentDict,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Overwrite the extra model output ``key`` per agent (agent-step indices)."""
        self._set_data(EXTRA, new_data, at_indices, neg_index_as_lookback, key=key)

    def _set_data(
        self,
        what: str,
        new_data: MultiAgentDict,
        at_indices: Any,
        neg_index_as_lookback: bool,
        key: str | None = None,
    ) -> None:
        """Implement the setters: write each agent's data into its ``what`` buffer.

        Raises:
            KeyError: An agent without an episode here, or without extra output ``key``.
        """
        for aid, data in new_data.items():
            buf = _buffer_of(self._sa(aid), what, key)
            if buf is None:
                raise KeyError(f"Agent {aid!r} has no extra model output {key!r}.")
            buf.set(data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback)

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

    # ------------------------------------------------------------- chunking
    def to_numpy(self) -> MultiAgentEpisode:
        """Turn every agent's step data into numpy arrays (``SingleAgentEpisode.to_numpy``)."""
        for sa in self.agent_episodes.values():
            sa.to_numpy()
        return self

    def cut(self, len_lookback_buffer: int = 0) -> MultiAgentEpisode:
        """Return the empty successor chunk that continues this ongoing episode.

        The lookback grows beyond ``len_lookback_buffer`` where needed so that
        every ongoing agent's last observation is in it (an agent with a hanging
        action continues from there). The successor has the same id,
        ``env_t_started == self.env_t``, each agent continues at its own ``t``,
        hanging actions carry over, and this chunk's ``_hanging_rewards_end``
        becomes the successor's ``_hanging_rewards_begin`` (added to the agent's
        next completed step).

        Raises:
            RuntimeError: The episode is already done.
            ValueError: ``len_lookback_buffer < 0``.
        """
        if self.is_done:
            raise RuntimeError(
                "Can't call `MultiAgentEpisode.cut()` when the episode is already done!"
            )
        if len_lookback_buffer < 0:
            raise ValueError(f"len_lookback_buffer must be >= 0, got {len_lookback_buffer}.")
        n = len(self)
        return self._sub_episode(n, n, int(len_lookback_buffer), cut=True)

    def slice(self, slice_: slice, *, len_lookback_buffer: int | None = None) -> MultiAgentEpisode:
        """Return env steps ``slice_`` of this chunk as a new chunk (data is copied).

        An agent that acted before the slice ends but observes only after it gets
        that action as hanging; its reward belongs to the later slice. The done
        flags are kept only if the slice reaches the end. Like ``cut``, the
        lookback grows so that agents ongoing at the slice start keep their last
        observation.

        Raises:
            ValueError: A slice step other than 1 or a negative lookback.
        """
        if slice_.step not in (None, 1):
            raise ValueError(f"MultiAgentEpisode.slice() needs step 1, got {slice_.step}.")
        start, stop, _ = slice_.indices(len(self))
        lb = self._len_lookback_buffers if len_lookback_buffer is None else int(len_lookback_buffer)
        if lb < 0:
            raise ValueError(f"len_lookback_buffer must be >= 0, got {lb}.")
        return self._sub_episode(start, max(stop, start), lb, cut=False)

    def __getitem__(self, item: slice) -> MultiAgentEpisode:
        """Return ``self.slice(item)``; only slices are supported.

        Raises:
            NotImplementedError: For anything but a slice.
        """
        return slice_only(self, item)

    def _sub_episode(self, start: int, stop: int, lookback: int, *, cut: bool) -> MultiAgentEpisode:
        """Build the chunk of env steps ``[start, stop)`` (``cut``: the successor)."""
        n = len(self)
        p0 = self._len_lookback_buffers + start
        p1 = self._len_lookback_buffers + stop
        lookback = min(lookback, p0)
        for aid, sa in self.agent_episodes.items():  # grow: ongoing agents keep their last obs
            data = self._mapping_data(aid)
            q = last_obs_position(data, p0)
            if q is not None and not (sa.is_done and last_obs_position(data) == q):
                lookback = max(lookback, p0 - q)
        w0 = p0 - lookback
        new = type(self)(
            self.id_,
            observation_space=self.observation_space,
            action_space=self.action_space,
            env_t_started=self.env_t_started + start,
            agent_episode_ids=self._agent_episode_ids,
            agent_module_ids=self._agent_to_module_mapping,
            agent_to_module_mapping_fn=self.agent_to_module_mapping_fn,
        )
        new._len_lookback_buffers = lookback
        new.env_t = new.env_t_started + stop - start
        for aid, sa in self.agent_episodes.items():
            data = self._mapping_data(aid)
            window = data[w0 : p1 + 1]
            steps = [(p, v) for p, v in enumerate(window, w0) if v != SKIP_ENV_TS_TAG]
            if not steps:
                continue
            before = [s for s in steps if s[0] <= p0]
            q0, v0 = before[-1] if before else steps[0]
            v1 = steps[-1][1]
            k = sum(1 for p, _ in steps if p < q0)
            s, e = v0 - sa.t_started, v1 - sa.t_started
            if cut and not sa.is_done:
                new_sa = sa.cut(len_lookback_buffer=k)
            else:
                new_sa = sa.slice(slice(s, e), len_lookback_buffer=k)
            new.agent_episodes[aid] = new_sa
            new.agent_t_started[aid] = new_sa.t_started
            new._agent_episode_ids[aid] = sa.id_
            new._env_t_to_agent_t[aid] = InfiniteLookbackBuffer(data=window, lookback=lookback)
            if not cut and aid in self._hanging_rewards_begin:
                # A carried reward waits for the step pending at the end; rewards before
                # the first observation go with the slice that holds that observation.
                if aid in self._carried_begin:
                    if stop == n:
                        new._hanging_rewards_begin[aid] = self._hanging_rewards_begin[aid]
                        new._carried_begin.add(aid)
                else:
                    first = next(p for p, v in enumerate(data) if v != SKIP_ENV_TS_TAG)
                    if p0 < first <= p1 or (start == 0 and first <= p1):
                        new._hanging_rewards_begin[aid] = self._hanging_rewards_begin[aid]
            if new_sa.is_done:
                new._done_agent_ids.add(aid)
                continue
            self._carry_hanging(aid, sa, new, e, stop == n, cut)
        if cut or stop == n:
            for aid, r in self._hanging_rewards_begin.items():
                if aid not in self.agent_episodes:  # still waiting for a first observation
                    new._hanging_rewards_begin[aid] = r
        new._custom_data = copy.deepcopy(self._custom_data)
        if cut:
            new._start_time = self._last_step_time or self._start_time
        else:
            if stop == n:
                new.is_terminated, new.is_truncated = self.is_terminated, self.is_truncated
            new._start_time, new._last_step_time = self._start_time, self._last_step_time
        return new

    def _carry_hanging(
        self,
        aid: Any,
        sa: SingleAgentEpisode,
        new: MultiAgentEpisode,
        e: int,
        at_end: bool,
        cut: bool,
    ) -> None:
        """Set ``aid``'s hanging values in a sub-episode ``new`` of this one."""
        if cut:
            new._copy_hanging_action(self, aid)
            pending = self._pending_reward(aid)
            if pending is not NOT_GIVEN:
                new._hanging_rewards_begin[aid] = pending
                new._carried_begin.add(aid)
            return
        if e < len(sa):  # acted in the slice, observes only after it
            new._hanging_actions_end[aid] = sa.actions.get(e)
            new._hanging_extra_model_outputs_end[aid] = {
                k: b.get(e) for k, b in sa.extra_model_outputs.items()
            }
        elif at_end:
            new._copy_hanging_action(self, aid)
            if aid in self._hanging_rewards_end:
                new._hanging_rewards_end[aid] = self._hanging_rewards_end[aid]

    def concat_episode(self, other: MultiAgentEpisode) -> None:
        """Append the successor chunk ``other`` (e.g. from ``cut()``) to this one, in place.

        Agents only in ``other`` are adopted; agents done here are skipped; the
        others are concatenated per agent. ``other``'s hanging values replace ours.

        Raises:
            AssertionError: Different ids, this chunk is done, or ``self.env_t !=
                other.env_t_started``.
        """
        check_successor(self, other, "env_t", self.env_t, other.env_t_started)
        lb_self, lb_other = self._len_lookback_buffers, other._len_lookback_buffers
        for aid, osa in other.agent_episodes.items():
            odata = other._mapping_data(aid)
            sa = self.agent_episodes.get(aid)
            if sa is not None and sa.is_done:
                continue
            adopted = sa is None
            if sa is not None:
                sa.concat_episode(osa)
                self._mapping_data(aid).extend(odata[lb_other + 1 :])
            else:
                self.agent_episodes[aid] = osa
                self.agent_t_started[aid] = osa.t_started
                head = [SKIP_ENV_TS_TAG] * (lb_self + len(self))
                self._env_t_to_agent_t[aid] = InfiniteLookbackBuffer(
                    data=head + list(odata[lb_other:]), lookback=lb_self
                )
                if aid in other._agent_to_module_mapping:
                    self._agent_to_module_mapping.setdefault(
                        aid, other._agent_to_module_mapping[aid]
                    )
            # Other's hanging state replaces ours for this agent.
            self._drop_pending(aid)
            self._copy_hanging_action(other, aid)
            pending = other._pending_reward(aid)
            if pending is not NOT_GIVEN:
                self._hanging_rewards_end[aid] = pending
            begin = other._hanging_rewards_begin.get(aid, NOT_GIVEN)
            if aid in other._carried_begin or begin is NOT_GIVEN:
                if adopted:
                    self._hanging_rewards_begin.pop(aid, None)
            elif adopted:  # `other` already holds what we had before its first obs
                self._hanging_rewards_begin[aid] = begin
            else:
                self._hanging_rewards_begin[aid] = self._hanging_rewards_begin.get(aid, 0.0) + begin
        # Agents still without an observation: `other` (a successor) has the full tally,
        # or has dropped them (they ended before observing).
        for aid in [a for a in self._hanging_rewards_begin if a not in self.agent_episodes]:
            if aid not in other._hanging_rewards_begin:
                del self._hanging_rewards_begin[aid]
        for aid, r in other._hanging_rewards_begin.items():
            if aid not in other.agent_episodes:
                self._hanging_rewards_begin[aid] = r
        self.env_t = other.env_t
        self.is_terminated = other.is_terminated
        self.is_truncated = other.is_truncated
        self._custom_data.update(other._custom_data)
        if other._last_step_time is not None:
            self._last_step_time = other._last_step_time
        self._done_agent_ids = {aid for aid, sa in self.agent_episodes.items() if sa.is_done}
        self._stepped_cache = None
        self._update_all_done()
        self.validate()

    # ----------------------------------------------------------------- state
    def get_state(self) -> dict[str, Any]:
        """Return the episode as plain data (no pickle); ``from_state`` restores it.

        The mapping function is not part of the state (the per-agent module ids
        are); pass it to ``from_state`` if new agents may still appear.
        """
        return {
            "id_": self.id_,
            "agent_to_module_mapping": dict(self._agent_to_module_mapping),
            "observation_space": _spaces_to_state(self.observation_space),
            "action_space": _spaces_to_state(self.action_space),
            "env_t_started": self.env_t_started,
            "env_t": self.env_t,
            "agent_t_started": dict(self.agent_t_started),
            "env_t_to_agent_t": {aid: b.get_state() for aid, b in self.env_t_to_agent_t.items()},
            "agent_episode_ids": dict(self._agent_episode_ids),
            "hanging_actions_end": dict(self._hanging_actions_end),
            "hanging_extra_model_outputs_end": {
                aid: dict(v) for aid, v in self._hanging_extra_model_outputs_end.items()
            },
            "hanging_rewards_end": dict(self._hanging_rewards_end),
            "hanging_rewards_begin": dict(self._hanging_rewards_begin),
            "carried_begin": list(self._carried_begin),
            "is_terminated": self.is_terminated,
            "is_truncated": self.is_truncated,
            "agent_episodes": {aid: sa.get_state() for aid, sa in self.agent_episodes.items()},
            "start_time": self._start_time,
            "last_step_time": self._last_step_time,
            "len_lookback_buffers": self._len_lookback_buffers,
            "custom_data": dict(self._custom_data),
        }

    @classmethod
    def from_state(
        cls, state: dict[str, Any], *, agent_to_module_mapping_fn: Callable[..., Any] | None = None
    ) -> MultiAgentEpisode:
        """Rebuild an episode from ``get_state()`` output (and validate it)."""
        ep = cls(
            state["id_"],
            observation_space=_spaces_from_state(state.get("observation_space")),
            action_space=_spaces_from_state(state.get("action_space")),
            env_t_started=state["env_t_started"],
            agent_t_started=state.get("agent_t_started"),
            agent_episode_ids=state.get("agent_episode_ids"),
            agent_module_ids=state.get("agent_to_module_mapping"),
            agent_to_module_mapping_fn=agent_to_module_mapping_fn,
        )
        ep.env_t = int(state["env_t"])
        ep._len_lookback_buffers = int(state.get("len_lookback_buffers", 0))
        ep._env_t_to_agent_t = {
            aid: InfiniteLookbackBuffer.from_state(s)
            for aid, s in state["env_t_to_agent_t"].items()
        }
        ep.agent_episodes = {
            aid: SingleAgentEpisode.from_state(s) for aid, s in state["agent_episodes"].items()
        }
        ep._hanging_actions_end = dict(state.get("hanging_actions_end") or {})
        ep._hanging_extra_model_outputs_end = {
            aid: dict(v) for aid, v in (state.get("hanging_extra_model_outputs_end") or {}).items()
        }
        ep._hanging_rewards_end = dict(state.get("hanging_rewards_end") or {})
        ep._hanging_rewards_begin = dict(state.get("hanging_rewards_begin") or {})
        ep._carried_begin = set(state.get("carried_begin") or ())
        ep.is_terminated = bool(state["is_terminated"])
        ep.is_truncated = bool(state["is_truncated"])
        ep._start_time = state.get("start_time")
        ep._last_step_time = state.get("last_step_time")
        ep._custom_data = dict(state.get("custom_data") or {})
        ep._done_agent_ids = {aid for aid, sa in ep.agent_episodes.items() if sa.is_done}
        ep.validate()
        return ep

    # ---------------------------------------------------------------- checks
    def validate(self) -> None:
        """Check every agent episode and the env-step mapping.

        Raises:
            AssertionError: An inconsistency (the message says which).
        """
        missing = set(self.agent_episodes) - set(self._env_t_to_agent_t)
        if missing:  # (a mapping without episode is fine: the runner prunes empty ones)
            raise AssertionError(f"Agents {sorted(map(str, missing))} have no env-step mapping.")
        lookback = self._len_lookback_buffers
        target = lookback + len(self) + 1
        for aid, sa in self.agent_episodes.items():
            sa.validate()
            data = self._mapping_data(aid)
            if len(data) != target or self._env_t_to_agent_t[aid].lookback != lookback:
                raise AssertionError(
                    f"Agent {aid!r}: mapping has {len(data)} entries (lookback "
                    f"{self._env_t_to_agent_t[aid].lookback}); expected {target} ({lookback})."
                )
            steps = [v for v in data if v != SKIP_ENV_TS_TAG]
            if steps and (
                steps != list(range(steps[0], steps[0] + len(steps))) or steps[-1] != sa.t
            ):
                raise AssertionError(
                    f"Agent {aid!r}: mapped agent steps {steps} are not consecutive up to t={sa.t}."
                )
        for aid in self._hanging_actions_end:
            sa = self.agent_episodes.get(aid)
            if sa is not None and sa.is_done:
                raise AssertionError(f"Agent {aid!r} is done but has a hanging action.")

    # --------------------------------------------------------------- display
    def _timing_grid(self) -> str:
        """Return the agent timing grid that ``print()`` shows."""
        lookback = self._len_lookback_buffers
        first = self.env_t_started - lookback
        header = [str(first + p) for p in range(lookback + len(self) + 1)]
        rows = {
            str(aid): ["." if v == SKIP_ENV_TS_TAG else str(v) for v in self._mapping_data(aid)]
            for aid in self.agent_episodes
        }
        width = max([len(c) for c in header] + [len(c) for r in rows.values() for c in r])
        name_w = max([len("env_t")] + [len(a) for a in rows])

        def line(name: str, cells: list[str]) -> str:
            parts = [c.rjust(width) for c in cells]
            if lookback:
                parts.insert(lookback, "|")
            return name.ljust(name_w) + "  " + " ".join(parts)

        return "\n".join([line("env_t", header)] + [line(a, r) for a, r in rows.items()])

    def print(self) -> None:
        """Print the agent timing grid: per env step, each agent's own step ("." = none).

        Example (the reset ``{a, b}``, then ``b`` skips one step)::

            env_t  0 1 2
            a      0 1 2
            b      0 . 1

        Lookback columns are separated from the chunk by ``|``.
        """
        print(self._timing_grid())

    def __repr__(self) -> str:
        """Summarise the chunk: length, done flag, per-agent returns and id."""
        returns = {aid: sa.get_return() for aid, sa in self.agent_episodes.items()}
        return f"MAEps(len={len(self)} done={self.is_done} Rs={returns} id_={self.id_})"


def _spaces_to_state(spaces: Any) -> dict[str, Any] | None:
    """Encode per-agent spaces (a dict or ``gym.spaces.Dict``) as plain data."""
    if not spaces:
        return None
    kind = "gym_dict" if isinstance(spaces, gym.spaces.Dict) else "dict"
    return {"kind": kind, "spaces": {aid: gym_space_to_dict(s) for aid, s in spaces.items()}}


def _spaces_from_state(state: dict[str, Any] | None) -> Any:
    """Decode per-agent spaces written by ``_spaces_to_state``."""
    if not state:
        return {}
    spaces = {aid: gym_space_from_dict(s) for aid, s in state["spaces"].items()}
    return gym.spaces.Dict(spaces) if state["kind"] == "gym_dict" else spaces
