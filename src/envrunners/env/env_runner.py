"""``EnvRunner`` (``ray.rllib.env.env_runner``), RLlib's runner contract, and the
base both new-stack runners share.

``EnvRunner`` (abstract): subclasses build an env and a module, and return
experience from ``sample()``. It copies the config, derives the runner's seed,
keeps metrics, and gives the env-failure handling every runner shares
(``_try_env_reset``/``_try_env_step``, which returns ``ENV_STEP_FAILURE``).

``NewStackEnvRunner`` (abstract): what ``SingleAgentEnvRunner`` and
``MultiAgentEnvRunner`` have in common: an RLModule, two connector pipelines
(one, or one per module), a sampling loop whose ``SampleResult`` becomes
metrics, the weights-seq-no gated state, checkpoints, health and ``stop``.
"""

from __future__ import annotations

import abc
import functools
import logging
import math
import random
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from envrunners.core import (
    COMPONENT_ENV_TO_MODULE_CONNECTOR,
    COMPONENT_MODULE_TO_ENV_CONNECTOR,
    COMPONENT_RL_MODULE,
    INPUT_ENV_SINGLE_SPACES,
    INPUT_ENV_SPACES,
)
from envrunners.env import runner_setup
from envrunners.env._remote_runner_calls import install_weights
from envrunners.errors import EnvRunnerError, StepFailedRecreateEnvError
from envrunners.offline.episode_writer import close_episode_writer, record_episodes
from envrunners.utils import metrics as M
from envrunners.utils.actor_manager import FaultAwareApply
from envrunners.utils.checkpoints import load_state, save_state
from envrunners.utils.failure_log import FAILURE_LOG
from envrunners.utils.metrics import (
    ENV_RESET_TIMER,
    ENV_STEP_TIMER,
    NUM_ENV_STEP_FAILURES_LIFETIME,
)
from envrunners.utils.metrics_logger import MetricsLogger

if TYPE_CHECKING:
    from collections.abc import Callable

    from envrunners.algorithms.algorithm_config import AlgorithmConfig
    from envrunners.env.env_context import EnvContext
    from envrunners.sampling.sample_result import EpisodeStats, SampleResult

__all__ = [
    "ENV_RESET_FAILURE",
    "ENV_STEP_FAILURE",
    "NUM_ENV_STEP_FAILURES_LIFETIME",
    "EnvRunner",
    "NewStackEnvRunner",
    "StepFailedRecreateEnvError",
]

logger = logging.getLogger("envrunners")

ENV_RESET_FAILURE = "env_reset_failure"
#: What ``_try_env_step`` returns after it recreated a failed env; a sampling loop
#: checks for it (by identity) and starts fresh episodes.
ENV_STEP_FAILURE = "env_step_failure"


def update_global_seed(seed: int | None) -> None:
    """Seed Python's ``random``, numpy's global RNG and torch (if imported) with ``seed``."""
    if seed is None:
        return
    random.seed(seed)
    np.random.seed(seed % (2**32))
    import torch

    torch.manual_seed(seed)


class EnvRunner(FaultAwareApply, metaclass=abc.ABCMeta):
    """Base class of everything that collects experience from environments.

    Args:
        config: The ``AlgorithmConfig``; the runner keeps a private unfrozen copy.
        **kwargs: ``worker_index`` (0 = local, >0 = remote; None = standalone) and
            ``num_workers``; other keys are accepted and ignored, as in RLlib.
    """

    def __init__(self, *, config: AlgorithmConfig, **kwargs: Any):
        self.config = config.copy(copy_frozen=False)
        #: Global env steps sampled by all runners; only ``set_state`` changes it.
        self.num_env_steps_sampled_lifetime = 0
        self.worker_index: int | None = kwargs.get("worker_index")
        self.num_workers: int = kwargs.get("num_workers", self.config.num_env_runners)
        self.env: Any = None
        self.metrics = MetricsLogger()
        self._seed: int | None = None
        if self.config.seed is not None:
            self._seed = int(
                self.config.seed
                + (self.worker_index or 0)
                + 1_000_000 * bool(self.config.in_evaluation)
            )
        update_global_seed(self._seed)
        self._env_step_time = 0.0
        self._env_reset_time = 0.0
        self._shared_data: dict | None = None

    # -- the contract --------------------------------------------------------------
    @abc.abstractmethod
    def assert_healthy(self) -> None:
        """Raise ``AssertionError`` unless the runner is fully built and can sample."""

    def make_env(self) -> None:
        """(Re)create ``self.env``, closing any previous one."""

    def make_module(self) -> None:
        """(Re)create ``self.module`` from the config."""

    @abc.abstractmethod
    def sample(self, **kwargs: Any) -> Any:
        """Return experience collected from the env."""

    def get_metrics(self) -> Any:
        """Metrics of the episodes completed since the last call."""
        return None

    @abc.abstractmethod
    def get_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        """Map module ids (and ``__env__``/``__env_single__``) to (obs, action) spaces."""

    def stop(self) -> None:
        """Release resources (close the env)."""

    def __del__(self) -> None:
        pass

    def sample_get_state_and_metrics(self) -> tuple[Any, dict, Any]:
        """``sample()``, then the state without the module, then the metrics, in one call.

        The episodes come back as an object-store reference when Ray is running, so
        a driver can pass them on without copying them through itself.
        """
        samples = self.sample()
        state = self.get_state(not_components="rl_module")  # type: ignore[attr-defined]
        metrics = self.get_metrics()
        try:
            import ray

            if ray.is_initialized():
                samples = ray.put(samples)
        except ImportError:  # pragma: no cover - ray is a dependency
            pass
        return samples, state, metrics

    # -- env failure handling ------------------------------------------------------
    def _try_env_reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[Any, Any]:
        """``env.reset``; on error recreate the env and retry if the config allows it.

        Otherwise (or after 10 failed retries) the error is raised as an
        ``EnvRunnerError`` naming the runner and sub-env, chained to the original.
        """
        for attempt in range(11):
            start = time.perf_counter()
            try:
                obs, infos = self.env.reset(seed=seed, options=options)
                self._env_reset_time += time.perf_counter() - start
                return obs, infos
            except Exception as err:
                if not self.config.restart_failed_sub_environments or attempt == 10:
                    sub = getattr(err, "sub_env_index", None)
                    where = f"sub-environment {sub}" if sub is not None else "the environment"
                    raise EnvRunnerError(
                        f"{where} raised {err!r} in reset(). Set config.fault_tolerance("
                        "restart_failed_sub_environments=True) to recreate failing envs "
                        "and go on.",
                        runner_index=self.worker_index,
                    ) from err
                if not isinstance(err, StepFailedRecreateEnvError):
                    FAILURE_LOG.report(
                        "env reset", err, "Resetting the env raised %r; recreating it.", err
                    )
                self.metrics.log_value(NUM_ENV_STEP_FAILURES_LIFETIME, 1, reduce="lifetime_sum")
                self.make_env()
        raise AssertionError("unreachable")  # pragma: no cover

    def _try_env_step(self, actions: Any) -> Any:
        """``env.step``; returns ``ENV_STEP_FAILURE`` after recreating a failed env.

        Without ``restart_failed_sub_environments`` the error is raised as an
        ``EnvRunnerError`` (a ``RuntimeError``) naming the runner and sub-env.
        """
        start = time.perf_counter()
        try:
            results = self.env.step(actions)
        except Exception as err:
            if self.config.restart_failed_sub_environments:
                return self._recreate_env_after(err)
            self.metrics.log_value(NUM_ENV_STEP_FAILURES_LIFETIME, 1, reduce="lifetime_sum")
            sub = getattr(err, "sub_env_index", None)
            where = f"sub-environment {sub}" if sub is not None else "the environment"
            logger.exception("Stepping the env raised %r.", err)
            raise EnvRunnerError(
                f"{where} raised {err!r} in step(). Set config.fault_tolerance("
                "restart_failed_sub_environments=True) to recreate failing envs and go on.",
                runner_index=self.worker_index,
            ) from err
        self._env_step_time += time.perf_counter() - start
        return results

    def _recreate_env_after(self, err: BaseException) -> str:
        """Count and log a failed step (``err``), recreate the env; returns ``ENV_STEP_FAILURE``."""
        self.metrics.log_value(NUM_ENV_STEP_FAILURES_LIFETIME, 1, reduce="lifetime_sum")
        if not isinstance(err, StepFailedRecreateEnvError):
            FAILURE_LOG.report("env step", err, "Stepping the env raised %r; recreating it.", err)
        self.make_env()
        return ENV_STEP_FAILURE

    def _recv_env(self) -> Any:
        """``env.recv()`` (ready-first); ``ENV_STEP_FAILURE`` after recreating a failed env."""
        start = time.perf_counter()
        try:
            results = self.env.recv()
        except Exception as err:
            return self._async_env_failed(err, "recv")
        self._env_step_time += time.perf_counter() - start
        return results

    def _send_env(self, actions: Any, env_ids: Any) -> Any:
        """``env.send(actions, env_ids)``; ``ENV_STEP_FAILURE`` after recreating a failed env."""
        start = time.perf_counter()
        try:
            self.env.send(actions, env_ids)
        except Exception as err:
            return self._async_env_failed(err, "send")
        self._env_step_time += time.perf_counter() - start
        return None

    def _async_env_failed(self, err: Exception, call: str) -> Any:
        """A failed ``recv``/``send``: recreate the env (if allowed), as ``_try_env_step`` does."""
        if self.config.restart_failed_sub_environments:
            return self._recreate_env_after(err)
        self.metrics.log_value(NUM_ENV_STEP_FAILURES_LIFETIME, 1, reduce="lifetime_sum")
        logger.exception("The environment raised %r in %s().", err, call)
        raise EnvRunnerError(
            f"the environment raised {err!r} in {call}(). Set config.fault_tolerance("
            "restart_failed_sub_environments=True) to recreate failing envs and go on.",
            runner_index=self.worker_index,
        ) from err

    def _log_env_timers(self, num_steps: int) -> None:
        """Log the env reset/step time accumulated since the last call (per step)."""
        if num_steps:
            self.metrics.log_value(ENV_STEP_TIMER, self._env_step_time / num_steps)
        if self._env_reset_time:
            self.metrics.log_value(ENV_RESET_TIMER, self._env_reset_time)
        self._env_step_time = 0.0
        self._env_reset_time = 0.0


class NewStackEnvRunner(EnvRunner):
    """Base of ``SingleAgentEnvRunner`` and ``MultiAgentEnvRunner``.

    Holds what both do the same way: the runner metrics of a ``sample()`` call
    (``_begin_sample``/``_record``/``_end_sample``, ``get_metrics``), the state
    (``get_state``/``set_state``: lifetime steps, module weights gated by
    ``weights_seq_no``, connector states), weights, checkpoints (plain files, no
    pickle, written atomically; restoring always applies the weights), health and
    ``stop``. A subclass builds ``env``, ``module``, ``_env_to_module`` and
    ``_module_to_env`` and says how weights load into its module, how its connector
    states look and how its episodes break down by agent and module (the ``_...`` hooks).

    Args:
        config: The ``AlgorithmConfig``.
        **kwargs: ``worker_index``, ``num_workers``, ``spaces`` (used when the
            runner has no env, e.g. a group's local runner with remotes) and
            ``tune_trial_id``.
    """

    def __init__(self, *, config: AlgorithmConfig, **kwargs: Any):
        super().__init__(config=config, **kwargs)
        self.tune_trial_id = kwargs.get("tune_trial_id")
        self.spaces: dict = kwargs.get("spaces") or {}
        self._callbacks = runner_setup.make_callbacks(self.config)
        self.num_envs = 0
        self.module: Any = None
        #: Why ``module`` is None (said by ``sample()`` unless it samples randomly).
        self._module_error: str | None = None
        self._env_to_module: Any = None
        self._module_to_env: Any = None
        self._needs_initial_reset = True
        self._weights_seq_no = 0
        #: Held by ``sample()`` and ``set_state``: weights set from another thread wait
        #: for a running sample, whose steps all record the ``weights_seq_no`` it began with.
        self._weights_lock = threading.RLock()
        self._explore = bool(self.config.explore)
        self._inference_time = 0.0
        self._time_after_sampling: float | None = None
        #: Stats of episodes finished since ``get_metrics``; only the newest
        #: ``_episode_window()`` matter (the metrics are means over that window).
        self._done_stats: deque[EpisodeStats] = deque(maxlen=self._episode_window())

    # -- the env -------------------------------------------------------------------
    def _replace_env(
        self, make_vector_env: Callable[[Any, int | None, int | None], tuple[Any, EnvContext]]
    ) -> None:
        """Close the current env (if any) and build the new one with ``make_vector_env``.

        ``make_vector_env(config, worker_index, num_workers) -> (vector env, EnvContext)``.

        Raises:
            ConfigError: The vector env's size is not ``num_envs_per_env_runner``.
        """
        if self.env is not None:
            runner_setup.close_quietly(self.env)
            self.env = None
        self.env, self._env_context = make_vector_env(
            self.config, self.worker_index, self.num_workers
        )
        self.num_envs = runner_setup.check_num_envs(self.env, self.config)

    def _env_created(self) -> None:
        """Ask for a seeded reset on the next ``sample()``; fire ``on_environment_created``."""
        self._needs_initial_reset = True
        runner_setup.fire(
            self,
            "on_environment_created",
            env_runner=self,
            metrics_logger=self.metrics,
            env=self.env.unwrapped,
            env_context=self._env_context,
        )

    def _env_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        """``__env__`` (batched) and ``__env_single__`` spaces of the env (which exists)."""
        env = self.env
        return {
            INPUT_ENV_SPACES: (env.observation_space, env.action_space),
            INPUT_ENV_SINGLE_SPACES: (env.single_observation_space, env.single_action_space),
        }

    # -- hooks of the subclasses ---------------------------------------------------
    @abc.abstractmethod
    def _set_module_state(self, weights: Any) -> None:
        """Load ``weights`` (a resolved ``rl_module`` state) into ``module``."""

    @abc.abstractmethod
    def _get_connector_state(self, pipelines: Any) -> Any:
        """The state of ``_env_to_module`` or ``_module_to_env``."""

    @abc.abstractmethod
    def _set_connector_state(self, pipelines: Any, state: Any) -> None:
        """Load ``state`` into ``_env_to_module`` or ``_module_to_env``."""

    @abc.abstractmethod
    def _steps_by_agent_and_module(self, result: SampleResult) -> dict[tuple[Any, Any], int]:
        """``{(agent_id, module_id): agent steps}`` of one sampling run."""

    @abc.abstractmethod
    def _log_episode_breakdown(self, stats: Any, window: int) -> None:
        """Log one finished episode's per-agent and per-module numbers."""

    # -- metrics of sample() -------------------------------------------------------
    def _begin_sample(
        self,
        num_timesteps: int | None,
        num_episodes: int | None,
        explore: bool | None,
        random_actions: bool,
    ) -> tuple[int | None, int | None, float]:
        """Check a ``sample()`` call and fill in its defaults; returns the counts and start time.

        With no counts, ``truncate_episodes`` asks for ``rollout_fragment_length *
        num_envs`` timesteps and ``complete_episodes`` for one episode per sub-env.

        Raises:
            ValueError: The runner has no env, or no module and ``random_actions`` is False.
            AssertionError: Both counts, or a negative one, are given (as in RLlib).
        """
        if self.env is None:
            raise ValueError(
                f"{self} doesn't have an env! Can't call `sample()` on it (this is a "
                "group's local runner without env: set create_env_on_local_worker=True, "
                "or sample from the remote runners)."
            )
        num_timesteps, num_episodes = runner_setup.check_sample_counts(num_timesteps, num_episodes)
        start = time.perf_counter()
        if self._time_after_sampling is not None:
            self.metrics.log_value(M.TIME_BETWEEN_SAMPLING, start - self._time_after_sampling)
        self.metrics.log_value(M.WEIGHTS_SEQ_NO, self._weights_seq_no, reduce="last")
        self._explore = bool(self.config.explore if explore is None else explore)
        if num_timesteps is None and num_episodes is None:
            if self.config.batch_mode == "truncate_episodes":
                fragment = self.config.get_rollout_fragment_length(self.worker_index or 0)
                num_timesteps = fragment * self.num_envs
            else:
                num_episodes = self.num_envs
        if not random_actions and self.module is None:
            raise ValueError(
                f"this runner has no module ({self._module_error}): sample with "
                "random_actions=True, give the runner an env or spaces, or set "
                "config.rl_module(rl_module_spec=...) to a module that handles the env's spaces."
            )
        self._inference_time = 0.0
        return num_timesteps, num_episodes, start

    def _acts_randomly(self, random_actions: bool) -> bool:
        """``random_actions``, or True when the config builds no module (base config)."""
        if random_actions or self.module is not None:
            return random_actions
        return self._module_error == runner_setup.NO_DEFAULT_MODULE

    def _t_offset(self) -> int:
        """The timestep the exploration schedule starts this call at (all runners' steps)."""
        n = self.config.num_env_runners or 1
        return (self.num_env_steps_sampled_lifetime // n) * n

    def _record(self, result: SampleResult) -> None:
        """Log the counters of one sampling run; keep its episode stats for ``get_metrics``."""
        log = self.metrics.log_value
        steps, n_done = result.env_steps, len(result.done)
        log(M.NUM_ENV_STEPS_SAMPLED, steps, reduce="sum")
        log(M.NUM_ENV_STEPS_SAMPLED_LIFETIME, steps, reduce="lifetime_sum", with_throughput=True)
        agents: dict[str, int] = {}
        modules: dict[str, int] = {}
        for (aid, mid), count in self._steps_by_agent_and_module(result).items():
            agents[str(aid)] = agents.get(str(aid), 0) + count
            modules[str(mid)] = modules.get(str(mid), 0) + count
        for aid, count in agents.items():
            log((M.NUM_AGENT_STEPS_SAMPLED, aid), count, reduce="sum")
            log((M.NUM_AGENT_STEPS_SAMPLED_LIFETIME, aid), count, reduce="lifetime_sum")
        for mid, count in modules.items():
            log((M.NUM_MODULE_STEPS_SAMPLED, mid), count, reduce="sum")
            log((M.NUM_MODULE_STEPS_SAMPLED_LIFETIME, mid), count, reduce="lifetime_sum")
        log(M.NUM_EPISODES, n_done, reduce="sum")
        log(M.NUM_EPISODES_LIFETIME, n_done, reduce="lifetime_sum")
        if result.num_sub_env_failures:  # whole-env failures were logged by _try_env_step
            n_failed = result.num_sub_env_failures
            log(M.NUM_ENV_STEP_FAILURES_LIFETIME, n_failed, reduce="lifetime_sum")
        if result.num_dropped_episodes:
            log("num_episodes_dropped_lifetime", result.num_dropped_episodes, reduce="lifetime_sum")
        if self.module is not None and steps:
            log(M.RLMODULE_INFERENCE_TIMER, self._inference_time / steps)
        self._log_env_timers(steps)
        done_stats = self._done_stats
        if done_stats.maxlen != (window := self._episode_window()):
            done_stats = self._done_stats = deque(done_stats, maxlen=window)
        done_stats.extend(result.episode_stats)

    def _end_sample(self, episodes: list, start: float) -> None:
        """Fire ``on_sample_end``, record the episodes (``config.output``), time the call."""
        runner_setup.fire(
            self, "on_sample_end", env_runner=self, metrics_logger=self.metrics, samples=episodes
        )
        record_episodes(self, episodes)  # no-op unless config.output is set
        self._time_after_sampling = time.perf_counter()
        self.metrics.log_value(M.SAMPLE_TIMER, self._time_after_sampling - start)

    def _episode_window(self) -> int:
        """Episodes per smoothing window: ``metrics_num_episodes_for_smoothing`` per runner."""
        return max(
            1,
            math.ceil(self.config.metrics_num_episodes_for_smoothing / (self.num_workers or 1)),
        )

    def get_metrics(self) -> dict:
        """Whole-episode stats of the episodes finished since the last call, plus counters.

        Only the newest window of finished episodes is kept between calls (RLlib's
        ``metrics_num_episodes_for_smoothing``), so memory stays bounded when this is
        never called.
        """
        window = self._episode_window()
        log = self.metrics.log_value
        for stats in self._done_stats:
            log(M.EPISODE_LEN_MEAN, stats.length, window=window)
            log(M.EPISODE_RETURN_MEAN, stats.ret, window=window)
            log(M.EPISODE_DURATION_SEC_MEAN, stats.duration_s, window=window)
            self._log_episode_breakdown(stats, window)
            log(M.EPISODE_LEN_MIN, stats.length, reduce="min", window=window)
            log(M.EPISODE_RETURN_MIN, stats.ret, reduce="min", window=window)
            log(M.EPISODE_LEN_MAX, stats.length, reduce="max", window=window)
            log(M.EPISODE_RETURN_MAX, stats.ret, reduce="max", window=window)
        self._done_stats.clear()
        return self.metrics.reduce()

    # -- state and weights ---------------------------------------------------------
    def get_state(
        self,
        components: str | list[str] | None = None,
        *,
        not_components: str | list[str] | None = None,
        **kwargs: Any,
    ) -> dict:
        """Lifetime step count, module weights (+ ``weights_seq_no``) and connector states.

        Args:
            components: Only these (``"rl_module"``, ``"rl_module/p0"``, connector names).
            not_components: Leave these out.
            **kwargs: ``inference_only`` (drop learner-only weights).

        Raises:
            AttributeError: ``rl_module`` is selected but the runner has no module.
        """
        state: dict[str, Any] = {
            "num_env_steps_sampled_lifetime": self.num_env_steps_sampled_lifetime
        }
        pick = runner_setup.component_selector(components, not_components)
        if pick(COMPONENT_RL_MODULE):
            if self.module is None:
                raise AttributeError("this runner has no module; its rl_module state is undefined")
            # ``rl_module/p0`` paths select modules of a MultiRLModule (a single
            # module ignores them), as in RLlib.
            state[COMPONENT_RL_MODULE] = self.module.get_state(
                components=_sub_components(components, COMPONENT_RL_MODULE),
                not_components=_sub_components(not_components, COMPONENT_RL_MODULE),
                inference_only=kwargs.get("inference_only", False),
            )
            state[M.WEIGHTS_SEQ_NO] = self._weights_seq_no
        if pick(COMPONENT_ENV_TO_MODULE_CONNECTOR):
            state[COMPONENT_ENV_TO_MODULE_CONNECTOR] = self._get_connector_state(
                self._env_to_module
            )
        if pick(COMPONENT_MODULE_TO_ENV_CONNECTOR):
            state[COMPONENT_MODULE_TO_ENV_CONNECTOR] = self._get_connector_state(
                self._module_to_env
            )
        return state

    def set_state(self, state: dict) -> None:
        """Apply a state; module weights only if ``weights_seq_no`` is 0 or newer than ours.

        Raises:
            AttributeError: The state has weights but the runner has no module.
        """
        with self._weights_lock:
            self._apply_state(state)

    def _install_pushed_weights(
        self, weights: Any, weights_seq_no: int = 0, global_vars: dict | None = None
    ) -> int:
        """Actor method of a weight push (``EnvRunnerGroup.sync_weights``): see
        ``_remote_runner_calls.install_weights``; returns the runner's seq no.

        A method of its own, so the group calls it directly instead of sending
        ``install_weights`` through ``apply`` (no function to pickle per call).
        """
        plain = _plain_set_state(type(self))
        return install_weights(self, weights, weights_seq_no, global_vars, plain=plain)

    def _apply_state(self, state: dict) -> None:
        if COMPONENT_ENV_TO_MODULE_CONNECTOR in state:
            self._set_connector_state(self._env_to_module, state[COMPONENT_ENV_TO_MODULE_CONNECTOR])
        if COMPONENT_MODULE_TO_ENV_CONNECTOR in state:
            self._set_connector_state(self._module_to_env, state[COMPONENT_MODULE_TO_ENV_CONNECTOR])
        if COMPONENT_RL_MODULE in state:
            seq = int(state.get(M.WEIGHTS_SEQ_NO, 0) or 0)
            self._apply_weights(state[COMPONENT_RL_MODULE], seq, runner_setup.resolve_ref)
        if "num_env_steps_sampled_lifetime" in state:
            self.num_env_steps_sampled_lifetime = int(state["num_env_steps_sampled_lifetime"])

    def _apply_weights(self, weights: Any, seq: int, prepare: Callable[[Any], Any]) -> None:
        """Load ``prepare(weights)`` into the module if ``seq`` is 0 or newer than ours
        (``prepare`` runs only then: resolving a ref, or making adoptable views); then
        take ``seq`` as ours. Call with ``_weights_lock`` held.

        Raises:
            AttributeError: The runner has no module.
        """
        if seq == 0 or self._weights_seq_no < seq:
            weights = prepare(weights)
            if self.module is None:
                raise AttributeError("this runner has no module to set weights on")
            self._set_module_state(weights)
        if seq > 0:
            self._weights_seq_no = max(self._weights_seq_no, seq)

    def get_weights(self, modules: Any = None) -> dict:
        """The module weights (``get_state(components="rl_module")``), or those of ``modules``."""
        components: str | list[str] = COMPONENT_RL_MODULE
        if modules is not None:
            ids = [modules] if isinstance(modules, str) else list(modules)
            components = [f"{COMPONENT_RL_MODULE}/{mid}" for mid in ids]
        return self.get_state(components=components)[COMPONENT_RL_MODULE]

    def set_weights(
        self, weights: dict, global_vars: dict | None = None, weights_seq_no: int = 0
    ) -> None:
        """Set module weights, gated by ``weights_seq_no`` like ``set_state``."""
        self.set_state({COMPONENT_RL_MODULE: weights, M.WEIGHTS_SEQ_NO: weights_seq_no})
        if global_vars and "num_env_steps_sampled_lifetime" in global_vars:
            self.num_env_steps_sampled_lifetime = int(global_vars["num_env_steps_sampled_lifetime"])

    # -- checkpoints (RLlib's Checkpointable API) ----------------------------------
    def get_ctor_args_and_kwargs(self) -> tuple[tuple, dict]:
        """What rebuilds this runner: ``((), {"config": config})``."""
        return (), {"config": self.config}

    def get_checkpointable_components(self) -> list[tuple[str, Any]]:
        """The module and both connector pipelines."""
        return [
            (COMPONENT_RL_MODULE, self.module),
            (COMPONENT_ENV_TO_MODULE_CONNECTOR, self._env_to_module),
            (COMPONENT_MODULE_TO_ENV_CONNECTOR, self._module_to_env),
        ]

    def get_metadata(self) -> dict:
        """Class and version info stored next to a checkpoint."""
        import envrunners

        return {
            "class": f"{type(self).__module__}.{type(self).__qualname__}",
            "envrunners_version": envrunners.__version__,
            "checkpoint_version": 1,
        }

    def save_to_path(self, path: str, *, state: dict | None = None) -> str:
        """Write the runner state to directory ``path`` (plain files, atomically)."""
        state = self.get_state() if state is None else state
        return str(save_state(path, state, self.get_metadata()))

    def restore_from_path(self, path: str, **kwargs: Any) -> None:
        """Load a state written by ``save_to_path`` (weights always applied)."""
        state, _ = load_state(path)
        state = dict(state)
        state.pop(M.WEIGHTS_SEQ_NO, None)
        self.set_state(state)

    @classmethod
    def from_checkpoint(cls, path: str, *, config: Any, **kwargs: Any) -> Any:
        """Build a runner from ``config`` and restore the checkpoint at ``path`` into it."""
        runner = cls(config=config, **kwargs)
        runner.restore_from_path(path)
        return runner

    # -- health and lifecycle ------------------------------------------------------
    def assert_healthy(self) -> None:
        """Raise ``AssertionError`` unless the env and module exist."""
        env, module = self.env, self.module
        assert env is not None and module is not None, (
            f"{type(self).__name__}(worker_index={self.worker_index}) is not healthy: "
            f"env={'ok' if env is not None else 'missing'}, "
            f"module={'ok' if module is not None else 'missing'}"
        )

    def stop(self) -> None:
        """Publish any episode recording and close the env (and its worker processes)."""
        close_episode_writer(self)
        if self.env is not None:
            runner_setup.close_quietly(self.env)

    def __repr__(self) -> str:
        index, n = getattr(self, "worker_index", None), getattr(self, "num_envs", 0)
        return f"{type(self).__name__}(worker_index={index}, num_envs={n})"


@functools.lru_cache(maxsize=64)
def _plain_set_state(cls: type) -> bool:
    """Whether ``cls`` applies states with ``NewStackEnvRunner``'s own ``set_state``."""
    base = NewStackEnvRunner
    return cls.set_state is base.set_state and cls._apply_state is base._apply_state


def _sub_components(value: str | list[str] | None, prefix: str) -> list[str] | None:
    """``["rl_module/p0"]`` -> ``["p0"]``; None if nothing below ``prefix`` is named."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    subs = [c[len(prefix) + 1 :] for c in items if c.startswith(prefix + "/")]
    return subs or None
