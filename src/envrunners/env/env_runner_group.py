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
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from envrunners.env import _group_state_sync as sync
from envrunners.env import _ray_setup
from envrunners.env._group_api import GroupLegacyAPI
from envrunners.env._group_recovery import GroupRecovery
from envrunners.env._group_state_sync import GroupStateSync
from envrunners.errors import ConfigError, EnvRunnerError
from envrunners.utils.actor_manager import FaultTolerantActorManager, RemoteCallResults

__all__ = ["EnvRunnerGroup"]

logger = logging.getLogger("envrunners")

_DEPRECATED = -1


class EnvRunnerGroup(GroupStateSync, GroupRecovery, GroupLegacyAPI):
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
        self.add_workers(num_env_runners, validate=config.validate_env_runners_after_construction)
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
        ids = self._worker_manager.add_actors(handles)
        self._ctor_kwargs.update(dict(zip(ids, kwargs_list)))
        if validate:
            self._validate(ids)

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
        internal = sum(self._worker_manager.num_outstanding_async_reqs(t) for t in _INTERNAL_TAGS)
        return self._worker_manager.num_outstanding_async_reqs() - internal

    def num_remote_worker_restarts(self) -> int:
        """How many times remote runners were brought back into service."""
        return self._worker_manager.total_num_restarts()

    def num_env_runners_dropped_lifetime(self) -> int:
        """Remote results lost to a deadline (``timeout_seconds``) so far."""
        return self._num_env_runners_dropped_lifetime

    # ------------------------------------------------------------------ calls
    def foreach_env_runner(
        self,
        func: Callable[..., Any] | str | list,
        *,
        kwargs: dict | list[dict] | None = None,
        local_env_runner: bool = True,
        healthy_only: bool = True,
        remote_worker_ids: list[int] | None = None,
        timeout_seconds: float | None = None,
        return_obj_refs: bool = False,
        mark_healthy: bool = False,
    ) -> list[Any]:
        """Call ``func(runner, **kwargs)`` on the local runner and the remote runners.

        Args:
            func: A callable, a method name (called, also on the local runner), or a
                list of callables (one per remote id).
            kwargs: Keyword arguments (a list: one dict per remote call).
            local_env_runner: Include the local runner (its result comes first).
            healthy_only: Only call healthy remote runners.
            remote_worker_ids: Which remote runners (None or ``[]``: all).
            timeout_seconds: Deadline; None = ``config.sample_timeout_s``, 0 = fire
                and forget. Late results are dropped and counted.
            return_obj_refs: Return the remote ``ObjectRef`` instead of the value.
            mark_healthy: An unhealthy runner that answers is restored (with state).

        Returns:
            The local result (if any), then the remote results in id order.

        Raises:
            Exception: The exception a user function raised (the runner stays up).
            EnvRunnerError: A runner failed, unless failures are ignored.
        """
        local = self._local_env_runner
        if return_obj_refs and local_env_runner and local is not None:
            raise ConfigError(
                "Can not return ObjectRef from local worker: pass local_env_runner=False."
            )
        if remote_worker_ids:
            self._worker_manager._check_known(remote_worker_ids)
        local_result = []
        if local_env_runner and local is not None:
            if isinstance(kwargs, list) or isinstance(func, list):
                raise ConfigError(
                    "A list of funcs or kwargs is for remote runners only: pass "
                    "local_env_runner=False."
                )
            method = getattr(local, func) if isinstance(func, str) else None
            local_result = [method(**(kwargs or {})) if method else func(local, **(kwargs or {}))]
        if self._worker_manager.num_actors() == 0:
            return local_result
        self._maintain()
        timeout = self._deadline(timeout_seconds)
        manager = self._worker_manager
        targets = list(remote_worker_ids or manager.actor_ids())
        if healthy_only:
            targets = [i for i in targets if manager.is_actor_healthy(i)]
        results = manager.foreach_actor(
            func,
            kwargs=kwargs,
            healthy_only=healthy_only,
            remote_actor_ids=remote_worker_ids,
            timeout_seconds=timeout,
            return_obj_refs=return_obj_refs,
        )
        self._account_drops(targets, results, timeout)
        if mark_healthy:
            revived = [
                r.actor_id for r in results if r.ok and not manager.is_actor_healthy(r.actor_id)
            ]
            if revived:
                self._restore_now(revived)
        self._handle_errors(results)
        return local_result + [r.get() for r in results.ignore_errors()]

    def foreach_env_runner_async(
        self,
        func: Callable[..., Any] | str | list,
        tag: str | None = None,
        *,
        kwargs: dict | list[dict] | None = None,
        healthy_only: bool = True,
        remote_worker_ids: list[int] | None = None,
    ) -> int:
        """Fire ``func`` on the remote runners without waiting; returns how many were sent.

        At most ``max_requests_in_flight_per_env_runner`` requests per runner and
        tag are outstanding; more are dropped.
        """
        if self._worker_manager.num_actors() == 0:
            return 0
        self._maintain()
        return self._worker_manager.foreach_actor_async(
            func,
            tag,
            kwargs=kwargs,
            healthy_only=healthy_only,
            remote_actor_ids=remote_worker_ids,
        )

    def fetch_ready_async_reqs(
        self,
        *,
        tags: str | list[str] | tuple[str, ...] | None = None,
        timeout_seconds: float | None = 0.0,
        return_obj_refs: bool = False,
        mark_healthy: bool = False,
    ) -> list[tuple[int, Any]]:
        """``[(runner id, result)]`` of the finished async requests (of ``tags``)."""
        results = self._fetch(tags, timeout_seconds, return_obj_refs, mark_healthy)
        return [(r.actor_id, r.get()) for r in results.ignore_errors()]

    def _fetch(
        self, tags: Any, timeout_seconds: float | None, return_obj_refs: bool, mark_healthy: bool
    ) -> RemoteCallResults:
        manager = self._worker_manager
        if manager.num_actors() == 0:
            return RemoteCallResults()
        self._maintain()
        results = manager.fetch_ready_async_reqs(
            tags=tags,
            timeout_seconds=self._deadline(timeout_seconds),
            return_obj_refs=return_obj_refs,
        )
        if mark_healthy:
            revived = [
                r.actor_id for r in results if r.ok and not manager.is_actor_healthy(r.actor_id)
            ]
            if revived:
                self._restore_now(revived)
        self._handle_errors(results)
        return results

    def foreach_env_runner_async_fetch_ready(
        self,
        func: Callable[..., Any] | str | list,
        kwargs: dict | list[dict] | None = None,
        tag: str | None = None,
        timeout_seconds: float | None = 0.0,
        return_obj_refs: bool = False,
        mark_healthy: bool = False,
        healthy_only: bool = True,
        remote_worker_ids: list[int] | None = None,
        return_actor_ids: bool = False,
    ) -> list[Any]:
        """Collect the finished requests of ``tag``, then fire ``func`` again; return the results."""
        results = self._fetch(tag, timeout_seconds, return_obj_refs, mark_healthy)
        self.foreach_env_runner_async(
            func, tag, kwargs=kwargs, healthy_only=healthy_only, remote_worker_ids=remote_worker_ids
        )
        if return_actor_ids:
            return [(r.actor_id, r.get()) for r in results.ignore_errors()]
        return [r.get() for r in results.ignore_errors()]

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

    # ------------------------------------------------------------------ internals
    def _deadline(self, timeout_seconds: float | None) -> float | None:
        if timeout_seconds is None:
            default = self._remote_config.sample_timeout_s
            return None if default is None else float(default)
        return timeout_seconds

    def _account_drops(
        self, targets: list[int], results: RemoteCallResults, timeout: float | None
    ) -> None:
        if timeout is None or timeout <= 0:
            return
        dropped = len(targets) - len(results)
        if dropped <= 0:
            return
        self._num_env_runners_dropped_lifetime += dropped
        answered = defaultdict(int)
        for r in results:
            answered[r.actor_id] += 1
        late = []
        for i in targets:
            if answered[i] > 0:
                answered[i] -= 1
            else:
                late.append(i)
        logger.warning(
            "env runners %s did not answer within %ss; their results are dropped "
            "(num_env_runners_dropped_lifetime=%d). Raise sample_timeout_s if they are slow.",
            late,
            timeout,
            self._num_env_runners_dropped_lifetime,
        )

    def __repr__(self) -> str:
        return (
            f"EnvRunnerGroup(local={self._local_env_runner is not None}, "
            f"remote={self.num_healthy_remote_env_runners()}/{self.num_remote_env_runners()} "
            f"healthy, cls={getattr(self.env_runner_cls, '__name__', self.env_runner_cls)})"
        )


_INTERNAL_TAGS = ("__sync_weights__", "__sync_states__")


def _ctor_exception(error: BaseException) -> BaseException | None:
    """The exception a runner's constructor raised, if ``error`` reports one."""
    from ray.exceptions import RayActorError, RayTaskError

    if not isinstance(error, RayActorError) or not getattr(error, "actor_init_failed", False):
        return None
    inner = error.args[0] if error.args else None
    if isinstance(inner, RayTaskError):
        return inner.as_instanceof_cause()
    return None
