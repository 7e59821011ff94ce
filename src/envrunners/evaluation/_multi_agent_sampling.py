"""Multi-agent sampling for ``SyncSampler``: the new-stack core, ``MultiAgentBatch`` at the edge.

Why: old-stack multi-agent workers should step their envs exactly like the
``MultiAgentEnvRunner`` (one batched forward per policy per step over all
agents of all sub-envs), so this drives ``envrunners.sampling.multi_agent``'s
``MultiAgentSampler`` with the worker's policies and filters, then turns each
agent's trajectory into a ``SampleBatch``, lets its policy postprocess it (with
the other agents' batches at hand) and groups the batches by policy id.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

from envrunners.env.multi_agent_episode import MultiAgentEpisode
from envrunners.env.runner_setup import torch_threads
from envrunners.errors import UnknownPolicyError, suggest
from envrunners.evaluation.episode_to_batch import episode_to_sample_batch
from envrunners.evaluation.metrics import RolloutMetrics
from envrunners.evaluation.sampler import _action_transform, clip_batch_rewards, wants_prev
from envrunners.policy.sample_batch import MultiAgentBatch, SampleBatch, concat_samples
from envrunners.sampling.multi_agent import MultiAgentSampler as _CoreSampler

__all__ = ["MultiAgentSampler"]


class _PerPolicy(dict):
    """``get(policy_id)`` builds the per-policy transform on demand (policies may be added)."""

    def __init__(self, make: Any):
        super().__init__()
        self._make = make

    def get(self, key: Any, default: Any = None) -> Any:  # type: ignore[override]
        return self._make(key)

    def __bool__(self) -> bool:
        return True


class _MappingFn:
    """The worker's ``policy_mapping_fn(agent_id, episode, worker=...)``, checked."""

    def __init__(self, worker: Any):
        self.worker = worker

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> Any:
        worker = self.worker
        pid = worker.policy_mapping_fn(agent_id, episode, worker=worker, **kwargs)
        if pid not in worker.policy_map:
            known = sorted(map(str, worker.policy_map.keys()))
            raise UnknownPolicyError(
                f"policy_mapping_fn returned policy id {pid!r} for agent {agent_id!r}, but "
                f"this worker's policy ids are {known}.{suggest(pid, known)} Return one of "
                f"them, or add {pid!r} with config.multi_agent(policies=...) or add_policy()."
            )
        return pid


class MultiAgentSampler:
    """The multi-agent half of ``SyncSampler`` (same batch modes, ``MultiAgentBatch`` out).

    Args:
        owner: The ``SyncSampler`` (gives the worker, fragment length, callbacks).
        env: The worker's ``SyncVectorMultiAgentEnv``.
        reward_fn: Reward clipping (applied to the stored rewards), or None.
    """

    def __init__(self, owner: Any, env: Any, reward_fn: Any = None):
        self.owner = owner
        self.worker = owner.worker
        self.env = env
        self._reward_fn = reward_fn
        self._metrics: list[RolloutMetrics] = []
        self._queue: deque[MultiAgentBatch] = deque()
        self._pending: dict[str, dict[Any, list]] = defaultdict(lambda: defaultdict(list))
        self._agent_index: dict[str, dict[Any, int]] = {}
        self._mapping_fn = _MappingFn(self.worker)
        config = self.worker.config
        act_fns: dict[Any, Any] = {}

        def action_fn(pid: Any) -> Any:
            if pid not in act_fns:
                policy = self.worker.policy_map[pid]
                act_fns[pid] = _action_transform(
                    policy.action_space, config.normalize_actions, config.clip_actions
                )
            return act_fns[pid]

        def obs_fn(pid: Any) -> Any:
            return self.worker.filters.get(pid)

        self._core = _CoreSampler(
            num_envs=env.num_envs,
            new_episode=self._new_episode,
            reset_fn=self._reset,
            step_fn=self._step,
            observation_spaces=env.single_observation_spaces,
            action_spaces=env.single_action_spaces,
            obs_fns=_PerPolicy(obs_fn),
            action_fns=_PerPolicy(action_fn),
            lookback=max(1, int(config.episode_lookback_horizon)),
        )
        self._first_reset = True

    def _new_episode(self, env_index: int) -> MultiAgentEpisode:
        return MultiAgentEpisode(
            observation_space=self.env.single_observation_spaces,
            action_space=self.env.single_action_spaces,
            agent_to_module_mapping_fn=self._mapping_fn,
        )

    def _reset(self) -> tuple[list, list]:
        seed = self.worker.env_seed() if self._first_reset else None
        self._first_reset = False
        return self.env.reset(seed=seed)

    def _step(self, actions: list[dict]) -> Any:
        return self.env.step(actions)

    # -- sampling ------------------------------------------------------------------
    def _act(self, pid: Any, obs: Any, explore: bool, t: int) -> dict[str, Any]:
        policy = self.worker.policy_map[pid]
        fast = getattr(policy, "compute_actions_for_sampling", None)
        if fast is not None:
            actions, extras = fast(obs, explore)
        else:
            actions, _, extras = policy.compute_actions(obs, explore=explore)
        return {"actions": actions, **extras}

    def _run(self, num_timesteps: int) -> Any:
        if not self._core.started:
            self._core.start()
        config = self.worker.config
        with torch_threads(config, self.worker.worker_index):
            res = self._core.run(
                act_fn=self._act,
                explore=bool(config.explore),
                num_timesteps=num_timesteps,
                count_agent_steps=self.owner.count_steps_by == "agent_steps",
            )
        for stats, episode in zip(res.episode_stats, res.done):
            modules = {str(a): sa.module_id for a, sa in episode.agent_episodes.items()}
            self._metrics.append(
                RolloutMetrics(
                    episode_length=stats.length,
                    episode_reward=stats.ret,
                    agent_rewards={(a, modules.get(a)): r for a, r in stats.agent_returns.items()},
                )
            )
        for _ in range(res.num_dropped_episodes):
            self._metrics.append(RolloutMetrics(episode_faulty=True))
        return res

    def _agent_batches(self, episode: MultiAgentEpisode, env_id: int) -> dict[Any, tuple]:
        """``{agent_id: (policy_id, batch)}`` for the agents that stepped in this chunk."""
        index = self._agent_index.setdefault(episode.id_, {})
        out = {}
        for aid, sa in episode.agent_episodes.items():
            if len(sa) == 0:
                continue
            idx = index.setdefault(aid, len(index))
            prev = wants_prev(self.worker.policy_map[sa.module_id])
            batch = episode_to_sample_batch(
                sa, env_id=env_id, agent_index=idx, eps_id=episode.id_, with_prev=prev
            )
            out[aid] = (sa.module_id, batch)
        return out

    def _postprocess(self, trajectories: list[tuple[MultiAgentEpisode, dict]]) -> dict[Any, list]:
        """Postprocess every agent trajectory with its policy; batches grouped by policy id."""
        policy_map = self.worker.policy_map
        by_policy: dict[Any, list[SampleBatch]] = defaultdict(list)
        for _, batches in trajectories:
            for pid, batch in batches.values():
                by_policy[pid].append(batch)
        with torch_threads(self.worker.config, self.worker.worker_index):
            for pid, batches in by_policy.items():
                add_values = getattr(policy_map[pid], "add_value_predictions", None)
                if add_values is not None:
                    add_values(batches)
            out: dict[Any, list] = defaultdict(list)
            for episode, batches in trajectories:
                others = {aid: (pid, policy_map[pid], b) for aid, (pid, b) in batches.items()}
                for aid, (pid, batch) in batches.items():
                    clip_batch_rewards(batch, self._reward_fn)
                    rest = {a: v for a, v in others.items() if a != aid}
                    done = policy_map[pid].postprocess_trajectory(batch, rest, episode)
                    done.pop("values_bootstrapped", None)
                    out[pid].append(done)
        return out

    @staticmethod
    def _ma_batch(groups: dict[Any, list], env_steps: int) -> MultiAgentBatch:
        return MultiAgentBatch(
            {pid: b[0] if len(b) == 1 else concat_samples(b) for pid, b in groups.items()},
            env_steps,
        )

    def get_data(self) -> MultiAgentBatch:
        """Truncate mode: a fragment of all sub-envs; complete mode: one whole episode."""
        owner = self.owner
        if owner.multiple_episodes_in_batch:
            res = self._run(owner.rollout_fragment_length)
            chunks = list(zip(res.done + res.ongoing, res.done_env_index + res.ongoing_env_index))
            trajectories = [(ep, self._agent_batches(ep, i)) for ep, i in chunks]
            for ep in res.done:
                self._agent_index.pop(ep.id_, None)
            return self._ma_batch(self._postprocess(trajectories), res.env_steps)
        while not self._queue:
            res = self._run(self.env.num_envs * max(1, min(owner.rollout_fragment_length, 100)))
            for ep, i in zip(res.ongoing, res.ongoing_env_index):
                for aid, item in self._agent_batches(ep, i).items():
                    self._pending[ep.id_][aid].append(item)
            for ep, i, stats in zip(res.done, res.done_env_index, res.episode_stats):
                parts = self._pending.pop(ep.id_, {})
                for aid, item in self._agent_batches(ep, i).items():
                    parts.setdefault(aid, []).append(item)
                self._agent_index.pop(ep.id_, None)
                whole = {
                    a: (items[0][0], concat_samples([b for _, b in items]))
                    if len(items) > 1
                    else items[0]
                    for a, items in parts.items()
                }
                self._queue.append(self._ma_batch(self._postprocess([(ep, whole)]), stats.length))
        return self._queue.popleft()

    def pop_metrics(self) -> list[RolloutMetrics]:
        """Metrics of the episodes finished since the last call."""
        out, self._metrics = self._metrics, []
        return out
