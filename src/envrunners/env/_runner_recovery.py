"""How an ``EnvRunnerGroup`` tells runner faults from user errors, and brings runners back.

The group holds a ``RunnerRecovery`` and hands it the results of its calls.

Classification of a failed remote call:

- the actor died or is unreachable (``RayActorError`` and other non-task Ray
  errors): a **runner fault**; Ray restarts the process if restarts are left;
- the call raised ``EnvRunnerError`` (env failure, failed ``set_state``): a
  **runner fault**; the runner is rebuilt in place (no new process);
- the call raised anything else: a **user error**; it is raised to the caller
  and the runner stays in service;
- the call missed its deadline: the runner is out of service at once (the
  manager watches its late call); if that call returns it is restored, if it
  is still running ``replace_env_runner_after_missed_deadlines`` deadlines
  after it was sent, the runner is killed as hung and replaced.

A fault that is neither ignored nor restarted reaches the caller as a
``RemoteEnvRunnerError`` (a ``ray.exceptions.RayError``) naming the runner.

A dead runner's place, or that of one Ray cannot restart yet (its node is
lost, no room), is taken by the group's standby runner when one is ready, else
Ray restarts the process wherever there is room, whichever comes first. The
standby is an actor with the runners' resources, placed away from their nodes
where the cluster allows, that has built a spare runner (an index no runner
has: env, module, connectors), so becoming the dead runner is one quick
rebuild. While a runner is late (it missed a deadline) the standby is built for
it with the latest state, so if that runner is killed as hung the standby
serves in its place at once. Each time the standby is used, the next one starts
at once in the background (as soon as the replaced runner's resources are
free); its start is never waited for.

Restoring: an unhealthy runner that Ray reports alive gets one ``set_state``
call with the last broadcast weights, connector states and lifetime step count
(or the local runner's state if nothing was broadcast yet). The call's success
is what puts the runner back into service, so no request reaches a restored
runner before its state. Restores run in the background of every group call,
and in ``probe_unhealthy_env_runners`` with a deadline.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from envrunners import errors
from envrunners.env import _ray_setup
from envrunners.env import _remote_runner_calls as remote
from envrunners.env._runner_state import INTERNAL_TAGS, STATES_TAG, BroadcastRecord
from envrunners.errors import EnvRunnerError
from envrunners.utils.actor_manager import (
    RemoteCallResults,
    actor_node_id,
    actor_state_in_gcs,
    remote_traceback_of,
)

__all__ = ["STANDBY_AFTER_S", "RunnerRecovery", "is_runner_fault"]

logger = logging.getLogger("envrunners")

_WAITING = ("RESTARTING", "PENDING_CREATION", "DEPENDENCIES_UNREADY")
#: A group started without ``standby_env_runner=True`` starts its standby after
#: being in use this long (seconds).
STANDBY_AFTER_S = 5.0
_MAX_RESTORE_FAILURES = 3


def is_runner_fault(error: BaseException) -> bool:
    """True for faults of the runner; False for errors of the user's function."""
    from ray.exceptions import RayTaskError

    if isinstance(error, RayTaskError):
        return isinstance(getattr(error, "cause", None), EnvRunnerError)
    return True


class RunnerRecovery:
    """Fault handling, standby runner and state restore of one ``EnvRunnerGroup``.

    Args:
        manager: The group's actor manager (built with ``is_fault=is_runner_fault``).
        config: The group's ``AlgorithmConfig`` (fault-tolerance settings, timeouts).
        broadcast: What the group broadcast: a restored runner gets the same.
        runner_cls: The runner class (a standby actor is a subclass of it).
        config_ref: Returns the ``ObjectRef`` of ``config`` (runners are rebuilt with it).
        ignore_errors: Log runner faults instead of raising them.
        standby: Keep a standby runner at all.
        standby_now: Start it with the first runners (else once the group has been
            in use for ``STANDBY_AFTER_S`` seconds).

    Attributes:
        ctor_kwargs: Constructor arguments of each remote runner, by id (to rebuild it).
        local_env_runner: The group's local runner (its state restores runners
            until something is broadcast), or None.
    """

    def __init__(
        self,
        manager: Any,
        config: Any,
        broadcast: BroadcastRecord,
        *,
        runner_cls: type,
        config_ref: Callable[[], Any],
        ignore_errors: bool,
        standby: bool,
        standby_now: bool,
    ):
        self._manager = manager
        self._config = config
        self._broadcast = broadcast
        self._runner_cls = runner_cls
        self._config_ref = config_ref
        self._ignore_errors = ignore_errors
        self._standby_on = standby
        #: When the standby starts: at once if asked for, else once the group has
        #: been in use a while (short-lived groups, e.g. in tests, never pay for it).
        self._standby_due = 0.0 if standby_now else float("inf")
        self._closed = False
        self.standby: Any = None
        #: The standby's last call (warm-up or preparation): it is ready once this is done.
        self._standby_ready: Any = None
        #: (runner id, state version) the standby is prepared for (see ``_prepare_standby``).
        self._prepared: tuple[int, int] | None = None
        #: Until then a standby without room is tried again soon (a replaced runner's
        #: resources are on their way back).
        self._respawn_until = 0.0
        self.ctor_kwargs: dict[int, dict] = {}
        self.local_env_runner: Any = None
        #: Runners whose process was replaced and that serve again (lifetime count).
        self.num_replaced = 0
        #: Ids of runners replaced (standby or new process) that serve again.
        self.replaced_ids: set[int] = set()
        #: When (``time.monotonic()``) each runner's last replacement (standby or new
        #: process) was put into service.
        self.replaced_at: dict[int, float] = {}
        self.reset()

    def reset(self) -> None:
        """Forget every restore, restart count and given-up runner (new runners follow)."""
        #: runner id -> (ObjectRef of its restore call, state version, start time)
        self._restore_calls: dict[int, tuple[Any, int, float]] = {}
        self._given_up: set[int] = set()
        self._restored_since_probe: list[int] = []
        self._rebuilds: dict[int, int] = defaultdict(int)
        self._fault_streak: dict[int, int] = defaultdict(int)
        self._restore_failures: dict[int, int] = defaultdict(int)
        #: Runners whose process is being replaced (counted once they serve again).
        self._replacing: set[int] = set()

    def close(self) -> None:
        """Kill the standby and forget everything (the group stopped)."""
        self._closed = True
        self.kill_standby()
        self.reset()

    def runners_added(self) -> None:
        """New runners are up: start the standby now, or its clock."""
        if self._standby_due == 0.0:
            self.spawn_standby()
        elif self._standby_due == float("inf"):
            self._standby_due = time.monotonic() + STANDBY_AFTER_S

    # ------------------------------------------------------------------ classification
    def fault_error(self, actor_id: int, error: BaseException) -> EnvRunnerError:
        """The ``RemoteEnvRunnerError`` raised to the caller for a fault of runner ``actor_id``."""
        from ray.exceptions import RayTaskError

        cause = getattr(error, "cause", None) if isinstance(error, RayTaskError) else None
        if isinstance(cause, EnvRunnerError):
            what = str(cause).split("\n\nRemote traceback:", 1)[0]
            text = what.split(": ", 1)[1] if what.startswith("env runner ") else what
        else:
            text = f"died or became unreachable ({type(error).__name__}: {str(error)[:300]})"
        if self._config.restart_failed_env_runners:
            fix = ""
        else:
            fix = (
                " Set config.fault_tolerance(restart_failed_env_runners=True) to restart "
                "failed runners, or ignore_env_runner_failures=True to go on without them."
            )
        err = errors.RemoteEnvRunnerError(
            text.rstrip(".") + "." + fix,
            runner_index=actor_id,
            remote_traceback=remote_traceback_of(error),
        )
        err.__cause__ = error
        return err

    def after_call(self, results: RemoteCallResults, mark_healthy: bool) -> None:
        """Restore the unhealthy runners that answered (``mark_healthy``), then handle errors."""
        if mark_healthy:
            manager = self._manager
            revived = [
                r.actor_id for r in results if r.ok and not manager.is_actor_healthy(r.actor_id)
            ]
            if revived:
                self.restore_now(revived)
        self.handle_errors(results)

    def handle_errors(self, results: RemoteCallResults) -> None:
        """Act on failed results: faults → restart/raise per config; user errors → raise."""
        first: BaseException | None = None
        handled: set[int] = set()
        for result in results:
            if result.ok:
                self._fault_streak.pop(result.actor_id, None)
                continue
            err = result.get()
            if not is_runner_fault(err):
                first = first or err
                continue
            if result.actor_id not in handled:
                handled.add(result.actor_id)
                self._after_fault(result.actor_id, err)
            if self._ignore_errors:
                logger.warning("env runner %d failed: %s", result.actor_id, str(err)[:2000])
            elif first is None:
                first = self.fault_error(result.actor_id, err)
        hung = self._after_hung_kills()
        if first is None and hung is not None and not self._ignore_errors:
            first = hung
        if first is not None:
            raise first

    def _after_hung_kills(self) -> EnvRunnerError | None:
        """Replace the runners the manager killed as hung (or take them out for good).

        Returns:
            The error for the first of them (raised unless failures are ignored).
        """
        import ray

        first = None
        for actor_id in self._manager.take_hung_actor_kills():
            self._restore_calls.pop(actor_id, None)
            if self._config.restart_failed_env_runners:
                self._replacing.add(actor_id)
                self._replace_dead(actor_id)  # else Ray restarts the killed process
            else:
                ray.kill(self._manager.get_actor(actor_id), no_restart=True)
                self._given_up.add(actor_id)
            if first is None:
                first = errors.RemoteEnvRunnerError(
                    "its call was still running "
                    f"replace_env_runner_after_missed_deadlines="
                    f"{self._config.replace_env_runner_after_missed_deadlines} deadlines after "
                    "it was sent; it was killed as hung.",
                    runner_index=actor_id,
                )
        return first

    def check_late_calls(self) -> None:
        """Restore runners whose late call returned; replace those whose call is hung."""
        manager = self._manager
        for result in manager.check_late_calls():
            actor_id = result.actor_id
            if actor_id not in manager.actors() or manager.is_actor_healthy(actor_id):
                continue
            if not result.ok:
                err = result.get()
                if is_runner_fault(err):
                    self._after_fault(actor_id, err)
                    continue
                logger.warning("env runner %d: a late call raised %s", actor_id, str(err)[:500])
            if actor_id not in self._restore_calls and actor_id not in self._given_up:
                self._fire_restore(actor_id)
        hung = self._after_hung_kills()
        if hung is not None and not self._ignore_errors:
            raise hung

    def _after_fault(self, actor_id: int, error: BaseException) -> None:
        """Restart (rebuild) a failed runner, or take it out for good, per the config."""
        import ray
        from ray.exceptions import RayTaskError

        config = self._config
        manager = self._manager
        if actor_id not in manager.actors():
            return
        handle = manager.get_actor(actor_id)
        alive = isinstance(error, RayTaskError)  # the call failed, the process did not
        if manager.is_actor_healthy(actor_id):
            manager.set_actor_state(actor_id, healthy=False)
        if not config.restart_failed_env_runners:
            if alive:
                ray.kill(handle, no_restart=True)
            self._given_up.add(actor_id)
            return
        self._fault_streak[actor_id] += 1
        if not self._may_restart(actor_id):
            return
        if not alive:
            self._replacing.add(actor_id)
            # A first failure in a row gets the standby; a crash loop waits for Ray.
            if self._fault_streak[actor_id] <= 1:
                self._replace_dead(actor_id)  # else Ray restarts the process
            return
        delay = 0.0
        if self._fault_streak[actor_id] > 1:
            delay = float(config.delay_between_env_runner_restarts_s)
        kwargs = self.ctor_kwargs.get(actor_id)
        self._restore_calls.pop(actor_id, None)
        if kwargs is None:  # not built by this group (reset()): restart the process
            ray.kill(handle, no_restart=False)
            return
        handle.apply.remote(
            remote.rebuild_runner, config=self._config_ref(), ctor_kwargs=kwargs, delay_s=delay
        )

    def _may_restart(self, actor_id: int) -> bool:
        """Count a restart by the group; beyond ``max_num_env_runner_restarts`` give up."""
        import ray

        self._rebuilds[actor_id] += 1
        limit = int(self._config.max_num_env_runner_restarts)
        if 0 <= limit < self._rebuilds[actor_id]:
            logger.error(
                "env runner %d failed again after max_num_env_runner_restarts=%d restarts; "
                "taking it out of service for good.",
                actor_id,
                limit,
            )
            ray.kill(self._manager.get_actor(actor_id), no_restart=True)
            self._given_up.add(actor_id)
            return False
        return True

    # ------------------------------------------------------------------ standby
    def spawn_standby(self) -> None:
        """Start the standby actor: the runners' resources, away from their nodes if possible.

        It reserves what a runner reserves, so a runner it replaces never shares
        a CPU unaccounted. Without room for it in the cluster it is not started
        (a lost runner then waits for Ray to restart it where there is room);
        ``maintain`` tries again every ``STANDBY_AFTER_S`` seconds.
        """
        if not self._standby_on or self._closed or self.standby is not None:
            return
        if not self._room_for_standby():
            # Not now (a pending actor would hold nothing but make Ray warn); look again
            # later, soon if a replaced runner's resources are being released.
            now = time.monotonic()
            self._standby_due = now + (0.1 if now < self._respawn_until else STANDBY_AFTER_S)
            return
        cls = _ray_setup.make_remote_class(_ray_setup.standby_class(self._runner_cls), self._config)
        options = self._standby_placement()
        self.standby = (cls.options(**options) if options else cls).remote()
        self._prepared = None
        self._warm_up_standby()

    def _warm_up_standby(self) -> None:
        """Build the standby as a spare runner (an index no runner has) in the background.

        Why: the standby then has its imports done and an env and module built
        once, so becoming a runner is a quick rebuild. Without constructor
        arguments (runners not built by this group) it only answers a ping.
        """
        if not self.ctor_kwargs:
            self._standby_ready = self.standby.ping.remote()
            return
        template = self.ctor_kwargs[max(self.ctor_kwargs)]
        spare = max(int(k.get("worker_index") or 0) for k in self.ctor_kwargs.values()) + 1
        self._standby_ready = self.standby.apply.remote(
            remote.warm_up_standby,
            config=self._config_ref(),
            ctor_kwargs={**template, "worker_index": spare},
        )
        self._prepared = None

    def _prepare_standby(self) -> None:
        """Build the ready standby as a late runner, with the latest state (background).

        Why: a runner that missed a deadline (a call only set aside before its
        deadline does not count) is killed as hung if its call has not
        returned ``replace_env_runner_after_missed_deadlines`` deadlines after it
        was sent; a standby built for it by then takes its place at once, with no
        call to wait for. Only while failed runners are restarted.
        """
        import ray

        if self.standby is None or self._prepared is not None or self._closed:
            return
        if not self._config.restart_failed_env_runners:
            return
        late = [i for i in self._manager.late_actor_ids(True) if i in self.ctor_kwargs]
        if not late:
            return
        ready, _ = ray.wait([self._standby_ready], timeout=0)
        if not ready:
            return
        actor_id = late[0]
        state = self._broadcast.restore_state(self.local_env_runner, self._peer_module_state)
        self._standby_ready = self.standby.apply.remote(
            remote.prepare_standby,
            state=state,
            config=self._config_ref(),
            ctor_kwargs=self.ctor_kwargs[actor_id],
        )
        self._prepared = (actor_id, self._broadcast.version)

    def _unprepare_standby(self, actor_id: int) -> None:
        """Runner ``actor_id`` serves again: its prepared standby goes back to a spare."""
        if self._prepared is not None and self._prepared[0] == actor_id and self.standby:
            self._warm_up_standby()

    def _room_for_standby(self) -> bool:
        """Whether the cluster has the CPUs and GPUs of one more runner free."""
        import ray

        config = self._config
        need = {
            "CPU": float(config.num_cpus_per_env_runner or 0),
            "GPU": float(config.num_gpus_per_env_runner or 0),
        }
        if not any(need.values()):
            return True
        try:
            free = ray.available_resources()
        except Exception:  # pragma: no cover - best effort: try to place it
            return True
        return all(free.get(k, 0.0) >= v for k, v in need.items() if v)

    def _standby_placement(self) -> dict[str, Any]:
        """Soft node affinity to a node without runners (that has the CPUs), if there is one.

        Why: a standby on a runner's node is lost with that node. Inside a
        placement group (Tune) or on one node, Ray's default placement is kept.
        """
        import ray
        from ray.util import get_current_placement_group
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if get_current_placement_group() is not None:
            return {}
        need = float(self._config.num_cpus_per_env_runner)
        try:
            nodes = [
                n["NodeID"]
                for n in ray.nodes()
                if n.get("Alive") and n.get("Resources", {}).get("CPU", 0.0) >= need
            ]
        except Exception:  # pragma: no cover - best effort only
            return {}
        if len(nodes) <= 1:
            return {}
        used = {actor_node_id(h) for h in self._manager.actors().values()}
        free = [n for n in nodes if n not in used]
        if not free:
            return {"scheduling_strategy": "SPREAD"}
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=free[0], soft=True)}

    def _take_standby(self) -> Any:
        """The standby actor if it is up (then it is no longer the standby), else None."""
        import ray
        from ray.exceptions import RayError

        if self.standby is None:
            return None
        ready, _ = ray.wait([self._standby_ready], timeout=0)
        if not ready:
            return None
        handle, self.standby, self._standby_ready = self.standby, None, None
        try:
            ray.get(ready[0])
        except RayError as err:
            logger.warning("The standby env runner is gone (%s); starting a new one.", err)
            ray.kill(handle, no_restart=True)
            self._prepared = None
            self.spawn_standby()
            return None
        return handle

    def kill_standby(self) -> None:
        """Kill the standby actor, if any (a dead runner then waits for Ray's restart)."""
        import ray

        if self.standby is not None:
            ray.kill(self.standby, no_restart=True)
        self.standby = self._standby_ready = None
        self._prepared = None

    def _replace_dead(self, actor_id: int) -> bool:
        """Give a dead runner's id to the standby actor; False if there is none ready."""
        import ray

        kwargs = self.ctor_kwargs.get(actor_id)
        standby = self._take_standby() if kwargs is not None else None
        if standby is None:
            return False
        prepared, self._prepared = self._prepared, None
        manager = self._manager
        ray.kill(manager.get_actor(actor_id), no_restart=True)
        manager.replace_actor(actor_id, standby)
        self._restore_calls.pop(actor_id, None)
        self._given_up.discard(actor_id)
        self._replacing.add(actor_id)
        logger.warning("env runner %d is gone; the standby runner takes its place.", actor_id)
        if prepared is not None and prepared[0] == actor_id:
            # Built for this runner with the state of version prepared[1]: it serves now.
            # Calls to one actor run in order, so a newer state pushed now arrives first.
            standby.apply.remote(remote.end_standby)
            self._restored(actor_id)
            if prepared[1] < self._broadcast.version:
                state = self._broadcast.restore_state(self.local_env_runner, lambda: None)
                manager.foreach_actor_async(
                    remote.apply_state,
                    STATES_TAG,
                    kwargs={"state": state},
                    remote_actor_ids=[actor_id],
                    coalesce=True,
                )
        # Its resources are being released: the next standby starts as soon as they are.
        self._respawn_until = time.monotonic() + STANDBY_AFTER_S
        self.spawn_standby()
        return True

    def _restored(self, actor_id: int) -> None:
        """Put a restored runner back into service; count it if its process was replaced."""
        self._restore_failures.pop(actor_id, None)
        self._manager.mark_actor_restored(actor_id)
        if actor_id in self._replacing:
            self._replacing.discard(actor_id)
            self.num_replaced += 1
            self.replaced_ids.add(actor_id)
            self.replaced_at[actor_id] = time.monotonic()
        self._restored_since_probe.append(actor_id)
        self._unprepare_standby(actor_id)
        logger.info("env runner %d is restored (with the latest state).", actor_id)

    # ------------------------------------------------------------------ restore
    def _peer_module_state(self) -> dict | None:
        """Weights of a healthy remote runner (used when nothing was broadcast yet)."""
        healthy = self._manager.healthy_actor_ids()
        if not healthy:
            return None
        timeout = float(self._config.env_runner_restore_timeout_s)
        results = self._manager.foreach_actor(
            remote.module_state, remote_actor_ids=healthy[:1], timeout_seconds=timeout
        )
        for r in results.ignore_errors():
            return r.get()
        return None

    def _fire_restore(self, actor_id: int) -> None:
        handle = self._manager.get_actor(actor_id)
        state = self._broadcast.restore_state(self.local_env_runner, self._peer_module_state)
        ref = handle.apply.remote(
            remote.restore_runner,
            state=state,
            config=self._config_ref(),
            ctor_kwargs=self.ctor_kwargs.get(actor_id),
        )
        self._restore_calls[actor_id] = (ref, self._broadcast.version, time.monotonic())

    def _poll_restores(self, timeout: float | None = 0.0, *, only: list[int] | None = None) -> None:
        """Send restore calls to unhealthy runners Ray reports alive; finish the done ones."""
        import ray
        from ray.exceptions import RayError

        manager = self._manager
        for actor_id in only if only is not None else manager.actor_ids():
            if (
                actor_id in self._restore_calls
                or actor_id in self._given_up
                or manager.is_actor_healthy(actor_id)
            ):
                continue
            gcs = None if only is not None else actor_state_in_gcs(manager.get_actor(actor_id))
            if gcs == "DEAD" or gcs in _WAITING:
                # Dead, or Ray cannot restart it yet (lost node, no room): the standby
                # takes its place if it is ready first.
                restart = bool(self._config.restart_failed_env_runners)
                if restart and self._replace_dead(actor_id):
                    self._may_restart(actor_id)
                    continue
                if gcs in _WAITING:
                    continue
                if restart and self.standby is not None:
                    continue  # the standby is starting: it takes over once it is up
                logger.error("env runner %d is dead and cannot be restarted.", actor_id)
                self._given_up.add(actor_id)
                continue
            self._fire_restore(actor_id)
        if not self._restore_calls:
            return
        refs = {
            ref: actor_id
            for actor_id, (ref, _, _) in self._restore_calls.items()
            if only is None or actor_id in only
        }
        if not refs:
            return
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        for ref in ready:
            actor_id = refs[ref]
            _, version, _ = self._restore_calls.pop(actor_id)
            if actor_id not in manager.actors():
                continue
            try:
                ray.get(ref)
            except RayError as err:
                self._restore_failures[actor_id] += 1
                # Once per outage (a lost node fails every probe until the runner is back).
                log = logger.warning if self._restore_failures[actor_id] == 1 else logger.debug
                log("Restoring env runner %d failed: %s", actor_id, str(err)[:500])
                if self._restore_failures[actor_id] >= _MAX_RESTORE_FAILURES:
                    self._after_fault(actor_id, err)
                    self._restore_failures[actor_id] = 0
                continue
            if version < self._broadcast.version:
                self._fire_restore(actor_id)  # a newer broadcast happened meanwhile
                continue
            self._restored(actor_id)
        limit = float(self._config.env_runner_restore_timeout_s)
        now = time.monotonic()
        for actor_id, (_, _, started) in list(self._restore_calls.items()):
            if now - started > limit:
                logger.error(
                    "env runner %d did not finish restoring within env_runner_restore_timeout_s"
                    "=%ss; killing it as hung.",
                    actor_id,
                    limit,
                )
                del self._restore_calls[actor_id]
                self._replacing.add(actor_id)
                ray.kill(manager.get_actor(actor_id), no_restart=False)

    def restore_now(self, actor_ids: list[int]) -> None:
        """Push state to runners that answered a ``mark_healthy`` call; wait for it."""
        manager = self._manager
        for actor_id in actor_ids:
            if manager.is_actor_healthy(actor_id):
                manager.set_actor_state(actor_id, healthy=False)
        self._given_up.difference_update(actor_ids)
        timeout = float(self._config.env_runner_restore_timeout_s)
        self._poll_restores(timeout, only=list(actor_ids))

    def maintain(self) -> None:
        """Collect finished internal pushes and move restores along (never blocks)."""
        manager = self._manager
        if manager.late_actor_ids():
            self.check_late_calls()
        if any(manager.num_outstanding_async_reqs(t) for t in INTERNAL_TAGS):
            results = manager.fetch_ready_async_reqs(tags=list(INTERNAL_TAGS), timeout_seconds=0)
            self.handle_errors(results)
        if self.standby is None and time.monotonic() >= self._standby_due:
            self.spawn_standby()
        if self._prepared is None and self.standby is not None and manager.late_actor_ids():
            self._prepare_standby()
        auto = bool(self._config.restart_failed_env_runners)
        if self._restore_calls or (auto and manager.num_healthy_actors() < manager.num_actors()):
            self._poll_restores(0.0)

    def probe(self, timeout_seconds: float | None = None) -> list[int]:
        """Restore the unhealthy runners, waiting up to ``timeout_seconds`` (default the
        probe timeout) for those that Ray is still starting or restarting.

        Returns:
            The ids restored since the last probe, by this call or in the background.
        """
        if timeout_seconds is None:
            timeout_seconds = float(self._config.env_runner_health_probe_timeout_s)
        manager = self._manager
        if manager.num_actors():
            self.maintain()
            deadline = time.monotonic() + timeout_seconds
            while True:
                self._poll_restores(min(0.05, max(0.0, deadline - time.monotonic())))
                waiting = [
                    i
                    for i in manager.actor_ids()
                    if not manager.is_actor_healthy(i) and i not in self._given_up
                ]
                if not waiting or time.monotonic() >= deadline:
                    break
                if not self._restore_calls:  # only runners Ray is still (re)starting
                    time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        restored, self._restored_since_probe = self._restored_since_probe, []
        return restored

    def await_healthy(self, timeout_seconds: float) -> bool:
        """Wait (with a deadline) until at least one remote runner is healthy."""
        manager = self._manager
        deadline = time.monotonic() + timeout_seconds
        while manager.num_healthy_actors() == 0:
            if all(i in self._given_up for i in manager.actor_ids()):
                return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._poll_restores(min(remaining, 0.05))
            if not self._restore_calls:
                time.sleep(min(max(remaining, 0.0), 0.02))
        return True
