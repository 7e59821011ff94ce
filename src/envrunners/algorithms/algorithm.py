"""``Algorithm``: RLlib's training driver: runners, learners, ``train()`` / ``evaluate()`` / checkpoints.

Why: a typical RLlib script is ``config.build_algo()`` then ``algo.train()`` in a
loop. This class is that entry point on top of the sampling layer, on both API stacks:

- **New stack** (default): an ``EnvRunnerGroup`` of ``SingleAgentEnvRunner`` or,
  for ``config.multi_agent(...)``, ``MultiAgentEnvRunner``; one single-file learner
  in the driver process (``PPOLearner`` / ``PGLearner``; subclasses name theirs in
  ``_learner_class``), or one per module (``ModuleLearners``) for multi-agent.
  ``train()`` returns RLlib 2.60's nested result dict (``env_runners``,
  ``learners/<module id>``, ``timers``, ``evaluation``, ...).
- **Old stack** (``api_stack(enable_rl_module_and_learner=False,
  enable_env_runner_and_connector_v2=False)``): an ``EnvRunnerGroup`` of
  ``RolloutWorker`` actors with the algorithm's policy (``get_default_policy_class``),
  trained by the local worker's ``learn_on_batch``; results in RLlib's old layout
  (``env_runners/episode_reward_mean``, ``info/learner/<policy id>/learner_stats``).

With ``config.env_runners(sample_continuously=True)`` (new stack, remote runners)
the runners keep sampling while the driver trains: each training step takes the
results they finished meanwhile (``execution/_continuous_sampling``), trains, and
pushes the weights without waiting; results report how many weight versions
behind the trained data was (``continuous_sampling/weights_staleness_*``).

Checkpoints are plain files (JSON + ``.npz``, no pickle). Algorithm-level
callbacks (``on_algorithm_init``, ``on_train_result``, ``on_evaluate_start`` /
``_end``, ``on_checkpoint_loaded``) fire where RLlib fires them.

Refused with ``ConfigError`` (see ``_refuse_unsupported``): remote learners
(``num_learners > 0``), learner GPUs (the learners train on the CPU),
``evaluation_parallel_to_training``, a hybrid API stack (one flag of the two),
``add_default_connectors_to_env_to_module_pipeline=False``, offline ``input_`` on
the new stack, ``sample_continuously`` on the old stack or without remote runners,
and on the old stack an ``exploration_config`` other than
``StochasticSampling``. ``validate()`` refuses ``exploration_config`` on the new
stack and ``add_default_connectors_to_learner_pipeline=False``.
"""

from __future__ import annotations

import collections
import datetime as _dt
import functools
import json
import math
import os
import socket
import time
import warnings
from pathlib import Path
from typing import Any

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core import DEFAULT_MODULE_ID
from envrunners.errors import ConfigError, EnvRunnersError

__all__ = ["Algorithm"]

#: ``metadata.json`` format tag of ``save_to_path`` checkpoints.
CHECKPOINT_FORMAT = "envrunners-algorithm-checkpoint"
#: Learner stat names -> RLlib's names under ``learners/<module id>/``.
_RLLIB_STAT_NAMES = {
    "mean_kl": "mean_kl_loss",
    "lr": "default_optimizer_learning_rate",
    "entropy_coeff": "curr_entropy_coeff",
    "kl_coeff": "curr_kl_coeff",
    "explained_variance": "vf_explained_var",
    "num_env_steps_trained": "num_module_steps_trained",
}
#: Old-stack counter names (RLlib's ``Algorithm._counters``).
_OLD_COUNTERS = (
    "num_env_steps_sampled",
    "num_agent_steps_sampled",
    "num_env_steps_trained",
    "num_agent_steps_trained",
)


class Algorithm:
    """Train RLModules (or old-stack policies): sample with an ``EnvRunnerGroup``, update, repeat.

    Built by ``config.build_algo()`` (``config.build()`` is the deprecated alias)
    or ``PPO(config=config)``. The config is copied and frozen.

    Args:
        config: An ``AlgorithmConfig`` (its class's ``algo_class`` picks the
            algorithm), a dict of keys for ``get_default_config()``, or None for
            the defaults.
        env: Optional env (id or creator) that replaces ``config.env``.
        **kwargs: ``logger_creator`` and other RLlib keywords are accepted and ignored.

    Raises:
        ConfigError: The config asks for something this class cannot do (see the
            module docstring), or fails ``validate()``.
    """

    #: The old stack's policy class (``"module:Class"``), imported on first use.
    _old_stack_policy = "envrunners.algorithms.ppo.ppo_torch_policy:PPOTorchPolicy"

    def __init__(self, config: Any = None, env: Any = None, **kwargs: Any) -> None:
        from envrunners.env.env_runner_group import EnvRunnerGroup
        from envrunners.env.runner_setup import make_callbacks
        from envrunners.utils.metrics_logger import MetricsLogger

        if config is None:
            config = self.get_default_config()
        elif isinstance(config, dict):
            config = self.get_default_config().update_from_dict(config)
        else:
            config = config.copy(copy_frozen=False)
        if env is not None:
            config.environment(env)
        config.validate()
        _refuse_unsupported(config)
        config.freeze()
        self.config = config
        self.iteration = 0
        self._old_stack = not config.enable_env_runner_and_connector_v2
        self._env_steps_sampled = 0
        self._episodes = 0
        self._counters = dict.fromkeys(_OLD_COUNTERS, 0)
        self._episode_history: collections.deque = collections.deque(
            maxlen=int(config.metrics_num_episodes_for_smoothing)
        )
        self._time_total_s = 0.0
        self._iterations_since_restore = 0
        self._time_since_restore = 0.0
        self._throughputs = _Throughputs()
        self.metrics = MetricsLogger()
        self._callbacks = make_callbacks(config)
        self.env_runner_group = EnvRunnerGroup(config=config, **self._group_kwargs())
        self.eval_env_runner_group: Any = None
        #: Seconds per timed part of the current ``train()`` iteration (RLlib's ``timers``).
        self._timers: dict[str, float] = collections.defaultdict(float)
        self.learner: Any = None
        #: ``config.sample_continuously``: the ``ContinuousSampler`` (built on first use).
        self._continuous: Any = None
        self._staleness: list[int] = []
        try:
            if self._old_stack:
                self.env_runner_group.sync_weights()
            else:
                self.learner = self._build_learner(self.env_runner_group)
                self._sync_runner_weights(self.env_runner_group)
            if config.evaluation_interval or config.evaluation_num_env_runners > 0:
                self._eval_group()
        except BaseException:
            self.stop()
            raise
        self._fire("on_algorithm_init", algorithm=self, metrics_logger=self.metrics)

    # ------------------------------------------------------------------ class hooks
    @classmethod
    def get_default_config(cls) -> AlgorithmConfig:
        """A fresh config of this algorithm (``AlgorithmConfig`` with ``algo_class=cls``)."""
        return AlgorithmConfig(algo_class=cls)

    @classmethod
    def get_default_policy_class(cls, config: Any = None) -> type:
        """The old stack's policy class (``PPOTorchPolicy`` unless a subclass says otherwise).

        Named by path (``_old_stack_policy``): the policy module imports its
        algorithm's config, so importing it here by name keeps the imports acyclic.
        """
        return _import_qualified(cls._old_stack_policy)

    @classmethod
    def _learner_class(cls) -> type:
        """The learner class (``PPOLearner`` unless a subclass says otherwise)."""
        from envrunners.algorithms.ppo.ppo_learner import PPOLearner

        return PPOLearner

    def _group_kwargs(self) -> dict[str, Any]:
        if self._old_stack:
            return {"default_policy_class": self.get_default_policy_class(self.config)}
        return {}

    def _build_learner(self, group: Any) -> Any:
        """One learner for a single-agent config; a ``ModuleLearners`` for a multi-agent one."""
        if self.config.is_multi_agent:
            from envrunners.algorithms._module_learners import ModuleLearners

            return ModuleLearners.from_group(self.config, group, self._learner_class())
        return self._learner_class().from_group(self.config, group)

    def _fire(self, event: str, **kwargs: Any) -> None:
        """Call ``event`` on the callbacks objects and the ``callbacks_on_<event>`` functions."""
        from envrunners.env.runner_setup import fire

        fire(self, event, **kwargs)

    # ------------------------------------------------------------------ properties
    @property
    def env_runner(self) -> Any:
        """The local (in-process) env runner of ``env_runner_group``."""
        return self.env_runner_group.local_env_runner

    @property
    def training_iteration(self) -> int:
        """Number of ``train()`` calls so far (restored with a checkpoint)."""
        return self.iteration

    # ------------------------------------------------------------------ training
    def train(self) -> dict[str, Any]:
        """Run one training iteration (and evaluation when ``evaluation_interval`` says so).

        One iteration calls the training step (sample ``total_train_batch_size``
        steps, one learner update, sync weights and connector states) until
        ``min_time_s_per_iteration``, ``min_sample_timesteps_per_iteration`` and
        ``min_train_timesteps_per_iteration`` are all reached (at least once), as
        RLlib does; then ``on_train_result`` callbacks see (and may edit) the result.

        Returns:
            New stack: RLlib 2.60's nested result dict: ``env_runners`` (episode and
            sampling stats, merged over runners and training steps), ``learners``
            (per module id, plus ``__all_modules__`` counters), ``timers``,
            ``fault_tolerance``, ``num_env_steps_sampled_lifetime``,
            ``num_training_step_calls_per_iteration``, times, ``config`` and, on
            evaluation iterations, ``evaluation``. Old stack: RLlib's old layout
            (``env_runners/episode_reward_mean``, ``info/learner``, ``counters``, ...).
        """
        config = self.config
        t_start = time.perf_counter()
        self._timers: dict[str, float] = collections.defaultdict(float)
        sampled_before = self._env_steps_sampled
        trained_before = self._env_steps_trained()
        steps: list[Any] = []
        while True:
            # As in RLlib: before each step, bring back the runners restored since
            # (without waiting for those still restarting: they join when they are up).
            with self._timed("restore_env_runners"):
                self._restore_env_runners(self.env_runner_group, timeout_seconds=0.0)
            steps.append(
                self._training_step_old_stack() if self._old_stack else self._training_step()
            )
            if _iteration_done(
                config,
                time.perf_counter() - t_start,
                self._env_steps_sampled - sampled_before,
                self._env_steps_trained() - trained_before,
            ):
                break
        self._timers["training_step"] = time.perf_counter() - t_start
        self.iteration += 1
        self._iterations_since_restore += 1
        if self._old_stack:
            result = self._old_stack_result(steps, self._env_steps_sampled - sampled_before)
        else:
            result = self._new_stack_result(steps)
        interval = config.evaluation_interval
        if interval and self.iteration % interval == 0:
            result["evaluation"] = self.evaluate()
        t_iter = time.perf_counter() - t_start
        self._timers["training_iteration"] = t_iter
        if self._old_stack:
            result["timers"] = {
                "training_iteration_time_ms": 1000 * t_iter,
                "training_step_time_ms": 1000 * self._timers["training_step"],
                "sample_time_ms": 1000 * self._timers["sample"],
                "learn_time_ms": 1000 * self._timers["learn"],
                "synch_weights_time_ms": 1000 * self._timers["synch_weights"],
            }
        else:
            result["timers"] = {
                "training_iteration": t_iter,
                "training_step": self._timers["training_step"],
                "env_runner_sampling_timer": self._timers["sample"],
                "learner_update_timer": self._timers["learn"],
                "synch_weights": self._timers["synch_weights"],
                "synch_env_connectors": self._timers["synch_env_connectors"],
                "restore_env_runners": self._timers["restore_env_runners"],
            }
            if self.eval_env_runner_group is not None:
                result["timers"]["restore_eval_env_runners"] = self._timers[
                    "restore_eval_env_runners"
                ]
        self._time_total_s += t_iter
        self._time_since_restore += t_iter
        _deep_update(result, self.metrics.reduce())
        now = _dt.datetime.now()
        result.update(
            done=False,
            training_iteration=self.iteration,
            trial_id="default",
            date=now.strftime("%Y-%m-%d_%H-%M-%S"),
            timestamp=int(now.timestamp()),
            time_this_iter_s=t_iter,
            time_total_s=self._time_total_s,
            time_since_restore=self._time_since_restore,
            iterations_since_restore=self._iterations_since_restore,
            pid=os.getpid(),
            hostname=socket.gethostname(),
            node_ip=_node_ip(),
            perf=_perf(),
            config=self.config.to_dict(),
        )
        self._fire("on_train_result", algorithm=self, metrics_logger=self.metrics, result=result)
        return result

    def _timed(self, name: str) -> _Timer:
        return _Timer(self._timers, name)

    def _sample_limit(self) -> dict[str, int]:
        key = "max_agent_steps" if self.config.count_steps_by == "agent_steps" else "max_env_steps"
        return {key: int(self.config.total_train_batch_size)}

    def _env_steps_trained(self) -> int:
        if self._old_stack:
            return self._counters["num_env_steps_trained"]
        return int(self.learner.num_env_steps_trained)

    def _training_step(self) -> tuple[dict[str, Any], dict[str, Any], int]:
        """New stack: sample, update, sync. Returns ``(runner metrics, stats, env steps)``."""
        from envrunners.execution.rollout_ops import synchronous_parallel_sample

        if self.config.sample_continuously:
            return self._training_step_continuous()
        config, group = self.config, self.env_runner_group
        with self._timed("sample"):
            episodes, runner_metrics = synchronous_parallel_sample(
                worker_set=group,
                sample_timeout_s=config.sample_timeout_s,
                _return_metrics=True,
                **self._sample_limit(),
            )
        env_steps = sum(len(e) for e in episodes)
        self._env_steps_sampled += env_steps
        with self._timed("learn"):
            stats = self.learner.update(episodes)
        with self._timed("synch_weights"):
            self._sync_runner_weights(group)
        with self._timed("synch_env_connectors"):
            group.sync_env_runner_states(config=config, env_steps_sampled=self._env_steps_sampled)
        return merge_runner_metrics(runner_metrics), stats, env_steps

    def _training_step_continuous(self) -> tuple[dict[str, Any], dict[str, Any], int]:
        """New stack, ``sample_continuously``: train on results the runners sampled meanwhile.

        Takes the oldest ready results (``ContinuousSampler.take``: at least
        ``total_train_batch_size`` steps, and every result that would otherwise be
        trained more than ``max_requests_in_flight_per_env_runner`` weight versions
        after it was sampled), updates, then pushes the weights and connector
        states without waiting for the runners, which are sampling the next results.
        """
        config, group = self.config, self.env_runner_group
        sampler = self._continuous_sampler()
        sampler.set_weights_version(self.learner.weights_seq_no)
        with self._timed("sample"):
            results = sampler.take(timeout_s=config.sample_timeout_s, **self._sample_limit())
        self._staleness.extend(sampler.staleness(results))
        episodes = [episode for result in results for episode in result.samples]
        env_steps = sum(result.env_steps for result in results)
        self._env_steps_sampled += env_steps
        with self._timed("learn"):
            stats = self.learner.update(episodes)
        with self._timed("synch_weights"):
            self._sync_runner_weights(group)
            sampler.set_weights_version(self.learner.weights_seq_no)
        with self._timed("synch_env_connectors"):
            # One state per runner (its latest): each includes what its earlier ones saw.
            latest = {r.runner_id: r.connector_states for r in results if r.connector_states}
            group.sync_env_runner_states(
                config=config,
                env_steps_sampled=self._env_steps_sampled,
                connector_states=list(latest.values()),
            )
        return merge_runner_metrics([r.metrics for r in results]), stats, env_steps

    def _continuous_sampler(self) -> Any:
        if self._continuous is None:
            from envrunners.execution._continuous_sampling import ContinuousSampler

            config = self.config
            merge = config.merge_env_runner_states is True or (
                config.merge_env_runner_states == "training_only" and not config.in_evaluation
            )
            self._continuous = ContinuousSampler(self.env_runner_group, with_connector_states=merge)
        return self._continuous

    def _continuous_result(self) -> dict[str, Any]:
        """``continuous_sampling``: how stale the trained data was, and the queue's state."""
        sampler, staleness = self._continuous, self._staleness
        self._staleness = []
        return {
            "weights_staleness_mean": float(sum(staleness) / len(staleness)) if staleness else 0.0,
            "weights_staleness_max": float(max(staleness, default=0)),
            "staleness_bound": sampler.max_requests_in_flight_per_env_runner,
            "num_results_trained": len(staleness),
            "num_requests_in_flight": sampler.num_in_flight(),
            "num_results_queued": sampler.num_queued(),
            "num_requests_lost_lifetime": sampler.num_requests_lost,
            "num_results_too_stale_lifetime": sampler.num_results_too_stale,
        }

    def _new_stack_result(self, steps: list[tuple[dict, dict, int]]) -> dict[str, Any]:
        group = self.env_runner_group
        env_runners = merge_runner_metrics([m for m, _, _ in steps])
        # Lifetime counters are totals already: the last step's are this iteration's.
        env_runners.update({k: v for k, v in steps[-1][0].items() if "lifetime" in str(k)})
        self._episodes += int(sum(m.get("num_episodes", 0) for m, _, _ in steps))
        env_runners["num_episodes_lifetime"] = float(self._episodes)
        env_runners["num_env_steps_sampled_lifetime"] = float(self._env_steps_sampled)
        counts = self._lifetime_counts()
        rates = {key: self._throughputs.of(key, count) for key, count in counts.items()}
        env_runners["num_env_steps_sampled_lifetime_throughput"] = rates[
            "num_env_steps_sampled_lifetime"
        ]
        result = {
            "env_runners": env_runners,
            "learners": self._learner_results(steps, counts, rates),
            "num_training_step_calls_per_iteration": len(steps),
            "num_env_steps_sampled_lifetime": float(self._env_steps_sampled),
            "fault_tolerance": {
                "num_healthy_workers": group.num_healthy_remote_env_runners(),
                "num_remote_worker_restarts": group.num_remote_worker_restarts(),
                "num_env_runners_dropped_lifetime": group.num_env_runners_dropped_lifetime(),
            },
            "env_runner_group": {"actor_manager_num_outstanding_async_reqs": 0},
        }
        if self._continuous is not None:
            result["continuous_sampling"] = self._continuous_result()
            result["env_runner_group"]["actor_manager_num_outstanding_async_reqs"] = (
                self._continuous.num_in_flight()
            )
        return result

    def _learner_results(
        self, steps: list[tuple[dict, dict, int]], counts: dict[str, float], rates: dict
    ) -> dict[str, Any]:
        """``learners/<module id>/...`` from the last step's stats, counts over all steps;
        lifetime ``counts`` and their throughputs (``rates``) by ``_lifetime_counts`` name."""
        learners = self._learners_by_module()
        if self.config.is_multi_agent:
            per_step = [stats for _, stats, _ in steps]
            env_trained = float(sum(n for _, stats, n in steps if stats))
        else:
            per_step = [{DEFAULT_MODULE_ID: stats} for _, stats, _ in steps]
            env_trained = float(sum(s.get("num_env_steps_trained", 0.0) for _, s, _ in steps))
        out: dict[str, Any] = {}
        module_trained = 0.0
        trainable = non_trainable = 0
        for mid, learner in learners.items():
            trained = [s[mid] for s in per_step if mid in s]
            n = float(sum(s.get("num_env_steps_trained", 0.0) for s in trained))
            module_trained += n
            out[mid] = module = _module_result(learner, trained[-1] if trained else None, n)
            module["num_module_steps_trained_lifetime_throughput"] = rates[
                f"{mid}/num_module_steps_trained_lifetime"
            ]
            trainable += int(module["num_trainable_parameters"])
            non_trainable += sum(
                p.numel() for p in learner.module.parameters() if not p.requires_grad
            )
        env_throughput = rates["num_env_steps_trained_lifetime"]
        module_throughput = rates["num_module_steps_trained_lifetime"]
        out["__all_modules__"] = {
            "num_env_steps_trained": env_trained,
            "num_env_steps_trained_lifetime": counts["num_env_steps_trained_lifetime"],
            "num_env_steps_trained_throughput": env_throughput["throughput_since_last_reduce"],
            "num_env_steps_trained_lifetime_throughput": env_throughput,
            "num_module_steps_trained": module_trained,
            "num_module_steps_trained_lifetime": counts["num_module_steps_trained_lifetime"],
            "num_module_steps_trained_throughput": module_throughput[
                "throughput_since_last_reduce"
            ],
            "num_module_steps_trained_lifetime_throughput": module_throughput,
            "num_trainable_parameters": float(trainable),
            "num_non_trainable_parameters": float(non_trainable),
        }
        return out

    # ------------------------------------------------------------------ old stack
    def _training_step_old_stack(self) -> dict[str, Any]:
        """Old stack: sample a batch, ``learn_on_batch`` on the local worker, push weights.

        Returns:
            ``{policy_id: learn_on_batch info}`` (with the call's number of SGD steps).
        """
        from envrunners.execution.rollout_ops import synchronous_parallel_sample

        config, group = self.config, self.env_runner_group
        with self._timed("sample"):
            batch = synchronous_parallel_sample(
                worker_set=group, sample_timeout_s=config.sample_timeout_s, **self._sample_limit()
            )
        env_steps, agent_steps = int(batch.env_steps()), int(batch.agent_steps())
        self._env_steps_sampled += env_steps
        self._counters["num_env_steps_sampled"] += env_steps
        self._counters["num_agent_steps_sampled"] += agent_steps
        local = group.local_env_runner
        with self._timed("learn"):
            before = {pid: local.get_policy(pid).num_grad_updates for pid in local.policy_map}
            info = local.learn_on_batch(batch)
            for pid, policy_info in info.items():
                after = local.get_policy(pid).num_grad_updates
                policy_info["num_grad_updates_this_call"] = after - before.get(pid, 0)
        if info:
            self._counters["num_env_steps_trained"] += env_steps
            self._counters["num_agent_steps_trained"] += agent_steps
        with self._timed("synch_weights"):
            group.sync_weights(global_vars={"timestep": self._counters["num_env_steps_sampled"]})
            if group.num_healthy_remote_env_runners() and config.observation_filter != "NoFilter":
                # RLlib's _sync_filters_if_needed: merge the workers' filter deltas.
                group.sync_env_runner_states(config=config)
        return info

    def _old_stack_episodes(self, group: Any) -> list[Any]:
        """The ``RolloutMetrics`` of the episodes the group's workers finished since last asked."""
        per_worker = group.foreach_env_runner("get_metrics", local_env_runner=True)
        return [m for metrics in per_worker for m in (metrics or [])]

    def _old_stack_result(self, steps: list[dict], env_steps: int) -> dict[str, Any]:
        from envrunners.algorithms._old_stack_results import learner_info, summarize_episodes

        group = self.env_runner_group
        new = self._old_stack_episodes(group)
        smoothing = self._episode_history.maxlen or 0
        window = list(self._episode_history)[-max(0, smoothing - len(new)) :] if smoothing else []
        window = (window if len(new) < smoothing else []) + new
        self._episode_history.extend(new)
        self._episodes += len(new)
        counters = dict(self._counters)
        trained = env_steps if any(steps) else 0
        t_step = max(self._timers["training_step"], 1e-9)
        return {
            "env_runners": summarize_episodes(window, len(new)),
            "info": {"learner": learner_info(steps[-1]), **counters},
            "counters": counters,
            **counters,
            "num_env_steps_sampled_this_iter": env_steps,
            "num_env_steps_trained_this_iter": trained,
            "num_steps_trained_this_iter": trained,
            "num_env_steps_sampled_lifetime": counters["num_env_steps_sampled"],
            "num_agent_steps_sampled_lifetime": counters["num_agent_steps_sampled"],
            "timesteps_total": counters["num_env_steps_sampled"],
            "agent_timesteps_total": counters["num_agent_steps_sampled"],
            "num_env_steps_sampled_throughput_per_sec": env_steps / t_step,
            "num_env_steps_trained_throughput_per_sec": trained / t_step,
            "num_healthy_workers": group.num_healthy_remote_env_runners(),
            "num_remote_worker_restarts": group.num_remote_worker_restarts(),
            "actor_manager_num_outstanding_async_reqs": 0,
        }

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict[str, Any]:
        """Sample ``evaluation_duration`` episodes (or env steps) with the current weights.

        Uses the evaluation group, built on first use from
        ``config.get_evaluation_config_object()`` (``evaluation_config`` overrides,
        ``evaluation_num_env_runners`` runners; none: the group's local runner).
        ``evaluation_duration="auto"`` samples one episode per evaluation runner.
        A ``custom_evaluation_function(algo, eval_env_runner_group)`` replaces the
        sampling; it returns ``(results, env_steps, agent_steps)`` as in RLlib.
        ``on_evaluate_start`` / ``on_evaluate_end`` callbacks fire around it.

        Returns:
            ``{"env_runners": {...}}`` with the same keys as ``train()``'s
            ``env_runners`` (``episode_return_mean``, ...; on the old stack
            ``episode_reward_mean``, ...), plus the evaluation group's fault-tolerance
            counts (``num_healthy_workers``, ``num_remote_worker_restarts``,
            ``num_env_runners_dropped_lifetime``) and
            ``actor_manager_num_outstanding_async_reqs``, as RLlib's evaluation results.
        """
        self._fire("on_evaluate_start", algorithm=self, metrics_logger=self.metrics)
        results = self._evaluate()
        self._fire(
            "on_evaluate_end",
            algorithm=self,
            metrics_logger=self.metrics,
            evaluation_metrics=results,
        )
        return results

    def restore_env_runners(self, env_runner_group: Any) -> list[int]:
        """Bring back unhealthy runners of ``env_runner_group``; return the restored indices.

        Waits up to ``env_runner_health_probe_timeout_s`` for runners Ray is still
        restarting (RLlib's behaviour; ``train()`` itself does not wait). A restored
        runner has the latest weights and connector states before it serves again
        (the group installs them), and ``on_env_runners_recreated`` callbacks fire
        with its indices. The result also holds runners the group restored on its own
        since the last call.
        """
        return self._restore_env_runners(env_runner_group, timeout_seconds=None)

    def _restore_env_runners(self, group: Any, timeout_seconds: float | None) -> list[int]:
        if group is None or not group.num_remote_env_runners():
            return []
        restored = group.probe_unhealthy_env_runners(timeout_seconds=timeout_seconds)
        if restored:
            self._fire(
                "on_env_runners_recreated",
                algorithm=self,
                env_runner_group=group,
                env_runner_indices=list(restored),
                is_evaluation=group is self.eval_env_runner_group,
            )
        return restored

    def _evaluate(self) -> dict[str, Any]:
        config = self.config
        group = self._eval_group()
        with self._timed("restore_eval_env_runners"):
            self._restore_env_runners(group, timeout_seconds=0.0)
        if self._old_stack:
            group.sync_weights(from_worker_or_learner_group=self.env_runner)
        else:
            self._sync_runner_weights(group)
            connector_state = self.env_runner.get_state(
                components=["env_to_module_connector", "module_to_env_connector"]
            )
            connector_state.pop("num_env_steps_sampled_lifetime", None)
            if connector_state:
                group.foreach_env_runner("set_state", kwargs={"state": connector_state})
        if config.custom_evaluation_function is not None:
            return _custom_evaluation(config.custom_evaluation_function, self, group)
        remote = group.num_healthy_remote_env_runners()
        workers = max(1, remote)
        duration = config.evaluation_duration
        unit = config.evaluation_duration_unit
        if duration == "auto":
            duration, unit = workers, "episodes"
        if self._old_stack:
            metrics = self._evaluate_old_stack(group, int(duration), unit)
        else:
            share = max(1, math.ceil(int(duration) / workers))
            kwargs = {"num_episodes": share} if unit == "episodes" else {"num_timesteps": share}
            results = group.foreach_env_runner(
                _sample_and_report,
                kwargs=kwargs,
                local_env_runner=remote == 0,
                timeout_seconds=config.evaluation_sample_timeout_s,
            )
            metrics = merge_runner_metrics([m for _, m in results])
        return {
            "env_runners": metrics,
            "num_healthy_workers": remote,
            "num_remote_worker_restarts": group.num_remote_worker_restarts(),
            "num_env_runners_dropped_lifetime": group.num_env_runners_dropped_lifetime(),
            "actor_manager_num_outstanding_async_reqs": group.num_in_flight_async_reqs(),
        }

    def _evaluate_old_stack(self, group: Any, duration: int, unit: str) -> dict[str, Any]:
        """Sample rounds on the evaluation workers until ``duration`` episodes / steps."""
        from envrunners.algorithms._old_stack_results import summarize_episodes
        from envrunners.execution.rollout_ops import synchronous_parallel_sample

        self._old_stack_episodes(group)  # drop episodes of earlier calls
        episodes: list[Any] = []
        steps = 0
        while (len(episodes) if unit == "episodes" else steps) < duration:
            batch = synchronous_parallel_sample(
                worker_set=group, sample_timeout_s=self.config.evaluation_sample_timeout_s
            )
            steps += int(batch.env_steps())
            episodes += self._old_stack_episodes(group)
        return summarize_episodes(episodes, len(episodes))

    def _eval_group(self) -> Any:
        if self.eval_env_runner_group is None:
            from envrunners.env.env_runner_group import EnvRunnerGroup

            eval_config = self.config.get_evaluation_config_object()
            eval_config.freeze()
            self.eval_env_runner_group = EnvRunnerGroup(config=eval_config, **self._group_kwargs())
        return self.eval_env_runner_group

    def _sync_runner_weights(self, group: Any) -> None:
        if self._old_stack:
            group.sync_weights(from_worker_or_learner_group=self.env_runner)
        else:
            group.sync_weights(from_worker_or_learner_group=self.learner, inference_only=True)

    # ------------------------------------------------------------------ weights and modules
    def get_module(self, module_id: str = DEFAULT_MODULE_ID) -> Any:
        """The RLModule ``module_id`` of the local env runner (the learner's when it has none).

        Returns None for an unknown module id and on the old stack (see ``get_policy``).
        """
        if self._old_stack:
            return None
        runner = self.env_runner
        module = getattr(runner, "module", None) if runner is not None else None
        if self.config.is_multi_agent:
            if module_id not in self.learner.learners:
                return None
            if module is not None and module_id in module.keys():
                return module[module_id]
            return self.learner.learners[module_id].module
        if module_id != DEFAULT_MODULE_ID:
            return None
        return module if module is not None else self.learner.module

    def get_policy(self, policy_id: str = DEFAULT_MODULE_ID) -> Any:
        """Old stack: the local worker's policy ``policy_id`` (None if unknown or new stack)."""
        if not self._old_stack:
            return None
        return self.env_runner.get_policy(policy_id)

    def get_weights(self, policies: list[str] | None = None) -> dict[str, Any]:
        """``{module id: weights}`` of the learners' modules (numpy arrays)."""
        if self._old_stack:
            return self.env_runner.get_weights(policies)
        weights = {mid: learner.module.get_state() for mid, learner in self._learners().items()}
        return {k: v for k, v in weights.items() if policies is None or k in policies}

    def set_weights(self, weights: dict[str, Any]) -> None:
        """Load ``{module id: weights}`` into the learners and push them to every runner."""
        if self._old_stack:
            self.env_runner.set_weights(weights)
        else:
            learners = self._learners()
            for mid, sub in weights.items():
                if mid in learners:
                    learners[mid].module.set_state(sub)
            self.learner.weights_seq_no += 1
        self._sync_runner_weights(self.env_runner_group)
        if self.eval_env_runner_group is not None:
            self._sync_runner_weights(self.eval_env_runner_group)

    def _learners(self) -> dict[str, Any]:
        if self.config.is_multi_agent:
            return self.learner.learners
        return {DEFAULT_MODULE_ID: self.learner}

    # ------------------------------------------------------------------ checkpoints
    def get_state(self) -> dict[str, Any]:
        """Learner (or old-stack policy) states, connector states and the training counters."""
        progress = {
            "training_iteration": self.iteration,
            "num_env_steps_sampled_lifetime": self._env_steps_sampled,
            "num_episodes_lifetime": self._episodes,
            "time_total_s": self._time_total_s,
            "counters": dict(self._counters),
        }
        if self._old_stack:
            local = self.env_runner
            policies = {}
            for pid in local.policy_map:
                state = dict(local.get_policy(pid).get_state())
                state.pop("policy_spec", None)  # rebuilt from the config on restore
                policies[pid] = state
            filters = {pid: f.get_state() for pid, f in local.filters.items()}
            return {"policies": policies, "filters": filters, "progress": progress}
        runner_state = self.env_runner.get_state(
            components=["env_to_module_connector", "module_to_env_connector"]
        )
        runner_state["num_env_steps_sampled_lifetime"] = self._env_steps_sampled
        return {
            "learner": self.learner.get_state(),
            "env_runner": runner_state,
            "progress": progress,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what ``get_state()`` returned and push weights and connector states out."""
        progress = state.get("progress", {})
        self.iteration = int(progress.get("training_iteration", self.iteration))
        self._env_steps_sampled = int(
            progress.get("num_env_steps_sampled_lifetime", self._env_steps_sampled)
        )
        self._episodes = int(progress.get("num_episodes_lifetime", self._episodes))
        self._time_total_s = float(progress.get("time_total_s", self._time_total_s))
        self._counters.update({k: int(v) for k, v in progress.get("counters", {}).items()})
        if self._old_stack:
            local = self.env_runner
            for pid, policy_state in (state.get("policies") or {}).items():
                policy = local.get_policy(pid)
                if policy is not None:
                    policy.set_state(policy_state)
            for pid, filter_state in (state.get("filters") or {}).items():
                if pid in local.filters:
                    local.filters[pid].set_state(filter_state)
            if state.get("filters"):
                self.env_runner_group.foreach_env_runner(
                    "sync_filters", kwargs={"new_filters": local.get_filters()}
                )
        elif "learner" in state:
            self.learner.set_state(state["learner"])
        runner_state = dict(state.get("env_runner", {}))
        if runner_state:
            runner_state["num_env_steps_sampled_lifetime"] = self._env_steps_sampled
            self.env_runner_group.foreach_env_runner("set_state", kwargs={"state": runner_state})
        self._sync_runner_weights(self.env_runner_group)
        if self.eval_env_runner_group is not None:
            self._sync_runner_weights(self.eval_env_runner_group)
        self._throughputs.restart(self._lifetime_counts())  # throughputs count from here

    def _learners_by_module(self) -> dict[str, Any]:
        """``{module_id: learner}`` (new stack; one ``DEFAULT_MODULE_ID`` learner single-agent)."""
        if self.config.is_multi_agent:
            return dict(self.learner.learners)
        return {DEFAULT_MODULE_ID: self.learner}

    def _lifetime_counts(self) -> dict[str, float]:
        """The lifetime counters that results give throughputs of (new stack), by name:
        what each result reads, and their values at a restore."""
        if self._old_stack:
            return {}
        learners = self._learners_by_module()
        counts = {
            f"{mid}/num_module_steps_trained_lifetime": float(learner.num_env_steps_trained)
            for mid, learner in learners.items()
        }
        counts.update(
            num_env_steps_sampled_lifetime=float(self._env_steps_sampled),
            num_env_steps_trained_lifetime=float(self.learner.num_env_steps_trained),
            num_module_steps_trained_lifetime=float(
                sum(learner.num_env_steps_trained for learner in learners.values())
            ),
        )
        return counts

    def save_to_path(self, path: str | os.PathLike | None = None, **kwargs: Any) -> str:
        """Write a checkpoint directory (``state.json``, ``arrays.npz``, ``metadata.json``).

        Args:
            path: Target directory (replaced atomically); None: a new temp directory.
            **kwargs: RLlib's ``state``/``filesystem`` keywords are not supported
                and ignored.

        Returns:
            The checkpoint directory as a string.
        """
        import tempfile

        import envrunners
        from envrunners.utils.checkpoints import save_state

        target = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="algo_ckpt_"))
        config, skipped = _jsonable_config(self.config)
        cls = type(self)
        metadata = {
            "format": CHECKPOINT_FORMAT,
            "version": 1,
            "envrunners_version": envrunners.__version__,
            "algo_class": f"{cls.__module__}:{cls.__qualname__}",
            "config_class": f"{type(self.config).__module__}:{type(self.config).__qualname__}",
            "config": config,
            "config_not_saved": skipped,
            "saved_at": _dt.datetime.now().isoformat(timespec="seconds"),
        }
        save_state(target, self.get_state(), metadata)
        return str(target)

    def restore_from_path(self, path: str | os.PathLike, **kwargs: Any) -> None:
        """Load the state of a ``save_to_path`` checkpoint into this algorithm.

        Fires ``on_checkpoint_loaded`` (as RLlib's ``restore`` does).
        """
        state, _ = _load_checkpoint(path)
        self.set_state(state)
        self._fire("on_checkpoint_loaded", algorithm=self)

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, **kwargs: Any) -> Algorithm:
        """Build the algorithm a ``save_to_path`` checkpoint describes and restore its state.

        Config keys that were not JSON data (callables, classes, spaces) are not in
        the checkpoint; their defaults apply and a ``UserWarning`` names them.

        Raises:
            ConfigError: The checkpoint's config was multi-agent (its ``policies`` /
                ``policy_mapping_fn`` are not JSON data): build the algorithm from
                its config and call ``restore_from_path`` instead.
        """
        state, meta = _load_checkpoint(path)
        algo_cls = _import_qualified(meta["algo_class"])
        config_cls = _import_qualified(meta["config_class"])
        lost = set(meta.get("config_not_saved") or ())
        if lost & {"policies", "policy_mapping_fn", "policies_to_train"}:
            raise ConfigError(
                f"checkpoint {path}: its multi-agent config keys {sorted(lost)} are not JSON "
                "data and were not saved, so from_checkpoint() cannot rebuild the algorithm; "
                "use `algo = config.build_algo(); algo.restore_from_path(path)` instead"
            )
        if lost:
            warnings.warn(
                f"checkpoint {path}: config keys {sorted(lost)} were not saved "
                "(not JSON data); their defaults apply",
                UserWarning,
                stacklevel=2,
            )
        config = config_cls().update_from_dict(meta["config"])
        algo = algo_cls(config=config)
        algo.set_state(state)
        algo._fire("on_checkpoint_loaded", algorithm=algo)
        return algo

    # ------------------------------------------------------------------ shutdown
    def stop(self) -> None:
        """Stop the runners of both groups (and a Ray the groups started)."""
        if getattr(self, "_continuous", None) is not None:
            self._continuous.stop()
        if getattr(self, "eval_env_runner_group", None) is not None:
            self.eval_env_runner_group.stop()
            self.eval_env_runner_group = None
        if getattr(self, "env_runner_group", None) is not None:
            self.env_runner_group.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(env={self.config.env!r}, iteration={self.iteration})"


# ---------------------------------------------------------------------- helpers
class _Timer:
    """``with _Timer(totals, name): ...`` adds the block's seconds to ``totals[name]``."""

    def __init__(self, totals: dict[str, float], name: str) -> None:
        self._totals, self._name = totals, name

    def __enter__(self) -> _Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._totals[self._name] += time.perf_counter() - self._t0


def _iteration_done(config: Any, seconds: float, sampled: int, trained: int) -> bool:
    """RLlib's stop rule for one iteration's loop of training steps.

    Done when ``min_time_s_per_iteration``, ``min_sample_timesteps_per_iteration``
    and ``min_train_timesteps_per_iteration`` (each skipped when unset or 0) are all
    reached by this iteration's time, sampled and trained env steps.
    """
    min_t = config.min_time_s_per_iteration
    min_sample = config.min_sample_timesteps_per_iteration
    min_train = config.min_train_timesteps_per_iteration
    return (
        (not min_t or seconds >= min_t)
        and (not min_sample or sampled >= min_sample)
        and (not min_train or trained >= min_train)
    )


@functools.cache
def _node_ip() -> str:
    """This machine's IP address as Ray names its node (``node_ip`` of a result)."""
    import ray

    try:
        return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - no route: the loopback, as a local Ray binds it
        return "127.0.0.1"


def _perf() -> dict[str, float]:
    """``perf`` of a result: the machine's CPU and RAM use in percent (Tune's keys;
    CPU use since the previous result), or nothing without ``psutil``."""
    try:
        import psutil
    except ImportError:
        return {}
    return {
        "cpu_util_percent": float(psutil.cpu_percent(interval=None)),
        "ram_util_percent": float(psutil.virtual_memory().percent),
    }


class _Throughputs:
    """The ``..._throughput`` entries of lifetime counters in a result, as RLlib 2.60 has
    them: ``{"throughput_since_last_reduce": per second since the previous result,
    "throughput_since_last_restore": per second since the algorithm was built or restored}``.

    Why its own state: each counter's value and time at the previous result, and the
    values at the restore (a restored checkpoint's counters are not this run's work).
    """

    def __init__(self) -> None:
        self.restart()

    def restart(self, counts: dict[str, float] | None = None) -> None:
        """Count "since last restore" from now and from ``counts`` (the counters' restored
        values; a counter not in it from 0)."""
        self._restored_at = time.perf_counter()
        self._at_restore = {k: float(v) for k, v in (counts or {}).items()}
        self._previous: dict[str, tuple[float, float]] = {}

    def of(self, key: str, lifetime: float) -> dict[str, float]:
        """Both throughputs of counter ``key`` (now at ``lifetime``); remembers this read."""
        now, lifetime = time.perf_counter(), float(lifetime)
        base = self._at_restore.get(key, 0.0)
        before, then = self._previous.get(key, (base, self._restored_at))
        self._previous[key] = (lifetime, now)
        return {
            "throughput_since_last_reduce": (lifetime - before) / max(now - then, 1e-9),
            "throughput_since_last_restore": (lifetime - base) / max(now - self._restored_at, 1e-9),
        }


def _module_result(learner: Any, stats: dict[str, float] | None, trained: float) -> dict:
    """``learners/<module id>``: RLlib's stat names; the schedules only for an untrained module."""
    if stats is None:
        module = {
            "default_optimizer_learning_rate": learner._lr(learner.num_env_steps_trained),
            "curr_entropy_coeff": learner._entropy_coeff(learner.num_env_steps_trained),
        }
    else:
        module = {_RLLIB_STAT_NAMES.get(k, k): v for k, v in stats.items()}
        module["num_module_steps_trained"] = trained
        module["num_module_steps_trained_lifetime"] = float(learner.num_env_steps_trained)
    module["num_trainable_parameters"] = float(
        sum(p.numel() for p in learner.module.parameters() if p.requires_grad)
    )
    return module


def _deep_update(target: dict, extra: dict) -> None:
    """Merge nested ``extra`` into ``target`` (values the user logged on ``metrics``)."""
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_update(target[key], value)
        else:
            target[key] = value


def _custom_evaluation(func: Any, algo: Algorithm, group: Any) -> dict[str, Any]:
    """Call ``custom_evaluation_function(algo, group)`` and check its ``(dict, int, int)``."""
    out = func(algo, group)
    if not (isinstance(out, tuple) and len(out) == 3):
        raise ValueError(
            "custom_evaluation_function must return (results dict, env_steps, agent_steps), "
            f"got {out!r}"
        )
    results, env_steps, agent_steps = out
    if not isinstance(results, dict):
        raise ValueError(
            f"custom_evaluation_function must return a dict of metrics, got {results!r}"
        )
    if not isinstance(env_steps, int) or not isinstance(agent_steps, int):
        raise ValueError(
            "custom_evaluation_function must return int env_steps and agent_steps, got "
            f"{env_steps!r} and {agent_steps!r}"
        )
    return results


def _sample_and_report(runner: Any, **kwargs: Any) -> tuple[None, dict]:
    """Runner side of ``evaluate()``: sample (episodes stay there), return the metrics."""
    runner.sample(**kwargs)
    return None, runner.get_metrics()


def merge_runner_metrics(metrics: list[dict]) -> dict[str, Any]:
    """Merge per-runner ``get_metrics()`` dicts into one, as RLlib's aggregation does.

    ``*_min``/``*_max`` keys take the min/max, counts (``num_*``) add up, every
    other number (means, timers) is averaged; nested dicts merge key by key.
    """
    metrics = [m for m in metrics if m]
    if not metrics:
        return {}
    merged: dict[str, Any] = {}
    for key in dict.fromkeys(k for m in metrics for k in m):
        values = [m[key] for m in metrics if key in m]
        if isinstance(values[0], dict):
            merged[key] = merge_runner_metrics(values)
        elif str(key).endswith("_min"):
            merged[key] = min(values)
        elif str(key).endswith("_max"):
            merged[key] = max(values)
        elif str(key).startswith("num_") and "throughput" not in str(key):
            merged[key] = sum(values)
        else:
            merged[key] = sum(values) / len(values)
    return merged


def _refuse_unsupported(config: AlgorithmConfig) -> None:
    """Raise one ``ConfigError`` naming every key this ``Algorithm`` cannot honour.

    Still refused: ``num_learners > 0`` (learners run in the driver), learner GPUs
    (``num_gpus_per_learner`` / ``num_gpus``: the learners train on the CPU),
    ``evaluation_parallel_to_training``, a hybrid API stack,
    ``add_default_connectors_to_env_to_module_pipeline=False`` (the runners' acting
    path does batching and tensors itself, so there are no default pieces to leave
    out), offline ``input_`` on the new stack (its runners only sample envs) and, on
    the old stack, an ``exploration_config`` other than ``StochasticSampling`` (the
    policies sample from their action distribution); ``sample_continuously`` on the
    old stack or with ``num_env_runners=0``.
    """
    problems = []
    if config.num_learners:
        problems.append(
            f"num_learners={config.num_learners}: this Algorithm trains in the driver "
            "process only; use num_learners=0"
        )
    gpus = max(float(config.num_gpus_per_learner or 0), float(config.num_gpus or 0))
    if gpus > 0:
        why = "the learners train on the CPU" if _cuda_available() else "this machine has none"
        problems.append(
            f"{gpus:g} GPU(s) asked for (num_gpus_per_learner / num_gpus) but {why}; set them to 0"
        )
    if config.evaluation_parallel_to_training:
        problems.append(
            "evaluation_parallel_to_training=True is not supported by Algorithm (evaluation "
            "runs after the training step); set it to False"
        )
    new_learner = bool(config.enable_rl_module_and_learner)
    new_runners = bool(config.enable_env_runner_and_connector_v2)
    if new_learner != new_runners:
        problems.append(
            f"a hybrid API stack (enable_rl_module_and_learner={new_learner}, "
            f"enable_env_runner_and_connector_v2={new_runners}) is not supported; set both "
            "to True (new stack) or both to False (old stack)"
        )
    if new_runners and not config.add_default_connectors_to_env_to_module_pipeline:
        problems.append(
            "add_default_connectors_to_env_to_module_pipeline=False is not supported: the "
            "runners batch observations and make tensors themselves (no default connector "
            "pieces to leave out); leave it True and add your own pieces with "
            "env_to_module_connector"
        )
    if new_runners and config.input_ != "sampler":
        problems.append(
            f"input_={config.input_!r}: the new-stack Algorithm samples from the env (no "
            "offline learning); offline input is read by the old stack's RolloutWorkers "
            "(api_stack(enable_rl_module_and_learner=False, "
            "enable_env_runner_and_connector_v2=False))"
        )
    exploration = config.exploration_config or {}
    if not new_runners and exploration.get("type", "StochasticSampling") != "StochasticSampling":
        problems.append(
            f"exploration_config={exploration!r} is not supported on the old stack: the "
            "policies sample from their action distribution (StochasticSampling; "
            "explore=False acts greedily); remove exploration_config"
        )
    if config.sample_continuously and not new_runners:
        problems.append(
            "sample_continuously=True needs the new API stack (EnvRunners and episodes); "
            "the old stack's RolloutWorkers sample synchronously"
        )
    elif config.sample_continuously and int(config.num_env_runners) < 1:
        problems.append(
            f"sample_continuously=True needs remote env runners to sample while the driver "
            f"trains, but num_env_runners={config.num_env_runners}; set "
            "config.env_runners(num_env_runners=1 or more)"
        )
    if problems:
        raise ConfigError(problems=problems)


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _jsonable_config(config: AlgorithmConfig) -> tuple[dict[str, Any], list[str]]:
    """The config keys that differ from the defaults and are JSON data; the others' names."""
    defaults = type(config)().to_dict()
    saved, skipped = {}, []
    for key, value in config.to_dict().items():
        if key == "model" or value == defaults.get(key):
            continue
        try:
            json.dumps(value, allow_nan=True)
        except (TypeError, ValueError):
            skipped.append(key)
            continue
        saved[key] = value
    return saved, skipped


def _load_checkpoint(path: str | os.PathLike) -> tuple[dict, dict]:
    from envrunners.utils.checkpoints import load_state

    state, meta = load_state(path)
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise EnvRunnersError(f"{path} is not an Algorithm checkpoint (written by save_to_path)")
    return state, meta


def _import_qualified(name: str) -> Any:
    import importlib

    module, _, qualname = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
