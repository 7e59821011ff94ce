"""``RolloutMetrics``: one finished episode's numbers, as the old-stack sampler reports them.

Why: ``RolloutWorker.get_metrics()`` returns a list of these (one per episode that
ended since the last call) and the driver aggregates them; a namedtuple keeps
them cheap to build and to ship between processes.
"""

from __future__ import annotations

from collections import namedtuple

__all__ = ["RolloutMetrics"]

RolloutMetrics = namedtuple(
    "RolloutMetrics",
    [
        "episode_length",
        "episode_reward",
        "agent_rewards",
        "custom_metrics",
        "perf_stats",
        "hist_data",
        "media",
        "episode_faulty",
        "connector_metrics",
    ],
)
RolloutMetrics.__new__.__defaults__ = (0, 0, {}, {}, {}, {}, {}, False, {})
RolloutMetrics.__doc__ = """One episode's length, total reward and per-agent rewards, plus extras.

Fields: ``episode_length``, ``episode_reward``, ``agent_rewards`` (``{(agent_id,
policy_id): reward}``), ``custom_metrics``, ``perf_stats``, ``hist_data``,
``media``, ``episode_faulty`` (the env failed during the episode) and
``connector_metrics``. Defaults: ``(0, 0, {}, {}, {}, {}, {}, False, {})``.
"""
