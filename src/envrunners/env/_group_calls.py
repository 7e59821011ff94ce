"""How ``EnvRunnerGroup`` calls its runners: sync, async, and the deadline rules.

Every remote wait has a deadline: ``timeout_seconds=None`` means the config's
``sample_timeout_s``. Results that miss it are dropped, counted in
``num_env_runners_dropped_lifetime`` and logged with the late runners' ids.
Before each call the group collects finished internal pushes and moves pending
restores along, so a restored runner is back as soon as possible.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from envrunners.env._runner_side import INTERNAL_TAGS
from envrunners.errors import ConfigError
from envrunners.utils.actor_manager import RemoteCallResults

__all__ = ["INTERNAL_TAGS", "GroupCalls"]

logger = logging.getLogger("envrunners")


class GroupCalls:
    """Remote calls of ``EnvRunnerGroup`` (a private mixin)."""

    _worker_manager: Any
    _remote_config: Any
    _local_env_runner: Any
    _num_env_runners_dropped_lifetime: int
    _maintain: Callable[[], None]
    _handle_errors: Callable[[Any], None]
    _restore_now: Callable[[list[int]], None]

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
