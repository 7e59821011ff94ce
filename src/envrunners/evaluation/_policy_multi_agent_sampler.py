"""``PolicyMultiAgentSampler``: old-stack multi-agent sampling, ``MultiAgentBatch`` at the edge.

Why: old-stack multi-agent workers should step their envs exactly like the
``MultiAgentEnvRunner`` (one batched forward per policy per step over all
agents of all sub-envs), so this drives the new-stack core
(``envrunners.sampling.multi_agent.MultiAgentSampler``) with ``Policy`` objects and
observation filters, then turns each agent's trajectory into a ``SampleBatch``,
lets its policy postprocess it (with the other agents' batches at hand) and groups
the batches by policy id. ``SyncSampler`` builds one for multi-agent envs.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

import numpy as np

from envrunners.env.multi_agent_episode import MultiAgentEpisode
from envrunners.errors import UnknownPolicyError, suggest
from envrunners.evaluation._sampling_hooks import (
    box_action_transform,
    clip_batch_rewards,
    policy_action_fn,
    wants_prev,
)
from envrunners.evaluation.episode_to_batch import add_sequences, episode_to_sample_batch
from envrunners.evaluation.metrics import RolloutMetrics
from envrunners.policy.sample_batch import MultiAgentBatch, SampleBatch, concat_samples
from envrunners.sampling.multi_agent import MultiAgentSampler

__all__ = ["PolicyMultiAgentSampler"]


class _PerPolicy(dict):
    """``get(policy_id)`` builds the per-policy transform on demand (policies may be added)."""

    def __init__(self, make: Any):
        super().__init__()
        self._make = make

    def get(self, key: Any, default: Any = None) -> Any:  # type: ignore[override]
        return self._make(key)

    def __bool__(self) -> bool:
        return True


class _CheckedMappingFn:
    """``policy_mapping_fn(agent_id, episode)``, checked against the policy map's ids."""

    def __init__(self, mapping_fn: Callable[..., Any], policy_map: Any):
        self.mapping_fn = mapping_fn
        self.policy_map = policy_map

    def __call__(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> Any:
        pid = self.mapping_fn(agent_id, episode, **kwargs)
        if pid not in self.policy_map:
            known = sorted(map(str, self.policy_map.keys()))
            raise UnknownPolicyError(
                f"policy_mapping_fn returned policy id {pid!r} for agent {agent_id!r}, but "
                f"this worker's policy ids are {known}.{suggest(pid, known)} Return one of "
                f"them, or add {pid!r} with config.multi_agent(policies=...) or add_policy()."
            )
        return pid


class PolicyMultiAgentSampler:
    """Samples a multi-agent vector env with ``Policy`` objects into ``MultiAgentBatch``es.

    The policy map, filters and mapping function are read at every step, so
    policies added or removed (and a new mapping function) apply at once.

    Args:
        env: The worker's ``SyncVectorMultiAgentEnv``.
        policy_map: ``{policy_id: Policy}`` (the worker's ``PolicyMap``, live).
        policy_mapping_fn: ``fn(agent_id, episode, **kw) -> policy_id``; an id not
            in ``policy_map`` raises ``UnknownPolicyError``.
        filters: ``{policy_id: observation filter}`` (live; a missing id: no filter).
        rollout_fragment_length: Env (or agent) steps per ``get_data()`` in
            truncate mode, over all sub-envs.
        multiple_episodes_in_batch: True for ``truncate_episodes`` (fragments of all
            sub-envs); False for ``complete_episodes`` (one whole episode a call).
        count_agent_steps: Count ``rollout_fragment_length`` in agent steps.
        explore: Sample with exploration.
        reward_fn: Reward clipping (applied to the stored rewards), or None.
        normalize_actions, clip_actions: Box action handling for the env.
        lookback: Lookback kept in each episode (at least 1: the previous action).
        seed: Seed of the first reset (later resets are unseeded).
        inference_threads: Zero-arg context-manager factory around forwards and
            postprocessing (the worker's torch/BLAS thread limit).
    """

    def __init__(
        self,
        env: Any,
        *,
        policy_map: Any,
        policy_mapping_fn: Callable[..., Any],
        filters: dict[Any, Any],
        rollout_fragment_length: int,
        multiple_episodes_in_batch: bool,
        count_agent_steps: bool = False,
        explore: bool = True,
        reward_fn: Any = None,
        normalize_actions: bool = True,
        clip_actions: bool = False,
        lookback: int = 1,
        seed: int | None = None,
        inference_threads: Callable[[], Any] = contextlib.nullcontext,
        on_non_finite: Callable[[list, tuple], Any] | None = None,
    ):
        self.env = env
        self.policy_map = policy_map
        self.filters = filters
        self.rollout_fragment_length = int(rollout_fragment_length)
        self.multiple_episodes_in_batch = bool(multiple_episodes_in_batch)
        self.count_agent_steps = bool(count_agent_steps)
        self.explore = bool(explore)
        self._reward_fn = reward_fn
        self._seed = seed
        self._threads = inference_threads
        self._metrics: list[RolloutMetrics] = []
        self._queue: deque[MultiAgentBatch] = deque()
        self._pending: dict[str, dict[Any, list]] = defaultdict(lambda: defaultdict(list))
        self._agent_index: dict[str, dict[Any, int]] = {}
        self._mapping_fn = _CheckedMappingFn(policy_mapping_fn, policy_map)
        #: Recurrent policies' state per ``(episode id, agent id)``: a list of arrays.
        self._agent_states: dict[tuple, list] = {}
        act_fns: dict[Any, Any] = {}

        def action_fn(pid: Any) -> Any:
            if pid not in act_fns:
                act_fns[pid] = box_action_transform(
                    policy_map[pid].action_space, normalize_actions, clip_actions
                )
            return act_fns[pid]

        self._core = MultiAgentSampler(
            num_envs=env.num_envs,
            new_episode=self._new_episode,
            reset_fn=self._reset,
            step_fn=env.step,
            observation_spaces=env.single_observation_spaces,
            action_spaces=env.single_action_spaces,
            obs_fns=_PerPolicy(filters.get),
            action_fns=_PerPolicy(action_fn),
            lookback=max(1, int(lookback)),
        )
        # Every step's observations and rewards are checked (``MultiAgentSampler``).
        self._core.check_finite = True
        self._core.on_non_finite = on_non_finite
        self._first_reset = True

    def _new_episode(self, env_index: int) -> MultiAgentEpisode:
        return MultiAgentEpisode(
            observation_space=self.env.single_observation_spaces,
            action_space=self.env.single_action_spaces,
            agent_to_module_mapping_fn=self._mapping_fn,
        )

    def _reset(self) -> tuple[list, list]:
        seed = self._seed if self._first_reset else None
        self._first_reset = False
        return self.env.reset(seed=seed)

    # -- sampling ------------------------------------------------------------------
    def _act(self, pid: Any, obs: Any, explore: bool, t: int) -> dict[str, Any]:
        policy = self.policy_map[pid]
        is_recurrent = getattr(policy, "is_recurrent", None)
        if is_recurrent is not None and is_recurrent():
            return self._act_recurrent(policy, pid, obs, explore)
        actions, extras = policy_action_fn(policy)(obs, explore)
        return {"actions": actions, **extras}

    def _act_recurrent(self, policy: Any, pid: Any, obs: Any, explore: bool) -> dict[str, Any]:
        """Act with a recurrent policy from each acting agent's own state.

        States are kept per ``(episode id, agent id)``: an agent that does not act
        keeps its state, and a new episode starts every agent from the initial state.
        The rows of ``obs`` are the core's acting agents of ``pid`` (its
        ``(sub-env, agent id)`` index for this step); ``state_in_*`` / ``state_out_*``
        are recorded per step like any extra model output.
        """
        idx = self._core.acting_agents(pid)
        episodes = self._core.episodes
        keys = [(episodes[i].id_, aid) for i, aid in idx]
        initial = policy.get_initial_state()
        held = self._agent_states
        per_row = [held.get(key) or initial for key in keys]
        state_in = [np.stack([row[j] for row in per_row]) for j in range(len(initial))]
        prev: dict[str, Any] = {}
        wanted = getattr(policy, "prev_inputs", ())
        if "prev_actions" in wanted or "prev_rewards" in wanted:
            prev = self._prev_inputs(keys, policy)
        actions, state_out, extras = policy.compute_actions(
            obs, state_batches=state_in, explore=explore, **prev
        )
        for k, key in enumerate(keys):
            held[key] = [s[k] for s in state_out]
        for j, (s_in, s_out) in enumerate(zip(state_in, state_out)):
            extras[f"state_in_{j}"] = s_in
            extras[f"state_out_{j}"] = s_out
        return {"actions": actions, **extras}

    def _prev_inputs(self, keys: list[tuple], policy: Any) -> dict[str, Any]:
        """The acting agents' previous actions and rewards (zeros at their first step)."""
        space = policy.action_space
        acts = np.zeros((len(keys), *space.shape), space.dtype)
        rews = np.zeros(len(keys), np.float32)
        by_id = {ep.id_: ep for ep in self._core.episodes}
        for k, (eps_id, aid) in enumerate(keys):
            sa = by_id[eps_id].agent_episodes.get(aid)
            if sa is not None and len(sa) > 0:
                acts[k] = sa.get_actions(-1)
                rews[k] = sa.get_rewards(-1)
        return {"prev_action_batch": acts, "prev_reward_batch": rews}

    def _forget_finished_states(self) -> None:
        """Drop the states of agents whose episode is over (kept: the current episodes')."""
        if self._agent_states:
            live = {ep.id_ for ep in self._core.episodes}
            self._agent_states = {k: v for k, v in self._agent_states.items() if k[0] in live}

    def _run(self, num_timesteps: int) -> Any:
        if not self._core.started:
            self._core.start()
        with self._threads():
            res = self._core.run(
                act_fn=self._act,
                explore=self.explore,
                num_timesteps=num_timesteps,
                count_agent_steps=self.count_agent_steps,
            )
        self._forget_finished_states()
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
            prev = wants_prev(self.policy_map[sa.module_id])
            batch = episode_to_sample_batch(
                sa, env_id=env_id, agent_index=idx, eps_id=episode.id_, with_prev=prev
            )
            out[aid] = (sa.module_id, batch)
        return out

    def _postprocess(self, trajectories: list[tuple[MultiAgentEpisode, dict]]) -> dict[Any, list]:
        """Postprocess every agent trajectory with its policy; batches grouped by policy id."""
        policy_map = self.policy_map
        by_policy: dict[Any, list[SampleBatch]] = defaultdict(list)
        for _, batches in trajectories:
            for pid, batch in batches.values():
                by_policy[pid].append(batch)
        for pid, batches in by_policy.items():
            policy = policy_map[pid]
            is_recurrent = getattr(policy, "is_recurrent", None)
            if is_recurrent is not None and is_recurrent():
                for batch in batches:
                    add_sequences(batch, int(getattr(policy, "max_seq_len", 20)))
        with self._threads():
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
        if self.multiple_episodes_in_batch:
            res = self._run(self.rollout_fragment_length)
            chunks = list(zip(res.done + res.ongoing, res.done_env_index + res.ongoing_env_index))
            trajectories = [(ep, self._agent_batches(ep, i)) for ep, i in chunks]
            for ep in res.done:
                self._agent_index.pop(ep.id_, None)
            return self._ma_batch(self._postprocess(trajectories), res.env_steps)
        while not self._queue:
            res = self._run(self.env.num_envs * max(1, min(self.rollout_fragment_length, 100)))
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
