"""``EnvRunnerGroup`` (``ray.rllib.env.env_runner_group``): one local runner plus N Ray actors.

The group owns an optional in-process runner (index 0) and ``num_env_runners``
remote runners (Ray actors, ids 1..N) behind a ``FaultTolerantActorManager``. It
calls them synchronously or asynchronously, broadcasts weights and connector
state, and keeps them in service:

- a runner that dies (killed, crashed, its node lost) is replaced by the
  standby runner or restarted by Ray, whichever is first; a runner whose env
  raised is rebuilt in place; one that misses a deadline (or whose call a
  sampling pass filled the batch without) is out of service at
  once and, if its call is still running
  ``replace_env_runner_after_missed_deadlines`` deadlines after it was sent,
  killed as hung and replaced. Before a restored runner serves again, the group
  pushes it the last broadcast weights (with ``weights_seq_no``), connector
  state and ``num_env_steps_sampled_lifetime``;
- an exception raised by a user function in a runner reaches the caller as that
  exception (the runner stays in service); runner faults are raised as
  ``RemoteEnvRunnerError`` (a ``ray.exceptions.RayError`` naming the runner)
  unless ``ignore_env_runner_failures`` or ``restart_failed_env_runners`` is set;
- every wait has a deadline: ``timeout_seconds=None`` means
  ``config.sample_timeout_s``; results that miss it are dropped, counted in
  ``num_env_runners_dropped_lifetime`` and logged with the late runners' ids.
  An async request (``foreach_env_runner_async``) running longer than
  ``sample_timeout_s`` is a missed deadline too, found by the next group call.

Weight and state pushes are async calls that are never dropped: a push that
finds the runner's previous push unacknowledged waits as its pending push (a
newer one replaces it) and is sent before any later request to that runner, so
the last broadcast always arrives, in order. The group keeps what it broadcast
in a ``BroadcastRecord`` (``_runner_state``) and leaves fault handling, the
standby runner and restores to the ``RunnerRecovery`` it holds
(``_runner_recovery``), which it calls before and after every remote call.

Ray is started on demand (or joined, see ``_ray_setup``); with
``num_env_runners=0`` Ray is not touched at all.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from envrunners import errors
from envrunners.env import _ray_setup
from envrunners.env import _remote_runner_calls as remote
from envrunners.env._runner_recovery import RunnerRecovery, is_runner_fault
from envrunners.env._runner_state import (
    E2M,
    INTERNAL_TAGS,
    M2E,
    NUM_STEPS,
    RL_MODULE,
    SEQ_NO,
    STATES_TAG,
    WEIGHTS_TAG,
    BroadcastRecord,
    is_object_ref,
    merge_connector_states,
    old_stack_weights,
    pipelines_of,
    source_state,
)
from envrunners.errors import ConfigError, EnvRunnerError
from envrunners.utils.actor_manager import (
    ActorMethod,
    FaultTolerantActorManager,
    RemoteCallResults,
)

__all__ = ["EnvRunnerGroup"]

#: The runners' method that installs pushed weights (``EnvRunner._install_pushed_weights``),
#: called with ``(weights, weights_seq_no[, global_vars])``.
_INSTALL_METHOD = ActorMethod("_install_pushed_weights", positional=True)

logger = logging.getLogger("envrunners")

_DEPRECATED = -1


class EnvRunnerGroup:
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
        standby_env_runner: Keep one standby actor (a spare runner built, the
            runners' resources reserved, placed away from their nodes where the
            cluster allows) that takes a dead, lost or hung runner's place in
            milliseconds instead of a process restart. True starts it
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
        # A late call is hung after this many deadlines (a lower, RLlib-named
        # tolerance of consecutive failures also bounds it).
        hung_after = min(
            int(config.replace_env_runner_after_missed_deadlines),
            int(config.num_consecutive_env_runner_failures_tolerance),
        )
        self._worker_manager = FaultTolerantActorManager(
            max_remote_requests_in_flight_per_actor=config.max_requests_in_flight_per_env_runner,
            init_id=1,
            is_fault=is_runner_fault,
            max_consecutive_timeouts=max(1, hung_after),
            unhealthy_on_timeout=True,
            actor_label="env runner",
        )
        self._num_env_runners_dropped_lifetime = 0
        self._local_env_runner: Any = None
        self._local_config: Any = None
        self._owns_ray = False
        self._stopped = False
        #: What was broadcast to the runners (replayed to restored ones).
        self._broadcast = BroadcastRecord()
        self._recovery = RunnerRecovery(
            self._worker_manager,
            config,
            self._broadcast,
            runner_cls=self.env_runner_cls,
            config_ref=self._config_ref,
            ignore_errors=self._ignore_ray_errors_on_env_runners,
            standby=_ray_setup.standby_enabled(config, standby_env_runner),
            standby_now=bool(standby_env_runner),
        )
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
            self._recovery.local_env_runner = self._local_env_runner

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
            handle.apply.remote(remote.freeze_gc)
        ids = self._worker_manager.add_actors(handles)
        self._recovery.ctor_kwargs.update(zip(ids, kwargs_list))
        if validate:
            self._validate(ids)
        self._recovery.runners_added()

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
            raise self._recovery.fault_error(r.actor_id, err)
        late = [i for i in ids if i not in answered]
        if late and not self._ignore_ray_errors_on_env_runners:
            raise errors.RemoteEnvRunnerError(
                f"env runners {late} were not built within env_runner_restore_timeout_s="
                f"{timeout}s (not enough CPUs? each needs num_cpus_per_env_runner="
                f"{self._remote_config.num_cpus_per_env_runner})",
                runner_index=late[0],
            )

    def reset(self, new_remote_workers: list[Any]) -> None:
        """Kill all remote runners and manage ``new_remote_workers`` instead (new ids)."""
        self._worker_manager.clear()
        self._recovery.reset()
        self._recovery.ctor_kwargs.clear()
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
                # Hung runners are out of service (their first missed deadline), so
                # this waits for runners that answer.
                deadline = min(10.0, float(self._remote_config.sample_timeout_s or 10.0))
                self._worker_manager.foreach_actor(
                    remote.stop_runner, healthy_only=True, timeout_seconds=deadline
                )
        except Exception:
            logger.exception("Failed to stop workers!")
        finally:
            self._recovery.close()
            self._worker_manager.clear()
            self._remote_config_obj_ref = None
            self._broadcast.clear()
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

    def num_env_runners_replaced_lifetime(self) -> int:
        """Runners whose process was replaced (standby or new process) and that serve again."""
        return self._recovery.num_replaced

    def lost_and_replaced_env_runners(self) -> tuple[list[int], list[int]]:
        """Indices of runners that were ever out of service, and of those replaced since.

        For run summaries (``envrunners train`` names them when it joined a cluster).
        """
        return sorted(self._worker_manager.ever_unhealthy), sorted(self._recovery.replaced_ids)

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
                and forget. Late results are dropped and counted, and a late
                runner is out of service until its call returns (then it is
                restored) or is replaced as hung.
            return_obj_refs: Return the remote ``ObjectRef`` instead of the value.
            mark_healthy: An unhealthy runner that answers is restored (with state).

        Returns:
            The local result (if any), then the remote results in id order.

        Raises:
            Exception: The exception a user function raised (the runner stays up).
            RemoteEnvRunnerError: A runner failed (a ``ray.exceptions.RayError``
                and ``EnvRunnerError`` naming it), unless failures are ignored.
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
        self._recovery.maintain()
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
        self._recovery.after_call(results, mark_healthy)
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
        self._expire_async_reqs()
        self._recovery.maintain()
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

    def wait_async_reqs(
        self, *, tags: str | list[str] | tuple[str, ...], timeout_seconds: float
    ) -> bool:
        """Block until one async request of ``tags`` is done (or the timeout); whether one is.

        Fetch it with ``fetch_ready_async_reqs(timeout_seconds=0)``; the wait also
        ends at the next ``sample_timeout_s`` deadline of a running request.
        """
        if self._worker_manager.num_actors() == 0:
            return False
        return self._worker_manager.wait_async_reqs(
            tags, timeout_seconds, request_timeout_s=self._request_deadline()
        )

    def _fetch(
        self, tags: Any, timeout_seconds: float | None, return_obj_refs: bool, mark_healthy: bool
    ) -> RemoteCallResults:
        manager = self._worker_manager
        if manager.num_actors() == 0:
            return RemoteCallResults()
        self._recovery.maintain()
        results = manager.fetch_ready_async_reqs(
            tags=tags,
            timeout_seconds=self._deadline(timeout_seconds),
            return_obj_refs=return_obj_refs,
            request_timeout_s=self._request_deadline(),
        )
        self._expire_async_reqs()
        self._recovery.after_call(results, mark_healthy)
        return results

    def _request_deadline(self) -> float | None:
        """How long an async request may run (``sample_timeout_s``; None: no limit)."""
        limit = self._remote_config.sample_timeout_s
        return float(limit) if limit is not None and float(limit) > 0 else None

    def _expire_async_reqs(self) -> None:
        """Async requests running past ``sample_timeout_s`` are missed deadlines.

        As for a synchronous call: the runner is out of service at once, its late
        call is watched (restored if it returns, replaced as hung after
        ``replace_env_runner_after_missed_deadlines`` deadlines), and the dropped
        results are counted in ``num_env_runners_dropped_lifetime``.
        """
        manager = self._worker_manager
        limit = self._request_deadline()
        if limit is not None:
            manager.expire_async_reqs(limit)
        expired = manager.take_expired_async_reqs()
        if expired:
            ids = sorted({actor_id for actor_id, _ in expired})
            self._log_dropped(
                ids, f"did not answer an async request within {limit}s", sum(n for _, n in expired)
            )

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

    # ------------------------------------------------------------------ deadlines
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
        self._log_dropped(late, f"did not answer within {timeout}s", 0)

    def _log_dropped(self, ids: list[int], why: str, count: int) -> None:
        """Count ``count`` more dropped results and log the runners that lost them."""
        self._num_env_runners_dropped_lifetime += count
        logger.warning(
            "env runners %s %s; their results are dropped (num_env_runners_dropped_lifetime="
            "%d). Raise sample_timeout_s if they are slow.",
            ids,
            why,
            self._num_env_runners_dropped_lifetime,
        )

    # ------------------------------------------------------------------ fault tolerance
    def probe_unhealthy_env_runners(self, timeout_seconds: float | None = None) -> list[int]:
        """Restore the unhealthy runners that are alive again; return the restored ids.

        Each one gets the latest weights, connector states and lifetime step count
        before it is marked healthy. The result also holds runners the group
        restored on its own since the last probe. As in RLlib, it waits up to
        ``timeout_seconds`` for runners that Ray is still starting or restarting
        (or that are busy), and restores those that come up in that time.

        Args:
            timeout_seconds: How long to wait (default
                ``env_runner_health_probe_timeout_s``).
        """
        return self._recovery.probe(timeout_seconds)

    def _await_healthy(self, timeout_seconds: float) -> bool:
        """Wait (with a deadline) until at least one remote runner is healthy."""
        return self._recovery.await_healthy(timeout_seconds)

    # ------------------------------------------------------------------ weights and state
    def sync_weights(
        self,
        policies: Sequence[str] | None = None,
        from_worker_or_learner_group: Any = None,
        to_worker_indices: list[int] | None = None,
        global_vars: dict | None = None,
        timeout_seconds: float | None = 0.0,
        inference_only: bool = False,
    ) -> None:
        """Broadcast module weights (one ``ray.put``) from a source to the remote runners.

        Args:
            policies: Only these module/policy ids (default: all).
            from_worker_or_learner_group: The source: a runner, a runner actor or a
                learner group (default: the local runner, which then keeps its
                weights; a given source's weights are also set on the local runner).
            to_worker_indices: Only these remote runners (default: all healthy).
            global_vars: Also passed to each runner's ``set_global_vars``.
            timeout_seconds: 0 returns at once (the push still arrives before any
                later request); otherwise wait until every runner has applied the
                weights, up to this deadline (None = ``sample_timeout_s``).
            inference_only: Take only the inference part of the weights.

        Raises:
            TypeError: There is no local runner and no source was given.
        """
        local = self._local_env_runner
        source = from_worker_or_learner_group
        if local is None and source is None:
            raise TypeError(
                "No `local_env_runner` in EnvRunnerGroup! Must provide "
                "`from_worker_or_learner_group` arg in `sync_weights()`!"
            )
        new_stack = bool(self._remote_config.enable_env_runner_and_connector_v2)
        has_remotes = self._worker_manager.num_actors() > 0
        state = None
        if has_remotes or source is not None:
            src = source if source is not None else local
            if new_stack:
                state = source_state(src, policies, inference_only)
            else:
                state = {"weights": old_stack_weights(src, policies, inference_only)}
            if has_remotes:
                previous = self._broadcast_weights(state, new_stack, to_worker_indices, global_vars)
                self._await_push(WEIGHTS_TAG, timeout_seconds)
                # Only now let go of the previous weights: freeing their object keeps the
                # object store busy, which would delay the runners' reads of the new ones
                # (about 0.1-0.3 ms per sync here).
                del previous
        if local is not None and source is not None and state is not None:
            if new_stack:
                local.set_state(state)
            else:
                local.set_weights(state["weights"])
        if global_vars is not None and local is not None and hasattr(local, "set_global_vars"):
            local.set_global_vars(global_vars)

    def _broadcast_weights(
        self, state: dict, new_stack: bool, ids: list[int] | None, global_vars: dict | None
    ) -> tuple:
        """Put the weights and push them; returns what held the previous weights (the
        caller lets go of it once the push is done: see ``sync_weights``)."""
        import ray

        previous = self._broadcast.drop_weights()
        if new_stack:
            weights = state[RL_MODULE]
            ref = weights if is_object_ref(weights) else ray.put(weights)
            seq_no = int(state.get(SEQ_NO, 0) or 0)
            self._broadcast.weights = {RL_MODULE: ref, SEQ_NO: seq_no}
            # The ref is the call's own argument, as in a plain ``actor.f.remote(ref)``:
            # Ray resolves it before the call (no ref pickled inside a dict).
            # The runner's own method where it has one: no function pickled per call.
            func = (
                _INSTALL_METHOD
                if hasattr(self.env_runner_cls, _INSTALL_METHOD.name)
                else remote.install_weights
            )
            kwargs = {"weights": ref, "weights_seq_no": seq_no}
            if global_vars is not None:  # (each argument costs a serialization)
                kwargs["global_vars"] = global_vars
        else:
            ref = ray.put(state["weights"])
            func, kwargs = remote.apply_weights, {"weights": ref, "global_vars": global_vars}
        self._broadcast.version += 1
        self._push(WEIGHTS_TAG, func, kwargs, ids)
        return previous

    def _push(
        self, tag: str, func: Callable[..., Any], kwargs: dict, ids: list[int] | None
    ) -> None:
        manager = self._worker_manager
        if ids:
            manager._check_known(ids)
        self._recovery.maintain()
        manager.foreach_actor_async(func, tag, kwargs=kwargs, remote_actor_ids=ids, coalesce=True)

    def _await_push(self, tag: str, timeout_seconds: float | None) -> None:
        """Wait until the pushes of ``tag`` are applied (0: don't wait)."""
        if timeout_seconds is not None and timeout_seconds <= 0:
            return
        manager = self._worker_manager
        timeout = self._deadline(timeout_seconds)
        deadline = None if timeout is None else time.monotonic() + timeout
        while manager.num_outstanding_async_reqs(tag) or manager.num_pending_calls(tag):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                logger.warning(
                    "Not every env runner applied the pushed state within %ss; it arrives "
                    "before their next request.",
                    timeout,
                )
                return
            self._recovery.handle_errors(
                manager.fetch_ready_async_reqs(tags=[tag], timeout_seconds=remaining)
            )

    def sync_env_runner_states(
        self,
        *,
        config: Any,
        from_worker: Any = None,
        env_steps_sampled: int | None = None,
        connector_states: list[dict] | None = None,
        rl_module_state: dict | None = None,
        env_runner_indices_to_update: list[int] | None = None,
        env_to_module: Any = None,
        module_to_env: Any = None,
    ) -> None:
        """Merge the runners' connector states and broadcast them (plus steps and weights).

        Merging (``config.merge_env_runner_states``) gathers every remote runner's
        connector state (or uses ``connector_states``) and merges it with the local
        runner's (the common base); broadcasting
        (``config.broadcast_env_runner_states``) sends the result, the lifetime
        env steps and ``rl_module_state`` (if given) to the remote runners. Old-stack
        groups sync their observation filters with ``FilterManager`` instead.
        """
        if env_steps_sampled is not None:
            env_steps_sampled = int(env_steps_sampled)
        local = self._local_env_runner
        from_worker = from_worker or local
        if not config.enable_env_runner_and_connector_v2:
            self._sync_old_stack_filters(config)
            return
        manager = self._worker_manager
        if manager.num_healthy_actors() == 0 and local is not None:
            state: dict[str, Any] = {}
            if env_steps_sampled is not None:
                state[NUM_STEPS] = env_steps_sampled
                self._broadcast.runner_state[NUM_STEPS] = env_steps_sampled
            state.update(rl_module_state or {})
            local.set_state(state)
            return
        merge = config.merge_env_runner_states is True or (
            config.merge_env_runner_states == "training_only" and not config.in_evaluation
        )
        broadcast = bool(config.broadcast_env_runner_states)
        if not merge and not broadcast:
            return
        e2m, m2e = pipelines_of(local, env_to_module, module_to_env)
        if merge:
            if connector_states is None:
                connector_states = self.foreach_env_runner(
                    remote.get_connector_states,
                    local_env_runner=False,
                    timeout_seconds=config.sync_filters_on_rollout_workers_timeout_s,
                )
            states = self._merge(connector_states, e2m, m2e)
        elif from_worker is not None:
            states = {k: v for k, v in from_worker.get_state(components=[E2M, M2E]).items()}
            states.pop(NUM_STEPS, None)
        else:
            states = {E2M: env_to_module.get_state(), M2E: module_to_env.get_state()}
        if env_steps_sampled is not None:
            states[NUM_STEPS] = env_steps_sampled
        if not broadcast:
            if local is not None:
                local.set_state(states)
            else:
                for key, pipe in ((E2M, env_to_module), (M2E, module_to_env)):
                    if pipe is not None and key in states:
                        pipe.set_state(states[key])
            states = {k: v for k, v in states.items() if k not in (E2M, M2E)}
        if not states and not rl_module_state:
            return
        if broadcast and local is not None:
            local.set_state(states)
        import ray

        rl = dict(rl_module_state or {})
        if RL_MODULE in rl and not is_object_ref(rl[RL_MODULE]):
            rl[RL_MODULE] = ray.put(rl[RL_MODULE])
        self._broadcast.runner_state.update(states)
        if RL_MODULE in rl:
            self._broadcast.weights = {
                RL_MODULE: rl[RL_MODULE],
                SEQ_NO: int(rl.get(SEQ_NO, 0) or 0),
            }
        self._broadcast.version += 1
        self._push(
            STATES_TAG,
            remote.apply_state,
            {"state": {**states, **rl}},
            env_runner_indices_to_update,
        )

    def _merge(self, states: list[dict], e2m: Any, m2e: Any) -> dict:
        """Merge with the local runner's (or the last broadcast) connector state as base."""
        local = self._local_env_runner
        if local is not None:
            base = local.get_state(components=[E2M, M2E])
            base.pop(NUM_STEPS, None)
        else:
            base = {k: v for k, v in self._broadcast.runner_state.items() if k in (E2M, M2E)}
        if e2m is None and m2e is None:
            healthy = self._worker_manager.healthy_actor_ids()
            if not healthy:
                return {}
            return self.foreach_env_runner(
                remote.merge_on_runner,
                kwargs={"states": states, "base": base},
                local_env_runner=False,
                remote_worker_ids=healthy[:1],
            )[0]
        return merge_connector_states(states, base=base, env_to_module=e2m, module_to_env=m2e)

    def get_merged_env_runner_state(
        self,
        *,
        config: Any,
        rl_module_state: dict,
        connector_states: list[dict] | None = None,
        env_steps_sampled: int | None = None,
        env_to_module: Any = None,
        module_to_env: Any = None,
    ) -> dict:
        """The merged connector states, steps and ``rl_module_state``, without pushing them.

        Raises:
            ValueError: ``rl_module_state`` has no ``weights_seq_no``.
        """
        if SEQ_NO not in (rl_module_state or {}):
            raise ValueError(
                "get_merged_env_runner_state(): rl_module_state must contain "
                f"'weights_seq_no' (keys: {sorted(rl_module_state or {})})."
            )
        merge = config.merge_env_runner_states is True or (
            config.merge_env_runner_states == "training_only" and not config.in_evaluation
        )
        out: dict[str, Any] = {}
        if merge and connector_states:
            e2m, m2e = pipelines_of(self._local_env_runner, env_to_module, module_to_env)
            out.update(self._merge(connector_states, e2m, m2e))
        if env_steps_sampled is not None:
            out[NUM_STEPS] = int(env_steps_sampled)
        out.update(rl_module_state)
        return out

    def _sync_old_stack_filters(self, config: Any) -> None:
        local = self._local_env_runner
        if local is None or not getattr(local, "filters", None):
            return
        from envrunners.utils.filter_manager import FilterManager

        FilterManager.synchronize(
            local.filters,
            self,
            update_remote=config.update_worker_filter_stats,
            timeout_seconds=config.sync_filters_on_rollout_workers_timeout_s,
            use_remote_data_for_update=config.use_worker_filter_stats,
        )

    # ------------------------------------------------------------------ WorkerSet names
    # The old names keep their old defaults where they differ (``foreach_worker``
    # marks answering runners healthy).
    def local_worker(self) -> Any:
        """The local runner (old name of ``local_env_runner``)."""
        return self._local_env_runner

    def remote_workers(self) -> list[Any]:
        """The actor handles of all remote runners, in id order."""
        return list(self._worker_manager.actors().values())

    def foreach_worker(
        self,
        func: Callable[[Any], Any],
        *,
        local_env_runner: bool = True,
        healthy_only: bool = True,
        remote_worker_ids: list[int] | None = None,
        timeout_seconds: float | None = None,
        return_obj_refs: bool = False,
        mark_healthy: bool = True,
        local_worker: Any = _DEPRECATED,
    ) -> list[Any]:
        """``foreach_env_runner`` under its old name (``mark_healthy`` defaults to True)."""
        if local_worker != _DEPRECATED:
            raise ConfigError(
                "foreach_worker(local_worker=...) is deprecated; use local_env_runner"
            )
        return self.foreach_env_runner(
            func,
            local_env_runner=local_env_runner,
            healthy_only=healthy_only,
            remote_worker_ids=remote_worker_ids,
            timeout_seconds=timeout_seconds,
            return_obj_refs=return_obj_refs,
            mark_healthy=mark_healthy,
        )

    def foreach_worker_with_id(
        self,
        func: Callable[[int, Any], Any],
        *,
        local_env_runner: bool = True,
        healthy_only: bool = True,
        remote_worker_ids: list[int] | None = None,
        timeout_seconds: float | None = None,
    ) -> list[Any]:
        """Call ``func(id, runner)`` on every runner (the local one has id 0)."""
        local = []
        if local_env_runner and self._local_env_runner is not None:
            local = [func(0, self._local_env_runner)]
        ids = list(remote_worker_ids or self._worker_manager.actor_ids())
        if not ids:
            return local
        return local + self.foreach_env_runner(
            [functools.partial(func, i) for i in ids],
            local_env_runner=False,
            healthy_only=healthy_only,
            remote_worker_ids=ids,
            timeout_seconds=timeout_seconds,
        )

    def foreach_worker_async(
        self,
        func: Callable[[Any], Any],
        *,
        healthy_only: bool = True,
        remote_worker_ids: list[int] | None = None,
    ) -> int:
        """``foreach_env_runner_async`` without a tag (old name)."""
        return self.foreach_env_runner_async(
            func, healthy_only=healthy_only, remote_worker_ids=remote_worker_ids
        )

    def probe_unhealthy_workers(self, timeout_seconds: float | None = None) -> list[int]:
        """``probe_unhealthy_env_runners`` (old name)."""
        return self.probe_unhealthy_env_runners(timeout_seconds)

    # ------------------------------------------------------------------ envs
    # Old-stack runners visit their envs and policies themselves; for new-stack
    # runners the sub-envs of their vector env are visited.
    def foreach_env(self, func: Callable[[Any], Any]) -> list[list[Any]]:
        """``[[func(sub_env) for each sub-env] for each runner]``, local runner first."""
        return self.foreach_env_runner(remote.visit_sub_envs, kwargs={"env_func": func})

    def foreach_env_with_context(self, func: Callable[[Any, Any], Any]) -> list[list[Any]]:
        """Like ``foreach_env`` with ``func(sub_env, env_context)``."""
        return self.foreach_env_runner(
            remote.visit_sub_envs, kwargs={"env_func": func, "with_context": True}
        )

    # ------------------------------------------------------------------ policies
    def foreach_policy(self, func: Callable[..., Any]) -> list[Any]:
        """``func(policy, policy_id)`` for every policy of every runner, flattened."""
        results = self.foreach_env_runner(remote.foreach_policy, kwargs={"policy_func": func})
        return [r for per_runner in results for r in per_runner]

    def foreach_policy_to_train(self, func: Callable[..., Any]) -> list[Any]:
        """Like ``foreach_policy``, only for the policies being trained."""
        results = self.foreach_env_runner(
            remote.foreach_policy_to_train, kwargs={"policy_func": func}
        )
        return [r for per_runner in results for r in per_runner]

    def foreach_trainable_policy(self, func: Callable[..., Any]) -> list[Any]:
        """Removed name; raises (use ``foreach_policy_to_train``)."""
        raise ConfigError("foreach_trainable_policy() is deprecated; use foreach_policy_to_train()")

    def is_policy_to_train(self, policy_id: str, batch: Any = None) -> bool:
        """Whether the local runner trains ``policy_id`` (True if it has no rule).

        Raises:
            NotImplementedError: The group has no local runner.
        """
        local = self._local_env_runner
        if local is None:
            raise NotImplementedError(
                "is_policy_to_train() needs a local env runner; this group has none."
            )
        rule = getattr(local, "is_policy_to_train", None)
        return True if rule is None else bool(rule(policy_id, batch))

    def add_policy(
        self,
        policy_id: str,
        policy_cls: type | None = None,
        policy: Any = None,
        *,
        observation_space: Any = None,
        action_space: Any = None,
        config: Any = None,
        policy_state: Any = None,
        policy_mapping_fn: Callable[..., Any] | None = None,
        policies_to_train: Any = None,
        module_spec: Any = None,
        workers: Any = _DEPRECATED,
    ) -> None:
        """Add a policy to the local runner and every remote runner (old stack).

        Exactly one of ``policy_cls`` and ``policy`` is needed; with an instance,
        the remote runners build clones from its class, spaces, config and state.

        Raises:
            KeyError: ``policy_id`` exists already.
            ValueError: Not exactly one of ``policy_cls``/``policy`` was given.
        """
        local = self._local_env_runner
        if local is not None and policy_id in getattr(local, "policy_map", {}):
            raise KeyError(
                f"Policy ID '{policy_id}' already exists in policy map! Make sure you use "
                "a Policy ID that has not been taken yet. Policy IDs that are already in "
                f"your policy map: {list(local.policy_map.keys())}"
            )
        if workers != _DEPRECATED:
            raise ConfigError("add_policy(workers=...) is deprecated; it adds to all runners")
        if (policy_cls is None) == (policy is None):
            raise ValueError(
                "Only one of `policy_cls` or `policy` must be provided to staticmethod: "
                "`EnvRunnerGroup.add_policy()`!"
            )
        if policy is not None:
            remote_kwargs = {
                "policy_cls": type(policy),
                "observation_space": policy.observation_space,
                "action_space": policy.action_space,
                "config": policy.config,
                "policy_state": policy.get_state(),
            }
        else:
            remote_kwargs = {
                "policy_cls": policy_cls,
                "observation_space": observation_space,
                "action_space": action_space,
                "config": config,
                "policy_state": policy_state,
            }
        common = {
            "policy_mapping_fn": policy_mapping_fn,
            "policies_to_train": (
                list(policies_to_train)
                if policies_to_train is not None and not callable(policies_to_train)
                else policies_to_train
            ),
            "module_spec": module_spec,
        }
        if local is not None:
            if policy is not None:
                local.add_policy(policy_id=policy_id, policy=policy, **common)
            else:
                local.add_policy(policy_id=policy_id, **remote_kwargs, **common)
        if self._worker_manager.num_actors():
            self.foreach_env_runner(
                remote.add_policy,
                kwargs={"policy_id": policy_id, **remote_kwargs, **common},
                local_env_runner=False,
            )

    # ------------------------------------------------------------------ spaces, repr
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
