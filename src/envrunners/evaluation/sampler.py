"""``SamplerInput`` and ``SyncSampler`` (``ray.rllib.evaluation.sampler``).

Why: a ``RolloutWorker`` reads experience through an input reader; for env
sampling that reader is a ``SyncSampler``. It steps the worker's vector env with
the one sampling core (``envrunners.sampling.single_agent.SingleAgentSampler``;
multi-agent envs go through ``PolicyMultiAgentSampler``), then turns each episode
chunk into a ``SampleBatch`` at the edge and lets the chunk's policy postprocess it.

Batch modes: with ``multiple_episodes_in_batch`` (``truncate_episodes``) one
``get_data()`` returns ``rollout_fragment_length`` env steps of all sub-envs (chunks
of unfinished episodes are postprocessed with a bootstrap value and continue in
the next call); without it (``complete_episodes``) each ``get_data()`` returns one
whole, postprocessed episode.

A recurrent policy acts through ``SubEnvStates`` (each sub-env's state carried
across steps and calls, reset when its episode starts anew); its trajectories get
RLlib's ``state_in_*`` (one row per sequence), ``state_out_*`` and ``seq_lens``
columns, cut into ``max_seq_len`` sequences before postprocessing.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from typing import Any

from envrunners.core import DEFAULT_AGENT_ID, DEFAULT_POLICY_ID
from envrunners.core.columns import Columns
from envrunners.env.runner_setup import torch_threads
from envrunners.errors import NonFiniteEnvDataError
from envrunners.evaluation._policy_multi_agent_sampler import PolicyMultiAgentSampler
from envrunners.evaluation._recurrent_states import SubEnvStates
from envrunners.evaluation._sampling_hooks import (
    box_action_transform,
    clip_batch_rewards,
    fire,
    policy_action_fn,
    wants_prev,
)
from envrunners.evaluation.episode_to_batch import add_sequences, episode_to_sample_batch
from envrunners.evaluation.metrics import RolloutMetrics
from envrunners.offline.input_reader import InputReader
from envrunners.policy.sample_batch import SampleBatch, concat_samples
from envrunners.sampling.finite_checks import (
    ObsRewardCheck,
    restart_bad_agent_sub_envs,
    restart_bad_sub_envs,
)
from envrunners.sampling.single_agent import SingleAgentSampler

__all__ = ["SamplerInput", "SyncSampler"]

logger = logging.getLogger("envrunners")

_DEPRECATED = object()
_OBSOLETE = ("policies", "policy_mapping_fn", "preprocessors", "obs_filters", "tf_sess")
_warned: set[str] = set()


class SamplerInput(InputReader):
    """An input reader that gets its experience from a sampler (abstract).

    Subclasses implement ``get_data``, ``get_metrics`` and ``get_extra_batches``.
    """

    def next(self) -> Any:
        """The next batch: ``get_data()`` concatenated with any extra batches."""
        batches = [self.get_data(), *self.get_extra_batches()]
        return batches[0] if len(batches) == 1 else concat_samples(batches)

    def get_data(self) -> Any:
        """Collect and return the next batch of experience."""
        raise NotImplementedError

    def get_metrics(self) -> list[RolloutMetrics]:
        """Metrics of the episodes finished since the last call."""
        raise NotImplementedError

    def get_extra_batches(self) -> list[Any]:
        """Batches produced besides the main data since the last call (e.g. by callbacks)."""
        raise NotImplementedError


class SyncSampler(SamplerInput):
    """Collects experience synchronously (in ``get_data()``) from the worker's vector env.

    Args:
        worker: The owning ``RolloutWorker`` (its policy map, filters, mapping fn,
            callbacks and config are read at every call, so changes apply at once).
        env: The worker's vector env (a gymnasium ``VectorEnv`` with ``NEXT_STEP``
            autoreset, or the multi-agent vector env).
        clip_rewards: ``None``/``False``, ``True`` (sign) or a bound ``c``.
        rollout_fragment_length: Env (or agent) steps per ``get_data()`` in
            truncate mode, over all sub-envs.
        count_steps_by: ``"env_steps"`` or ``"agent_steps"`` (multi-agent).
        callbacks: Callback objects (old-stack hooks are called if defined).
        multiple_episodes_in_batch: True for ``truncate_episodes``.
        normalize_actions, clip_actions: Box action handling for the env.
        observation_fn, sample_collector_class, render: Accepted; not used.
        policies, policy_mapping_fn, preprocessors, obs_filters, tf_sess: Obsolete
            (read from ``worker``); a warning is logged once.
        horizon, soft_horizon, no_done_at_end: Removed in RLlib; raise.
    """

    def __init__(
        self,
        *,
        worker: Any,
        env: Any,
        clip_rewards: bool | float | None = None,
        rollout_fragment_length: int,
        count_steps_by: str = "env_steps",
        callbacks: Any = None,
        multiple_episodes_in_batch: bool = False,
        normalize_actions: bool = True,
        clip_actions: bool = False,
        observation_fn: Any = None,
        sample_collector_class: Any = None,
        render: bool = False,
        policies: Any = None,
        policy_mapping_fn: Any = None,
        preprocessors: Any = None,
        obs_filters: Any = None,
        tf_sess: Any = None,
        horizon: Any = _DEPRECATED,
        soft_horizon: Any = _DEPRECATED,
        no_done_at_end: Any = _DEPRECATED,
    ):
        for name, value in (
            ("horizon", horizon),
            ("soft_horizon", soft_horizon),
            ("no_done_at_end", no_done_at_end),
        ):
            if value is not _DEPRECATED:
                raise ValueError(
                    f"SyncSampler({name}=...) was removed: episode time limits belong in the "
                    "env (e.g. gymnasium.wrappers.TimeLimit)."
                )
        given = locals()
        for name in _OBSOLETE:
            if given[name] is not None and name not in _warned:
                _warned.add(name)
                logger.warning("SyncSampler(%s=...) is obsolete and ignored.", name)
        from envrunners.connectors.reward_clipping import clip_rewards_fn

        self.worker = worker
        self.env = env
        self.rollout_fragment_length = int(rollout_fragment_length)
        self.count_steps_by = count_steps_by
        self.callbacks = list(callbacks or [])
        self.multiple_episodes_in_batch = bool(multiple_episodes_in_batch)
        self.render = render
        self._reward_fn = clip_rewards_fn(clip_rewards)
        self._metrics: list[RolloutMetrics] = []
        self._queue: deque[Any] = deque()
        self._pending: dict[str, list[SampleBatch]] = defaultdict(list)
        self._extra_batches: list[Any] = []
        self.perf_stats: dict[str, float] = defaultdict(float)
        self._started = False
        self._states: SubEnvStates | None = None  # for a recurrent policy
        self._multi_agent = bool(getattr(worker, "_env_is_multi_agent", False))
        if self._multi_agent:
            self._ma = PolicyMultiAgentSampler(
                env,
                policy_map=worker.policy_map,
                policy_mapping_fn=self._policy_for_agent,
                filters=worker.filters,
                rollout_fragment_length=self.rollout_fragment_length,
                multiple_episodes_in_batch=self.multiple_episodes_in_batch,
                count_agent_steps=count_steps_by == "agent_steps",
                explore=bool(worker.config.explore),
                reward_fn=self._reward_fn,
                normalize_actions=normalize_actions,
                clip_actions=clip_actions,
                lookback=int(worker.config.episode_lookback_horizon),
                seed=worker.env_seed(),
                inference_threads=lambda: torch_threads(worker.config, worker.worker_index),
                on_non_finite=self._on_agent_non_finite,
            )
            return
        act_space = env.single_action_space
        self._action_fn = box_action_transform(act_space, normalize_actions, clip_actions)
        self._core = SingleAgentSampler(
            env,
            observation_space=worker.policy_map[DEFAULT_POLICY_ID].observation_space,
            action_space=act_space,
            step_fn=env.step,
            obs_fn=self._filter_obs,
            action_fn=self._action_fn,
            reward_fn=None,  # clipped at the batch edge: metrics keep the env's rewards
            lookback=max(1, int(worker.config.episode_lookback_horizon)),
        )
        self._core.finite_check = ObsRewardCheck(env.single_observation_space)
        self._core.on_non_finite = self._on_non_finite

    # -- the sampling loop ---------------------------------------------------------
    def _policy_for_agent(self, agent_id: Any, episode: Any = None, **kwargs: Any) -> Any:
        """The worker's current ``policy_mapping_fn`` (it may be replaced at any time)."""
        return self.worker.policy_mapping_fn(agent_id, episode, worker=self.worker, **kwargs)

    def _restart_fn(self, errors: list[NonFiniteEnvDataError]) -> Any:
        """The vector env's ``restart_sub_env`` under ``restart_failed_sub_environments``.

        Otherwise, or if the env cannot recreate one sub-env, the first error is raised.
        """
        restart = getattr(self.env, "restart_sub_env", None)
        if restart is None or not self.worker.config.restart_failed_sub_environments:
            raise errors[0]
        return restart

    def _on_non_finite(self, errors: list[NonFiniteEnvDataError], results: tuple) -> tuple:
        """Non-finite observations or rewards: raise, or recreate the bad sub-envs.

        As in ``SingleAgentEnvRunner``: a recreated sub-env's partial episode is dropped
        and its reset observation takes the bad row's place.
        """
        results = restart_bad_sub_envs(self._restart_fn(errors), errors, results)
        if self._states is not None:
            self._states.restarted([err.sub_env_index for err in errors])
        return results

    def _on_agent_non_finite(self, errors: list[NonFiniteEnvDataError], results: tuple) -> tuple:
        """``_on_non_finite`` for a multi-agent env (as in ``MultiAgentEnvRunner``)."""
        return restart_bad_agent_sub_envs(self._restart_fn(errors), errors, results)

    def _filter_obs(self, obs: Any) -> Any:
        filt = self.worker.filters.get(DEFAULT_POLICY_ID)
        return obs if filt is None else filt(obs)

    def _start(self) -> None:
        seed = self.worker.env_seed()
        obs, infos = self.env.reset(seed=seed)
        if isinstance(infos, dict):  # a gymnasium vector env without DictInfoToList
            infos = [{} for _ in range(self.env.num_envs)]
        self._core.start(obs, infos)
        self._started = True
        if self._states is not None:
            self._states.reset_all()

    def _recurrent_states(self, policy: Any) -> SubEnvStates | None:
        """The per-sub-env states of a recurrent ``policy`` (None if it is stateless).

        Made when the policy is first seen; it then wraps the core's env step to
        see episode boundaries. A new policy object gets fresh states.
        """
        is_recurrent = getattr(policy, "is_recurrent", None)
        if is_recurrent is None or not is_recurrent():
            if self._states is not None:
                self._states = None
                self._core.step_fn = self.env.step
            return None
        if self._states is None or self._states.policy is not policy:
            self._states = SubEnvStates(policy, self.env.num_envs)
            self._core.step_fn = self._states.wrap_step(self.env.step, self.env)
        return self._states

    def _run_core(self, num_timesteps: int) -> Any:
        if not self._started:
            self._start()
        policy = self.worker.policy_map[DEFAULT_POLICY_ID]
        explore = bool(self.worker.config.explore)
        states = self._recurrent_states(policy)
        if states is not None:
            act = states.act
        else:
            compute = policy_action_fn(policy)

            def act(obs: Any, explore: bool, t: int) -> tuple[Any, dict]:
                return compute(obs, explore)

        start = time.perf_counter()
        with torch_threads(self.worker.config, self.worker.worker_index):
            result = self._core.run(act_fn=act, explore=explore, num_timesteps=num_timesteps)
        self.perf_stats["sample_time_s"] += time.perf_counter() - start
        for stats in result.episode_stats:
            self._metrics.append(
                RolloutMetrics(
                    episode_length=stats.length,
                    episode_reward=stats.ret,
                    agent_rewards={(DEFAULT_AGENT_ID, DEFAULT_POLICY_ID): stats.ret},
                )
            )
        for _ in range(result.num_dropped_episodes):
            self._metrics.append(RolloutMetrics(episode_faulty=True))
        self._fire_episode_callbacks(result, policy)
        return result, policy

    def _postprocess_all(self, items: list[tuple[SampleBatch, Any]], policy: Any) -> list[Any]:
        """Postprocess ``(batch, episode)`` pairs, adding value predictions in one pass.

        A recurrent policy's trajectories are first cut into ``max_seq_len``
        sequences (``seq_lens``, ``state_in_*`` per sequence), as RLlib's are.
        """
        if self._states is not None and self._states.policy is policy:
            seq_len = int(getattr(policy, "max_seq_len", 20))
            for batch, _ in items:
                add_sequences(batch, seq_len)
        add_values = getattr(policy, "add_value_predictions", None)
        with torch_threads(self.worker.config, self.worker.worker_index):
            if add_values is not None:
                add_values([b for b, _ in items])
            out = [self._postprocess(b, policy, ep) for b, ep in items]
        return out

    def _postprocess(self, batch: SampleBatch, policy: Any, episode: Any) -> SampleBatch:
        start = time.perf_counter()
        clip_batch_rewards(batch, self._reward_fn)
        out = policy.postprocess_trajectory(batch, None, episode)
        if isinstance(out, SampleBatch):
            out.pop(Columns.VALUES_BOOTSTRAPPED, None)
        if self.callbacks:
            fire(
                self.callbacks,
                "on_postprocess_trajectory",
                worker=self.worker,
                episode=episode,
                agent_id=DEFAULT_AGENT_ID,
                policy_id=DEFAULT_POLICY_ID,
                policies=self.worker.policy_map,
                postprocessed_batch=out,
                original_batches={DEFAULT_AGENT_ID: (DEFAULT_POLICY_ID, policy, batch)},
            )
        self.perf_stats["postprocess_time_s"] += time.perf_counter() - start
        return out

    def get_data(self) -> Any:
        """The next batch (see the module docstring for the two batch modes)."""
        if self._multi_agent:
            return self._ma.get_data()
        if self.multiple_episodes_in_batch:
            result, policy = self._run_core(self.rollout_fragment_length)
            prev = wants_prev(policy)
            items = [
                (episode_to_sample_batch(episode, env_id=env_id, with_prev=prev), episode)
                for episode, env_id in zip(
                    result.done + result.ongoing,
                    result.done_env_index + result.ongoing_env_index,
                )
            ]
            batches = self._postprocess_all(items, policy)
            return batches[0] if len(batches) == 1 else concat_samples(batches)
        while not self._queue:
            steps = self.env.num_envs * max(1, min(self.rollout_fragment_length, 100))
            result, policy = self._run_core(steps)
            prev = wants_prev(policy)
            for episode, env_id in zip(result.ongoing, result.ongoing_env_index):
                batch = episode_to_sample_batch(episode, env_id=env_id, with_prev=prev)
                self._pending[episode.id_].append(batch)
            items = []
            for episode, env_id in zip(result.done, result.done_env_index):
                chunks = self._pending.pop(episode.id_, [])
                chunks.append(episode_to_sample_batch(episode, env_id=env_id, with_prev=prev))
                items.append((chunks[0] if len(chunks) == 1 else concat_samples(chunks), episode))
            self._queue.extend(self._postprocess_all(items, policy))
        return self._queue.popleft()

    def _fire_episode_callbacks(self, result: Any, policy: Any) -> None:
        wanted = ("on_episode_start", "on_episode_step", "on_episode_end")
        if not any(hasattr(cb, e) for cb in self.callbacks for e in wanted):
            return
        common = {
            "worker": self.worker,
            "base_env": self.env,
            "policies": self.worker.policy_map,
        }
        for kind, episodes, indices in (
            ("done", result.done, result.done_env_index),
            ("ongoing", result.ongoing, result.ongoing_env_index),
        ):
            for episode, env_index in zip(episodes, indices):
                kw = {**common, "episode": episode, "env_index": env_index}
                if episode.t_started == 0:
                    fire(self.callbacks, "on_episode_start", **kw)
                for _ in range(len(episode)):
                    fire(self.callbacks, "on_episode_step", **kw)
                if kind == "done":
                    fire(self.callbacks, "on_episode_end", **kw)

    # -- SamplerInput --------------------------------------------------------------
    def get_metrics(self) -> list[RolloutMetrics]:
        """``RolloutMetrics`` of the episodes finished since the last call."""
        if self._multi_agent:
            self._metrics.extend(self._ma.pop_metrics())
        out, self._metrics = self._metrics, []
        perf = dict(self.perf_stats)
        return [m._replace(perf_stats=perf) for m in out]

    def get_extra_batches(self) -> list[Any]:
        """Extra batches queued since the last call (none are produced here)."""
        out, self._extra_batches = self._extra_batches, []
        return out
