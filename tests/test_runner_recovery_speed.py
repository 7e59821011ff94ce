"""How runners are replaced: a warm standby swapped in at once, async requests with deadlines.

Real Ray, real runner processes, real faults (SIGKILL, an env whose ``step()``
blocks). Assertions are on the group's own counters and on which actor serves,
never on wall-clock times beyond generous bounds.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
import ray
import ray.cloudpickle
from tests.test_env_runner_failures import make_config, steps
from tests.waiting import wait_until

from envrunners.env.env_runner_group import EnvRunnerGroup
from envrunners.execution.rollout_ops import synchronous_parallel_sample

# Ray workers cannot import this test module by name: ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _faulty(tmp_path, deadline: float, **fault):
    """Runner 2 misbehaves (``fault``: FaultyEnv's ``mode``, ``at_step``, ...)."""
    return make_config(tmp_path, env_config={"bad_worker": 2, **fault}, sample_timeout_s=deadline)


def _pid(runner) -> int:
    return os.getpid()


def _standby_shape(runner) -> tuple:
    """(still a standby, index it is built for, has an env, has a module)."""
    return (
        bool(getattr(runner, "_standby", False)),
        getattr(runner, "_standby_built_for", None),
        runner.env is not None,
        getattr(runner, "module", None) is not None,
    )


def _index_and_standby(runner) -> tuple[int, bool]:
    return runner.worker_index, bool(getattr(runner, "_standby", False))


def _ready_standby(group: EnvRunnerGroup, timeout: float = 120.0):
    """The group's standby handle once it is warmed up."""
    assert wait_until(lambda: group._recovery.standby is not None, timeout=timeout)
    ray.get(group._recovery._standby_ready, timeout=timeout)
    return group._recovery.standby


@pytest.mark.timeout(240)
def test_each_sigkill_is_taken_over_by_a_warm_standby(ray_session, tmp_path):
    """Two kills in a row: both replaced by the standby (warm, built as a spare runner)."""
    config = make_config(tmp_path, sample_timeout_s=20.0)
    with EnvRunnerGroup(config=config, standby_env_runner=True) as group:
        for kill in (1, 2):
            standby = _ready_standby(group)
            # Warm: built as a spare runner (index 3: no runner's), env and module built.
            assert ray.get(standby.apply.remote(_standby_shape)) == (True, 3, True, True)
            victim = group.healthy_env_runner_ids()[kill - 1]
            pid = group.foreach_env_runner(_pid, remote_worker_ids=[victim], local_env_runner=False)
            os.kill(pid[0], signal.SIGKILL)
            assert wait_until(
                lambda kill=kill: (
                    synchronous_parallel_sample(worker_set=group, max_env_steps=80) is not None
                    and group.num_remote_worker_restarts() == kill
                    and group.num_healthy_remote_env_runners() == 2
                ),
                timeout=60,
            )
            # The standby took the dead runner's place (no process restart waited for),
            # and the next standby was started right away in the background.
            assert group._worker_manager.get_actor(victim) == standby
            assert group._recovery.standby is not None and group._recovery.standby != standby
            assert group.num_env_runners_replaced_lifetime() == kill
            assert victim in group.lost_and_replaced_env_runners()[1]
            index = group.foreach_env_runner(
                _index_and_standby, remote_worker_ids=[victim], local_env_runner=False
            )
            assert index == [(victim, False)]
        assert 80 <= steps(synchronous_parallel_sample(worker_set=group, max_env_steps=80)) <= 83


@pytest.mark.timeout(240)
def test_hung_runner_is_replaced_by_the_prepared_standby_at_the_kill(ray_session, tmp_path):
    """Runner 2's env blocks in step(): the standby is built for it after its first missed
    deadline, and the group call that kills runner 2 (its second deadline) is already
    answered by the standby in its place."""
    config = _faulty(tmp_path, 4.0, mode="hang")
    most = 400 + 2 * 2 - 1
    with EnvRunnerGroup(config=config, standby_env_runner=True) as group:
        standby = _ready_standby(group)
        start = time.monotonic()
        assert (
            400 <= steps(synchronous_parallel_sample(worker_set=group, max_env_steps=400)) <= most
        )
        assert (tmp_path / "fault").exists()
        assert group.healthy_env_runner_ids() == [1]  # out of service at once
        answers: list = []
        while group._worker_manager.num_hung_actor_kills() == 0:
            assert time.monotonic() - start < 120, "runner 2 was never killed as hung"
            if group._recovery._prepared is not None:  # built for runner 2, still a standby
                assert group._recovery._prepared[0] == 2
            time.sleep(0.05)
            answers = group.foreach_env_runner(_index_and_standby, local_env_runner=False)
        # The call that killed runner 2 was answered by its replacement: no restore awaited.
        assert answers == [(1, False), (2, False)]
        assert group._worker_manager.get_actor(2) == standby
        assert group.num_env_runners_replaced_lifetime() == 1
        assert group.num_remote_worker_restarts() == 1
        assert group.num_env_runners_dropped_lifetime() == 1
        assert (
            400 <= steps(synchronous_parallel_sample(worker_set=group, max_env_steps=400)) <= most
        )


def _sample(runner):
    return len(runner.sample())


@pytest.mark.timeout(240)
def test_async_request_past_its_deadline_is_a_missed_deadline(ray_session, tmp_path):
    """A hung async request: runner out at once, result dropped and counted, runner replaced."""
    config = _faulty(tmp_path, 2.0, mode="hang", at_step=1)
    with EnvRunnerGroup(config=config, standby_env_runner=False) as group:
        assert group.foreach_env_runner_async(_sample) == 2
        got = group.fetch_ready_async_reqs(timeout_seconds=None)  # waits up to the deadline
        assert [i for i, _ in got] == [1]
        assert (tmp_path / "fault").exists()
        assert group.healthy_env_runner_ids() == [1]  # unhealthy at the missed deadline
        assert group.num_env_runners_dropped_lifetime() == 1
        assert group.num_in_flight_async_reqs() == 0  # the late request is no longer waited for
        seen: list[int] = []

        def replaced() -> bool:
            group.foreach_env_runner_async(_sample)
            seen.extend(i for i, _ in group.fetch_ready_async_reqs(timeout_seconds=0.2))
            return group.num_healthy_remote_env_runners() == 2

        assert wait_until(replaced, timeout=120)
        assert group._worker_manager.num_hung_actor_kills() == 1
        assert group.num_remote_worker_restarts() == 1
        assert group.num_env_runners_dropped_lifetime() == 1
        # The replaced runner answers async requests again.
        assert wait_until(lambda: replaced() and 2 in seen, timeout=60)


@pytest.mark.timeout(240)
def test_slow_async_request_is_dropped_and_its_runner_restored(ray_session, tmp_path):
    """Late once (4 s; deadline 3 s, hung after 2 deadlines): dropped and counted, not killed."""
    config = _faulty(tmp_path, 3.0, mode="slow", sleep_s=4.0, at_step=1)
    with EnvRunnerGroup(config=config, standby_env_runner=False) as group:
        group.foreach_env_runner_async(_sample)
        results = group.fetch_ready_async_reqs(timeout_seconds=None)
        assert [i for i, _ in results] == [1]
        assert group.healthy_env_runner_ids() == [1]
        assert wait_until(
            lambda: (
                results.extend(group.fetch_ready_async_reqs(timeout_seconds=0.1)) is None
                and group.num_healthy_remote_env_runners() == 2
            ),
            timeout=60,
        )
        assert [i for i, _ in results] == [1]  # the late result never came back
        assert group._worker_manager.num_hung_actor_kills() == 0
        assert group.num_env_runners_replaced_lifetime() == 0
        assert group.num_env_runners_dropped_lifetime() == 1
        assert group.num_remote_worker_restarts() == 1
