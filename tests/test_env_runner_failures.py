"""EnvRunnerGroup fault tolerance with real faults: killed, crashing and hung runners.

Every test bounds its waits; none sleeps without a deadline.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import ray.cloudpickle
import ray.exceptions
from tests.waiting import wait_until

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.env.env_runner_group import EnvRunnerGroup
from envrunners.errors import EnvRunnerError
from envrunners.execution.rollout_ops import synchronous_parallel_sample

# Ray workers cannot import this test module by name: ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class FaultyEnv(gym.Env):
    """A 10-step episode env that raises or hangs in ``step`` on one runner, once.

    ``env_config``: ``bad_worker`` (the runner index that misbehaves), ``mode``
    (``"raise"`` or ``"hang"``), ``at_step`` (which step of that runner), and
    ``marker`` (a file created at the fault, so that restarted or rebuilt
    runners behave).
    """

    def __init__(self, config):
        self.worker_index = getattr(config, "worker_index", 0)
        self.vector_index = getattr(config, "vector_index", 0)
        self.cfg = dict(config)
        self.observation_space = gym.spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.full(2, float(self.worker_index), np.float32), {}

    def step(self, action):
        self.t += 1
        self.steps += 1
        cfg = self.cfg
        marker = Path(cfg["marker"]) if cfg.get("marker") else None
        if (
            self.worker_index == cfg.get("bad_worker")
            and self.vector_index == 0
            and self.steps == cfg.get("at_step", 3)
            and marker is not None
            and not marker.exists()
        ):
            marker.write_text(str(os.getpid()))
            if cfg.get("mode", "raise") == "hang":
                time.sleep(3600)
            if cfg.get("mode") == "slow":  # late once, then fine
                time.sleep(float(cfg["sleep_s"]))
                return np.zeros(2, np.float32), 1.0, True, False, {}
            raise ValueError(f"injected env failure on runner {self.worker_index}")
        obs = np.full(2, float(self.worker_index) + self.t / 10.0, np.float32)
        return obs, 1.0, self.t >= 10, False, {}


def make_config(tmp_path, n=2, **fault_tolerance):
    env_runner_kw = {
        k: fault_tolerance.pop(k)
        for k in ("observation_filter", "sample_timeout_s")
        if k in fault_tolerance
    }
    env_config = fault_tolerance.pop("env_config", {})
    return (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(FaultyEnv, env_config={"marker": str(tmp_path / "fault"), **env_config})
        .env_runners(
            num_env_runners=n,
            num_cpus_per_env_runner=0,
            num_envs_per_env_runner=2,
            rollout_fragment_length=20,
            **env_runner_kw,
        )
        .fault_tolerance(delay_between_env_runner_restarts_s=0.0, **fault_tolerance)
        .debugging(seed=0)
    )


def weights_of(runner) -> dict:
    return runner.get_state(components="rl_module")["rl_module"]


def steps(episodes) -> int:
    return sum(len(e) for e in episodes)


def test_killed_runner_is_restored_with_weights_filter_and_steps(ray_session, tmp_path):
    """SIGKILL (the standby takes over) and ray.kill (Ray restarts the process): the
    restored runner has the learner's exact weights, seq no, merged filter and steps."""
    config = make_config(tmp_path, observation_filter="MeanStdFilter")
    with EnvRunnerGroup(config=config, standby_env_runner=True) as group:
        local = group.local_env_runner
        synchronous_parallel_sample(worker_set=group, max_env_steps=100)
        group.sync_env_runner_states(config=config, env_steps_sampled=4321)
        learner = {k: np.asarray(v) * 0 + 0.25 for k, v in weights_of(local).items()}
        local.set_state({"rl_module": learner, "weights_seq_no": 9})
        group.sync_weights(timeout_seconds=None)
        merged = local.get_state(components="env_to_module_connector")["env_to_module_connector"]

        for kill in ("sigkill", "ray.kill"):
            pid = group.foreach_env_runner(lambda w: os.getpid(), remote_worker_ids=[1])[-1]
            standby_pid = None
            if kill == "sigkill":
                standby = group._recovery.standby
                assert standby is not None
                standby_pid = ray_session.get(standby.apply.remote(lambda w: os.getpid()))
                os.kill(pid, signal.SIGKILL)
            else:
                group._recovery.kill_standby()  # no standby: Ray restarts the process
                ray_session.kill(group.remote_workers()[0], no_restart=False)
            # The next call finds it dead: out of service, the other runner answers.
            assert wait_until(
                lambda: (
                    group.foreach_env_runner(lambda w: 1, local_env_runner=False) == [1]
                    or group.num_healthy_remote_env_runners() == 1
                ),
                timeout=30,
            )
            restored: list[int] = []

            def runner_1_restored(restored=restored) -> bool:
                restored.extend(group.probe_unhealthy_env_runners(timeout_seconds=1.0))
                return 1 in restored

            assert wait_until(
                runner_1_restored,
                timeout=60,
            ), f"runner 1 not restored after {kill}"
            state, seq, new_pid = group.foreach_env_runner(
                lambda w: (w.get_state(), w._weights_seq_no, os.getpid()), remote_worker_ids=[1]
            )[-1]
            assert new_pid != pid
            if standby_pid is not None:
                assert new_pid == standby_pid
            assert seq == 9
            for key, value in state["rl_module"].items():
                np.testing.assert_array_equal(value, learner[key])
            assert state["num_env_steps_sampled_lifetime"] == 4321
            assert _same(state["env_to_module_connector"], merged)
        assert group.num_remote_worker_restarts() == 2
        assert group.num_healthy_remote_env_runners() == 2


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    return a == b


def test_env_error_without_any_restart_is_raised_with_index_and_traceback(ray_session, tmp_path):
    config = make_config(
        tmp_path,
        n=1,
        env_config={"bad_worker": 1},
        restart_failed_env_runners=False,
        ignore_env_runner_failures=False,
    )
    with EnvRunnerGroup(config=config, standby_env_runner=False) as group:
        with pytest.raises(EnvRunnerError, match="env runner 1:") as info:
            synchronous_parallel_sample(worker_set=group, max_env_steps=200)
        assert isinstance(info.value, ray.exceptions.RayError)  # as with RLlib
        assert info.value.runner_index == 1
        assert "injected env failure on runner 1" in info.value.remote_traceback
        assert group.healthy_env_runner_ids() == []


def test_env_error_with_sub_env_restart_keeps_runner(ray_session, tmp_path):
    config = make_config(
        tmp_path, n=1, env_config={"bad_worker": 1}, restart_failed_sub_environments=True
    )
    with EnvRunnerGroup(config=config, standby_env_runner=False) as group:
        episodes = synchronous_parallel_sample(worker_set=group, max_env_steps=200)
        assert steps(episodes) >= 200
        assert (tmp_path / "fault").exists()  # the fault did happen
        assert group.num_healthy_remote_env_runners() == 1
        assert group.num_remote_worker_restarts() == 0


def test_env_error_rebuilds_runner_in_place_and_batch_is_full(ray_session, tmp_path):
    config = make_config(tmp_path, env_config={"bad_worker": 1})  # restart_failed_env_runners
    with EnvRunnerGroup(config=config, standby_env_runner=False) as group:
        pid = group.foreach_env_runner(lambda w: os.getpid(), remote_worker_ids=[1])[-1]
        start = time.monotonic()
        episodes = synchronous_parallel_sample(worker_set=group, max_env_steps=400)
        assert steps(episodes) >= 400  # the failed runner did not shrink the batch
        assert (tmp_path / "fault").exists()
        assert wait_until(lambda: group.num_healthy_remote_env_runners() == 2, timeout=10)
        assert time.monotonic() - start < 10
        assert group.probe_unhealthy_env_runners() == [1]
        assert group.num_remote_worker_restarts() == 1
        # Rebuilt in the same process (no process restart needed).
        assert group.foreach_env_runner(lambda w: os.getpid(), remote_worker_ids=[1])[-1] == pid


def test_ignore_without_restart_goes_on_with_healthy_runners(ray_session, tmp_path):
    config = make_config(
        tmp_path,
        env_config={"bad_worker": 2},
        restart_failed_env_runners=False,
        ignore_env_runner_failures=True,
    )
    with EnvRunnerGroup(config=config, standby_env_runner=False) as group:
        episodes = synchronous_parallel_sample(worker_set=group, max_env_steps=300)
        assert steps(episodes) >= 300
        assert group.healthy_env_runner_ids() == [1]
        assert group.probe_unhealthy_env_runners(timeout_seconds=1.0) == []


@pytest.mark.timeout(120)
def test_hung_runner_is_detected_killed_and_restarted(ray_session, tmp_path):
    config = make_config(
        tmp_path,
        env_config={"bad_worker": 2, "mode": "hang"},
        sample_timeout_s=2.0,
        num_consecutive_env_runner_failures_tolerance=1,
        env_runner_health_probe_timeout_s=5.0,
    )
    with EnvRunnerGroup(config=config) as group:
        start = time.monotonic()
        episodes = synchronous_parallel_sample(worker_set=group, max_env_steps=300)
        elapsed = time.monotonic() - start
        assert steps(episodes) >= 300
        assert (tmp_path / "fault").exists()
        assert group.num_env_runners_dropped_lifetime() >= 1
        assert elapsed < 30, f"the driver waited {elapsed:.1f}s"
        # Runner 1 filled the batch; runner 2 is killed one deadline after its call
        # was sent (the batch may be done before that).
        assert wait_until(
            lambda: (
                group.probe_unhealthy_env_runners(timeout_seconds=0.5) is not None
                and group._worker_manager.num_hung_actor_kills() == 1
            ),
            timeout=30,
        )
        restored: list[int] = []
        assert wait_until(
            lambda: (
                restored.extend(group.probe_unhealthy_env_runners(timeout_seconds=1.0))
                or group.num_healthy_remote_env_runners() == 2
            ),
            timeout=60,
        )
        assert group.foreach_env_runner(lambda w: w.worker_index, local_env_runner=False) == [1, 2]


def test_constructor_failure_reraises_the_original_exception(ray_session, tmp_path):
    def broken_env(ctx):
        raise RuntimeError("no simulator license")

    config = make_config(tmp_path, n=1, restart_failed_env_runners=False)
    config.environment(broken_env)
    with pytest.raises(RuntimeError, match="no simulator license"):
        EnvRunnerGroup(config=config, standby_env_runner=False)


def test_killed_runner_without_restart_is_a_ray_error_naming_it(ray_session, tmp_path):
    config = make_config(tmp_path, restart_failed_env_runners=False)
    with EnvRunnerGroup(config=config, standby_env_runner=False) as group:
        ray_session.kill(group.remote_workers()[1])
        with pytest.raises(ray.exceptions.RayError, match="env runner 2: died") as info:
            synchronous_parallel_sample(worker_set=group, max_env_steps=100)
        assert isinstance(info.value, EnvRunnerError) and info.value.runner_index == 2
        assert group.healthy_env_runner_ids() == [1]
    # It travels (pickled) unchanged, e.g. out of a Tune trial.
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is type(info.value) and str(again) == str(info.value)
    assert again.runner_index == 2


def test_probe_waits_for_a_runner_that_ray_is_restarting(ray_session, tmp_path):
    config = make_config(tmp_path, n=1)
    with EnvRunnerGroup(config=config, standby_env_runner=False) as group:
        ray_session.kill(group.remote_workers()[0], no_restart=False)
        assert wait_until(
            lambda: (
                group.foreach_env_runner(lambda w: 1, local_env_runner=False) == []
                and group.num_healthy_remote_env_runners() == 0
            )
        )
        # One probe waits (up to its timeout) for the new process instead of returning [].
        assert group.probe_unhealthy_env_runners(timeout_seconds=60.0) == [1]
        assert group.num_healthy_remote_env_runners() == 1
        assert group.num_remote_worker_restarts() == 1
        assert group.num_env_runners_replaced_lifetime() == 1
        assert group.lost_and_replaced_env_runners() == ([1], [1])  # for run summaries


@pytest.mark.timeout(120)
def test_hung_runner_is_out_at_once_then_replaced_and_batches_stay_exact(ray_session, tmp_path):
    """2 runners x 2 envs, a 1.5 s deadline; runner 2's env blocks in step()."""
    deadline = 1.5
    config = make_config(
        tmp_path, env_config={"bad_worker": 2, "mode": "hang"}, sample_timeout_s=deadline
    )
    most = 400 + 2 * 2 - 1  # N + num_envs x num_runners - 1
    with EnvRunnerGroup(config=config, standby_env_runner=True) as group:
        start = time.monotonic()
        episodes = synchronous_parallel_sample(worker_set=group, max_env_steps=400)
        took = time.monotonic() - start
        # One deadline, not one per sub-round (5 rounds of 80 steps were needed).
        assert took < 2 * deadline, f"the round waited {took:.1f}s"
        assert 400 <= steps(episodes) <= most
        assert (tmp_path / "fault").exists()
        assert group.num_healthy_remote_env_runners() == 1  # unhealthy at once
        assert group.num_env_runners_dropped_lifetime() == 1
        # Training goes on with runner 1; runner 2 is killed two deadlines after its call
        # was sent and replaced (standby or new process), then serves again.
        sizes, killed_at = [], None
        while time.monotonic() - start < 60 and group.num_healthy_remote_env_runners() < 2:
            sizes.append(steps(synchronous_parallel_sample(worker_set=group, max_env_steps=400)))
            if killed_at is None and group._worker_manager.num_hung_actor_kills():
                killed_at = time.monotonic() - start
        assert killed_at is not None and killed_at < 2 * deadline + 1.5, killed_at
        assert group.num_healthy_remote_env_runners() == 2
        assert sizes and all(400 <= n <= most for n in sizes), sizes
        assert group._worker_manager.num_hung_actor_kills() == 1
        assert group.num_env_runners_replaced_lifetime() == 1
        assert group.num_remote_worker_restarts() == 1
        assert group.num_env_runners_dropped_lifetime() == 1
        assert group.foreach_env_runner(lambda w: w.worker_index, local_env_runner=False) == [1, 2]
        assert (
            400 <= steps(synchronous_parallel_sample(worker_set=group, max_env_steps=400)) <= most
        )


@pytest.mark.timeout(120)
def test_batch_is_topped_up_while_a_hung_call_is_in_flight(ray_session, tmp_path):
    """Runner 2 hangs in its first call: runner 1 fills the batch before the deadline."""
    deadline = 5.0
    config = make_config(
        tmp_path,
        env_config={"bad_worker": 2, "mode": "hang", "at_step": 1},
        sample_timeout_s=deadline,
    )
    most = 400 + 2 * 2 - 1
    with EnvRunnerGroup(config=config, standby_env_runner=True) as group:
        start = time.monotonic()
        episodes = synchronous_parallel_sample(worker_set=group, max_env_steps=400)
        took = time.monotonic() - start
        assert took < deadline, f"the pass waited {took:.1f}s for the hung call"
        assert 400 <= steps(episodes) <= most
        assert (tmp_path / "fault").exists()
        # Left behind, out of service at once; its result will not count.
        assert group.healthy_env_runner_ids() == [1]
        assert group.num_env_runners_dropped_lifetime() == 1
        sizes = []
        while time.monotonic() - start < 90 and group.num_env_runners_replaced_lifetime() < 1:
            sizes.append(steps(synchronous_parallel_sample(worker_set=group, max_env_steps=400)))
        assert group._worker_manager.num_hung_actor_kills() == 1
        assert group.num_env_runners_replaced_lifetime() == 1
        assert sizes and all(400 <= n <= most for n in sizes), sizes
        assert group.num_env_runners_dropped_lifetime() == 1


@pytest.mark.timeout(120)
def test_slow_call_left_behind_is_dropped_and_its_runner_comes_back(ray_session, tmp_path):
    """Runner 2 is slow once (3 s, deadline 10 s): batch filled by runner 1, runner 2 not killed."""
    config = make_config(
        tmp_path,
        env_config={"bad_worker": 2, "mode": "slow", "sleep_s": 3.0, "at_step": 1},
        sample_timeout_s=10.0,
    )
    most = 400 + 2 * 2 - 1
    with EnvRunnerGroup(config=config, standby_env_runner=False) as group:
        assert (
            400 <= steps(synchronous_parallel_sample(worker_set=group, max_env_steps=400)) <= most
        )
        assert (tmp_path / "fault").exists()
        assert group.healthy_env_runner_ids() == [1]
        sizes = []
        assert wait_until(
            lambda: (
                sizes.append(
                    steps(synchronous_parallel_sample(worker_set=group, max_env_steps=400))
                )
                or group.num_healthy_remote_env_runners() == 2
            ),
            timeout=60,
        )
        assert sizes and all(400 <= n <= most for n in sizes), sizes
        assert group._worker_manager.num_hung_actor_kills() == 0
        assert group.num_env_runners_dropped_lifetime() == 1
        assert group.num_env_runners_replaced_lifetime() == 0  # the same process serves again
        assert group.foreach_env_runner(lambda w: w.worker_index, local_env_runner=False) == [1, 2]


def test_stop_returns_within_a_deadline_with_a_hung_runner(ray_session, tmp_path):
    deadline = 1.5
    config = make_config(
        tmp_path,
        env_config={"bad_worker": 2, "mode": "hang", "at_step": 1},
        sample_timeout_s=deadline,
    )
    group = EnvRunnerGroup(config=config, standby_env_runner=False)
    try:
        # The runner hangs inside an async call: it is still marked healthy.
        group.foreach_env_runner_async(lambda w: w.sample(), remote_worker_ids=[2])
        assert wait_until(lambda: (tmp_path / "fault").exists())
        assert group.num_healthy_remote_env_runners() == 2
    finally:
        start = time.monotonic()
        group.stop()
        took = time.monotonic() - start
    assert took < deadline + 1.0, f"stop() took {took:.1f}s"


_LOST_NODE = """
import shutil, sys, tempfile, time
import ray
from ray.cluster_utils import Cluster
from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.env.env_runner_group import EnvRunnerGroup
from envrunners.execution.rollout_ops import synchronous_parallel_sample
from envrunners.utils.actor_manager import actor_node_id

# A temp dir of its own: other Ray users on this machine must not find this cluster.
tmp = tempfile.mkdtemp(prefix="erlost")
cluster = Cluster(
    initialize_head=True,
    head_node_args={"num_cpus": 0, "include_dashboard": False, "temp_dir": tmp},
)
nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
try:
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    cluster.wait_for_nodes()
    config = (
        AlgorithmConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=1, num_cpus_per_env_runner=1, rollout_fragment_length=20)
        .fault_tolerance(delay_between_env_runner_restarts_s=0.0)
    )
    group = EnvRunnerGroup(config=config, standby_env_runner=True)
    ray.get(group._recovery._standby_ready, timeout=120)
    runner_node = actor_node_id(group.remote_workers()[0])
    standby_node = actor_node_id(group._recovery.standby)
    assert runner_node is not None and standby_node != runner_node, (runner_node, standby_node)
    cpus = lambda w: ray.get_runtime_context().get_assigned_resources().get("CPU")
    assert ray.get(group._recovery.standby.apply.remote(cpus)) == 1.0
    # Lose the runner's node: no CPU is free anywhere, only the standby can take over.
    cluster.remove_node(next(n for n in nodes if n.node_id == runner_node))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and group.num_remote_worker_restarts() < 1:
        synchronous_parallel_sample(worker_set=group, max_env_steps=40)
    assert group.num_healthy_remote_env_runners() == 1
    assert group.num_remote_worker_restarts() == 1
    assert group.num_env_runners_replaced_lifetime() == 1
    assert group.num_env_runners_dropped_lifetime() == 0
    assert group.foreach_env_runner(cpus, local_env_runner=False) == [1.0]
    assert actor_node_id(group.remote_workers()[0]) == standby_node
    assert len(synchronous_parallel_sample(worker_set=group, max_env_steps=40)) > 0
    group.stop()
    print("LOST-NODE-OK")
finally:
    ray.shutdown()
    cluster.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
"""


@pytest.mark.timeout(300)
def test_runner_on_a_lost_node_is_replaced_by_the_standby_away_from_it(tmp_path):
    """A real 3-node Ray cluster (in a subprocess: the session's Ray stays as it is)."""
    import subprocess

    import envrunners

    env = dict(os.environ)
    src = str(Path(envrunners.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-c", _LOST_NODE],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,
    )
    assert "LOST-NODE-OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]
