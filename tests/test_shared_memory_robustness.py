"""``SharedMemoryVectorEnv`` when a worker hangs or dies mid-reset, and the runner's
``overlap_inference="auto"`` announcing its env once, with real worker processes.

A sub-env that blocks forever in ``step`` (``time.sleep``) leaves its worker alive but
silent: past ``timeout_s`` it is killed and replaced (``restart_failed``: its sub-envs
come back reset and marked failed) or reported as ``VectorEnvWorkerHungError``. A
worker that dies inside a seeded reset is replaced by one that resets with the same
seeds. A marker file arms the fault once: the sub-env that removes it misbehaves, its
replacement finds none.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from tests.test_shared_memory_vector_env import assert_worker_1_replaced, start_stepping

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.columns import Columns
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.core.rl_module.torch.torch_rl_module import TorchRLModule
from envrunners.env.env_runner_group import EnvRunnerGroup
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.env.vector import SharedMemoryVectorEnv
from envrunners.env.vector.shared_memory_vector_env import default_start_method
from envrunners.errors import ConfigError, VectorEnvWorkerDiedError, VectorEnvWorkerHungError
from envrunners.sampling._overlap_choice import available_cpus


class Faulty(gym.Wrapper):
    """CartPole that, once ``marker`` exists, removes it and then blocks forever in
    ``step`` (``fault="hang"``) or exits its process in ``reset`` (``fault="exit"``)."""

    def __init__(self, marker: str | None = None, fault: str = "hang", sleep_s: float = 0.0):
        super().__init__(gym.make("CartPole-v1"))
        self.marker, self.fault, self.sleep_s = marker, fault, sleep_s

    def _armed(self) -> bool:
        if self.marker is None:
            return False
        try:
            os.remove(self.marker)
        except FileNotFoundError:
            return False
        return True

    def step(self, action):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.fault == "hang" and self._armed():
            time.sleep(1e6)
        return self.env.step(action)

    def reset(self, **kwargs):
        if self.fault == "exit" and self._armed():
            os._exit(3)
        return self.env.reset(**kwargs)


def faulty_fns(n: int, marker: str | None, faulty: set[int], fault: str = "hang") -> list:
    return [(lambda m=(marker if i in faulty else None): Faulty(m, fault)) for i in range(n)]


def gone(pid: int) -> bool:
    """Whether process ``pid`` no longer exists (killed and reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def arm(path) -> str:
    path.write_text("")
    return str(path)


def test_a_hung_worker_without_restarts_is_an_error_naming_it(tmp_path):
    marker = tmp_path / "hang"
    env = SharedMemoryVectorEnv(faulty_fns(4, str(marker), {2, 3}), num_workers=2, timeout_s=1)
    env.reset(seed=0)
    pid = env.processes[1].pid
    arm(marker)
    with pytest.raises(VectorEnvWorkerHungError) as info:
        env.step(np.zeros(4, np.int64))
    err = info.value
    message = str(err)
    assert f"worker 1 (pid {pid}, sub-envs 2..3)" in message and "timeout_s=1.0" in message
    assert err.worker_index == 1 and err.sub_env_indices == [2, 3] and err.timeout_s == 1.0
    assert isinstance(err, VectorEnvWorkerDiedError)
    assert env.closed and gone(pid) and not mp.active_children()


@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_hung_worker_is_killed_and_replaced_when_restarting_failed_sub_envs(tmp_path, batch_size):
    marker = tmp_path / "hang"
    env = SharedMemoryVectorEnv(
        faulty_fns(4, str(marker), {2, 3}),
        num_workers=2,
        batch_size=batch_size,
        restart_failed=True,
        timeout_s=1,
    )
    try:
        old_pid = env.processes[1].pid
        start_stepping(env, batch_size)
        arm(marker)
        if batch_size is None:
            obs, rew, te, tr, _ = env.step(np.zeros(4, np.int64))
            ids = np.arange(4)
        else:  # the other worker keeps answering meanwhile
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                ids, obs, rew, te, tr, _ = env.recv()
                if env.failed.any():
                    break
                env.send(np.zeros(2, np.int64), ids)
        assert [i for i, _ in env.last_errors] == [2, 3]
        assert gone(old_pid)
        assert_worker_1_replaced(
            env, ids, obs, rew, te, tr, VectorEnvWorkerHungError, sync=batch_size is None
        )
    finally:
        env.close()
    assert not mp.active_children()


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_worker_dying_in_a_seeded_reset_is_replaced_with_its_seeds(tmp_path, asynchronous):
    batch_size = 2 if asynchronous else None

    def seeded_reset(env):
        if not asynchronous:
            return env.reset(seed=11)[0]
        env.async_reset(seed=11)
        obs = np.zeros((4, 4), np.float32)
        for _ in range(2):  # each worker's share once (none is sent again)
            ids, batch, *_ = env.recv()
            obs[ids] = batch
        return obs

    reference = SharedMemoryVectorEnv(
        faulty_fns(4, None, set()), num_workers=2, batch_size=batch_size
    )
    try:
        expected = seeded_reset(reference)
    finally:
        reference.close()
    marker = tmp_path / "exit"
    env = SharedMemoryVectorEnv(
        faulty_fns(4, str(marker), {2, 3}, fault="exit"),
        num_workers=2,
        batch_size=batch_size,
        restart_failed=True,
    )
    try:
        old_pid = env.processes[1].pid
        arm(marker)
        obs = seeded_reset(env)
        assert env.processes[1].pid != old_pid and env.num_failures == 2
        np.testing.assert_array_equal(obs, expected)
    finally:
        env.close()
    assert not mp.active_children()


def test_a_bad_timeout_is_a_config_error():
    for bad in (0, -1.0, "1", True):
        with pytest.raises(ConfigError, match=r"timeout_s must be a positive number"):
            SharedMemoryVectorEnv(faulty_fns(2, None, set()), num_workers=1, timeout_s=bad)


def _runner_config(env_creator, num_envs: int = 4):
    return (
        AlgorithmConfig()
        .environment(env_creator)
        .env_runners(
            num_envs_per_env_runner=num_envs,
            gym_env_vectorize_mode="shared_memory",
            overlap_inference=False,
            sample_timeout_s=1.0,
        )
        .fault_tolerance(restart_failed_sub_environments=True)
        .debugging(seed=0)
    )


def test_runner_drops_the_episodes_of_a_hung_worker_and_goes_on(tmp_path):
    marker = tmp_path / "hang"
    path = str(marker)
    config = _runner_config(lambda ctx: Faulty(path if ctx.vector_index >= 2 else None))
    runner = SingleAgentEnvRunner(config=config)
    try:
        assert runner.env.timeout_s == 1.0
        runner.sample(num_timesteps=100)
        arm(marker)
        episodes = runner.sample(num_timesteps=200)
        assert runner.env.num_failures == len(runner.env.shares[-1])
        assert sum(len(e) for e in episodes) >= 200
        for e in episodes:
            assert len(e.get_observations()) == len(e) + 1
    finally:
        runner.stop()
    assert not mp.active_children()


class AngleModule(TorchRLModule):
    """Scripted policy: push toward the side the pole leans to."""

    sleep_s = 0.0

    def setup(self):
        self.unused = torch.nn.Linear(1, 1)

    def _forward(self, batch, **kwargs):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return {Columns.ACTIONS: (batch[Columns.OBS][:, 2] > 0).long()}


class SlowAngleModule(AngleModule):
    """A forward that costs about as much as the ``Faulty(sleep_s=0.002)`` step, so that
    ``overlap_inference="auto"`` overlaps (given a second core)."""

    sleep_s = 0.002


@pytest.mark.parametrize("slow", [False, True])
def test_auto_overlap_announces_only_the_env_it_uses(slow):
    created = []
    config = (
        AlgorithmConfig()
        .environment(lambda ctx: Faulty(sleep_s=0.002 if slow else 0.0))
        .env_runners(num_envs_per_env_runner=4, gym_env_vectorize_mode="shared_memory")
        .callbacks(on_environment_created=lambda env, **kw: created.append(env))
        .debugging(seed=0)
        .rl_module(
            rl_module_spec=RLModuleSpec(module_class=SlowAngleModule if slow else AngleModule)
        )
    )
    runner = SingleAgentEnvRunner(config=config)
    try:
        assert runner._overlap_costs is not None  # "auto" timed the first env
        if slow and available_cpus() >= 2:
            assert runner._ready_batch == 2  # and replaced it to overlap
        assert created == [runner.env.unwrapped]
        assert sum(len(e) for e in runner.sample(num_timesteps=40)) >= 40
        runner.make_env()  # a recreated env is announced again
        assert len(created) == 2 and created[1] is runner.env.unwrapped
    finally:
        runner.stop()
    assert not mp.active_children()


# -- the workers' start method --------------------------------------------------------------
#: Taken by ``LockedCartPole``'s constructor; a thread of the test holds it meanwhile.
_BUILD_LOCK = threading.Lock()


class LockedCartPole(gym.Wrapper):
    """CartPole whose constructor takes a module-level lock: a forked worker inherits
    the lock as the parent's other thread holds it and waits forever (how native
    libraries' thread pools break forked children); a worker that imports this module
    afresh finds it free."""

    def __init__(self):
        with _BUILD_LOCK:
            super().__init__(gym.make("CartPole-v1"))


def _spaces():
    env = gym.make("CartPole-v1")
    return {"observation_space": env.observation_space, "action_space": env.action_space}


@pytest.fixture
def lock_held_by_another_thread():
    held, release = threading.Event(), threading.Event()

    def hold():
        with _BUILD_LOCK:
            held.set()
            release.wait()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    held.wait()
    yield
    release.set()
    thread.join()


def test_workers_start_from_a_forkserver_where_other_threads_run(lock_held_by_another_thread):
    """This process runs threads (the fixture's, BLAS's), so the default start method is
    the forkserver: the workers build their sub-envs while the lock is held here. Forced
    to fork, the same workers inherit the held lock and hang (and are reported)."""
    assert default_start_method() == "forkserver"
    env = SharedMemoryVectorEnv([LockedCartPole] * 4, num_workers=2, timeout_s=5, **_spaces())
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (4, 4)
        env.step(np.zeros(4, np.int64))
    finally:
        env.close()
    with pytest.raises(VectorEnvWorkerHungError, match="building its sub-envs"):
        SharedMemoryVectorEnv(
            [LockedCartPole] * 2, num_workers=2, timeout_s=1, context="fork", **_spaces()
        )
    assert not mp.active_children()


def test_a_single_threaded_process_forks():
    """With one thread (BLAS pools off), forking is safe and the fastest start."""
    code = (
        "import os;"
        "from envrunners.env.vector.shared_memory_vector_env import default_start_method;"
        "assert len(os.listdir('/proc/self/task')) == 1;"
        "print(default_start_method())"
    )
    single = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **single}, capture_output=True,
        text=True, timeout=120, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "fork"


def test_env_functions_the_forkserver_cannot_pickle_fall_back_to_fork(
    caplog, lock_held_by_another_thread
):
    """Threads run here (the fixture's), but the env functions hold a lock, which
    cloudpickle cannot pickle: the workers are forked, with a warning saying why."""
    assert default_start_method() == "forkserver"
    lock = threading.Lock()

    def make():
        assert lock is not None
        return gym.make("CartPole-v1")

    with caplog.at_level("WARNING", logger="envrunners"):
        env = SharedMemoryVectorEnv([make] * 2, num_workers=2, **_spaces())
    try:
        assert env._ctx.get_start_method() == "fork"
        assert env.reset(seed=0)[0].shape == (2, 4)
    finally:
        env.close()
    assert "cannot be pickled" in caplog.text and "forking this process instead" in caplog.text


def _one_remote_shared_memory_runner():
    """A config of one remote runner stepping 4 CartPoles in shared-memory workers."""
    return (
        AlgorithmConfig()
        .environment("CartPole-v1")
        .env_runners(
            num_env_runners=1, num_envs_per_env_runner=4, gym_env_vectorize_mode="shared_memory"
        )
        .rl_module(rl_module_spec=RLModuleSpec())
    )


def test_a_remote_runner_steps_shared_memory_workers_started_from_a_forkserver(ray_session):
    """A Ray actor runs Ray's threads, so its shared-memory workers start from a
    forkserver; the runner samples whole episodes and closes them on stop."""
    config = _one_remote_shared_memory_runner().debugging(seed=0)
    with EnvRunnerGroup(config=config, standby_env_runner=False) as group:
        (methods,) = group.foreach_env_runner(
            lambda r: (r.env._ctx.get_start_method(), default_start_method()),
            local_env_runner=False,
        )
        assert methods == ("forkserver", "forkserver")
        (episodes,) = group.foreach_env_runner(
            lambda r: r.sample(num_episodes=4), local_env_runner=False
        )
        assert len(episodes) == 4 and all(e.is_done for e in episodes)


def test_a_script_without_a_main_guard_runs_forkserver_workers(tmp_path):
    """multiprocessing runs a script's main module again in each forkserver child; the
    workers leave it out, so a training script without ``if __name__ == "__main__"``
    (common in RLlib scripts) does not build its runner again in every worker. The
    gymnasium id the script registers reaches the workers too (its spec goes along)."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import threading

            import gymnasium as gym

            from envrunners.algorithms.ppo import PPOConfig
            from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner

            print("script body runs", flush=True)
            stop = threading.Event()
            threading.Thread(target=stop.wait, daemon=True).start()  # another thread runs
            gym.register("ScriptCartPole-v0", entry_point=lambda: gym.make("CartPole-v1"))
            config = PPOConfig().environment("ScriptCartPole-v0").env_runners(
                num_envs_per_env_runner=4, gym_env_vectorize_mode="shared_memory"
            )
            runner = SingleAgentEnvRunner(config=config)
            episodes = runner.sample(num_episodes=2)
            print(runner.env._ctx.get_start_method(), len(episodes), flush=True)
            runner.stop()
            stop.set()
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.splitlines() == ["script body runs", "forkserver 2"], out.stderr[-2000:]


def test_a_killed_remote_runner_leaves_no_forkserver_or_worker_behind(ray_session):
    """SIGKILL the runner actor: its forkserver, the resource tracker and the workers all
    go within seconds (Ray ends a dead worker's children; the next test checks the
    workers' own parent check, without Ray)."""
    config = _one_remote_shared_memory_runner().fault_tolerance(restart_failed_env_runners=False)
    with EnvRunnerGroup(config=config, standby_env_runner=False) as group:
        ((actor_pid, workers, method),) = group.foreach_env_runner(
            lambda r: (
                os.getpid(),
                [p.pid for p in r.env.processes],
                r.env._ctx.get_start_method(),
            ),
            local_env_runner=False,
        )
        assert method == "forkserver" and len(workers) == 2
        with open(f"/proc/{actor_pid}/task/{actor_pid}/children") as f:
            helpers = [int(pid) for pid in f.read().split()]  # the forkserver, the tracker
        assert helpers and not set(workers) & set(helpers)  # workers are the server's
        os.kill(actor_pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(map(gone, workers + helpers)):
            time.sleep(0.1)
        assert all(map(gone, workers + helpers))


def test_forkserver_workers_of_a_killed_parent_exit():
    """A forkserver's workers have the server as their parent, so they watch the pid of
    the process that made the env: SIGKILL it and they exit at their next idle poll."""
    script = textwrap.dedent(
        """
        import threading, time
        import gymnasium as gym
        from envrunners.env.vector import SharedMemoryVectorEnv

        threading.Thread(target=time.sleep, args=(1e6,), daemon=True).start()
        env = SharedMemoryVectorEnv([lambda: gym.make("CartPole-v1")] * 2, num_workers=2)
        print(env._ctx.get_start_method(), *[p.pid for p in env.processes], flush=True)
        time.sleep(1e6)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    method, *pids = parent.stdout.readline().split()
    workers = [int(pid) for pid in pids]
    try:
        assert method == "forkserver" and len(workers) == 2
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(map(gone, workers)):
            time.sleep(0.1)
        assert all(map(gone, workers))
    finally:
        for pid in workers:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        parent.stdout.close()


_KILLED_WITH_ITS_HELPERS = textwrap.dedent(
    """
    import functools, os, signal
    import gymnasium as gym
    from envrunners.env.vector import SharedMemoryVectorEnv
    fn = functools.partial(gym.make, "CartPole-v1")
    env = SharedMemoryVectorEnv([fn] * 2, num_workers=2, context="forkserver")
    env.reset(seed=0)
    print(" ".join(f for f in os.listdir("/dev/shm") if f"-{os.getpid()}-" in f), flush=True)
    os.killpg(0, signal.SIGKILL)  # with its forkserver, resource tracker and workers
    """
)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX named semaphores in /dev/shm")
def test_semaphores_of_a_process_killed_with_its_resource_tracker_are_swept():
    """A Ray node shutting down kills a runner with its helpers, the resource tracker
    too, which would unlink the semaphores: before, they stayed in /dev/shm for good.
    The next vector env (any process) removes the entries of processes that are gone."""
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_WITH_ITS_HELPERS], capture_output=True, text=True,
        timeout=120, start_new_session=True,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    left = proc.stdout.split()
    assert len(left) == 3  # "done" and one "go" per worker, named after the killed process
    assert set(left) <= set(os.listdir("/dev/shm"))
    env = SharedMemoryVectorEnv(
        [lambda: gym.make("CartPole-v1")] * 2, num_workers=2, context="forkserver"
    )
    try:
        assert not set(left) & set(os.listdir("/dev/shm"))
        own = [f for f in os.listdir("/dev/shm") if f"-{os.getpid()}-" in f]
        assert len(own) == 3  # a live process's entries stay (they are in use)
        env.reset(seed=0)
        env.step(np.zeros(2, dtype=np.int64))
    finally:
        env.close()
    assert not [f for f in os.listdir("/dev/shm") if f"-{os.getpid()}-" in f]


def test_multi_agent_env_functions_load_in_a_worker_without_torch():
    """Unpickling a multi-agent runner's env functions (what each shared-memory or
    async worker does first) imports gymnasium and the registry, not torch. Before,
    they named ``_multi_agent_setup`` (acting code): every worker imported torch, and
    a multi-agent runner with shared-memory workers took 1-2.5 s to build, a replaced
    one too (0.04-0.07 s after)."""
    from ray import cloudpickle

    from envrunners.env._multi_agent_setup import make_vector_env
    from envrunners.env.multi_agent_env import make_multi_agent

    config = AlgorithmConfig().environment(
        make_multi_agent("CartPole-v1"), env_config={"num_agents": 2}
    )
    env, _ = make_vector_env(config, 1, 2)  # (sync: the same functions, kept in-process)
    fn = env.env_fns[0]
    env.close()
    code = (
        "import sys; from ray import cloudpickle;"
        "env = cloudpickle.loads(sys.stdin.buffer.read())();"
        "obs, _ = env.reset(seed=0);"
        "print(sorted(obs), 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=cloudpickle.dumps(fn), capture_output=True,
        timeout=120, check=True,
    )  # fmt: skip
    assert out.stdout.decode().split() == ["[0,", "1]", "False"], out.stderr.decode()[-2000:]
