"""``PolicyMap``: policy id -> ``Policy``, holding at most ``capacity`` policies in memory.

Why: league-style training adds many policies to a worker; keeping all of them
alive costs memory. The map keeps the ``capacity`` most recently used policies
and stashes the state of the others (in Ray's object store when Ray is running,
else in this process), rebuilding a stashed policy on its next access. With
``policy_states_are_swappable`` the evicted policy object is reused and only its
state is swapped in, which is much cheaper than building a new policy.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from envrunners.errors import ConfigError, UnknownPolicyError
from envrunners.policy.policy import Policy

__all__ = ["PolicyMap"]

_DEPRECATED_ARGS = ("worker_index", "num_workers", "session_creator", "seed")


def _locked(method: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(self: PolicyMap, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


def _put(state: Any) -> Any:
    try:
        import ray

        if ray.is_initialized():
            return ray.put(state)
    except ImportError:  # pragma: no cover - ray is a dependency
        pass
    return _LocalRef(state)


def _get(ref: Any) -> Any:
    if isinstance(ref, _LocalRef):
        return ref.value
    import ray

    return ray.get(ref)


class _LocalRef:
    """A stashed state kept in this process (Ray is not running)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class PolicyMap(dict):
    """An LRU cache of policies keyed by policy id, stashing the least recently used.

    Args:
        capacity: How many policies to keep in memory at most.
        policy_states_are_swappable: All policies share one class and architecture,
            so a stashed policy can be restored into an evicted policy object.
        worker_index, num_workers, session_creator, seed: Deprecated, ignored.
        policy_config: Deprecated; raises.

    Raises:
        ConfigError: ``policy_config`` is given or ``capacity < 1``.
    """

    def __init__(
        self,
        *,
        capacity: int = 100,
        policy_states_are_swappable: bool = False,
        policy_config: Any = None,
        **deprecated: Any,
    ):
        super().__init__()
        if policy_config is not None:
            raise ConfigError(
                "PolicyMap(policy_config=...) is deprecated and no longer accepted; "
                "drop the argument."
            )
        unknown = set(deprecated) - set(_DEPRECATED_ARGS)
        if unknown:
            raise TypeError(f"PolicyMap() got unexpected keyword arguments {sorted(unknown)}")
        if int(capacity) < 1:
            raise ConfigError(f"PolicyMap capacity must be >= 1, got {capacity!r}")
        self.capacity = int(capacity)
        self.policy_states_are_swappable = bool(policy_states_are_swappable)
        self.cache: dict[str, Policy] = {}
        self._valid_keys: set[str] = set()
        self._deque: deque[str] = deque()
        self._policy_state_refs: dict[str, Any] = {}
        self._lock = threading.RLock()

    # -- access --------------------------------------------------------------------
    @_locked
    def __getitem__(self, key: str) -> Policy:
        """The policy for ``key``; a stashed one is restored (evicting the LRU one if full).

        Raises:
            UnknownPolicyError: ``key`` is not in the map (a ``KeyError``).
        """
        if key not in self._valid_keys:
            raise UnknownPolicyError(
                f"PolicyID {key!r} not found in this PolicyMap! IDs stored in this map: "
                f"{sorted(self._valid_keys, key=str)}."
            )
        if key in self.cache:
            self._deque.remove(key)
            self._deque.append(key)
            return self.cache[key]
        ref = self._policy_state_refs.get(key)
        assert ref is not None, f"PolicyMap: no stashed state for policy {key!r}"
        state = _get(ref)
        evicted = self._stash_lru() if len(self._deque) >= self.capacity else None
        if self.policy_states_are_swappable and evicted is not None:
            evicted.set_state(state)
            policy = evicted
        else:
            policy = Policy.from_state(state)
        del self._policy_state_refs[key]
        self.cache[key] = policy
        self._deque.append(key)
        return policy

    @_locked
    def __setitem__(self, key: str, value: Policy) -> None:
        """Add (or replace) a policy as most recently used, stashing the LRU one if full."""
        if key in self.cache:
            self._deque.remove(key)
        else:
            self._policy_state_refs.pop(key, None)
            if len(self._deque) >= self.capacity:
                self._stash_lru()
        self._deque.append(key)
        self.cache[key] = value
        self._valid_keys.add(key)

    @_locked
    def __delitem__(self, key: str) -> None:
        """Remove ``key`` (cached or stashed).

        Raises:
            UnknownPolicyError: ``key`` is not in the map.
        """
        if key not in self._valid_keys:
            raise UnknownPolicyError(
                f"PolicyID {key!r} not found in this PolicyMap! IDs stored in this map: "
                f"{sorted(self._valid_keys, key=str)}."
            )
        self._valid_keys.remove(key)
        if key in self.cache:
            self._deque.remove(key)
            del self.cache[key]
        self._policy_state_refs.pop(key, None)

    def _stash_lru(self) -> Policy:
        """Move the least recently used policy's state out of memory; return the object."""
        key = self._deque.popleft()
        policy = self.cache.pop(key)
        self._policy_state_refs[key] = _put(policy.get_state())
        return policy

    # -- dict API ------------------------------------------------------------------
    def __iter__(self) -> Iterator[str]:
        return iter(list(self._valid_keys))

    def keys(self) -> Iterator[str]:  # type: ignore[override]
        """All policy ids (without loading stashed policies)."""
        with self._lock:
            snapshot = list(self._valid_keys)
        return (k for k in snapshot)

    def values(self) -> Iterator[Policy]:  # type: ignore[override]
        """Every policy (stashed ones are loaded, one after the other)."""
        return (self[k] for k in self.keys())

    def items(self) -> Iterator[tuple[str, Policy]]:  # type: ignore[override]
        """``(policy_id, policy)`` pairs, loading each policy as it is reached."""
        return ((k, self[k]) for k in self.keys())

    @_locked
    def update(self, __m: Mapping[str, Policy] | None = None, **kwargs: Policy) -> None:  # type: ignore[override]
        """``self[k] = v`` for every entry."""
        for key, value in dict(__m or {}, **kwargs).items():
            self[key] = value

    @_locked
    def get(self, key: str) -> Policy | None:  # type: ignore[override]
        """The policy for ``key``, or None if it is unknown."""
        return self[key] if key in self._valid_keys else None

    def __len__(self) -> int:
        """The number of policies, stashed ones included."""
        return len(self._valid_keys)

    def __contains__(self, key: object) -> bool:
        return key in self._valid_keys

    def __bool__(self) -> bool:
        return bool(self._valid_keys)

    def __str__(self) -> str:
        ids = sorted(self._valid_keys, key=str)
        return f"<PolicyMap lru-caching-capacity={self.capacity} policy-IDs={ids}>"

    __repr__ = __str__
