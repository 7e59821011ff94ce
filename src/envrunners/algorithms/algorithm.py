"""``Algorithm``: RLlib's training driver: runners, a learner, ``train()`` / ``evaluate()`` / checkpoints.

Why: a typical RLlib script is ``config.build_algo()`` then ``algo.train()`` in a
loop. This class is that entry point on top of the sampling layer: it owns an
``EnvRunnerGroup`` (``env_runner_group``), an optional evaluation group
(``eval_env_runner_group``) and one single-file learner in the driver process
(``PPOLearner`` / ``PGLearner``; subclasses name theirs in ``_learner_class``).
``train()`` returns RLlib 2.60's nested result dict (``env_runners``,
``learners/default_policy``, ``timers``, ``evaluation``, ...); checkpoints are
plain files (JSON + ``.npz``, no pickle).

Not supported (each refused with ``ConfigError`` when the config asks for it):
remote learners (``num_learners > 0``), GPUs the machine does not have,
multi-agent configs and the old API stack.
"""

from __future__ import annotations

import datetime as _dt
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


class Algorithm:
    """Train an RLModule: sample with an ``EnvRunnerGroup``, update a driver-side learner.

    Built by ``config.build_algo()`` (``config.build()`` is the deprecated alias)
    or ``PPO(config=config)``. The config is copied and frozen.

    Args:
        config: An ``AlgorithmConfig`` (its class's ``algo_class`` picks the
            algorithm), a dict of keys for ``get_default_config()``, or None for
            the defaults.
        env: Optional env (id or creator) that replaces ``config.env``.
        **kwargs: ``logger_creator`` and other RLlib keywords are accepted and ignored.

    Raises:
        ConfigError: The config asks for something this class cannot do
            (``num_learners > 0``, GPUs the machine lacks, multi-agent, old stack),
            or fails ``validate()``.
    """

    def __init__(self, config: Any = None, env: Any = None, **kwargs: Any) -> None:
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
        self._env_steps_sampled = 0
        self._episodes = 0
        self._time_total_s = 0.0
        self._iterations_since_restore = 0
        self._time_since_restore = 0.0
        from envrunners.env.env_runner_group import EnvRunnerGroup

        self.env_runner_group = EnvRunnerGroup(config=config)
        self.eval_env_runner_group: Any = None
        try:
            self.learner = self._learner_class().from_group(config, self.env_runner_group)
            self._sync_runner_weights(self.env_runner_group)
            if config.evaluation_interval or config.evaluation_num_env_runners > 0:
                self._eval_group()
        except BaseException:
            self.stop()
            raise

    # ------------------------------------------------------------------ class hooks
    @classmethod
    def get_default_config(cls) -> AlgorithmConfig:
        """A fresh config of this algorithm (``AlgorithmConfig`` with ``algo_class=cls``)."""
        return AlgorithmConfig(algo_class=cls)

    @classmethod
    def _learner_class(cls) -> type:
        """The learner class (``PPOLearner`` unless a subclass says otherwise)."""
        from envrunners.algorithms.ppo.ppo_learner import PPOLearner

        return PPOLearner

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

        One iteration samples ``total_train_batch_size`` env steps, runs one learner
        update, and syncs weights and connector states back to the runners.

        Returns:
            RLlib 2.60's nested result dict: ``env_runners`` (episode and sampling
            stats, merged over runners), ``learners`` (``default_policy`` losses and
            ``__all_modules__`` counters), ``timers``, ``fault_tolerance``,
            ``num_env_steps_sampled_lifetime``, ``training_iteration``, times,
            ``config`` and, on evaluation iterations, ``evaluation``.
        """
        from envrunners.execution.rollout_ops import synchronous_parallel_sample

        config, group = self.config, self.env_runner_group
        t_start = time.perf_counter()
        with _Timer() as t_sample:
            episodes, runner_metrics = synchronous_parallel_sample(
                worker_set=group,
                max_env_steps=config.total_train_batch_size,
                sample_timeout_s=config.sample_timeout_s,
                _return_metrics=True,
            )
        self._env_steps_sampled += sum(len(e) for e in episodes)
        with _Timer() as t_learn:
            stats = self.learner.update(episodes)
        with _Timer() as t_sync:
            self._sync_runner_weights(group)
            group.sync_env_runner_states(config=config, env_steps_sampled=self._env_steps_sampled)
        t_step = time.perf_counter() - t_start
        self.iteration += 1
        self._iterations_since_restore += 1
        env_runners = merge_runner_metrics(runner_metrics)
        self._episodes += int(env_runners.get("num_episodes", 0))
        env_runners["num_episodes_lifetime"] = float(self._episodes)
        env_runners["num_env_steps_sampled_lifetime"] = float(self._env_steps_sampled)
        result: dict[str, Any] = {
            "env_runners": env_runners,
            "learners": self._learner_results(stats),
            "num_training_step_calls_per_iteration": 1,
            "num_env_steps_sampled_lifetime": float(self._env_steps_sampled),
            "fault_tolerance": {
                "num_healthy_workers": group.num_healthy_remote_env_runners(),
                "num_remote_worker_restarts": group.num_remote_worker_restarts(),
            },
            "env_runner_group": {"actor_manager_num_outstanding_async_reqs": 0},
        }
        interval = config.evaluation_interval
        if interval and self.iteration % interval == 0:
            result["evaluation"] = self.evaluate()
        t_iter = time.perf_counter() - t_start
        result["timers"] = {
            "training_iteration": t_iter,
            "training_step": t_step,
            "env_runner_sampling_timer": t_sample.seconds,
            "learner_update_timer": t_learn.seconds,
            "synch_weights": t_sync.seconds,
        }
        self._time_total_s += t_iter
        self._time_since_restore += t_iter
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
            config=self.config.to_dict(),
        )
        return result

    def _learner_results(self, stats: dict[str, float]) -> dict[str, Any]:
        module = {_RLLIB_STAT_NAMES.get(k, k): v for k, v in stats.items()}
        trained = float(stats.get("num_env_steps_trained", 0.0))
        module["num_module_steps_trained_lifetime"] = float(self.learner.num_env_steps_trained)
        module["num_trainable_parameters"] = float(
            sum(p.numel() for p in self.learner.module.parameters() if p.requires_grad)
        )
        return {
            DEFAULT_MODULE_ID: module,
            "__all_modules__": {
                "num_env_steps_trained": trained,
                "num_env_steps_trained_lifetime": float(self.learner.num_env_steps_trained),
                "num_module_steps_trained": trained,
            },
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

        Returns:
            ``{"env_runners": {...}}`` with the same keys as ``train()``'s
            ``env_runners`` (``episode_return_mean``, ...), plus fault-tolerance counts.
        """
        config = self.config
        group = self._eval_group()
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
        }

    def _eval_group(self) -> Any:
        if self.eval_env_runner_group is None:
            from envrunners.env.env_runner_group import EnvRunnerGroup

            eval_config = self.config.get_evaluation_config_object()
            eval_config.freeze()
            self.eval_env_runner_group = EnvRunnerGroup(config=eval_config)
        return self.eval_env_runner_group

    def _sync_runner_weights(self, group: Any) -> None:
        group.sync_weights(from_worker_or_learner_group=self.learner, inference_only=True)

    # ------------------------------------------------------------------ weights and modules
    def get_module(self, module_id: str = DEFAULT_MODULE_ID) -> Any:
        """The RLModule of the local env runner (the learner's when the runner has none).

        Returns None for a module id other than ``default_policy`` (single-agent only).
        """
        if module_id != DEFAULT_MODULE_ID:
            return None
        runner = self.env_runner
        module = getattr(runner, "module", None) if runner is not None else None
        return module if module is not None else self.learner.module

    def get_weights(self, policies: list[str] | None = None) -> dict[str, Any]:
        """``{module id: weights}`` of the learner's module (numpy arrays)."""
        weights = {DEFAULT_MODULE_ID: self.learner.module.get_state()}
        return {k: v for k, v in weights.items() if policies is None or k in policies}

    def set_weights(self, weights: dict[str, Any]) -> None:
        """Load ``{module id: weights}`` into the learner and push them to every runner."""
        if DEFAULT_MODULE_ID in weights:
            self.learner.module.set_state(weights[DEFAULT_MODULE_ID])
            self.learner.weights_seq_no += 1
        self._sync_runner_weights(self.env_runner_group)
        if self.eval_env_runner_group is not None:
            self._sync_runner_weights(self.eval_env_runner_group)

    # ------------------------------------------------------------------ checkpoints
    def get_state(self) -> dict[str, Any]:
        """Learner state, local runner connector state and the training counters."""
        runner_state = self.env_runner.get_state(
            components=["env_to_module_connector", "module_to_env_connector"]
        )
        runner_state["num_env_steps_sampled_lifetime"] = self._env_steps_sampled
        return {
            "learner": self.learner.get_state(),
            "env_runner": runner_state,
            "progress": {
                "training_iteration": self.iteration,
                "num_env_steps_sampled_lifetime": self._env_steps_sampled,
                "num_episodes_lifetime": self._episodes,
                "time_total_s": self._time_total_s,
            },
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
        if "learner" in state:
            self.learner.set_state(state["learner"])
        runner_state = dict(state.get("env_runner", {}))
        if runner_state:
            runner_state["num_env_steps_sampled_lifetime"] = self._env_steps_sampled
            self.env_runner_group.foreach_env_runner("set_state", kwargs={"state": runner_state})
        self._sync_runner_weights(self.env_runner_group)
        if self.eval_env_runner_group is not None:
            self._sync_runner_weights(self.eval_env_runner_group)

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
        """Load the state of a ``save_to_path`` checkpoint into this algorithm."""
        state, _ = _load_checkpoint(path)
        self.set_state(state)

    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike, **kwargs: Any) -> Algorithm:
        """Build the algorithm a ``save_to_path`` checkpoint describes and restore its state.

        Config keys that were not JSON data (callables, classes, spaces) are not in
        the checkpoint; their defaults apply and a ``UserWarning`` names them.
        """
        state, meta = _load_checkpoint(path)
        algo_cls = _import_qualified(meta["algo_class"])
        config_cls = _import_qualified(meta["config_class"])
        if meta.get("config_not_saved"):
            warnings.warn(
                f"checkpoint {path}: config keys {meta['config_not_saved']} were not saved "
                "(not JSON data); their defaults apply",
                UserWarning,
                stacklevel=2,
            )
        config = config_cls().update_from_dict(meta["config"])
        algo = algo_cls(config=config)
        algo.set_state(state)
        return algo

    # ------------------------------------------------------------------ shutdown
    def stop(self) -> None:
        """Stop the runners of both groups (and a Ray the groups started)."""
        if getattr(self, "eval_env_runner_group", None) is not None:
            self.eval_env_runner_group.stop()
            self.eval_env_runner_group = None
        if getattr(self, "env_runner_group", None) is not None:
            self.env_runner_group.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(env={self.config.env!r}, iteration={self.iteration})"


# ---------------------------------------------------------------------- helpers
class _Timer:
    """``with _Timer() as t: ...`` then ``t.seconds``."""

    seconds = 0.0

    def __enter__(self) -> _Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self._t0


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
    problems = []
    if config.num_learners:
        problems.append(
            f"num_learners={config.num_learners}: this Algorithm trains in the driver "
            "process only; use num_learners=0"
        )
    gpus = max(float(config.num_gpus_per_learner or 0), float(config.num_gpus or 0))
    if gpus > 0 and not _cuda_available():
        problems.append(
            f"{gpus:g} GPU(s) asked for (num_gpus_per_learner / num_gpus) but this machine "
            "has none; set them to 0"
        )
    if config.evaluation_parallel_to_training:
        problems.append(
            "evaluation_parallel_to_training=True is not supported by Algorithm (evaluation "
            "runs after the training step); set it to False"
        )
    if config.is_multi_agent:
        problems.append("multi-agent configs (config.multi_agent) are not supported by Algorithm")
    if not config.enable_env_runner_and_connector_v2:
        problems.append(
            "the old API stack (api_stack(enable_env_runner_and_connector_v2=False)) is not "
            "supported by Algorithm; use the new stack"
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
