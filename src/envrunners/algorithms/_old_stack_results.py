"""Old-API-stack result pieces of ``Algorithm.train()``: episode summaries and learner info.

Why: on the old stack RLlib reports ``env_runners`` from the ``RolloutMetrics`` of
finished episodes (``summarize_episodes``) and ``info/learner/<policy id>`` from
each policy's ``learn_on_batch`` output (``LearnerInfoBuilder``). These pure
functions build those two dicts with RLlib 2.60's keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["learner_info", "summarize_episodes"]


def _stat(values: list[float], fn: Any) -> float:
    return float(fn(values)) if values else math.nan


def summarize_episodes(window: Sequence[Any], num_new: int) -> dict[str, Any]:
    """RLlib's old-stack ``env_runners`` dict from ``RolloutMetrics``.

    Args:
        window: The episodes to average over: this iteration's, topped up with
            earlier ones to ``metrics_num_episodes_for_smoothing`` (as RLlib does).
        num_new: How many of them finished in this iteration.

    Returns:
        ``episode_reward_mean/min/max`` (and the same as ``episode_return_*``),
        ``episode_len_mean``, ``episodes_timesteps_total``, ``policy_reward_mean/
        min/max`` per policy id, ``hist_stats``, ``episodes_this_iter``,
        ``num_episodes``, ``num_faulty_episodes``, ``custom_metrics``,
        ``sampler_perf`` and ``connector_metrics``; NaN statistics without episodes.
    """
    healthy = [m for m in window if not m.episode_faulty]
    rewards = [float(m.episode_reward) for m in healthy]
    lengths = [int(m.episode_length) for m in healthy]
    per_policy: dict[str, list[float]] = {}
    custom: dict[str, list[float]] = {}
    for m in healthy:
        for (_, policy_id), reward in (m.agent_rewards or {}).items():
            per_policy.setdefault(str(policy_id), []).append(float(reward))
        for key, value in (m.custom_metrics or {}).items():
            custom.setdefault(key, []).append(float(value))
    out: dict[str, Any] = {
        "episode_reward_max": _stat(rewards, np.max),
        "episode_reward_min": _stat(rewards, np.min),
        "episode_reward_mean": _stat(rewards, np.mean),
        "episode_len_mean": _stat(lengths, np.mean),
        "episodes_timesteps_total": int(sum(lengths)),
        "policy_reward_min": {p: _stat(v, np.min) for p, v in per_policy.items()},
        "policy_reward_max": {p: _stat(v, np.max) for p, v in per_policy.items()},
        "policy_reward_mean": {p: _stat(v, np.mean) for p, v in per_policy.items()},
        "custom_metrics": {
            f"{key}_{name}": _stat(values, fn)
            for key, values in custom.items()
            for name, fn in (("mean", np.mean), ("min", np.min), ("max", np.max))
        },
        "hist_stats": {
            "episode_reward": rewards,
            "episode_lengths": lengths,
            **{f"policy_{p}_reward": v for p, v in per_policy.items()},
        },
        "sampler_perf": {},
        "num_faulty_episodes": len(window) - len(healthy),
        "connector_metrics": {},
        "episodes_this_iter": int(num_new),
        "num_episodes": int(num_new),
    }
    out["episode_return_max"] = out["episode_reward_max"]
    out["episode_return_min"] = out["episode_reward_min"]
    out["episode_return_mean"] = out["episode_reward_mean"]
    return out


def learner_info(info: dict[str, Any]) -> dict[str, Any]:
    """RLlib's ``info/learner`` dict from ``RolloutWorker.learn_on_batch`` output.

    Args:
        info: ``{policy_id: {"learner_stats", "num_agent_steps_trained",
            "num_grad_updates", "num_grad_updates_this_call"}}``.

    Returns:
        Per policy id: ``learner_stats``, ``num_agent_steps_trained``,
        ``num_grad_updates_lifetime``, ``diff_num_grad_updates_vs_sampler_policy``
        (RLlib's mean over the call's SGD steps of the updates made since the
        batch was sampled: ``(k - 1) / 2`` for ``k`` steps) and ``custom_metrics``.
    """
    out = {}
    for pid, policy_info in info.items():
        steps = int(policy_info.get("num_grad_updates_this_call", 0))
        out[pid] = {
            "learner_stats": dict(policy_info.get("learner_stats", {})),
            "num_agent_steps_trained": float(policy_info.get("num_agent_steps_trained", 0)),
            "num_grad_updates_lifetime": float(policy_info.get("num_grad_updates", 0)),
            "diff_num_grad_updates_vs_sampler_policy": max(0.0, (steps - 1) / 2),
            "custom_metrics": dict(policy_info.get("custom_metrics", {})),
        }
    return out
