"""Fault-aware remote calls on Ray actors (``ray.rllib.utils.actor_manager``).

``FaultAwareApply`` is the mixin every runner class inherits, so a Ray actor made
from a runner can be pinged and can run arbitrary functions on itself.
``FaultTolerantActorManager`` calls a set of such actors (synchronously, or
asynchronously with tags and a per-actor in-flight limit) and keeps their health
from the call results, as RLlib's manager does. ``ResultOrError``, ``CallResult``
and ``RemoteCallResults`` hold the outcomes of those calls. Differences from RLlib:

- the round-robin of ``foreach_actor_async`` targets real actor ids;
- results come back in call order (RLlib: completion order);
- a ``RayTaskError`` carries the actor id in its message;
- ``is_fault`` decides which errors take an actor out of service (default: every
  ``RayError``, as in RLlib);
- missed deadlines are counted, and with ``max_consecutive_timeouts`` an actor
  that misses that many in a row is killed (Ray restarts it if it may); with
  ``unhealthy_on_timeout`` an actor is out of service from its first miss and
  killed once its late call has run ``max_consecutive_timeouts`` deadlines;
- ``coalesce=True`` async calls are never dropped: a call that finds the tag's
  slots full waits as the actor's pending call, replaced by any newer one, and
  is sent before the next call of any tag to that actor;
- probes wait (up to their timeout) for actors that Ray is still starting or
  restarting, and skip dead ones.

Ray is imported lazily, so importing this module (as every runner does) is cheap.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from envrunners.errors import ConfigError

__all__ = [
    "CallResult",
    "FaultAwareApply",
    "FaultTolerantActorManager",
    "RemoteCallResults",
    "ResultOrError",
    "actor_node_id",
    "actor_state_in_gcs",
]

logger = logging.getLogger("envrunners")


# ---------------------------------------------------------------------- results
class ResultOrError:
    """The value returned by one remote call, or the error it raised.

    ``None`` is a valid result. A ``RayTaskError`` is stored as the instance that
    also derives from the remote exception's class (``isinstance(err, KeyError)``
    holds for a remote ``KeyError``).

    Args:
        result: The returned value.
        error: The exception, if the call failed.
    """

    __slots__ = ("_error", "_result")

    def __init__(self, result: Any = None, error: BaseException | None = None):
        self._result = result
        self._error = _as_instance_of_cause(error) if error is not None else None

    @property
    def ok(self) -> bool:
        """True when the call returned without error."""
        return self._error is None

    @property
    def result(self) -> Any:
        """The returned value (None for a failed call)."""
        return self._result

    @property
    def error(self) -> BaseException | None:
        """The exception of a failed call, else None."""
        return self._error

    def get(self) -> Any:
        """The error if there is one, else the result."""
        return self._error if self._error is not None else self._result

    def __repr__(self) -> str:
        if self.ok:
            return f"ResultOrError(result={self._result!r})"
        return f"ResultOrError(error={type(self._error).__name__})"


@dataclasses.dataclass
class CallResult:
    """One remote call's outcome, with the id of the actor that served it and its tag."""

    actor_id: int
    result_or_error: ResultOrError
    tag: str | None = None

    @property
    def ok(self) -> bool:
        """True when the call returned without error."""
        return self.result_or_error.ok

    def get(self) -> Any:
        """The error if there is one, else the result."""
        return self.result_or_error.get()


class RemoteCallResults:
    """The outcomes of a batch of remote calls, in the order they were collected."""

    def __init__(self) -> None:
        self.result_or_errors: list[CallResult] = []

    def add_result(self, actor_id: int, result_or_error: ResultOrError, tag: str | None) -> None:
        """Append one call's outcome."""
        self.result_or_errors.append(CallResult(actor_id, result_or_error, tag))

    def __len__(self) -> int:
        return len(self.result_or_errors)

    def __iter__(self) -> Iterator[CallResult]:
        # A copy, so callers may add results while iterating.
        return iter(list(self.result_or_errors))

    def ignore_errors(self) -> Iterator[CallResult]:
        """Only the successful results."""
        return (r for r in self.result_or_errors if r.ok)

    def ignore_ray_errors(self) -> Iterator[CallResult]:
        """The results whose ``get()`` is not a ``RayError``.

        Remote application errors arrive as ``RayTaskError`` (a ``RayError``), so
        in practice this yields the successful results only.
        """
        from ray.exceptions import RayError

        return (r for r in self.result_or_errors if not isinstance(r.get(), RayError))

    def __repr__(self) -> str:
        ok = sum(1 for r in self.result_or_errors if r.ok)
        return f"RemoteCallResults({ok} ok, {len(self) - ok} errors)"


def _as_instance_of_cause(error: BaseException) -> BaseException:
    """``RayTaskError`` → the variant that is also an instance of the user's class."""
    from ray.exceptions import RayTaskError

    if isinstance(error, RayTaskError):
        cause = getattr(error, "cause", None)
        if cause is not None and not isinstance(error, type(cause)):
            return error.as_instanceof_cause()
    return error


def label_remote_error(error: BaseException, label: str) -> BaseException:
    """Return ``error`` with ``label`` (e.g. ``"env runner 2"``) leading its message.

    Why: a ``RayTaskError`` names the remote function and pid but not which of a
    group's runners raised. The result is still a ``RayTaskError`` and still an
    instance of the original exception class, so ``except ValueError`` and
    ``except RayError`` both keep working. Other errors are returned unchanged.
    """
    from ray.exceptions import RayTaskError

    if not isinstance(error, RayTaskError):
        return error
    cause = getattr(error, "cause", None)
    if cause is None:
        return error
    text = f"{label} raised {type(cause).__name__}: {error}"
    relabelled = RayTaskError(
        getattr(error, "function_name", "apply"), text, cause, proctitle=label, pid=0, ip="-"
    )
    return _as_instance_of_cause(relabelled)


def remote_traceback_of(error: BaseException) -> str:
    """The remote traceback text carried by a (labelled) ``RayTaskError``, or ``str(error)``."""
    inner = getattr(error, "remote_traceback", None)
    if isinstance(inner, str) and inner:
        return inner
    return str(error)


# ---------------------------------------------------------------------- actor side
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


# ---------------------------------------------------------------------- manager
class CallMethod:
    """Picklable ``lambda actor, **kw: getattr(actor, name)(**kw)`` for string funcs."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __call__(self, actor: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(actor, self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<method {self.name}>"


class ActorMethod:
    """A call of the actor's own method ``name`` with the call's kwargs, instead of
    ``apply(func, **kwargs)``: no function is pickled and sent (about 30 us per call).

    With ``positional`` the kwargs' values go as positional arguments, in the kwargs'
    order (which must be the method's), as a plain ``actor.f.remote(ref, n)`` sends them.
    """

    __slots__ = ("name", "positional")

    def __init__(self, name: str, positional: bool = False):
        self.name = name
        self.positional = positional

    def __repr__(self) -> str:
        return f"<actor method {self.name}>"


@dataclasses.dataclass
class ActorState:
    """What the manager knows about one actor."""

    num_in_flight_async_requests_by_tag: dict[str | None, int] = dataclasses.field(
        default_factory=lambda: defaultdict(int)
    )
    is_healthy: bool = True
    consecutive_timeouts: int = 0
    pending: dict[str | None, tuple[Any, dict]] = dataclasses.field(default_factory=dict)


def normalize_calls(
    func: Any, kwargs: Any, ids: list[int], what: str
) -> tuple[list[Any], list[dict]]:
    """Per-call funcs and kwargs (strings become method calls)."""
    if isinstance(func, list):
        if len(func) != len(ids):
            raise AssertionError(f"Funcs must have the same number of callables as {what}.")
        if kwargs is not None and not isinstance(kwargs, list):
            raise AssertionError(
                "With a list of funcs, kwargs must be a list of dicts (one per func) or None."
            )
        funcs = list(func)
    else:
        funcs = [func] * len(ids)
    if isinstance(kwargs, list):
        if len(kwargs) != len(ids):
            raise AssertionError(f"kwargs must have the same number of dicts as {what}.")
        kws = [dict(k or {}) for k in kwargs]
    else:
        kws = [dict(kwargs or {}) for _ in ids]
    funcs = [CallMethod(f) if isinstance(f, str) else f for f in funcs]
    return funcs, kws


def _ping(actor: Any) -> Any:
    return actor.ping()


#: Ray actor states of an actor that is being started or restarted.
_STARTING = ("RESTARTING", "PENDING_CREATION", "DEPENDENCIES_UNREADY")


def actor_state_in_gcs(handle: Any) -> str | None:
    """Ray's view of an actor: ``"ALIVE"``, ``"RESTARTING"``, ``"DEAD"``, ... or None if unknown."""
    try:
        from ray._private import state as ray_state

        info = ray_state.actors(handle._actor_id.hex())
        return info.get("State") if isinstance(info, dict) else None
    except Exception:  # private API: any failure just means "unknown"
        return None


def actor_node_id(handle: Any) -> str | None:
    """The id of the node an actor runs on (hex), or None if unknown or not placed."""
    try:
        from ray._private import state as ray_state

        info = ray_state.actors(handle._actor_id.hex())
        address = info.get("Address") if isinstance(info, dict) else None
        return (address or {}).get("NodeID") or None
    except Exception:  # private API: any failure just means "unknown"
        return None


def _tag_matcher(tags: Any) -> Callable[[Any], bool]:
    """Which tags a fetch means: the given ones, or every user tag (not ``"__..."``)."""
    if isinstance(tags, str):
        wanted: set | None = {tags}
    elif tags is None or isinstance(tags, (list, tuple)):
        wanted = set(tags) if tags else None
    else:
        raise ValueError(f"tags must be a str, list or tuple, got {type(tags).__name__}")

    def match(tag: Any) -> bool:
        if wanted is None:
            return not (isinstance(tag, str) and tag.startswith("__"))
        return tag in wanted

    return match


def _default_is_fault(error: BaseException) -> bool:
    from ray.exceptions import RayError

    return isinstance(error, RayError)


class FaultTolerantActorManager:
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
        unhealthy_on_timeout: Take an actor out of service as soon as it misses a
            deadline, and watch its late call (``check_late_calls``): it is killed
            as hung once that call has run ``max_consecutive_timeouts`` deadlines.
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
        unhealthy_on_timeout: bool = False,
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
        #: Ids of actors that were ever marked unhealthy (lost), for reports.
        self.ever_unhealthy: set[int] = set()
        self._restored_actors: set[int] = set()
        self._in_flight_req_to_actor_id: dict[Any, tuple[str | None, int]] = {}
        #: When each async call in flight was sent (``time.monotonic()``).
        self._in_flight_sent_at: dict[Any, float] = {}
        #: When an actor's last async call was collected (its next one starts then).
        self._async_done_at: dict[int, float] = {}
        #: (actor id, calls dropped) of async calls that missed their deadline.
        self._expired_async: list[tuple[int, int]] = []
        self._current_actor_id = 0
        self._num_actor_restarts = 0
        self._num_timed_out_calls = 0
        self._hung_kills: list[int] = []
        self._num_hung_kills = 0
        self._is_fault = is_fault or _default_is_fault
        self.max_consecutive_timeouts = max_consecutive_timeouts
        self.unhealthy_on_timeout = bool(unhealthy_on_timeout)
        #: Calls that missed their deadline: ref -> (actor id, sent at, deadline in s).
        self._late_calls: dict[Any, tuple[int, float, float]] = {}
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
        self._forget_late_calls(actor_id)
        return handle

    def replace_actor(self, actor_id: int, handle: Any) -> None:
        """Put a new handle under an existing id (marked unhealthy until restored)."""
        self._check_known([actor_id])
        self.set_actor_state(actor_id, healthy=False)
        self._forget_late_calls(actor_id)
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
        self._in_flight_sent_at.clear()
        self._async_done_at.clear()
        self._late_calls.clear()
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

    def num_pending_calls(self, tag: str | None = None) -> int:
        """Coalesced calls waiting for a free slot (over all tags, or one tag)."""
        return sum(
            (len(s.pending) if tag is None else int(tag in s.pending))
            for s in self._remote_actor_states.values()
        )

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
            self._forget_late_calls(actor_id)
        elif not healthy:
            self.ever_unhealthy.add(actor_id)
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
            self._forget_late_calls(actor_id)
        state.is_healthy = True
        state.consecutive_timeouts = 0

    def _forget_in_flight(self, actor_id: int) -> None:
        for ref in [
            r for r, (_, aid) in self._in_flight_req_to_actor_id.items() if aid == actor_id
        ]:
            del self._in_flight_req_to_actor_id[ref]
            self._in_flight_sent_at.pop(ref, None)
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

    def _calls(
        self, func: Any, kwargs: Any, ids: list[int], what: str, healthy_only: bool
    ) -> list[tuple[int, Any, dict]]:
        """``(actor id, func, kwargs)`` of each call to make (unhealthy targets left out)."""
        funcs, kws = normalize_calls(func, kwargs, ids, what)
        calls = zip(ids, funcs, kws)
        if healthy_only:
            return [c for c in calls if self._remote_actor_states[c[0]].is_healthy]
        return list(calls)

    def _fire(self, actor_id: int, func: Any, kw: dict) -> Any:
        """Send one call (after the actor's pending coalesced calls)."""
        self._fire_pending(actor_id)
        return self._submit(actor_id, func, kw)

    def _submit(self, actor_id: int, func: Any, kw: dict) -> Any:
        """``actor.apply.remote(func, **kw)``, or the actor's own method for an ``ActorMethod``."""
        actor = self._actors[actor_id]
        if type(func) is ActorMethod:
            if func.positional:
                return getattr(actor, func.name).remote(*kw.values())
            return getattr(actor, func.name).remote(**kw)
        return actor.apply.remote(func, **kw)

    def _fire_pending(self, actor_id: int, only_free_slots: bool = False) -> None:
        """Send the actor's coalesced calls (all, or those whose tag has a free slot)."""
        state = self._remote_actor_states.get(actor_id)
        if state is None or not state.pending:
            return
        for tag in list(state.pending):
            if only_free_slots and (
                state.num_in_flight_async_requests_by_tag.get(tag, 0) >= self._max_in_flight
            ):
                continue
            func, kw = state.pending.pop(tag)
            ref = self._submit(actor_id, func, kw)
            state.num_in_flight_async_requests_by_tag[tag] += 1
            self._in_flight_req_to_actor_id[ref] = (tag, actor_id)
            self._in_flight_sent_at[ref] = time.monotonic()

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
        values: dict[Any, Any] = {}
        if len(ready) > 1 and not return_obj_refs:
            try:  # one call for all (the usual case); per call below only after an error
                values = dict(zip(ready, ray.get(ready)))
            except RayError:
                values = {}
        for ref in ready:
            tag, actor_id = meta[ref]
            if return_obj_refs:
                results.add_result(actor_id, ResultOrError(result=ref), tag)
                continue
            try:
                value = values[ref] if ref in values else ray.get(ref)
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

    def _missed_deadline(self, actor_id: int, ref: Any, sent_at: float, timeout: float) -> None:
        """Count a missed deadline; take the actor out (``unhealthy_on_timeout``) or kill
        it once it misses ``max_consecutive_timeouts`` in a row."""
        self._num_timed_out_calls += 1
        state = self._remote_actor_states.get(actor_id)
        if state is None:
            return
        state.consecutive_timeouts += 1
        if self.unhealthy_on_timeout:
            self._late_calls[ref] = (actor_id, sent_at, timeout)
            if state.is_healthy:
                logger.warning(
                    "%s %d missed its %ss deadline: out of service until its late call "
                    "returns (killed as hung if it has not after %s deadlines).",
                    self.actor_label,
                    actor_id,
                    timeout,
                    self.max_consecutive_timeouts,
                )
                self.set_actor_state(actor_id, healthy=False)
            if (self.max_consecutive_timeouts or 1) <= 1:
                self._kill_hung(actor_id, 1)  # one deadline is all it gets
            return
        limit = self.max_consecutive_timeouts
        if limit is None or state.consecutive_timeouts < max(1, limit) or not state.is_healthy:
            return
        self._kill_hung(actor_id, state.consecutive_timeouts)

    def _kill_hung(self, actor_id: int, deadlines: int) -> None:
        """Kill a hung actor (Ray restarts it if it may) and report it (``take_hung_actor_kills``)."""
        import ray

        logger.error(
            "%s %d missed %d deadlines in a row: it is hung; killing it (Ray restarts it if "
            "restarts are left).",
            self.actor_label,
            actor_id,
            deadlines,
        )
        try:
            ray.kill(self._actors[actor_id], no_restart=False)
        except Exception as err:  # pragma: no cover - already gone
            logger.debug("ray.kill of a hung actor failed: %r", err)
        self.set_actor_state(actor_id, healthy=False)
        self._forget_late_calls(actor_id)
        self._hung_kills.append(actor_id)
        self._num_hung_kills += 1

    def _forget_late_calls(self, actor_id: int) -> None:
        for ref in [r for r, (aid, _, _) in self._late_calls.items() if aid == actor_id]:
            del self._late_calls[ref]

    def late_actor_ids(self, overdue_only: bool = False) -> list[int]:
        """Ids of the actors with a call that missed its deadline and has not returned.

        With ``overdue_only``, only those whose call has run past its deadline (not
        calls set aside before it, see ``set_aside``).
        """
        if not overdue_only:
            return sorted({aid for aid, _, _ in self._late_calls.values()})
        now = time.monotonic()
        return sorted({aid for aid, sent, t in self._late_calls.values() if now - sent >= t})

    def check_late_calls(self) -> RemoteCallResults:
        """Collect the late calls that returned; kill the actors whose late call is hung.

        Only with ``unhealthy_on_timeout``. A late call still running
        ``max_consecutive_timeouts`` deadlines after it was sent gets its actor
        killed (see ``take_hung_actor_kills``). Never blocks.

        Returns:
            The returned late calls (values or errors); their actors stay unhealthy
            (the caller restores them).
        """
        if not self._late_calls:
            return RemoteCallResults()
        import ray

        refs = list(self._late_calls)
        ready, not_ready = ray.wait(refs, num_returns=len(refs), timeout=0)
        meta = {r: (None, self._late_calls.pop(r)[0]) for r in ready}
        results = self._collect(ready, meta, return_obj_refs=False, mark_healthy=False)
        limit = max(1, self.max_consecutive_timeouts or 1)
        now = time.monotonic()
        for ref in not_ready:
            entry = self._late_calls.get(ref)
            if entry is None:  # forgotten with an earlier ref of the same actor
                continue
            actor_id, sent_at, timeout = entry
            if now - sent_at >= limit * timeout and actor_id in self._actors:
                self._kill_hung(actor_id, limit)
        return results

    def next_hung_check_at(self) -> float | None:
        """When (``time.monotonic()``) the oldest late call turns hung; None without one.

        A waiting caller wakes by then and calls ``check_late_calls``, so a hung
        actor is killed when its call has run ``max_consecutive_timeouts``
        deadlines, not at the next call after that.
        """
        if not self._late_calls:
            return None
        limit = max(1, self.max_consecutive_timeouts or 1)
        return min(sent_at + limit * timeout for _, sent_at, timeout in self._late_calls.values())

    def set_aside(self, actor_id: int, ref: Any, sent_at: float, timeout: float) -> None:
        """Leave a call still running, not yet late, to the late-call watch.

        For a caller that stops waiting before the deadline (its batch is full):
        the actor is out of service until the call returns (its result is
        dropped; the caller restores the actor) and killed as hung once the call
        has run ``max_consecutive_timeouts`` deadlines (``check_late_calls``).
        """
        state = self._remote_actor_states.get(actor_id)
        if state is None:
            return
        self._late_calls[ref] = (actor_id, sent_at, timeout)
        if state.is_healthy:
            logger.warning(
                "%s %d is still busy with a call the batch was filled without: out of "
                "service until it returns (killed as hung if it has not after %s deadlines "
                "of %ss).",
                self.actor_label,
                actor_id,
                self.max_consecutive_timeouts,
                timeout,
            )
            self.set_actor_state(actor_id, healthy=False)

    def fire(self, actor_id: int, func: Any, kwargs: dict) -> Any:
        """Send one call to an actor now (after its pending coalesced calls); its ref."""
        self._check_known([actor_id])
        funcs, kws = normalize_calls(func, kwargs, [actor_id], "actor indices")
        return self._fire(actor_id, funcs[0], kws[0])

    def collect(self, calls: dict[Any, int], ready: list[Any]) -> RemoteCallResults:
        """Results of the ``ready`` refs among ``calls`` (ref -> actor id) sent by ``fire``."""
        return self._collect(ready, {r: (None, calls[r]) for r in ready}, False, False)

    def missed_deadline(self, actor_id: int, ref: Any, sent_at: float, timeout: float) -> None:
        """Count a call sent by ``fire`` that missed its deadline (see ``foreach_actor``)."""
        self._missed_deadline(actor_id, ref, sent_at, timeout)

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
        calls = self._calls(func, kwargs, ids, "actor indices", healthy_only)
        if not calls:
            return RemoteCallResults()
        import ray

        sent_at = time.monotonic()
        refs = [self._fire(i, f, kw) for i, f, kw in calls]
        meta = {ref: (None, i) for ref, (i, _, _) in zip(refs, calls)}
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
                self._missed_deadline(meta[ref][1], ref, sent_at, timeout_seconds)
        results = RemoteCallResults()
        results.result_or_errors = [by_ref[r] for r in refs if r in by_ref]
        return results

    # ------------------------------------------------------------------ async calls
    def foreach_actor_async(
        self,
        func: Any,
        tag: str | None = None,
        *,
        kwargs: dict | list[dict] | None = None,
        healthy_only: bool = True,
        remote_actor_ids: list[int] | None = None,
        coalesce: bool = False,
    ) -> int:
        """Fire calls without waiting; collect them later with ``fetch_ready_async_reqs``.

        Per actor and tag at most ``max_remote_requests_in_flight_per_actor`` calls
        are outstanding. Calls beyond that are dropped, or with ``coalesce=True``
        kept as the actor's one pending call for the tag (a newer one replaces it).

        Returns:
            How many calls were sent (plus, with ``coalesce``, how many were queued).
        """
        ids = list(remote_actor_ids or self.actor_ids())
        self._check_known(ids)
        if isinstance(func, list):
            num_calls = len(func)
        elif isinstance(kwargs, list):
            num_calls = len(kwargs)
        else:
            num_calls = len(ids)
        if num_calls != len(ids):
            every = self.actor_ids()
            if not every:
                return 0
            ids = [every[(self._current_actor_id + k) % len(every)] for k in range(num_calls)]
            self._current_actor_id = (self._current_actor_id + num_calls) % len(every)
        sent = 0
        for actor_id, f, kw in self._calls(func, kwargs, ids, "remote actor ids", healthy_only):
            state = self._remote_actor_states[actor_id]
            in_flight = state.num_in_flight_async_requests_by_tag.get(tag, 0)
            if in_flight >= self._max_in_flight:
                if coalesce:
                    state.pending[tag] = (f, kw)
                    sent += 1
                continue
            ref = self._fire(actor_id, f, kw)
            state.num_in_flight_async_requests_by_tag[tag] += 1
            self._in_flight_req_to_actor_id[ref] = (tag, actor_id)
            self._in_flight_sent_at[ref] = time.monotonic()
            sent += 1
        return sent

    def fetch_ready_async_reqs(
        self,
        *,
        tags: str | list[str] | tuple[str, ...] | None = (),
        timeout_seconds: float | None = 0.0,
        return_obj_refs: bool = False,
        mark_healthy: bool = False,
        request_timeout_s: float | None = None,
    ) -> RemoteCallResults:
        """Collect the async calls (of ``tags``; None/empty = all) that are done.

        Calls not done within ``timeout_seconds`` stay in flight for a later fetch.
        Tags starting with ``"__"`` are internal and only fetched when named.
        With ``request_timeout_s``, a call of these tags that has run longer than
        that is a missed deadline (see ``expire_async_reqs``); the wait ends
        early for nothing but that.
        """
        match = _tag_matcher(tags)
        meta = {r: m for r, m in self._in_flight_req_to_actor_id.items() if match(m[0])}
        if not meta:
            return RemoteCallResults()
        import ray

        ready: list[Any] = []
        waiting = list(meta)
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        while True:
            now = time.monotonic()
            left = None if deadline is None else max(0.0, deadline - now)
            expiry = self._next_expiry(request_timeout_s, match)
            if expiry is not None:
                # (a due expiry of a call that is done but not local yet: no busy loop)
                until = max(0.005, expiry - now)
                left = until if left is None else min(left, until)
            got, waiting = ray.wait(
                waiting, num_returns=len(waiting), timeout=left, fetch_local=not return_obj_refs
            )
            ready += got
            for ref in got:  # collected below: no longer in flight (nor expiring)
                self._take_in_flight(ref)
            if request_timeout_s is not None and request_timeout_s > 0:
                self.expire_async_reqs(request_timeout_s, tags=tags)
            waiting = [r for r in waiting if r in self._in_flight_req_to_actor_id]
            if not waiting or (deadline is not None and time.monotonic() >= deadline):
                break
            if timeout_seconds is not None and timeout_seconds <= 0:
                break
        touched = {meta[ref][1] for ref in ready}
        ready_set = set(ready)
        results = self._collect(
            [r for r in meta if r in ready_set], meta, return_obj_refs, mark_healthy
        )
        for actor_id in touched:
            state = self._remote_actor_states.get(actor_id)
            if state is not None and state.is_healthy:
                self._fire_pending(actor_id, only_free_slots=True)
        return results

    def wait_async_reqs(
        self,
        tags: str | list[str] | tuple[str, ...] | None,
        timeout_seconds: float,
        *,
        request_timeout_s: float | None = None,
    ) -> bool:
        """Block until ONE async call of ``tags`` is done (or ``timeout_seconds``); whether one is.

        Why: ``fetch_ready_async_reqs`` waits for all calls or the timeout, so a
        caller that wants each result as soon as it comes had to poll with short
        timeouts, a full bookkeeping pass per wake-up. This collects nothing (fetch
        with ``timeout_seconds=0`` next); with ``request_timeout_s`` the wait also
        ends when the oldest running call reaches that deadline.
        """
        match = _tag_matcher(tags)
        refs = [r for r, m in self._in_flight_req_to_actor_id.items() if match(m[0])]
        if not refs:
            return False
        import ray

        left = max(0.0, timeout_seconds)
        expiry = self._next_expiry(request_timeout_s, match)
        if expiry is not None:
            left = min(left, max(0.005, expiry - time.monotonic()))
        ready, _ = ray.wait(refs, num_returns=1, timeout=left, fetch_local=True)
        return bool(ready)

    def _take_in_flight(self, ref: Any) -> None:
        """Forget a collected async call (its slot is free again)."""
        tag, actor_id = self._in_flight_req_to_actor_id.pop(ref)
        self._in_flight_sent_at.pop(ref, None)
        self._async_done_at[actor_id] = time.monotonic()
        state = self._remote_actor_states.get(actor_id)
        if state is not None and state.num_in_flight_async_requests_by_tag.get(tag, 0) > 0:
            state.num_in_flight_async_requests_by_tag[tag] -= 1

    def _running_async(self, match: Callable[[Any], bool]) -> dict[int, tuple[Any, float]]:
        """Per actor, its oldest async call of the matched tags and when it started running.

        An actor runs its calls one after the other: a call sent while an older
        one was running starts when that one was collected.
        """
        oldest: dict[int, tuple[Any, float]] = {}
        for ref, (tag, actor_id) in self._in_flight_req_to_actor_id.items():
            if not match(tag):
                continue
            sent = self._in_flight_sent_at.get(ref)
            if sent is None:
                continue
            if actor_id not in oldest or sent < oldest[actor_id][1]:
                oldest[actor_id] = (ref, sent)
        return {
            aid: (ref, max(sent, self._async_done_at.get(aid, 0.0)))
            for aid, (ref, sent) in oldest.items()
        }

    def _next_expiry(self, timeout: float | None, match: Callable[[Any], bool]) -> float | None:
        if timeout is None or timeout <= 0:
            return None
        running = self._running_async(match)
        return min((start + timeout for _, start in running.values()), default=None)

    def expire_async_reqs(
        self, timeout_seconds: float, *, tags: str | list[str] | tuple[str, ...] | None = ()
    ) -> None:
        """Count async calls (of ``tags``, as in ``fetch_ready_async_reqs``) running longer
        than ``timeout_seconds`` as missed deadlines, like late synchronous calls.

        The call is no longer in flight (its result is dropped); its actor misses
        a deadline (with ``unhealthy_on_timeout`` it is out of service at once,
        its other calls are dropped with it, and its late call is watched: see
        ``check_late_calls``). A call's clock starts when it was sent or, if the
        actor was busy with an older async call then, when that one was collected.
        What was dropped is reported by ``take_expired_async_reqs``.
        """
        if not self._in_flight_sent_at:
            return
        match = _tag_matcher(tags)
        now = time.monotonic()
        late = {
            ref: (actor_id, start)
            for actor_id, (ref, start) in self._running_async(match).items()
            if now - start >= timeout_seconds
        }
        if not late:
            return
        import ray

        # Done but not collected yet (the caller fetches later) is not late.
        done, _ = ray.wait(list(late), num_returns=len(late), timeout=0, fetch_local=False)
        for ref in done:
            del late[ref]
        for ref, (actor_id, start) in late.items():
            if ref not in self._in_flight_req_to_actor_id:
                continue
            tag, _ = self._in_flight_req_to_actor_id[ref]
            self._in_flight_req_to_actor_id.pop(ref)
            self._in_flight_sent_at.pop(ref, None)
            state = self._remote_actor_states.get(actor_id)
            if state is not None and state.num_in_flight_async_requests_by_tag.get(tag, 0) > 0:
                state.num_in_flight_async_requests_by_tag[tag] -= 1
            was_healthy = state is not None and state.is_healthy
            others = [r for r, (t, a) in self._in_flight_req_to_actor_id.items() if a == actor_id]
            lost = 1 + sum(1 for r in others if match(self._in_flight_req_to_actor_id[r][0]))
            self._missed_deadline(actor_id, ref, start, timeout_seconds)
            if not (was_healthy and self.unhealthy_on_timeout):
                lost = 1  # the actor's other calls stay in flight
            self._expired_async.append((actor_id, lost))

    def take_expired_async_reqs(self) -> list[tuple[int, int]]:
        """``(actor id, calls dropped)`` of async calls expired since the last call."""
        out, self._expired_async = self._expired_async, []
        return out

    def foreach_actor_async_fetch_ready(
        self,
        func: Any,
        tag: str | None = None,
        *,
        kwargs: dict | list[dict] | None = None,
        timeout_seconds: float | None = 0.0,
        return_obj_refs: bool = False,
        mark_healthy: bool = False,
        healthy_only: bool = True,
        remote_actor_ids: list[int] | None = None,
        ignore_ray_errors: bool = True,
        return_actor_ids: bool = False,
    ) -> list[Any]:
        """Collect the ready results of ``tag``, then fire new calls; return the good results."""
        results = self.fetch_ready_async_reqs(
            tags=tag,
            timeout_seconds=timeout_seconds,
            return_obj_refs=return_obj_refs,
            mark_healthy=mark_healthy,
        )
        self.foreach_actor_async(
            func,
            tag,
            kwargs=kwargs,
            healthy_only=healthy_only,
            remote_actor_ids=remote_actor_ids,
        )
        self.handle_remote_call_result_errors(results, ignore_ray_errors=ignore_ray_errors)
        if return_actor_ids:
            return [(r.actor_id, r.get()) for r in results.ignore_errors()]
        return [r.get() for r in results.ignore_errors()]

    # ------------------------------------------------------------------ probing
    def probe_unhealthy_actors(
        self, timeout_seconds: float | None = None, mark_healthy: bool = False
    ) -> list[int]:
        """Ping the unhealthy actors; return those that answer (and those restored before).

        As in RLlib, the pings wait up to ``timeout_seconds`` (None: until each
        answers or dies), so an actor that Ray is still starting or restarting
        is restored when it comes up within that time. A ping that fails while
        its actor is restarting is sent again; dead actors are skipped. Without
        ``mark_healthy`` responsive actors are returned but stay unhealthy.
        """
        import ray

        already = sorted(self._restored_actors)
        unhealthy = [i for i, s in self._remote_actor_states.items() if not s.is_healthy]
        deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
        just: list[int] = []
        refs: dict[Any, int] = {}
        retry: list[int] = [i for i in unhealthy if actor_state_in_gcs(self._actors[i]) != "DEAD"]
        while retry or refs:
            for actor_id in retry:
                refs[self._actors[actor_id].apply.remote(_ping)] = actor_id
            retry = []
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=left)
            if not ready:
                break
            meta = {r: (None, refs.pop(r)) for r in ready}
            for result in self._collect(ready, meta, False, mark_healthy):
                if result.ok:
                    just.append(result.actor_id)
                elif result.actor_id in self._actors:
                    gcs = actor_state_in_gcs(self._actors[result.actor_id])
                    if gcs in _STARTING or (gcs != "DEAD" and deadline is not None):
                        retry.append(result.actor_id)  # sent before a restart: ping again
            if retry:
                time.sleep(0.05)
        self._restored_actors.clear()
        return already + [i for i in just if i not in already]

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
