"""Helpers of the multi-agent sampler: mapping check, episode totals, batching.

Why: kept apart from the loop in ``envrunners.sampling.multi_agent`` so that
module stays short; nothing here is public API beyond what it re-exports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from envrunners.env.multi_agent_episode import MultiAgentEpisode
from envrunners.errors import UnknownPolicyError, suggest
from envrunners.sampling.sample_result import MultiAgentEpisodeStats

__all__ = [
    "CheckedMappingFn",
    "EpisodeTotals",
    "action_rows",
    "prune_zero_len_agents",
    "rows",
    "stack",
]


class CheckedMappingFn:
    """``policy_mapping_fn`` wrapper that rejects module ids the runner does not have.

    Why: a typo in the mapping fn otherwise surfaces as a KeyError deep in the
    sampler; this names the agent, the returned id, the known ids and the fix.
    Picklable (the episodes carry it through Ray's object store).
    """

    def __init__(self, fn: Callable[..., Any], module_ids: Any):
        self.fn = fn
        self.module_ids = frozenset(module_ids)

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> Any:
        module_id = self.fn(agent_id, episode, **kwargs)
        if module_id not in self.module_ids:
            known = sorted(map(str, self.module_ids))
            raise UnknownPolicyError(
                f"policy_mapping_fn returned module id {module_id!r} for agent {agent_id!r}, "
                f"but the known module (policy) ids are {known}.{suggest(module_id, known)} "
                f"Fix: return one of {known} from policy_mapping_fn, or add {module_id!r} to "
                "config.multi_agent(policies=...)."
            )
        return module_id


class EpisodeTotals:
    """Running totals of the chunks of one episode already returned."""

    __slots__ = ("length", "steps", "returns", "modules")

    def __init__(self) -> None:
        self.length = 0
        self.steps: dict[Any, int] = {}
        self.returns: dict[Any, float] = {}
        self.modules: dict[Any, Any] = {}

    def add(self, episode: MultiAgentEpisode) -> None:
        self.length += len(episode)
        for aid, sa in episode.agent_episodes.items():
            n = len(sa)
            if n:
                self.steps[aid] = self.steps.get(aid, 0) + n
                self.returns[aid] = self.returns.get(aid, 0.0) + _chunk_return(sa)
                self.modules[aid] = sa.module_id

    def stats(self, duration_s: float) -> MultiAgentEpisodeStats:
        module_returns: dict[str, float] = {}
        for aid, ret in self.returns.items():
            mid = str(self.modules[aid])
            module_returns[mid] = module_returns.get(mid, 0.0) + ret
        return MultiAgentEpisodeStats(
            length=self.length,
            ret=float(sum(self.returns.values())),
            duration_s=duration_s,
            agent_steps={str(a): n for a, n in self.steps.items()},
            agent_returns={str(a): r for a, r in self.returns.items()},
            module_returns=module_returns,
        )


def stack(items: list[Any]) -> Any:
    """Stack per-agent observations into one batch (nested dict/tuple obs supported)."""
    first = items[0]
    if isinstance(first, np.ndarray):
        return np.array(items)  # = np.stack for equal shapes, ~5x faster for small batches
    if isinstance(first, dict):
        return {k: stack([x[k] for x in items]) for k in first}
    if isinstance(first, tuple):
        return tuple(stack([x[j] for x in items]) for j in range(len(first)))
    return np.asarray(items)


def rows(batch: Any) -> list[Any]:
    """Split a batch into per-row items (views for arrays): the inverse of ``stack``."""
    if isinstance(batch, np.ndarray):
        return list(batch)
    if isinstance(batch, dict):
        cols = {k: rows(v) for k, v in batch.items()}
        n = len(next(iter(cols.values()))) if cols else 0
        return [{k: c[j] for k, c in cols.items()} for j in range(n)]
    if isinstance(batch, tuple):
        cols_t = [rows(v) for v in batch]
        return [tuple(c[j] for c in cols_t) for j in range(len(cols_t[0]))]
    return list(np.asarray(batch))


def action_rows(actions: Any) -> list[Any]:
    """Per-row actions; integer (Discrete) actions as ``np.int64`` scalars.

    Why: gymnasium 1.4's ``Discrete.contains`` (which e.g. CartPole asserts per
    step) checks numpy integers faster than Python ints; RLlib also hands envs
    numpy scalars. Always int64, so finalized episodes keep the dtype they had.
    """
    if isinstance(actions, np.ndarray) and actions.ndim == 1 and actions.dtype.kind in "iu":
        if actions.dtype == np.uint64:  # may not fit int64
            return actions.tolist()
        return list(actions.astype(np.int64, copy=False))
    return rows(actions)


def _chunk_return(sa: Any) -> float:
    buf = sa.rewards
    if type(buf.data) is list:  # = buf.get() on a list buffer, without the slice machinery
        return float(sum(buf.data[buf.lookback :]))
    rewards = buf.get()
    if isinstance(rewards, np.ndarray):
        return float(rewards.sum())
    return float(sum(rewards))


def prune_zero_len_agents(episode: MultiAgentEpisode) -> None:
    """Drop agents without any step from a returned chunk (RLlib does the same)."""
    empty = [aid for aid, sa in episode.agent_episodes.items() if len(sa) == 0]
    for aid in empty:
        del episode.agent_episodes[aid]
        mapping = getattr(episode, "_env_t_to_agent_t", None)
        if mapping is not None:
            mapping.pop(aid, None)
