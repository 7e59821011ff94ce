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

from envrunners.env._multi_agent_episode_index import SKIP_ENV_TS_TAG
from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

__all__ = ["MultiAgentFastStepMixin"]

_ALL = "__all__"


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

        Plain: the episode is ongoing and has no hanging actions or rewards;
        ``__all__`` is not set; the agents that observe are exactly those that
        acted and got a reward, each has a (list-based, not done) agent episode;
        ``terminateds``/``truncateds`` name exactly these agents (plus ``__all__``).

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
            or terminateds.get(_ALL)
            or truncateds.get(_ALL)
        ):
            return False
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
            ):
                return False
            agents.append(sa)

        env_t = self.env_t = self.env_t + 1
        stepped = self._stepped_cache = []
        pos = self._len_lookback_buffers + env_t - self.env_t_started
        mappings = self._env_t_to_agent_t
        for (aid, obs), sa in zip(observations.items(), agents):
            act, rew = actions[aid], rewards[aid]
            term, trunc = bool(terminateds[aid]), bool(truncateds[aid])
            info = infos.get(aid)
            if info is None:
                info = {}
            # = SingleAgentEpisode.add_env_step on list buffers
            sa.observations.data.append(obs)
            sa.actions.data.append(act)
            sa.rewards.data.append(rew)
            sa.infos.append(info)
            t = sa.t = sa.t + 1
            ext = extra_model_outputs.get(aid)
            if ext:
                bufs = sa.extra_model_outputs
                for key, value in ext.items() if type(ext) is dict else zip(*ext):
                    buf = bufs.get(key)
                    if buf is None:
                        bufs[key] = InfiniteLookbackBuffer([value])
                    else:
                        buf.append(value)
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
        self.is_terminated = self.is_truncated = False
        if len(self._done_agent_ids) >= len(episodes):  # else _update_all_done is a no-op
            self._update_all_done()
        self._last_step_time = now
        if self._start_time is None:
            self._start_time = now
        return True
