"""FaultTolerantActorManager on a real local Ray: the spec §18.6 properties, deterministically."""

from __future__ import annotations

import functools
import os
import sys
import time

import pytest
import ray.cloudpickle as cloudpickle
from tests.waiting import wait_until

from envrunners.errors import ConfigError
from envrunners.utils.actor_manager import (
    ActorMethod,
    CallResult,
    FaultAwareApply,
    FaultTolerantActorManager,
    RemoteCallResults,
    ResultOrError,
)

# Ray workers cannot import this test module by name: ship its classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Actor(FaultAwareApply):
    """Counts calls; can raise, die or hang on request."""

    def __init__(self, index: int):
        self.index = index
        self.count = 0

    def call(self) -> int:
        self.count += 1
        return self.count

    def fail(self) -> None:
        raise AttributeError(f"actor {self.index} was told to fail")

    def die(self) -> None:
        os._exit(1)

    def slow(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


class SlowStart(Actor):
    """An ``Actor`` whose start takes a second and whose restart takes three."""

    def __init__(self, index: int):
        import ray

        time.sleep(3.0 if ray.get_runtime_context().was_current_actor_reconstructed else 1.0)
        super().__init__(index)


def _call_fails(ray_module, actor) -> bool:
    try:
        ray_module.get(actor.ping.remote(), timeout=5)
    except Exception:
        return True
    return False


def call(actor, **_):
    return actor.call()


def reset_count(actor) -> None:
    actor.count = 0


def make_manager(ray, n=4, **kwargs) -> FaultTolerantActorManager:
    """A manager over ``n`` new actors (for tests that kill them)."""
    cls = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(Actor)
    actors = [cls.remote(i) for i in range(n)]
    ray.get([a.ping.remote() for a in actors])  # built, so deadlines measure calls only
    return FaultTolerantActorManager(actors=actors, **kwargs)


@pytest.fixture(scope="module")
def shared_actors(ray_session):
    """Four actors shared by the tests that do not kill them (actor start-up is slow)."""
    cls = ray_session.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(Actor)
    actors = [cls.remote(i) for i in range(4)]
    ray_session.get([a.ping.remote() for a in actors])
    yield actors
    for a in actors:
        ray_session.kill(a)


@pytest.fixture
def manager(ray_session, shared_actors):
    ray_session.get([a.apply.remote(reset_count) for a in shared_actors])
    return FaultTolerantActorManager(actors=shared_actors)


# ---------------------------------------------------------------------- no Ray needed
class TestResults:
    def test_result_or_error(self):
        ok = ResultOrError(result=None)
        assert ok.ok and ok.get() is None
        bad = ResultOrError(error=ValueError("x"))
        assert not bad.ok and isinstance(bad.get(), ValueError)

    def test_remote_call_results(self):
        from ray.exceptions import RayError

        results = RemoteCallResults()
        results.add_result(0, ResultOrError(result=1), None)
        results.add_result(1, ResultOrError(error=RayError("down")), "t")
        results.add_result(2, ResultOrError(error=KeyError("k")), None)
        assert len(results) == 3
        assert [r.actor_id for r in results.ignore_errors()] == [0]
        assert [r.actor_id for r in results.ignore_ray_errors()] == [0, 2]
        assert isinstance(next(iter(results)), CallResult)

    def test_bad_in_flight_limit(self):
        with pytest.raises(ConfigError, match="must be >= 1"):
            FaultTolerantActorManager(max_remote_requests_in_flight_per_actor=0)


# ---------------------------------------------------------------------- sync calls
class TestSyncCalls:
    def test_results_in_call_order_and_repeats(self, manager):
        res = manager.foreach_actor(call)
        assert [r.actor_id for r in res] == [0, 1, 2, 3]
        assert [r.get() for r in res] == [1, 1, 1, 1]
        res = manager.foreach_actor(call, remote_actor_ids=[0, 0])
        assert [r.get() for r in res] == [2, 3]
        assert [r.get() for r in manager.foreach_actor("call", remote_actor_ids=[])] == [
            4,
            2,
            2,
            2,
        ]

    def test_healthy_only_and_list_of_funcs(self, manager):
        manager.set_actor_state(1, healthy=False)
        manager.set_actor_state(2, healthy=False)
        funcs = [functools.partial(lambda i, a: i, i) for i in range(4)]
        assert [r.get() for r in manager.foreach_actor(funcs)] == [0, 3]
        with pytest.raises(AssertionError, match="same number of callables"):
            manager.foreach_actor(funcs[:3])
        assert len(manager.foreach_actor(call, healthy_only=False)) == 4

    def test_unknown_ids(self, manager):
        with pytest.raises(
            ConfigError, match=r"Unknown actor id\(s\) \[7\]; known ids: \[0, 1, 2, 3\]"
        ):
            manager.foreach_actor(call, remote_actor_ids=[0, 7])
        with pytest.raises(ValueError, match="Unknown actor id"):
            manager.is_actor_healthy(9)
        with pytest.raises(KeyError, match="9"):
            manager.remove_actor(9)

    def test_application_error_carries_id_and_type(self, ray_session, manager):
        from ray.exceptions import RayTaskError

        res = list(manager.foreach_actor("fail", remote_actor_ids=[1]))
        err = res[0].get()
        assert not res[0].ok
        assert isinstance(err, AttributeError) and isinstance(err, RayTaskError)
        assert "actor 1 raised AttributeError" in str(err)
        assert "was told to fail" in str(err)
        # RLlib's rule (default): any Ray error takes the actor out of service.
        assert manager.healthy_actor_ids() == [0, 2, 3]
        again = manager.foreach_actor("fail", remote_actor_ids=[0])
        FaultTolerantActorManager.handle_remote_call_result_errors(again, ignore_ray_errors=True)
        with pytest.raises(AttributeError):
            FaultTolerantActorManager.handle_remote_call_result_errors(
                again, ignore_ray_errors=False
            )

    def test_is_fault_keeps_actor_for_user_errors(self, shared_actors):
        from ray.exceptions import RayTaskError

        mgr = FaultTolerantActorManager(
            shared_actors[:1], is_fault=lambda e: not isinstance(e, RayTaskError)
        )
        assert not next(iter(mgr.foreach_actor("fail"))).ok
        assert mgr.num_healthy_actors() == 1

    def test_fire_and_forget_still_executes(self, manager):
        for _ in range(5):
            manager.foreach_actor(call, timeout_seconds=0)
        assert [r.get() for r in manager.foreach_actor(call)] == [6, 6, 6, 6]

    def test_return_obj_refs(self, ray_session, manager):
        res = manager.foreach_actor(call, return_obj_refs=True)
        refs = [r.get() for r in res]
        assert all(isinstance(r, ray_session.ObjectRef) for r in refs)
        assert ray_session.get(refs) == [1, 1, 1, 1]

    def test_timeout_drops_counts_and_kills_hung_actor(self, ray_session):
        mgr = make_manager(ray_session, n=2, max_consecutive_timeouts=2)
        try:
            slow = [{"seconds": 0.0}, {"seconds": 60.0}]
            res = mgr.foreach_actor("slow", kwargs=slow, timeout_seconds=0.5)
            assert [r.actor_id for r in res] == [0]
            assert mgr.num_timed_out_calls() == 1
            assert mgr.is_actor_healthy(1)  # one miss is only a drop
            res = mgr.foreach_actor(call, timeout_seconds=0.5)
            assert [r.actor_id for r in res] == [0]
            assert mgr.take_hung_actor_kills() == [1]
            assert mgr.healthy_actor_ids() == [0]
            # Ray restarts the killed actor; a probe brings it back.
            assert wait_until(lambda: 1 in mgr.probe_unhealthy_actors(2.0, mark_healthy=True))
            assert mgr.healthy_actor_ids() == [0, 1] and mgr.total_num_restarts() == 1
        finally:
            mgr.clear()


# ---------------------------------------------------------------------- async calls
class TestAsyncCalls:
    def test_in_flight_limit_per_tag(self, manager):
        assert manager.foreach_actor_async(call, remote_actor_ids=[0, 0]) == 2
        assert manager.foreach_actor_async(call, remote_actor_ids=[0], healthy_only=False) == 0
        assert manager.foreach_actor_async(call, "other", remote_actor_ids=[0]) == 1
        assert manager.num_outstanding_async_reqs() == 3
        assert manager.num_outstanding_async_reqs("other") == 1
        res = manager.fetch_ready_async_reqs(timeout_seconds=None)
        assert sorted(r.get() for r in res) == [1, 2, 3]
        assert manager.num_outstanding_async_reqs() == 0

    def test_tags(self, manager):
        assert manager.foreach_actor_async("ping", "pingpong") == 4
        assert manager.foreach_actor_async(call, "call") == 4
        assert [
            r.get() for r in manager.fetch_ready_async_reqs(tags="pingpong", timeout_seconds=None)
        ] == ["pong"] * 4
        assert [
            r.get() for r in manager.fetch_ready_async_reqs(tags=["call"], timeout_seconds=None)
        ] == [1] * 4
        manager.foreach_actor_async(call)
        manager.foreach_actor_async("ping")
        res = manager.fetch_ready_async_reqs(timeout_seconds=None)
        assert sorted(map(str, (r.get() for r in res))) == ["2"] * 4 + ["pong"] * 4
        manager.foreach_actor_async(call, "call")
        assert len(manager.fetch_ready_async_reqs(tags=["incorrect"], timeout_seconds=1)) == 0
        res = manager.fetch_ready_async_reqs(tags=("pingpong", "call"), timeout_seconds=None)
        assert [r.get() for r in res] == [3] * 4 and {r.tag for r in res} == {"call"}
        with pytest.raises(ValueError, match="tags must be"):
            manager.fetch_ready_async_reqs(tags=5)

    def test_waiting_fetch_sorts_out_failures_and_late_calls(self, manager):
        """A fetch that waits returns every call's result once all are done; an error is
        that actor's result, and a call still running at the timeout stays in flight."""
        manager.foreach_actor_async(ActorMethod("slow"), "w", kwargs=[{"seconds": 0.0}] * 4)
        res = manager.fetch_ready_async_reqs(tags="w", timeout_seconds=30.0)
        assert sorted(r.actor_id for r in res) == [0, 1, 2, 3] and all(r.ok for r in res)
        manager.foreach_actor_async(
            ActorMethod("slow"), "w", kwargs={"seconds": 0.3}, remote_actor_ids=[0]
        )
        manager.foreach_actor_async(ActorMethod("fail"), "w", remote_actor_ids=[1])
        manager.foreach_actor_async(call, "w", remote_actor_ids=[2])
        res = manager.fetch_ready_async_reqs(tags="w", timeout_seconds=30.0)
        by_id = {r.actor_id: r for r in res}
        assert sorted(by_id) == [0, 1, 2]
        assert by_id[0].get() == 0.3 and by_id[2].ok
        assert not by_id[1].ok and "was told to fail" in str(by_id[1].get())
        assert not manager.is_actor_healthy(1)  # the default fault rule: out of service
        manager.foreach_actor_async(
            ActorMethod("slow"), "w", kwargs={"seconds": 2.0}, remote_actor_ids=[3]
        )
        manager.foreach_actor_async(call, "w", remote_actor_ids=[0])
        res = manager.fetch_ready_async_reqs(tags="w", timeout_seconds=0.3)
        assert [r.actor_id for r in res] == [0]
        assert manager.num_outstanding_async_reqs("w") == 1
        res = manager.fetch_ready_async_reqs(tags="w", timeout_seconds=30.0)
        assert [(r.actor_id, r.get()) for r in res] == [(3, 2.0)]

    def test_actor_method_calls_the_method_itself(self, manager, shared_actors):
        """An ``ActorMethod`` is the actor's own method with the kwargs (not ``apply``),
        also when a coalesced call waits for a free slot."""
        manager = FaultTolerantActorManager(
            actors=shared_actors, max_remote_requests_in_flight_per_actor=1
        )
        slow = ActorMethod("slow")
        assert manager.foreach_actor_async(slow, "m", kwargs={"seconds": 0.2}) == 4
        assert manager.foreach_actor_async(slow, "m", kwargs={"seconds": 0.0}, coalesce=True) == 4
        assert manager.num_pending_calls("m") == 4
        res = manager.fetch_ready_async_reqs(tags="m", timeout_seconds=None)
        assert [r.get() for r in res] == [0.2] * 4
        res = manager.fetch_ready_async_reqs(tags="m", timeout_seconds=None)
        assert [r.get() for r in res] == [0.0] * 4
        res = manager.foreach_actor(call)
        assert [r.get() for r in res] == [1] * 4  # (``slow`` went to the method, not ``call``)

    def test_round_robin_uses_real_ids(self, ray_session):
        cls = ray_session.remote(num_cpus=0)(Actor)
        mgr = FaultTolerantActorManager(actors=[cls.remote(0), cls.remote(1)], init_id=1)
        try:
            sent = mgr.foreach_actor_async(call, "rr", kwargs=[{}, {}, {}])
            assert sent == 3
            ids = sorted(
                r.actor_id for r in mgr.fetch_ready_async_reqs(tags="rr", timeout_seconds=None)
            )
            assert ids == [1, 1, 2]
        finally:
            mgr.clear()

    def test_coalesced_calls_are_never_dropped(self, shared_actors):
        mgr = FaultTolerantActorManager(
            shared_actors[:1], max_remote_requests_in_flight_per_actor=1
        )

        def set_value(actor, value):
            time.sleep(0.2)
            actor.value = value
            return value

        for value in (1, 2, 3):
            assert (
                mgr.foreach_actor_async(set_value, "s", kwargs={"value": value}, coalesce=True) == 1
            )
        assert mgr.num_pending_calls("s") == 1  # 3 replaced 2
        # The pending (newest) call goes out before any later call to that actor.
        assert [r.get() for r in mgr.foreach_actor(lambda a: a.value)] == [3]
        assert len(mgr.fetch_ready_async_reqs(tags="s", timeout_seconds=None)) == 2

    def test_foreach_actor_async_fetch_ready(self, manager):
        assert manager.foreach_actor_async_fetch_ready(call, "t") == []
        got = manager.foreach_actor_async_fetch_ready(
            call, "t", timeout_seconds=None, return_actor_ids=True
        )
        assert got == [(0, 1), (1, 1), (2, 1), (3, 1)]
        assert manager.num_outstanding_async_reqs("t") == 4


# ---------------------------------------------------------------------- health
class TestHealth:
    def test_death_probe_and_restart_count(self, ray_session):
        mgr = make_manager(ray_session, n=2)
        try:
            res = list(mgr.foreach_actor("die", remote_actor_ids=[1]))
            assert not res[0].ok and mgr.healthy_actor_ids() == [0]
            # Without mark_healthy a responsive actor is reported but stays unhealthy.
            assert wait_until(lambda: 1 in mgr.probe_unhealthy_actors(2.0))
            assert mgr.num_healthy_actors() == 1
            assert mgr.probe_unhealthy_actors(2.0, mark_healthy=True) == [1]
            assert mgr.num_healthy_actors() == 2 and mgr.total_num_restarts() == 1
        finally:
            mgr.clear()

    def test_probe_waits_for_an_actor_ray_is_restarting(self, ray_session):
        """As in RLlib, one probe with a timeout restores an actor that comes back within it."""
        cls = ray_session.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(SlowStart)
        actors = [cls.remote(i) for i in range(2)]
        ray_session.get([a.ping.remote() for a in actors])
        mgr = FaultTolerantActorManager(actors=actors)
        try:
            ray_session.kill(actors[1], no_restart=False)
            # Wait until the old process is gone (a direct call fails; ray.kill is
            # asynchronous), then mark it out of service as a failed call would: the probe
            # runs while Ray restarts the process (its restart takes 3 s).
            assert wait_until(lambda: _call_fails(ray_session, actors[1]))
            mgr.set_actor_state(1, healthy=False)
            assert mgr.healthy_actor_ids() == [0]
            start = time.monotonic()
            assert mgr.probe_unhealthy_actors(20.0, mark_healthy=True) == [1]
            assert time.monotonic() - start >= 0.5  # it did wait for the restart
            assert mgr.healthy_actor_ids() == [0, 1] and mgr.total_num_restarts() == 1
            # A dead actor is not waited for.
            ray_session.kill(actors[1], no_restart=True)
            assert wait_until(lambda: not list(mgr.foreach_actor(call, remote_actor_ids=[1]))[0].ok)
            start = time.monotonic()
            assert mgr.probe_unhealthy_actors(20.0, mark_healthy=True) == []
            assert time.monotonic() - start < 5.0
        finally:
            mgr.clear()

    def test_late_actor_is_out_at_once_and_killed_after_the_limit(self, ray_session):
        mgr = make_manager(ray_session, n=2, max_consecutive_timeouts=2, unhealthy_on_timeout=True)
        try:
            slow = [{"seconds": 0.0}, {"seconds": 60.0}]
            res = mgr.foreach_actor("slow", kwargs=slow, timeout_seconds=0.5)
            assert [r.actor_id for r in res] == [0]
            assert mgr.healthy_actor_ids() == [0] and mgr.late_actor_ids() == [1]
            assert len(mgr.check_late_calls()) == 0 and mgr.take_hung_actor_kills() == []
            assert wait_until(lambda: not mgr.check_late_calls() and mgr.num_hung_actor_kills())
            assert mgr.take_hung_actor_kills() == [1] and mgr.late_actor_ids() == []
            # A late call that returns within the limit (2 x 0.7 s) is handed back; its
            # actor stays out until restored.
            res = mgr.foreach_actor(
                "slow", kwargs=[{"seconds": 1.0}], remote_actor_ids=[0], timeout_seconds=0.7
            )
            assert len(res) == 0 and mgr.late_actor_ids() == [0]
            late: list = []
            assert wait_until(lambda: late.extend(mgr.check_late_calls()) or late)
            assert [(r.actor_id, r.get()) for r in late] == [(0, 1.0)]
            assert not mgr.is_actor_healthy(0) and mgr.num_hung_actor_kills() == 1
        finally:
            mgr.clear()

    def test_set_aside_call_is_out_of_service_and_killed_on_its_timer(self, ray_session):
        mgr = make_manager(ray_session, n=1, max_consecutive_timeouts=2, unhealthy_on_timeout=True)
        try:
            sent_at = time.monotonic()
            ref = mgr.fire(0, "slow", {"seconds": 60.0})
            assert mgr.next_hung_check_at() is None
            mgr.set_aside(0, ref, sent_at, 0.5)  # not late yet: the caller stopped waiting
            assert mgr.healthy_actor_ids() == [] and mgr.late_actor_ids() == [0]
            assert mgr.num_timed_out_calls() == 0
            assert mgr.next_hung_check_at() == pytest.approx(sent_at + 2 * 0.5)
            assert wait_until(lambda: not mgr.check_late_calls() and mgr.num_hung_actor_kills())
            assert mgr.take_hung_actor_kills() == [0] and mgr.next_hung_check_at() is None
            # Fired calls are collected like foreach_actor's.
            assert wait_until(lambda: mgr.probe_unhealthy_actors(1.0, mark_healthy=True) == [0])
            ref = mgr.fire(0, call, {})
            ready, _ = ray_session.wait([ref], timeout=30)
            assert [(r.actor_id, r.get()) for r in mgr.collect({ref: 0}, ready)] == [(0, 1)]
        finally:
            mgr.clear()

    def test_async_call_past_its_deadline_is_a_missed_deadline(self, ray_session):
        mgr = make_manager(ray_session, n=2, max_consecutive_timeouts=2, unhealthy_on_timeout=True)
        try:
            slow = [{"seconds": 0.0}, {"seconds": 60.0}]
            assert mgr.foreach_actor_async("slow", "t", kwargs=slow) == 2
            # Waits for both, but wakes at the slow call's deadline and drops it.
            res = mgr.fetch_ready_async_reqs(tags="t", timeout_seconds=None, request_timeout_s=0.5)
            assert [(r.actor_id, r.get()) for r in res] == [(0, 0.0)]
            assert mgr.take_expired_async_reqs() == [(1, 1)]
            assert mgr.healthy_actor_ids() == [0] and mgr.late_actor_ids() == [1]
            assert mgr.num_outstanding_async_reqs() == 0 and mgr.num_timed_out_calls() == 1
            # Its late call is watched like a synchronous one: killed as hung on its timer.
            assert wait_until(lambda: not mgr.check_late_calls() and mgr.num_hung_actor_kills())
            assert mgr.take_hung_actor_kills() == [1]
            # A call done in time but collected late is not late.
            mgr.foreach_actor_async("slow", "t", kwargs=[{"seconds": 0.0}], remote_actor_ids=[0])
            done, _ = ray_session.wait(list(mgr._in_flight_req_to_actor_id), timeout=30)
            assert len(done) == 1
            time.sleep(0.05)  # older than its 0.01 s deadline, but done
            mgr.expire_async_reqs(0.01)
            assert mgr.take_expired_async_reqs() == []
            res = mgr.fetch_ready_async_reqs(tags="t", timeout_seconds=5.0)
            assert [r.actor_id for r in res] == [0]
        finally:
            mgr.clear()

    def test_set_state_probe_and_async_purge(self, manager):
        manager.foreach_actor_async(call, "t")
        manager.set_actor_state(2, healthy=False)
        assert manager.num_outstanding_async_reqs("t") == 3
        assert manager.probe_unhealthy_actors(mark_healthy=True) == [2]
        assert manager.num_healthy_actors() == 4

    def test_add_remove_clear_ids_continue(self, ray_session):
        mgr = make_manager(ray_session, n=2)
        handle = mgr.remove_actor(1)
        assert mgr.actor_ids() == [0]
        assert mgr.add_actors([handle]) == [2]
        mgr.clear()
        assert mgr.num_actors() == 0
        # ray.kill is asynchronous: a call sent right after it may still be served.
        deadline = time.monotonic() + 30
        with pytest.raises(ray_session.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray_session.get(handle.ping.remote(), timeout=30)
        assert mgr.add_actors([handle]) == [3]
