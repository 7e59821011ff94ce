"""The abstract ``EnvRunner`` (``ray.rllib.env.env_runner``): RLlib's runner contract.

Subclasses build an env and a module, and return experience from ``sample()``.
The base copies the config, derives the runner's seed, keeps metrics, and gives
the env-failure handling every runner shares (``_try_env_reset``/``_try_env_step``).
"""

from __future__ import annotations

import abc
import logging
import random
import time
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from envrunners.errors import EnvRunnerError, StepFailedRecreateEnvError
from envrunners.utils.actor_manager import FaultAwareApply
from envrunners.utils.metrics import (
    ENV_RESET_TIMER,
    ENV_STEP_TIMER,
    NUM_ENV_STEP_FAILURES_LIFETIME,
)
from envrunners.utils.metrics_logger import MetricsLogger

if TYPE_CHECKING:
    from envrunners.algorithms.algorithm_config import AlgorithmConfig

__all__ = [
    "ENV_RESET_FAILURE",
    "ENV_STEP_FAILURE",
    "NUM_ENV_STEP_FAILURES_LIFETIME",
    "EnvRunner",
    "StepFailedRecreateEnvError",
]

logger = logging.getLogger("envrunners")

ENV_RESET_FAILURE = "env_reset_failure"
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
                    logger.exception("Resetting the env raised %r; recreating it.", err)
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
            self.metrics.log_value(NUM_ENV_STEP_FAILURES_LIFETIME, 1, reduce="lifetime_sum")
            if self.config.restart_failed_sub_environments:
                if not isinstance(err, StepFailedRecreateEnvError):
                    logger.exception("Stepping the env raised %r; recreating it.", err)
                self.make_env()
                return ENV_STEP_FAILURE
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

    def _log_env_timers(self, num_steps: int) -> None:
        """Log the env reset/step time accumulated since the last call (per step)."""
        if num_steps:
            self.metrics.log_value(ENV_STEP_TIMER, self._env_step_time / num_steps)
        if self._env_reset_time:
            self.metrics.log_value(ENV_RESET_TIMER, self._env_reset_time)
        self._env_step_time = 0.0
        self._env_reset_time = 0.0
