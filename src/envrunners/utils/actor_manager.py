"""Fault-aware remote calls on Ray actors (``ray.rllib.utils.actor_manager``).

``FaultAwareApply`` is the mixin every runner class inherits, so a Ray actor made
from a runner can be pinged and can run arbitrary functions on itself.
``FaultTolerantActorManager`` calls a set of such actors (synchronously, or
asynchronously with tags and a per-actor in-flight limit) and keeps their health
from the call results, as RLlib's manager does, with these differences:

- the round-robin of ``foreach_actor_async`` targets real actor ids;
- results come back in call order (RLlib: completion order);
- a ``RayTaskError`` carries the actor id in its message;
- ``is_fault`` decides which errors take an actor out of service (default: every
  ``RayError``, as in RLlib);
- missed deadlines are counted, and with ``max_consecutive_timeouts`` an actor
  that misses that many in a row is killed (Ray restarts it if it may);
- ``coalesce=True`` async calls are never dropped: a call that finds the tag's
  slots full waits as the actor's pending call, replaced by any newer one, and
  is sent before the next call of any tag to that actor;
- probes skip actors that Ray reports as restarting or dead.

Ray is imported lazily, so importing this module (as every runner does) is cheap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from envrunners.errors import ConfigError
from envrunners.utils._actor_calls import (
    ActorState,
    AsyncCallsMixin,
    actor_state_in_gcs,
    normalize_calls,
)
from envrunners.utils._actor_results import (
    CallResult,
    RemoteCallResults,
    ResultOrError,
    label_remote_error,
)

__all__ = [
    "CallResult",
    "FaultAwareApply",
    "FaultTolerantActorManager",
    "RemoteCallResults",
    "ResultOrError",
    "actor_state_in_gcs",
]

logger = logging.getLogger("envrunners")


class FaultAwareApply:
    """Mixin giving an actor ``ping()`` and ``apply(func, *args, **kwargs)``.

    Unlike RLlib, an exception raised by ``func`` is not turned into a sleep and a
    process exit: it propagates to the caller unchanged (as a ``RayTaskError`` that
    is also an instance of the original class), so the user sees their own error.
    """

    def ping(self) -> str:
        """Answer ``"pong"``: the cheapest proof that the actor is alive."""
        return "pong"

    def apply(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``func(self, *args, **kwargs)`` and return its result."""
        return func(self, *args, **kwargs)


def _default_is_fault(error: BaseException) -> bool:
    from ray.exceptions import RayError

    return isinstance(error, RayError)


class FaultTolerantActorManager(AsyncCallsMixin):
    """Calls a set of Ray actors and tracks their health from the results.

    Args:
        actors: Actor handles to manage; each must expose ``apply`` and ``ping``
            (inherit ``FaultAwareApply``).
        max_remote_requests_in_flight_per_actor: Per actor and per tag, how many
            async calls may be outstanding; more are dropped (or, with
            ``coalesce=True``, held as the one pending call).
        init_id: The first actor id; ids are never reused.
        is_fault: Which call errors take an actor out of service. Default: every
            ``RayError`` (RLlib's rule).
        max_consecutive_timeouts: Kill (``ray.kill``, restart allowed) an actor that
            misses this many deadlines in a row; None never does.
        actor_label: How messages name an actor (``"env runner"`` in a group).
    """

    def __init__(
        self,
        actors: Sequence[Any] | None = None,
        max_remote_requests_in_flight_per_actor: int = 2,
        init_id: int = 0,
        *,
        is_fault: Callable[[BaseException], bool] | None = None,
        max_consecutive_timeouts: int | None = None,
        actor_label: str = "actor",
    ):
        if max_remote_requests_in_flight_per_actor < 1:
            raise ConfigError(
                "max_remote_requests_in_flight_per_actor must be >= 1, got "
                f"{max_remote_requests_in_flight_per_actor}"
            )
        self._max_in_flight = int(max_remote_requests_in_flight_per_actor)
        self._next_id = int(init_id)
        self._actors: dict[int, Any] = {}
        self._remote_actor_states: dict[int, ActorState] = {}
        self._restored_actors: set[int] = set()
        self._in_flight_req_to_actor_id: dict[Any, tuple[str | None, int]] = {}
        self._current_actor_id = 0
        self._num_actor_restarts = 0
        self._num_timed_out_calls = 0
        self._hung_kills: list[int] = []
        self._num_hung_kills = 0
        self._is_fault = is_fault or _default_is_fault
        self.max_consecutive_timeouts = max_consecutive_timeouts
        self.actor_label = actor_label
        if actors:
            self.add_actors(actors)

    # ------------------------------------------------------------------ membership
    def actors(self) -> dict[int, Any]:
        """The ``{id: handle}`` dict itself (legacy accessor)."""
        return self._actors

    def actor_ids(self) -> list[int]:
        """All ids, healthy or not, in the order the actors were added."""
        return list(self._actors)

    def healthy_actor_ids(self) -> list[int]:
        """Ids of the actors currently marked healthy."""
        return [i for i, s in self._remote_actor_states.items() if s.is_healthy]

    def add_actors(self, actors: Iterable[Any]) -> list[int]:
        """Manage more actors; each starts healthy. Returns their new ids."""
        ids = []
        for handle in actors:
            self._actors[self._next_id] = handle
            self._remote_actor_states[self._next_id] = ActorState()
            ids.append(self._next_id)
            self._next_id += 1
        return ids

    def remove_actor(self, actor_id: int) -> Any:
        """Stop managing ``actor_id`` (it is not killed) and return its handle."""
        if actor_id not in self._actors:
            raise KeyError(f"Unknown actor id {actor_id!r}; known ids: {self.actor_ids()}")
        handle = self._actors.pop(actor_id)
        self._remote_actor_states.pop(actor_id, None)
        self._restored_actors.discard(actor_id)
        self._forget_in_flight(actor_id)
        return handle

    def replace_actor(self, actor_id: int, handle: Any) -> None:
        """Put a new handle under an existing id (marked unhealthy until restored)."""
        self._check_known([actor_id])
        self.set_actor_state(actor_id, healthy=False)
        self._actors[actor_id] = handle

    def get_actor(self, actor_id: int) -> Any:
        """The handle of ``actor_id``."""
        self._check_known([actor_id])
        return self._actors[actor_id]

    def clear(self) -> None:
        """Kill every actor (no restart) and forget them all; ids keep counting up."""
        import ray

        for handle in self._actors.values():
            try:
                ray.kill(handle, no_restart=True)
            except Exception as err:  # already gone
                logger.debug("ray.kill failed during clear(): %r", err)
        self._actors.clear()
        self._remote_actor_states.clear()
        self._restored_actors.clear()
        self._in_flight_req_to_actor_id.clear()
        self._current_actor_id = 0

    # ------------------------------------------------------------------ counters
    def num_actors(self) -> int:
        """How many actors are managed."""
        return len(self._actors)

    def num_healthy_actors(self) -> int:
        """How many of them are healthy."""
        return sum(s.is_healthy for s in self._remote_actor_states.values())

    def total_num_restarts(self) -> int:
        """How many unhealthy → healthy transitions calls with ``mark_healthy`` made."""
        return self._num_actor_restarts

    def num_timed_out_calls(self) -> int:
        """Results lost to a positive timeout so far (they are never returned later)."""
        return self._num_timed_out_calls

    def num_hung_actor_kills(self) -> int:
        """How many actors were killed for missing ``max_consecutive_timeouts`` deadlines."""
        return self._num_hung_kills

    def take_hung_actor_kills(self) -> list[int]:
        """Ids killed as hung since the last call (then forgotten)."""
        ids, self._hung_kills = self._hung_kills, []
        return ids

    def take_restored_actor_ids(self) -> list[int]:
        """Ids that became healthy again since the last probe or call (then forgotten)."""
        ids = sorted(self._restored_actors)
        self._restored_actors.clear()
        return ids

    def num_outstanding_async_reqs(self, tag: str | None = None) -> int:
        """Async calls in flight, over all tags or for one tag."""
        states = self._remote_actor_states.values()
        if tag is None:
            return sum(sum(s.num_in_flight_async_requests_by_tag.values()) for s in states)
        return sum(s.num_in_flight_async_requests_by_tag.get(tag, 0) for s in states)

    # ------------------------------------------------------------------ health
    def is_actor_healthy(self, actor_id: int) -> bool:
        """Whether ``actor_id`` is marked healthy."""
        if actor_id not in self._remote_actor_states:
            raise ConfigError(f"Unknown actor id: {actor_id!r}; known ids: {self.actor_ids()}")
        return self._remote_actor_states[actor_id].is_healthy

    def set_actor_state(self, actor_id: int, healthy: bool) -> None:
        """Mark an actor (un)healthy; going unhealthy forgets its in-flight and pending calls."""
        if actor_id not in self._remote_actor_states:
            raise ConfigError(f"Unknown actor id: {actor_id!r}; known ids: {self.actor_ids()}")
        state = self._remote_actor_states[actor_id]
        if healthy and not state.is_healthy:
            self._restored_actors.add(actor_id)
        elif not healthy:
            self._restored_actors.discard(actor_id)
            if state.is_healthy:
                self._forget_in_flight(actor_id)
                state.pending.clear()
        state.is_healthy = healthy
        state.consecutive_timeouts = 0

    def mark_actor_restored(self, actor_id: int) -> None:
        """Put an unhealthy actor back into service and count it as a restart.

        Unlike ``set_actor_state`` it does not report the actor as restored to the
        next ``probe_unhealthy_actors`` (the caller has dealt with it).
        """
        self._check_known([actor_id])
        state = self._remote_actor_states[actor_id]
        if not state.is_healthy:
            self._num_actor_restarts += 1
        state.is_healthy = True
        state.consecutive_timeouts = 0

    def _forget_in_flight(self, actor_id: int) -> None:
        for ref in [
            r for r, (_, aid) in self._in_flight_req_to_actor_id.items() if aid == actor_id
        ]:
            del self._in_flight_req_to_actor_id[ref]
        state = self._remote_actor_states.get(actor_id)
        if state is not None:
            state.num_in_flight_async_requests_by_tag.clear()

    # ------------------------------------------------------------------ call helpers
    def _check_known(self, ids: Iterable[int]) -> None:
        unknown = [i for i in ids if i not in self._actors]
        if unknown:
            raise ConfigError(
                f"Unknown {self.actor_label} id(s) {unknown}; known ids: {self.actor_ids()}"
            )

    def _fire(self, actor_id: int, func: Any, kw: dict) -> Any:  # also used by the async half
        self._fire_pending(actor_id)
        return self._actors[actor_id].apply.remote(func, **kw)

    def _collect(
        self,
        ready: list[Any],
        meta: dict[Any, tuple[str | None, int]],
        return_obj_refs: bool,
        mark_healthy: bool,
    ) -> RemoteCallResults:
        """Turn ready refs into results and update health (``meta``: ref → (tag, id))."""
        import ray
        from ray.exceptions import RayError

        results = RemoteCallResults()
        for ref in ready:
            tag, actor_id = meta[ref]
            if return_obj_refs:
                results.add_result(actor_id, ResultOrError(result=ref), tag)
                continue
            try:
                value = ray.get(ref)
            except RayError as err:
                label = f"{self.actor_label} {actor_id}"
                results.add_result(
                    actor_id, ResultOrError(error=label_remote_error(err, label)), tag
                )
                state = self._remote_actor_states.get(actor_id)
                if state is None:
                    continue
                if self._is_fault(err):
                    if state.is_healthy:
                        logger.error(
                            "Ray error (%s), taking %s out of service.",
                            type(err).__name__,
                            label,
                        )
                        self.set_actor_state(actor_id, healthy=False)
                else:
                    state.consecutive_timeouts = 0
                continue
            results.add_result(actor_id, ResultOrError(result=value), tag)
            state = self._remote_actor_states.get(actor_id)
            if state is None:
                continue
            state.consecutive_timeouts = 0
            if mark_healthy and not state.is_healthy:
                self.set_actor_state(actor_id, healthy=True)
                self._num_actor_restarts += 1
        return results

    def _missed_deadline(self, actor_id: int) -> None:
        """Count a missed deadline; kill the actor once it misses too many in a row."""
        import ray

        self._num_timed_out_calls += 1
        state = self._remote_actor_states.get(actor_id)
        if state is None:
            return
        state.consecutive_timeouts += 1
        limit = self.max_consecutive_timeouts
        if limit is None or state.consecutive_timeouts < max(1, limit) or not state.is_healthy:
            return
        logger.error(
            "%s %d missed %d deadlines in a row: it is hung; killing it (Ray restarts it if "
            "restarts are left).",
            self.actor_label,
            actor_id,
            state.consecutive_timeouts,
        )
        try:
            ray.kill(self._actors[actor_id], no_restart=False)
        except Exception as err:  # pragma: no cover - already gone
            logger.debug("ray.kill of a hung actor failed: %r", err)
        self.set_actor_state(actor_id, healthy=False)
        self._hung_kills.append(actor_id)
        self._num_hung_kills += 1

    # ------------------------------------------------------------------ sync calls
    def foreach_actor(
        self,
        func: Any,
        *,
        kwargs: dict | list[dict] | None = None,
        healthy_only: bool = True,
        remote_actor_ids: list[int] | None = None,
        timeout_seconds: float | None = None,
        return_obj_refs: bool = False,
        mark_healthy: bool = False,
    ) -> RemoteCallResults:
        """Call ``func(actor, **kwargs)`` on actors and wait for the results.

        Args:
            func: A callable, a method name, or a list of either (one per target).
            kwargs: One dict for all calls or a list of per-call dicts.
            healthy_only: Skip actors marked unhealthy.
            remote_actor_ids: Targets (repeats allowed); None or ``[]`` means all.
            timeout_seconds: None waits for all; 0 fires and forgets; a positive
                value drops (and counts) the calls not done in time.
            return_obj_refs: Return the ``ObjectRef`` of each call, not its value.
            mark_healthy: A successful call brings an unhealthy actor back.

        Returns:
            The results in call order; failed calls carry their error.
        """
        ids = list(remote_actor_ids or self.actor_ids())
        self._check_known(ids)
        funcs, kws = normalize_calls(func, kwargs, ids, "actor indices")
        if healthy_only:
            keep = [k for k, i in enumerate(ids) if self._remote_actor_states[i].is_healthy]
            ids, funcs, kws = (
                [ids[k] for k in keep],
                [funcs[k] for k in keep],
                [kws[k] for k in keep],
            )
        if not ids:
            return RemoteCallResults()
        import ray

        refs = [self._fire(i, f, kw) for i, f, kw in zip(ids, funcs, kws)]
        meta = {ref: (None, i) for ref, i in zip(refs, ids)}
        by_ref: dict[Any, CallResult] = {}

        def take(ready: list[Any]) -> None:
            got = self._collect(ready, meta, return_obj_refs, mark_healthy)
            by_ref.update(zip(ready, got.result_or_errors))

        if return_obj_refs or (timeout_seconds is not None and timeout_seconds <= 0):
            ready, not_ready = ray.wait(
                refs,
                num_returns=len(refs),
                timeout=timeout_seconds,
                fetch_local=not return_obj_refs,
            )
            take(ready)
        else:
            # Unpack each result as it arrives, overlapping the slower actors' work.
            deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
            not_ready = list(refs)
            while not_ready:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready, not_ready = ray.wait(not_ready, num_returns=1, timeout=left)
                if not ready:
                    break
                if not_ready:
                    more, not_ready = ray.wait(not_ready, num_returns=len(not_ready), timeout=0)
                    ready += more
                take(ready)
        if not_ready and timeout_seconds is not None and timeout_seconds > 0:
            for ref in not_ready:
                self._missed_deadline(meta[ref][1])
        results = RemoteCallResults()
        results.result_or_errors = [by_ref[r] for r in refs if r in by_ref]
        return results

    @staticmethod
    def handle_remote_call_result_errors(
        results_or_errors: RemoteCallResults, *, ignore_ray_errors: bool
    ) -> None:
        """Log each failed result if ``ignore_ray_errors``, else raise the first error."""
        for result in results_or_errors:
            if result.ok:
                continue
            if ignore_ray_errors:
                logger.error("Remote call to actor %s failed: %s", result.actor_id, result.get())
            else:
                raise result.get()

    def __repr__(self) -> str:
        return (
            f"FaultTolerantActorManager({self.num_healthy_actors()}/{self.num_actors()} healthy, "
            f"{self.num_outstanding_async_reqs()} in flight)"
        )
