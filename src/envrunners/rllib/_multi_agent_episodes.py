"""Our multi-agent episode chunks as RLlib ``MultiAgentEpisode`` objects, once per ``sample()``.

Why: RLlib's learner connectors, metrics and callbacks take RLlib's own episode
classes. Our loop records into ``envrunners.env.multi_agent_episode`` chunks
(lists per agent, extra model outputs already numpy); this builds RLlib's
objects around the same data arrays and lists (no copy of the step data): one
``SingleAgentEpisode`` per agent from its buffers, plus the episode-level
env-step mapping, hanging data, ids, step counters and timers. The result
passes RLlib's ``validate()``; ``to_numpy()`` is RLlib's, run by the caller.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as RLlibMultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibSingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer as RLlibBuffer

__all__ = ["to_rllib_episode"]


def _buffer(ours: Any, space: Any = None) -> RLlibBuffer:
    """RLlib's lookback buffer around our buffer's data (same list / arrays)."""
    buf = RLlibBuffer(ours.data, ours.lookback, space)
    buf.lookback = ours.lookback  # (the constructor caps it at len(data): equal here)
    buf.finalized = ours.finalized
    return buf


def _agent_episode(sa: Any, episode_id: str) -> RLlibSingleAgentEpisode:
    """RLlib's ``SingleAgentEpisode`` holding the data of our agent episode ``sa``."""
    rewards = _buffer(sa.rewards)
    rewards.space = sa.rewards.space
    out = RLlibSingleAgentEpisode(
        sa.id_,
        observations=_buffer(sa.observations),
        observation_space=sa.observation_space,
        infos=_buffer(sa.infos),
        actions=_buffer(sa.actions),
        action_space=sa.action_space,
        rewards=rewards,
        terminated=sa.is_terminated,
        truncated=sa.is_truncated,
        extra_model_outputs={k: _buffer(b) for k, b in sa.extra_model_outputs.items()},
        t_started=sa.t_started,
        agent_id=sa.agent_id,
        module_id=sa.module_id,
        multi_agent_episode_id=episode_id,
    )
    out._start_time = sa._start_time
    out._last_step_time = sa._last_step_time
    out._custom_data = sa.custom_data
    return out


def to_rllib_episode(episode: Any, mapping_fn: Any) -> RLlibMultiAgentEpisode:
    """RLlib's ``MultiAgentEpisode`` with the data of our chunk ``episode``.

    Args:
        episode: An ``envrunners.env.multi_agent_episode.MultiAgentEpisode`` chunk
            (finished or cut), not numpy'd by us.
        mapping_fn: The ``policy_mapping_fn`` the RLlib episode keeps.
    """
    ep_id = episode.id_
    out = RLlibMultiAgentEpisode(
        ep_id,
        observation_space=episode.observation_space,
        action_space=episode.action_space,
        env_t_started=episode.env_t_started,
        agent_t_started=dict(episode.agent_t_started),
        agent_module_ids=dict(episode._agent_to_module_mapping),
        agent_to_module_mapping_fn=mapping_fn,
    )
    out._len_lookback_buffers = episode._len_lookback_buffers
    out.env_t = episode.env_t
    mapping = defaultdict(RLlibBuffer)
    for aid, buf in episode.env_t_to_agent_t.items():
        mapping[aid] = _buffer(buf)
    out.env_t_to_agent_t = mapping
    out._hanging_actions_end = dict(episode._hanging_actions_end)
    hanging_extra = defaultdict(dict)
    hanging_extra.update(episode._hanging_extra_model_outputs_end)
    out._hanging_extra_model_outputs_end = hanging_extra
    out._hanging_rewards_end = defaultdict(float, episode._hanging_rewards_end)
    out._hanging_rewards_begin = defaultdict(float, episode._hanging_rewards_begin)
    out.is_terminated = episode.is_terminated
    out.is_truncated = episode.is_truncated
    out.agent_episodes = {
        aid: _agent_episode(sa, ep_id) for aid, sa in episode.agent_episodes.items()
    }
    out._start_time = episode._start_time
    out._last_step_time = episode._last_step_time
    out._custom_data = episode.custom_data
    out.validate()
    return out
