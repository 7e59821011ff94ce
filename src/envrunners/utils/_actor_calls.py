"""Async calls and probes of ``FaultTolerantActorManager``, and its per-actor bookkeeping.

``foreach_actor_async`` fires calls without waiting, at most
``max_remote_requests_in_flight_per_actor`` per actor and tag; ``coalesce=True``
keeps a call that finds the slots full as the actor's pending call (a newer one
replaces it), sent before the next call of any tag to that actor or as soon as a
slot frees. ``fetch_ready_async_reqs`` collects finished calls by tag.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from envrunners.utils._actor_results import RemoteCallResults

__all__ = [
    "ActorState",
    "AsyncCallsMixin",
    "CallMethod",
    "actor_state_in_gcs",
    "normalize_calls",
]


class CallMethod:
    """Picklable ``lambda actor, **kw: getattr(actor, name)(**kw)`` for string funcs."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __call__(self, actor: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(actor, self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<method {self.name}>"


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


#: Ray actor states in which a call cannot be served yet (or ever).
_NOT_SERVING = ("RESTARTING", "PENDING_CREATION", "DEPENDENCIES_UNREADY", "DEAD")


def actor_state_in_gcs(handle: Any) -> str | None:
    """Ray's view of an actor: ``"ALIVE"``, ``"RESTARTING"``, ``"DEAD"``, ... or None if unknown."""
    try:
        from ray._private import state as ray_state

        info = ray_state.actors(handle._actor_id.hex())
        return info.get("State") if isinstance(info, dict) else None
    except Exception:  # private API: any failure just means "unknown"
        return None


class AsyncCallsMixin:
    """Async calls and probes of ``FaultTolerantActorManager`` (a private mixin)."""

    _actors: dict[int, Any]
    _remote_actor_states: dict[int, ActorState]
    _in_flight_req_to_actor_id: dict[Any, tuple[str | None, int]]
    _max_in_flight: int
    _current_actor_id: int
    actor_ids: Any
    _check_known: Any
    _fire: Any
    _collect: Any
    handle_remote_call_result_errors: Any
    foreach_actor: Any
    _restored_actors: set[int]

    def num_pending_calls(self, tag: str | None = None) -> int:
        """Coalesced calls waiting for a free slot (over all tags, or one tag)."""
        return sum(
            (len(s.pending) if tag is None else int(tag in s.pending))
            for s in self._remote_actor_states.values()
        )

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
            ref = self._actors[actor_id].apply.remote(func, **kw)
            state.num_in_flight_async_requests_by_tag[tag] += 1
            self._in_flight_req_to_actor_id[ref] = (tag, actor_id)

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
        funcs, kws = normalize_calls(func, kwargs, ids, "remote actor ids")
        if healthy_only:
            keep = [k for k, i in enumerate(ids) if self._remote_actor_states[i].is_healthy]
            ids, funcs, kws = (
                [ids[k] for k in keep],
                [funcs[k] for k in keep],
                [kws[k] for k in keep],
            )
        sent = 0
        for actor_id, f, kw in zip(ids, funcs, kws):
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
            sent += 1
        return sent

    def fetch_ready_async_reqs(
        self,
        *,
        tags: str | list[str] | tuple[str, ...] | None = (),
        timeout_seconds: float | None = 0.0,
        return_obj_refs: bool = False,
        mark_healthy: bool = False,
    ) -> RemoteCallResults:
        """Collect the async calls (of ``tags``; None/empty = all) that are done.

        Calls not done within ``timeout_seconds`` stay in flight for a later fetch.
        Tags starting with ``"__"`` are internal and only fetched when named.
        """
        if isinstance(tags, str):
            wanted: set | None = {tags}
        elif tags is None or isinstance(tags, (list, tuple)):
            wanted = set(tags) if tags else None
        else:
            raise ValueError(f"tags must be a str, list or tuple, got {type(tags).__name__}")

        def match(tag: str | None) -> bool:
            if wanted is None:
                return not (isinstance(tag, str) and tag.startswith("__"))
            return tag in wanted

        meta = {r: m for r, m in self._in_flight_req_to_actor_id.items() if match(m[0])}
        if not meta:
            return RemoteCallResults()
        import ray

        refs = list(meta)
        ready, _ = ray.wait(
            refs, num_returns=len(refs), timeout=timeout_seconds, fetch_local=not return_obj_refs
        )
        touched = set()
        for ref in ready:
            tag, actor_id = self._in_flight_req_to_actor_id.pop(ref)
            state = self._remote_actor_states.get(actor_id)
            if state is not None and state.num_in_flight_async_requests_by_tag.get(tag, 0) > 0:
                state.num_in_flight_async_requests_by_tag[tag] -= 1
            touched.add(actor_id)
        ready_set = set(ready)
        results = self._collect(
            [r for r in refs if r in ready_set], meta, return_obj_refs, mark_healthy
        )
        for actor_id in touched:
            state = self._remote_actor_states.get(actor_id)
            if state is not None and state.is_healthy:
                self._fire_pending(actor_id, only_free_slots=True)
        return results

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

        Actors that Ray reports as restarting or dead are not pinged (a ping to a
        restarting actor only fails after a second). Without ``mark_healthy``
        responsive actors are returned but stay unhealthy.
        """
        already = sorted(self._restored_actors)
        unhealthy = [i for i, s in self._remote_actor_states.items() if not s.is_healthy]
        candidates = [
            i for i in unhealthy if actor_state_in_gcs(self._actors[i]) not in _NOT_SERVING
        ]
        just: list[int] = []
        if candidates:
            results = self.foreach_actor(
                _ping,
                remote_actor_ids=candidates,
                healthy_only=False,
                timeout_seconds=timeout_seconds,
                mark_healthy=mark_healthy,
            )
            just = [r.actor_id for r in results if r.ok]
        self._restored_actors.clear()
        return already + [i for i in just if i not in already]
