"""``EnvRunnerGroup`` (``ray.rllib.env.env_runner_group``): one local runner plus N Ray actors.

The group owns an optional in-process runner (index 0) and ``num_env_runners``
remote runners (Ray actors, ids 1..N) behind a ``FaultTolerantActorManager``. It
calls them synchronously or asynchronously, broadcasts weights and connector
state, and keeps them in service:

- a runner that dies (killed, crashed) is restarted by Ray; a runner whose env
  raised is rebuilt in place; one that misses
  ``num_consecutive_env_runner_failures_tolerance`` deadlines in a row is killed
  and restarted. Before a restored runner serves again, the group pushes it the
  last broadcast weights (with ``weights_seq_no``), connector state and
  ``num_env_steps_sampled_lifetime``;
- an exception raised by a user function in a runner reaches the caller as that
  exception (the runner stays in service); runner faults are raised as
  ``EnvRunnerError`` unless ``ignore_env_runner_failures`` or
  ``restart_failed_env_runners`` is set;
- every wait has a deadline: ``timeout_seconds=None`` means
  ``config.sample_timeout_s``; results that miss it are dropped and counted.

Ray is started on demand (or joined, see ``_ray_setup``); with
``num_env_runners=0`` Ray is not touched at all.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from envrunners.env import _ray_setup
from envrunners.env import _runner_side as sync
from envrunners.env._group_api import GroupLegacyAPI
from envrunners.env._group_calls import INTERNAL_TAGS, GroupCalls
from envrunners.env._group_recovery import STANDBY_AFTER_S, GroupRecovery
from envrunners.env._group_state_sync import GroupStateSync
from envrunners.errors import ConfigError, EnvRunnerError
from envrunners.utils.actor_manager import FaultTolerantActorManager

__all__ = ["EnvRunnerGroup"]

logger = logging.getLogger("envrunners")

_DEPRECATED = -1


class EnvRunnerGroup(GroupCalls, GroupStateSync, GroupRecovery, GroupLegacyAPI):
    """Set of EnvRunners with n ``@ray.remote`` workers and zero or one local worker.

    Args:
        env_creator: Passed to every runner (old-stack runners build envs with it).
        validate_env: Passed to every runner.
        default_policy_class: Passed to every runner (old stack).
        config: The ``AlgorithmConfig`` (a dict is converted); None = defaults.
        local_env_runner: Whether to build an in-process runner (forced when
            there are no remote runners).
        logdir: Passed to the runners as ``log_dir``.
        _setup: Build the runners now.
        tune_trial_id: Passed to the runners.
        pg_offset: Placement-group bundle offset of the remote runners.
        num_env_runners: Number of remote runners (default: the config's).
        standby_env_runner: Keep one idle standby actor (imports done, nothing
            built, no CPU reserved until it is used) that takes a dead runner's
            place in milliseconds instead of a process restart. True starts it
            with the runners; None (default) starts it once the group has been in
            use for ``STANDBY_AFTER_S`` seconds, if ``restart_failed_env_runners``
            and the runners use no GPUs; False never.
        num_workers: Deprecated; use ``num_env_runners``.
        local_worker: Deprecated; use ``local_env_runner``.

    Raises:
        ConfigError: ``num_env_runners < 0``, or a deprecated argument was given.
    """

    def __init__(
        self,
        *,
        env_creator: Callable[..., Any] | None = None,
        validate_env: Callable[[Any], None] | None = None,
        default_policy_class: type | None = None,
        config: Any = None,
        local_env_runner: bool = True,
        logdir: str | None = None,
        _setup: bool = True,
        tune_trial_id: str | None = None,
        pg_offset: int = 0,
        num_env_runners: int | None = None,
        standby_env_runner: bool | None = None,
        num_workers: Any = _DEPRECATED,
        local_worker: Any = _DEPRECATED,
    ):
        if num_workers != _DEPRECATED:
            raise ConfigError(
                "EnvRunnerGroup(num_workers=...) is deprecated; use num_env_runners=..."
            )
        if local_worker != _DEPRECATED:
            raise ConfigError(
                "EnvRunnerGroup(local_worker=...) is deprecated; use local_env_runner=..."
            )
        from envrunners.algorithms.algorithm_config import AlgorithmConfig

        if config is None:
            config = AlgorithmConfig()
        elif isinstance(config, dict):
            config = AlgorithmConfig.from_dict(config)
        if num_env_runners is not None and num_env_runners < 0:
            raise ConfigError(f"num_env_runners must be >= 0, got {num_env_runners}")
        self._env_creator = env_creator
        self._validate_env = validate_env
        self._policy_class = default_policy_class
        self._logdir = logdir
        self._tune_trial_id = tune_trial_id
        self._pg_offset = int(pg_offset)
        self._remote_config = config
        self._remote_config_obj_ref: Any = None
        self._remote_args = _ray_setup.remote_options(config)
        self.env_runner_cls = _ray_setup.default_runner_class(config)
        self._ignore_ray_errors_on_env_runners = bool(
            config.ignore_env_runner_failures or config.restart_failed_env_runners
        )
        tolerance = int(config.num_consecutive_env_runner_failures_tolerance)
        self._worker_manager = FaultTolerantActorManager(
            max_remote_requests_in_flight_per_actor=config.max_requests_in_flight_per_env_runner,
            init_id=1,
            is_fault=self._is_runner_fault,
            max_consecutive_timeouts=max(1, tolerance),
            actor_label="env runner",
        )
        self._num_env_runners_dropped_lifetime = 0
        self._local_env_runner: Any = None
        self._local_config: Any = None
        self._ctor_kwargs: dict[int, dict] = {}
        self._owns_ray = False
        self._stopped = False
        self._standby_on = _ray_setup.standby_enabled(config, standby_env_runner)
        #: When the standby starts: at once if asked for, else once the group has
        #: been in use a while (short-lived groups, e.g. in tests, never pay for it).
        self._standby_due = 0.0 if standby_env_runner else float("inf")
        self._init_recovery()
        if _setup:
            n = config.num_env_runners if num_env_runners is None else num_env_runners
            if n < 0:
                raise ConfigError(f"config.num_env_runners must be >= 0, got {n}")
            try:
                self._setup(
                    validate_env=validate_env,
                    config=config,
                    num_env_runners=n,
                    local_env_runner=local_env_runner,
                )
            except BaseException:
                self.stop()
                raise

    # ------------------------------------------------------------------ setup
    def _setup(
        self,
        *,
        validate_env: Callable[[Any], None] | None = None,
        config: Any = None,
        num_env_runners: int = 0,
        local_env_runner: bool = True,
    ) -> None:
        if num_env_runners == 0:
            local_env_runner = True
        self._local_config = config.copy(copy_frozen=False)
        preload = None
        if local_env_runner and num_env_runners > 0:
            # Import torch for the local runner while the remote runners start.
            preload = threading.Thread(target=_import_torch, daemon=True)
            preload.start()
        self.add_workers(num_env_runners, validate=config.validate_env_runners_after_construction)
        if preload is not None:
            preload.join()
        spaces = None
        if (
            local_env_runner
            and self._worker_manager.num_actors() > 0
            and not config.create_env_on_local_worker
            and (config.observation_space is None or config.action_space is None)
        ):
            spaces = self.get_spaces()
        if local_env_runner:
            self._local_env_runner = self.env_runner_cls(
                **self._runner_kwargs(0, num_env_runners, spaces=spaces),
                config=self._local_config,
            )

    def _runner_kwargs(self, worker_index: int, num_workers: int, spaces: Any = None) -> dict:
        return {
            "env_creator": self._env_creator,
            "validate_env": self._validate_env,
            "default_policy_class": self._policy_class,
            "worker_index": worker_index,
            "num_workers": num_workers,
            "recreated_worker": False,
            "log_dir": self._logdir,
            "spaces": spaces,
            "dataset_shards": None,
            "tune_trial_id": self._tune_trial_id,
        }

    def _config_ref(self) -> Any:
        if self._remote_config_obj_ref is None:
            import ray

            self._remote_config_obj_ref = ray.put(self._remote_config)
        return self._remote_config_obj_ref

    def add_workers(self, num_workers: int, validate: bool = False) -> None:
        """Create ``num_workers`` more remote runners (ids and indices continue).

        Args:
            num_workers: How many to add.
            validate: Check each new runner with ``assert_healthy()`` (waits until
                they are built, up to ``env_runner_restore_timeout_s``). A runner
                whose constructor raised re-raises that exception here, unless
                failures are ignored.
        """
        if num_workers < 0:
            raise ConfigError(f"add_workers(num_workers={num_workers}): must be >= 0")
        if num_workers == 0:
            return
        config = self._remote_config
        if not self._owns_ray:
            need = num_workers * float(config.num_cpus_per_env_runner)
            self._owns_ray = _ray_setup.acquire_ray(need)
        _ray_setup.check_resources(config, num_workers)
        cls = _ray_setup.make_remote_class(self.env_runner_cls, config)
        old = self._worker_manager.num_actors()
        total = old + num_workers
        config_ref = self._config_ref()
        handles, kwargs_list = [], []
        for i in range(num_workers):
            index = old + i + 1
            kwargs = self._runner_kwargs(index, total)
            options = _ray_setup.placement_options(self._pg_offset, index)
            actor_cls = cls.options(**options) if options else cls
            handles.append(actor_cls.remote(config=config_ref, **kwargs))
            kwargs_list.append(kwargs)
        for handle in handles:  # runs right after the constructor, before anything else
            handle.apply.remote(sync.freeze_gc)
        ids = self._worker_manager.add_actors(handles)
        self._ctor_kwargs.update(dict(zip(ids, kwargs_list)))
        if validate:
            self._validate(ids)
        if self._standby_due == 0.0:
            self._spawn_standby(reserve_cpus=False)
        elif self._standby_due == float("inf"):
            self._standby_due = time.monotonic() + STANDBY_AFTER_S

    def _validate(self, ids: list[int]) -> None:
        timeout = float(self._remote_config.env_runner_restore_timeout_s)
        results = self._worker_manager.foreach_actor(
            "assert_healthy", remote_actor_ids=ids, healthy_only=False, timeout_seconds=timeout
        )
        answered = {r.actor_id for r in results}
        for r in results:
            if r.ok:
                continue
            err = r.get()
            if self._ignore_ray_errors_on_env_runners:
                logger.error("env runner %d failed its construction check: %s", r.actor_id, err)
                continue
            original = _ctor_exception(err)
            if original is not None:
                raise original
            raise self._fault_error(r.actor_id, err)
        late = [i for i in ids if i not in answered]
        if late and not self._ignore_ray_errors_on_env_runners:
            raise EnvRunnerError(
                f"env runners {late} were not built within env_runner_restore_timeout_s="
                f"{timeout}s (not enough CPUs? each needs num_cpus_per_env_runner="
                f"{self._remote_config.num_cpus_per_env_runner})",
                runner_index=late[0],
            )

    def reset(self, new_remote_workers: list[Any]) -> None:
        """Kill all remote runners and manage ``new_remote_workers`` instead (new ids)."""
        self._worker_manager.clear()
        self._init_recovery()
        self._ctor_kwargs.clear()
        self._worker_manager.add_actors(new_remote_workers)

    def stop(self) -> None:
        """Stop every runner (local included), kill the actors, release Ray if we started it."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self._local_env_runner is not None:
                self._local_env_runner.stop()
            if self._worker_manager.num_healthy_actors():
                deadline = min(10.0, float(self._remote_config.sample_timeout_s or 10.0))
                self._worker_manager.foreach_actor(
                    sync.stop_runner, healthy_only=True, timeout_seconds=deadline
                )
        except Exception:
            logger.exception("Failed to stop workers!")
        finally:
            self._kill_standby()
            self._worker_manager.clear()
            self._remote_config_obj_ref = None
            self._init_recovery()
            self._init_sync_memory()
            if self._owns_ray:
                self._owns_ray = False
                _ray_setup.release_ray()

    def __enter__(self) -> EnvRunnerGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ accessors
    @property
    def local_env_runner(self) -> Any:
        """The in-process runner (index 0), or None."""
        return self._local_env_runner

    def healthy_env_runner_ids(self) -> list[int]:
        """Ids of the healthy remote runners."""
        return self._worker_manager.healthy_actor_ids()

    def healthy_worker_ids(self) -> list[int]:
        """Ids of the healthy remote runners (old name)."""
        return self.healthy_env_runner_ids()

    def num_remote_env_runners(self) -> int:
        """Number of remote runners, healthy or not."""
        return self._worker_manager.num_actors()

    def num_remote_workers(self) -> int:
        """Number of remote runners (old name)."""
        return self.num_remote_env_runners()

    def num_healthy_remote_env_runners(self) -> int:
        """Number of healthy remote runners."""
        return self._worker_manager.num_healthy_actors()

    def num_healthy_remote_workers(self) -> int:
        """Number of healthy remote runners (old name)."""
        return self.num_healthy_remote_env_runners()

    def num_healthy_env_runners(self) -> int:
        """Healthy remote runners plus the local runner, if any."""
        return int(self._local_env_runner is not None) + self.num_healthy_remote_env_runners()

    def num_healthy_workers(self) -> int:
        """Healthy remote runners plus the local runner (old name)."""
        return self.num_healthy_env_runners()

    def num_in_flight_async_reqs(self, tag: str | None = None) -> int:
        """User async requests in flight (all tags, or one)."""
        if tag is not None:
            return self._worker_manager.num_outstanding_async_reqs(tag)
        internal = sum(self._worker_manager.num_outstanding_async_reqs(t) for t in INTERNAL_TAGS)
        return self._worker_manager.num_outstanding_async_reqs() - internal

    def num_remote_worker_restarts(self) -> int:
        """How many times remote runners were brought back into service."""
        return self._worker_manager.total_num_restarts()

    def num_env_runners_dropped_lifetime(self) -> int:
        """Remote results lost to a deadline (``timeout_seconds``) so far."""
        return self._num_env_runners_dropped_lifetime

    def get_spaces(self) -> dict[str, tuple[Any, Any]]:
        """The (observation, action) spaces per module, from a remote runner (else the local)."""
        healthy = self.healthy_env_runner_ids()
        if healthy:
            return self.foreach_env_runner(
                "get_spaces", remote_worker_ids=healthy[:1], local_env_runner=False
            )[0]
        if self._local_env_runner is None:
            raise EnvRunnerError("get_spaces(): no local env runner and no healthy remote one")
        return self._local_env_runner.get_spaces()

    def __repr__(self) -> str:
        return (
            f"EnvRunnerGroup(local={self._local_env_runner is not None}, "
            f"remote={self.num_healthy_remote_env_runners()}/{self.num_remote_env_runners()} "
            f"healthy, cls={getattr(self.env_runner_cls, '__name__', self.env_runner_cls)})"
        )


def _import_torch() -> None:
    try:
        import torch  # noqa: F401
    except Exception:  # pragma: no cover - the local runner will report it
        pass


def _ctor_exception(error: BaseException) -> BaseException | None:
    """The exception a runner's constructor raised, if ``error`` reports one."""
    from ray.exceptions import RayActorError, RayTaskError

    if not isinstance(error, RayActorError) or not getattr(error, "actor_init_failed", False):
        return None
    inner = error.args[0] if error.args else None
    if isinstance(inner, RayTaskError):
        return inner.as_instanceof_cause()
    return None
