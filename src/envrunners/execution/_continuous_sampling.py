"""Continuous sampling: remote runners keep sampling while the driver trains.

``ContinuousSampler`` keeps up to K = ``max_requests_in_flight_per_env_runner``
``sample()`` requests outstanding per healthy remote runner of an
``EnvRunnerGroup``. Outstanding means sent and not yet handed to the driver: in
flight, or finished and waiting in the sampler's queue, so the queue is bounded
(K results per runner) and a runner only gets a new request when the driver
takes one of its results (``take``). It works on the group's public async API
(``foreach_env_runner_async`` / ``fetch_ready_async_reqs``) with one tag per
runner, so the group's in-flight count per tag is that runner's.

Weight versions: every request records the ``weights_seq_no`` it was sent under
and the version the runner actually sampled with (also recorded per step in
every episode's ``weights_seq_no`` column). Weights are pushed with the group's
``sync_weights(timeout_seconds=0)``: one ``ray.put`` and one call per runner,
never waited for. Ray runs an actor's calls in the order they were sent, so a
push reaches a busy runner after the requests already queued there and before
any request sent after it: a request samples with the weights broadcast last
before it was sent, and weights never change in the middle of a ``sample()``.

Staleness bound: data sampled with version ``d`` is trained while the driver's
version ``V`` is at most ``d + K``. ``take`` at version ``V`` therefore waits for
(and includes) every result sent under version ``V - K``, even when the batch is
already full: a slow runner can fall at most K versions behind (stale-synchronous
sampling). With K = 1 every training step includes one result of each healthy
runner, sampled while the previous step trained. A result that could only be
trained later than that (its runner missed the deadline of the step that waited
for it, or the version jumped) is dropped and counted in ``num_results_too_stale``.

Failures: results already fetched are kept (a runner killed afterwards loses
none of them); requests in flight on a runner that failed are lost and counted
in ``num_requests_lost``; the group restarts or drops the runner as configured,
and a restored runner gets new requests on the next ``take``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Any

from envrunners import errors
from envrunners.env._remote_runner_calls import get_connector_states
from envrunners.errors import ConfigError
from envrunners.execution.rollout_ops import _count, _sample_on_runner, _unpack

__all__ = ["ContinuousSample", "ContinuousSampler"]

logger = logging.getLogger("envrunners")

#: Tag prefix of the sampler's requests (``"__"``: the group's plain fetch skips them).
TAG_PREFIX = "__continuous_sample__/"
#: Polling while runners are restored: first and longest sleep between upkeep passes, in s.
_POLL_MIN_S, _POLL_MAX_S = 0.001, 0.005
#: Longest block waiting for the next result while every runner is healthy, in seconds
#: (a result, a runner's death or a request deadline end it sooner).
_BLOCK_MAX_S = 0.1


@dataclasses.dataclass
class ContinuousSample:
    """One ``sample()`` result of one runner, as the driver takes it.

    Attributes:
        runner_id: The remote runner's id.
        samples: Its episodes (new stack) or batch.
        metrics: The runner's ``get_metrics()`` after the call.
        connector_states: Its connector states (None unless asked for).
        sent_version: The driver's weights version when the request was sent.
        weights_seq_no: The version the runner sampled with.
        env_steps: Env steps in ``samples``.
        agent_steps: Agent steps in ``samples``.
    """

    runner_id: int
    samples: Any
    metrics: Any
    connector_states: dict | None
    sent_version: int
    weights_seq_no: int
    env_steps: int
    agent_steps: int


def _sample_continuously_on_runner(
    runner: Any, *, sent_version: int, random_actions: bool, with_states: bool
) -> tuple[int, int, Any, dict | None]:
    """Runner side: the version it samples with, ``sample()`` + metrics, connector states."""
    used = int(getattr(runner, "_weights_seq_no", 0) or 0)
    packed = _sample_on_runner(runner, random_actions=random_actions, with_metrics=True)
    states = get_connector_states(runner) if with_states else None
    return sent_version, used, packed, states


class ContinuousSampler:
    """Keep the group's remote runners sampling; hand the driver bounded-stale results.

    Args:
        group: The ``EnvRunnerGroup`` (its remote runners sample).
        max_requests_in_flight_per_env_runner: K (default: the group config's):
            requests outstanding per runner, and the staleness bound in versions.
        with_connector_states: Also return each runner's connector states (to
            merge observation filters and the like).
        random_actions: Sample with random actions.

    Raises:
        ConfigError: K is not an int >= 1.
    """

    def __init__(
        self,
        group: Any,
        *,
        max_requests_in_flight_per_env_runner: int | None = None,
        with_connector_states: bool = False,
        random_actions: bool = False,
    ):
        config = group._remote_config
        k = max_requests_in_flight_per_env_runner
        if k is None:
            k = config.max_requests_in_flight_per_env_runner
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(
                f"max_requests_in_flight_per_env_runner must be an int >= 1 for continuous "
                f"sampling, got {k!r}"
            )
        group_k = int(config.max_requests_in_flight_per_env_runner)
        if k > group_k:
            raise ConfigError(
                f"max_requests_in_flight_per_env_runner={k} is more than the group allows "
                f"per runner ({group_k}); set it in config.env_runners(...) instead"
            )
        self.group = group
        self.max_requests_in_flight_per_env_runner = k
        self._with_states = bool(with_connector_states)
        self._random_actions = bool(random_actions)
        #: The weights version requests are sent under (see ``set_weights_version``).
        self.weights_version = 0
        #: Runner id -> the ``sent_version`` of each request in flight, oldest first.
        self._in_flight: dict[int, list[int]] = collections.defaultdict(list)
        self._ready: collections.deque[ContinuousSample] = collections.deque()
        self.num_requests_sent = 0
        self.num_results_received = 0
        #: Requests lost with their runner (it failed, was killed or missed a deadline).
        self.num_requests_lost = 0
        #: Results dropped because they arrived more than K versions old.
        self.num_results_too_stale = 0

    # ------------------------------------------------------------------ state
    def set_weights_version(self, version: int) -> None:
        """Say which weights version the runners get from now on (call after each push)."""
        self.weights_version = int(version)

    def num_in_flight(self, runner_id: int | None = None) -> int:
        """Requests sent and not yet fetched (of one runner, or all)."""
        if runner_id is not None:
            return len(self._in_flight.get(runner_id, ()))
        return sum(len(v) for v in self._in_flight.values())

    def num_queued(self, runner_id: int | None = None) -> int:
        """Fetched results waiting to be taken (of one runner, or all)."""
        if runner_id is None:
            return len(self._ready)
        return sum(1 for r in self._ready if r.runner_id == runner_id)

    def num_outstanding(self, runner_id: int) -> int:
        """Requests of a runner that are in flight or queued (never more than K)."""
        return self.num_in_flight(runner_id) + self.num_queued(runner_id)

    # ------------------------------------------------------------------ requests
    def _tag(self, runner_id: int) -> str:
        return f"{TAG_PREFIX}{runner_id}"

    def fill(self) -> int:
        """Send requests so that every healthy runner has K outstanding; how many were sent."""
        group = self.group
        self._reconcile()
        queued = collections.Counter(r.runner_id for r in self._ready)
        sent = 0
        kwargs = {
            "sent_version": self.weights_version,
            "random_actions": self._random_actions,
            "with_states": self._with_states,
        }
        for runner_id in group.healthy_env_runner_ids():
            room = self.max_requests_in_flight_per_env_runner
            room -= len(self._in_flight[runner_id]) + queued[runner_id]
            for _ in range(room):
                n = group.foreach_env_runner_async(
                    _sample_continuously_on_runner,
                    self._tag(runner_id),
                    kwargs=kwargs,
                    remote_worker_ids=[runner_id],
                )
                if not n:
                    break
                self._in_flight[runner_id].append(self.weights_version)
                sent += 1
        self.num_requests_sent += sent
        return sent

    def _reconcile(self) -> None:
        """Forget requests the group no longer has in flight (their runner failed)."""
        for runner_id in self.group.healthy_env_runner_ids():
            self._in_flight.setdefault(runner_id, [])
        for runner_id, versions in self._in_flight.items():
            left = self.group.num_in_flight_async_reqs(self._tag(runner_id))
            if left > len(versions):  # sent by an earlier sampler on this group
                versions.extend([self.weights_version] * (left - len(versions)))
            elif left < len(versions):
                lost = len(versions) - left
                del versions[:lost]  # an actor runs its calls in order: the oldest went first
                self.num_requests_lost += lost

    def _tags_in_flight(self) -> list[str]:
        return [self._tag(r) for r, v in self._in_flight.items() if v]

    def poll(self, timeout_s: float = 0.0) -> int:
        """Fetch finished requests into the queue (waiting up to ``timeout_s``); how many."""
        tags = self._tags_in_flight()
        if not tags:
            return 0
        got = self.group.fetch_ready_async_reqs(tags=tags, timeout_seconds=timeout_s)
        for runner_id, (sent_version, used, packed, states) in got:
            versions = self._in_flight[runner_id]
            if sent_version in versions:
                versions.remove(sent_version)
            elif versions:
                versions.pop(0)
            samples, metrics = _unpack(packed)
            self._ready.append(
                ContinuousSample(
                    runner_id=runner_id,
                    samples=samples,
                    metrics=metrics,
                    connector_states=states,
                    sent_version=sent_version,
                    weights_seq_no=used,
                    env_steps=_count(samples, False),
                    agent_steps=_count(samples, True),
                )
            )
        self.num_results_received += len(got)
        self._reconcile()
        return len(got)

    # ------------------------------------------------------------------ taking
    def take(
        self,
        *,
        max_env_steps: int | None = None,
        max_agent_steps: int | None = None,
        timeout_s: float | None = None,
    ) -> list[ContinuousSample]:
        """The oldest results with at least ``max_env_steps`` (or agent) steps; refill.

        Also waits for (and returns) every result sent under version
        ``weights_version - K``, so nothing left behind is trained more than K
        versions after it was sampled; older results are dropped (counted in
        ``num_results_too_stale``). Results leave the queue as they come, so their
        runners sample on even when a batch needs more than K results of each.
        Without a maximum, at least one result.

        Args:
            max_env_steps: Env steps wanted.
            max_agent_steps: Agent steps wanted (instead of env steps).
            timeout_s: Deadline (None: the group config's ``sample_timeout_s``).

        Raises:
            ConfigError: Both maxima were given.
            RemoteEnvRunnerError: Nothing arrived within the deadline, or no
                healthy runner is left and none is being restored.
        """
        if max_env_steps and max_agent_steps:
            raise ConfigError(
                "ContinuousSampler.take(): give max_env_steps or max_agent_steps, not both "
                f"(got {max_env_steps} and {max_agent_steps})."
            )
        agents = bool(max_agent_steps)
        need = int(max_agent_steps or max_env_steps or 1)
        config = self.group._remote_config
        if timeout_s is None:
            timeout_s = config.sample_timeout_s
        deadline = None if timeout_s is None else time.monotonic() + float(timeout_s)
        # Data sent under a version below ``due`` must be trained in this step; below
        # ``oldest`` it is too old to train at all.
        oldest = self.weights_version - self.max_requests_in_flight_per_env_runner
        due = oldest + 1
        taken: list[ContinuousSample] = []
        # No fetch up front: results that finished meanwhile end the first wait at once,
        # and each fetch is one more pass over the group's upkeep (and a ray.wait).
        steps, wait, got, fetched = 0, _POLL_MIN_S, 0, False
        while True:
            self._drop_too_stale(oldest)
            # Results move from the queue to this step as they come (oldest first), so
            # their runners get new requests even when a batch needs more than K each.
            kept: collections.deque[ContinuousSample] = collections.deque()
            for result in self._ready:
                if steps < need or result.sent_version < due:
                    taken.append(result)
                    steps += result.agent_steps if agents else result.env_steps
                else:
                    kept.append(result)
            self._ready = kept
            self.fill()
            overdue = any(oldest <= v < due for vs in self._in_flight.values() for v in vs)
            if steps >= need and not overdue:
                return taken
            if self.num_in_flight() == 0 and not self._restoring():
                if taken:
                    return taken
                raise errors.RemoteEnvRunnerError(
                    "Continuous sampling: no healthy remote env runner is left "
                    f"(0 of {self.group.num_remote_env_runners()}) and none is being "
                    "restored; enable restart_failed_env_runners or check the runners' logs."
                )
            now = time.monotonic()
            if deadline is not None and now >= deadline and not fetched:
                # Past the deadline before any fetch (a zero timeout): results that
                # finished before this call still count.
                got, fetched = self.poll(0.0), True
                continue
            if deadline is not None and now >= deadline:
                if taken:
                    logger.warning(
                        "Continuous sampling: returning %d of the %d steps asked for after "
                        "sample_timeout_s=%ss.",
                        steps,
                        need,
                        timeout_s,
                    )
                    return taken
                raise errors.RemoteEnvRunnerError(
                    f"Continuous sampling: no sample() result within sample_timeout_s="
                    f"{timeout_s}s from remote env runners {self.group.healthy_env_runner_ids()}"
                    "; they are slow or hung. Raise sample_timeout_s, or lower "
                    "rollout_fragment_length / num_envs_per_env_runner."
                )
            wait = _POLL_MIN_S if got else min(_POLL_MAX_S, wait * 1.5)
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - now))
            if self.num_in_flight():
                # Sleep until the first result is ready (not until all are, nor in short
                # polls): one upkeep pass per result. While some runner is out of
                # service, wake up often enough to move its restore along.
                group = self.group
                block = _BLOCK_MAX_S
                if group.num_healthy_remote_env_runners() < group.num_remote_env_runners():
                    block = _POLL_MAX_S
                if deadline is not None:
                    block = min(block, max(0.0, deadline - now))
                group.wait_async_reqs(tags=self._tags_in_flight(), timeout_seconds=block)
                got, fetched = self.poll(0.0), True
            else:  # runners are being restored: move their restores along meanwhile
                # (with no request in flight, no call of this loop reaches the group's
                # upkeep: runners all killed at once were never restored before)
                started = time.monotonic()
                self.group._await_healthy(wait)
                time.sleep(max(0.0, wait - (time.monotonic() - started)))
                got = 0

    def _drop_too_stale(self, oldest: int) -> None:
        # By the version the request was sent under (the sampler's own count): a runner
        # reports what its pushes said, which a caller may not bump (0 = "force").
        if not any(r.sent_version < oldest for r in self._ready):
            return
        kept = collections.deque(r for r in self._ready if r.sent_version >= oldest)
        dropped = len(self._ready) - len(kept)
        self.num_results_too_stale += dropped
        self._ready = kept
        logger.warning(
            "Continuous sampling: dropped %d result(s) sampled more than %d weight versions "
            "ago (num_results_too_stale=%d).",
            dropped,
            self.max_requests_in_flight_per_env_runner,
            self.num_results_too_stale,
        )

    def _restoring(self) -> bool:
        """Whether some remote runner is out of service but may come back."""
        group = self.group
        if group.num_healthy_remote_env_runners() == group.num_remote_env_runners():
            return False
        return bool(group._remote_config.restart_failed_env_runners)

    def stop(self) -> None:
        """Forget the queue and the requests in flight (their results are never fetched)."""
        self._ready.clear()
        self._in_flight.clear()

    def staleness(self, results: list[ContinuousSample]) -> list[int]:
        """Versions each result is behind the driver's current version."""
        return [self.weights_version - r.weights_seq_no for r in results]
