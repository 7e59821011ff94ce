"""Driver-side sync of old-stack observation filters (``ray.rllib.utils.filter_manager``).

Why: each remote worker normalises with its own copy of the filters and records
what it saw in a delta buffer. ``FilterManager.synchronize`` pulls those deltas,
merges them into the driver's filters and pushes the merged filters back, so all
workers normalise with statistics over everyone's data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from envrunners.errors import UnknownPolicyError
from envrunners.utils.filter import Filter

__all__ = ["FilterManager"]

logger = logging.getLogger(__name__)


def _foreach(worker_set: Any) -> Callable[..., list[Any]]:
    """Return the group's ``foreach_env_runner`` (or the legacy ``foreach_worker``)."""
    fn = getattr(worker_set, "foreach_env_runner", None)
    return fn if fn is not None else worker_set.foreach_worker


def _num_healthy_remotes(worker_set: Any) -> int | None:
    for name in ("num_healthy_remote_env_runners", "num_healthy_remote_workers"):
        fn = getattr(worker_set, name, None)
        if fn is not None:
            return int(fn())
    return None


def _check_count(worker_set: Any, got: int, what: str, timeout_seconds: float | None) -> None:
    expected = _num_healthy_remotes(worker_set)
    if expected is not None and got != expected:
        logger.error(
            "FilterManager: %s %d of %d healthy remote env runners (timeout_seconds=%s); "
            "the others timed out or failed. Raise sync_filters_on_rollout_workers_timeout_s "
            "if this repeats.",
            what,
            got,
            expected,
            timeout_seconds,
        )


def _shared(obj: Any) -> Callable[[], Any]:
    """Put ``obj`` in Ray's object store once (if Ray is up); return a getter for the workers."""
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a dependency
        return lambda: obj
    if not ray.is_initialized():
        return lambda: obj
    ref = ray.put(obj)
    return lambda: ray.get(ref)


class FilterManager:
    """Merges remote filter deltas into the local filters and broadcasts the result."""

    @staticmethod
    def synchronize(
        local_filters: Mapping[str, Filter],
        worker_set: Any,
        update_remote: bool = True,
        timeout_seconds: float | None = None,
        use_remote_data_for_update: bool = True,
    ) -> None:
        """Pull every remote's filter deltas, merge them locally, push the merged filters.

        Why: observation statistics must cover all workers' data, and every worker
        must normalise with the same statistics.

        Args:
            local_filters: Policy id -> the driver's (local) filter, updated in place.
            worker_set: The ``EnvRunnerGroup``; only its ``foreach_env_runner`` is used
                (remote runners only), and the runners' ``get_filters`` and
                ``sync_filters`` methods.
            update_remote: Push the merged filters back to the remote runners.
            timeout_seconds: Deadline for each of the two remote calls; runners that
                miss it are left out (logged as an error).
            use_remote_data_for_update: Merge the remote deltas into ``local_filters``.

        Raises:
            UnknownPolicyError: A remote runner has a filter for a policy id that has
                no local filter.
        """
        if not update_remote and not use_remote_data_for_update:
            return
        foreach = _foreach(worker_set)
        # Remote buffers are flushed as they are read, so each delta is merged once.
        remote_filters = foreach(
            lambda w: w.get_filters(flush_after=True),
            local_env_runner=False,
            timeout_seconds=timeout_seconds,
        )
        _check_count(worker_set, len(remote_filters), "got filters from", timeout_seconds)

        if use_remote_data_for_update:
            for filters in remote_filters:
                for policy_id, remote in filters.items():
                    if policy_id not in local_filters:
                        raise UnknownPolicyError(
                            f"A remote env runner has an observation filter for policy "
                            f"{policy_id!r}, but the local filters are for "
                            f"{sorted(map(str, local_filters))}."
                        )
                    local_filters[policy_id].apply_changes(remote, with_buffer=False)

        if update_remote:
            copies = {k: v.as_serializable() for k, v in local_filters.items()}
            get = _shared(copies)
            acks = foreach(
                lambda w: w.sync_filters(get()),
                local_env_runner=False,
                timeout_seconds=timeout_seconds,
            )
            _check_count(worker_set, len(acks), "pushed filters to", timeout_seconds)
