"""The sampler's fast path for recording a "plain" env step in a ``MultiAgentEpisode``.

Why: ``MultiAgentEpisode.add_env_step`` handles every multi-agent protocol case
(hanging actions and rewards, agents joining or ending without an observation,
``__all__``), checks each agent in a first pass and then calls
``SingleAgentEpisode.add_env_step`` per agent. For simultaneous-move envs almost
every step is plain: each agent that acted observes again and gets a reward,
nothing hangs. ``try_add_plain_env_step`` records such a step with direct list
appends (one ``perf_counter`` per env step) and returns False, changing nothing,
for anything else, so the caller falls back to ``add_env_step``. The result is
identical to what ``add_env_step`` records (timestamps aside).
"""

from __future__ import annotations

import time
from typing import Any

from envrunners.env._episode_ids import new_episode_id
from envrunners.env._multi_agent_episode_index import SKIP_ENV_TS_TAG
from envrunners.env.single_agent_episode import REWARD_SPACE, SingleAgentEpisode
from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from envrunners.utils.spaces import get_base_struct_from_space

__all__ = ["MultiAgentFastStepMixin", "new_agent_episode"]

_ALL = "__all__"
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


class MultiAgentFastStepMixin:
    """``try_add_plain_env_step``: ``add_env_step`` for plain steps, minus the generality."""

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
