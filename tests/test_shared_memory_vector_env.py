"""``SharedMemoryVectorEnv`` and ``gym_env_vectorize_mode="shared_memory"``, with real worker
processes.

The reference is gymnasium's ``SyncVectorEnv`` (``NEXT_STEP`` autoreset) under the same
seeds and scripted actions: the synchronous API must give the same batches, and the
asynchronous ``recv``/``send`` API must give every sub-env the same trajectory, for
CartPole and for an env with a nested ``Dict``/``Tuple`` observation and infos. Failures:
a raising sub-env is recreated (or raised), a SIGKILLed worker is an error naming it, and
``close`` leaves no process and no ``/dev/shm`` entry behind.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers.vector import DictInfoToList

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.columns import Columns
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.core.rl_module.torch.torch_rl_module import TorchRLModule
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.env.vector import SharedMemoryVectorEnv
from envrunners.env.vector.shared_memory_vector_env import default_num_workers
from envrunners.errors import ConfigError, SubEnvError, VectorEnvWorkerDiedError

NEXT_STEP = gym.vector.AutoresetMode.NEXT_STEP


class NestedCartPole(gym.Wrapper):
    """CartPole with a nested observation (``Dict`` holding a ``Tuple``) and infos on
    every third step."""

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        box = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        self.observation_space = gym.spaces.Dict(
            {
                "cart": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32),
                "pole": gym.spaces.Tuple((box, box)),
                "parity": gym.spaces.Discrete(2),
            }
        )
        self.t = 0

    def _obs(self, o):
        return {"cart": o[:2], "pole": (o[2:3], o[3:4]), "parity": self.t % 2}

    def reset(self, **kwargs):
        self.t = 0
        obs, info = self.env.reset(**kwargs)
        return self._obs(obs), {"reset": True}

    def step(self, action):
        self.t += 1
        obs, r, te, tr, _ = self.env.step(action)
        return self._obs(obs), r, te, tr, ({"t": self.t} if self.t % 3 == 0 else {})


class FailingCartPole(gym.Wrapper):
    """CartPole whose ``step`` raises on its ``fail_at``-th call."""

    def __init__(self, fail_at: int):
        super().__init__(gym.make("CartPole-v1"))
        self.calls, self.fail_at = 0, fail_at

    def step(self, action):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError(f"boom at step {self.calls}")
        return self.env.step(action)


class _ExitWhenPickled:
    """An info value whose pickling ends the (worker) process: it dies after answering,
    before its message is sent (the answer is in shared memory, the message never comes)."""

    def __reduce__(self):
        os._exit(1)


class DiesBeforeItsMessage(gym.Wrapper):
    """CartPole whose ``die_at``-th step returns an info that kills its worker while it is
    sent; only once (``marker``, a file), so the replacement worker behaves."""

    def __init__(self, die_at: int, marker: str):
        super().__init__(gym.make("CartPole-v1"))
        self.calls, self.die_at, self.marker = 0, die_at, marker

    def step(self, action):
        self.calls += 1
        obs, r, te, tr, info = self.env.step(action)
        if self.calls == self.die_at and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            info = {"x": _ExitWhenPickled()}
        return obs, r, te, tr, info


def assert_worker_1_replaced(
    env, ids, obs, rew, te, tr, error_cls=VectorEnvWorkerDiedError, *, sync: bool
):
    """Worker 1 (sub-envs 2, 3) was replaced after ``error_cls``: its rows are fresh
    resets, marked failed, and it runs again (``sync``: the next ``step`` is clean)."""
    assert env.failed.tolist() == [False, False, True, True]
    assert all(isinstance(e, error_cls) for _, e in env.last_errors)
    rows = np.isin(ids, [2, 3])
    assert (rew[rows] == 0).all() and not te[rows].any() and not tr[rows].any()
    assert (np.abs(obs[rows]) <= 0.05).all()  # CartPole's start states
    assert env.processes[1].is_alive()
    if sync:
        env.step(np.zeros(4, np.int64))
        assert not env.failed.any()


def start_stepping(env, batch_size):
    """Reset ``env`` (2 workers of 2 sub-envs); ready-first: both shares received and sent again."""
    if batch_size is None:
        env.reset(seed=0)
        return
    env.async_reset(seed=0)
    for _ in range(2):
        ids, *_ = env.recv()
        env.send(np.zeros(2, np.int64), ids)


def assert_closed_cleanly(pids, shm_before):
    """No worker process left (``pids`` all gone) and no new /dev/shm entry."""
    assert not mp.active_children()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    if os.path.isdir("/dev/shm"):
        assert set(os.listdir("/dev/shm")) - shm_before == set()


def cartpole_fns(n):
    return [lambda: gym.make("CartPole-v1") for _ in range(n)]


def nested_fns(n):
    return [NestedCartPole for _ in range(n)]


def flat(obs, row=None):
    """A (nested) observation batch, or its row ``row``, as one list of leaf arrays."""
    if isinstance(obs, dict):
        return [leaf for key in sorted(obs) for leaf in flat(obs[key], row)]
    if isinstance(obs, tuple):
        return [leaf for item in obs for leaf in flat(item, row)]
    return [np.asarray(obs if row is None else obs[row])]


def assert_same_obs(a, b):
    for x, y in zip(flat(a), flat(b), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("make", [cartpole_fns, nested_fns])
def test_sync_api_gives_gymnasium_sync_vector_env_batches(make):
    n, steps = 4, 150
    ref = DictInfoToList(gym.vector.SyncVectorEnv(make(n), autoreset_mode=NEXT_STEP))
    env = SharedMemoryVectorEnv(make(n), num_workers=2)
    try:
        assert not env.is_async and env.num_workers == 2
        assert env.single_observation_space == ref.single_observation_space
        obs, infos = env.reset(seed=11)
        ref_obs, ref_infos = ref.reset(seed=11)
        assert_same_obs(obs, ref_obs)
        assert infos == ref_infos
        actions = np.random.default_rng(0).integers(0, 2, (steps, n))
        dones = 0
        for t in range(steps):
            out, ref_out = env.step(actions[t]), ref.step(actions[t])
            assert_same_obs(out[0], ref_out[0])
            for x, y in zip(out[1:4], ref_out[1:4], strict=True):
                np.testing.assert_array_equal(x, y)
                assert x.dtype == y.dtype
            assert out[4] == ref_out[4]
            dones += int(out[2].sum() + out[3].sum())
        assert dones >= 4  # the run crosses autoresets
    finally:
        env.close()
        ref.close()


def test_spawned_workers_give_the_same_batches():
    """Another start method: the env functions and the shared buffer travel pickled."""
    ref = gym.vector.SyncVectorEnv(cartpole_fns(2), autoreset_mode=NEXT_STEP)
    env = SharedMemoryVectorEnv(cartpole_fns(2), num_workers=2, context="spawn")
    try:
        np.testing.assert_array_equal(env.reset(seed=4)[0], ref.reset(seed=4)[0])
        for t in range(40):
            out, ref_out = env.step([t % 2, 0]), ref.step([t % 2, 0])
            for x, y in zip(out[:4], ref_out[:4], strict=True):
                np.testing.assert_array_equal(x, y)
    finally:
        env.close()
        ref.close()


def sync_reference(make, n, seed, script, steps):
    """Per sub-env: ``steps + 1`` (obs, reward, terminated, truncated, info) of the synchronous
    run where sub-env ``i`` takes ``script[i, t]`` at its step ``t``."""
    ref = DictInfoToList(gym.vector.SyncVectorEnv(make(n), autoreset_mode=NEXT_STEP))
    obs, infos = ref.reset(seed=seed)
    seen = [[(flat(obs, i), 0.0, False, False, infos[i])] for i in range(n)]
    for t in range(steps):
        obs, rew, te, tr, infos = ref.step(script[:, t])
        for i in range(n):
            seen[i].append((flat(obs, i), rew[i], te[i], tr[i], infos[i]))
    ref.close()
    return seen


@pytest.mark.parametrize(
    ("make", "workers"), [(cartpole_fns, 4), (cartpole_fns, 2), (nested_fns, 2)]
)
def test_async_recv_send_gives_each_sub_env_the_synchronous_trajectory(make, workers):
    n, batch, steps, seed = 4, 2, 80, 5
    script = np.random.default_rng(1).integers(0, 2, (n, steps + 1))
    expected = sync_reference(make, n, seed, script, steps)
    env = SharedMemoryVectorEnv(make(n), num_workers=workers, batch_size=batch)
    seen = [[] for _ in range(n)]
    try:
        assert env.is_async
        with pytest.raises(ConfigError, match="async_reset"):
            env.reset()
        env.async_reset(seed=seed)
        while min(len(s) for s in seen) <= steps:
            ids, obs, rew, te, tr, infos = env.recv()
            assert ids.dtype == np.int32 and len(ids) == batch == len(infos)
            for j, i in enumerate(ids.tolist()):
                seen[i].append((flat(obs, j), rew[j], te[j], tr[j], infos[j]))
            env.send(np.array([script[i, min(len(seen[i]) - 1, steps)] for i in ids]), ids)
    finally:
        env.close()
    for i in range(n):
        for got, want in zip(seen[i][: steps + 1], expected[i], strict=True):
            for x, y in zip(got[0], want[0], strict=True):
                np.testing.assert_array_equal(x, y)
            assert got[1:] == want[1:]
    assert sum(e[2] or e[3] for s in expected for e in s) >= 4  # crosses autoresets


def recv_until(env, done, actions=None, timeout_s=60.0):
    """``recv``/``send`` until ``done(recv_results)`` holds (returns those results).

    Bounded by time, not by calls: on a loaded machine one worker may wait for a CPU
    while the others answer hundreds of calls, and ready-first returns those.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        results = env.recv()
        if done(results):
            return results
        ids = results[0]
        env.send(np.zeros(len(ids), np.int64) if actions is None else actions, ids)
    raise AssertionError(f"no matching recv() within {timeout_s} s")


def check_next_step_autoreset(env, n):
    """The rules ``EnvPoolVectorEnv`` documents, through ``step`` and through ``recv``/``send``:
    the call after a sub-env's episode ended returns its reset observation with reward 0 and
    both flags False; rows are in sub-env order; infos are one dict per row."""
    obs, infos = env.reset(seed=3)
    assert isinstance(infos, list) and len(infos) == n and obs.shape == (n, 4)
    ended = np.zeros(n, bool)
    resets = 0
    for _ in range(40):  # always pushing left ends CartPole episodes within ~10 steps
        obs, rew, te, tr, infos = env.step(np.zeros(n, np.int64))
        assert len(infos) == n and all(isinstance(i, dict) for i in infos)
        assert not (rew[ended] != 0).any() and not te[ended].any() and not tr[ended].any()
        assert (np.abs(obs[ended]) <= 0.05).all()  # CartPole's start states
        resets += int(ended.sum())
        ended = te | tr
    assert resets >= n


def test_autoreset_semantics_are_envpool_vector_envs():
    n = 4
    env = SharedMemoryVectorEnv(cartpole_fns(n), num_workers=2)
    try:
        check_next_step_autoreset(env, n)
    finally:
        env.close()
    envpool_vector_env = pytest.importorskip("envrunners.env.vector.envpool_vector_env")
    pytest.importorskip("envpool")
    pool = envpool_vector_env.EnvPoolVectorEnv("CartPole-v1", n)
    try:
        check_next_step_autoreset(pool, n)
    finally:
        pool.close()


def test_a_raising_sub_env_is_recreated_and_reported():
    n = 4
    fns = cartpole_fns(n)
    fns[1] = lambda: FailingCartPole(fail_at=3)
    env = SharedMemoryVectorEnv(fns, num_workers=2, restart_failed=True)
    try:
        env.reset(seed=0)
        for _ in range(2):
            env.step(np.ones(n, np.int64))
            assert not env.failed.any() and env.last_errors == []
        obs, rew, te, tr, _ = env.step(np.ones(n, np.int64))
        assert env.failed.tolist() == [False, True, False, False]
        [(index, error)] = env.last_errors
        assert index == 1 and isinstance(error, RuntimeError) and "boom at step 3" in str(error)
        assert rew[1] == 0 and not te[1] and not tr[1] and (np.abs(obs[1]) <= 0.05).all()
        assert env.num_failures == 1
        env.step(np.ones(n, np.int64))
        assert not env.failed.any() and env.last_errors == []
        # The runner's non-finite path: recreate a sub-env after an error in its results.
        new_obs, info = env.restart_sub_env(2, ValueError("a NaN observation"))
        assert (np.abs(new_obs) <= 0.05).all() and isinstance(info, dict)
        assert env.failed[2] and env.num_failures == 2
    finally:
        env.close()


def test_a_raising_sub_env_without_restarts_raises_naming_it():
    fns = cartpole_fns(4)
    fns[3] = lambda: FailingCartPole(fail_at=1)
    env = SharedMemoryVectorEnv(fns, num_workers=2, batch_size=2)
    try:
        env.async_reset(seed=0)
        with pytest.raises(SubEnvError, match="boom at step 1") as info:
            recv_until(env, lambda results: False)
        assert info.value.sub_env_index == 3 and "raise RuntimeError" in info.value.remote_traceback
    finally:
        env.close()


def test_restart_failed_marks_sub_envs_in_recv():
    fns = cartpole_fns(4)
    fns[2] = lambda: FailingCartPole(fail_at=2)
    env = SharedMemoryVectorEnv(fns, num_workers=4, batch_size=2, restart_failed=True)
    marked = []

    def note(results):
        ids = results[0]
        marked.extend(ids[env.failed[ids]].tolist())
        return len(marked) >= 2

    try:
        env.async_reset(seed=0)
        recv_until(env, note)
    finally:
        env.close()
    # Each new FailingCartPole fails at its second step again.
    assert marked == [2, 2] and env.num_failures == 2


def test_a_killed_worker_is_an_error_naming_it_and_its_sub_envs():
    env = SharedMemoryVectorEnv(cartpole_fns(4), num_workers=2)
    env.reset(seed=0)
    victim = env.processes[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    with pytest.raises(VectorEnvWorkerDiedError, match=r"worker 1 .*sub-envs 2\.\.3") as info:
        env.step(np.zeros(4, np.int64))
    assert info.value.worker_index == 1 and info.value.sub_env_indices == [2, 3]
    assert isinstance(info.value, SubEnvError)
    assert env.closed and not mp.active_children()


@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_killed_worker_is_replaced_when_restarting_failed_sub_envs(batch_size):
    env = SharedMemoryVectorEnv(
        cartpole_fns(4), num_workers=2, batch_size=batch_size, restart_failed=True
    )
    try:
        old_pid = env.processes[1].pid
        start_stepping(env, batch_size)
        os.kill(old_pid, signal.SIGKILL)
        if batch_size is None:
            obs, rew, te, tr, _ = env.step(np.zeros(4, np.int64))
            ids = np.arange(4)
        else:
            ids, obs, rew, te, tr, _ = recv_until(env, lambda results: env.failed.any())
        assert [i for i, _ in env.last_errors] == [2, 3]
        assert env.processes[1].pid != old_pid
        assert_worker_1_replaced(env, ids, obs, rew, te, tr, sync=batch_size is None)
    finally:
        env.close()
    assert not mp.active_children()


@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_worker_dying_after_its_answer_before_its_message_is_replaced(tmp_path, batch_size):
    fns = cartpole_fns(4)
    marker = str(tmp_path / "died")
    fns[2] = lambda: DiesBeforeItsMessage(die_at=3, marker=marker)
    env = SharedMemoryVectorEnv(fns, num_workers=2, batch_size=batch_size, restart_failed=True)
    try:
        old_pid = env.processes[1].pid
        start_stepping(env, batch_size)
        if batch_size is None:
            results = None
            for _ in range(5):
                obs, rew, te, tr, _ = env.step(np.zeros(4, np.int64))
                if env.failed.any():
                    results = (np.arange(4), obs, rew, te, tr)
                    break
            assert results is not None
        else:
            results = recv_until(env, lambda r: env.failed.any())
        ids, obs, rew, te, tr = results[:5]
        assert os.path.exists(marker)
        # The rows of the lost message are the replacement's reset, marked failed.
        assert np.isin(ids, [2, 3]).sum() == 2
        assert env.processes[1].pid != old_pid
        assert_worker_1_replaced(env, ids, obs, rew, te, tr, sync=batch_size is None)
        if batch_size is not None:  # (the returned shares step again once they are sent)
            env.send(np.zeros(len(ids), np.int64), ids)
            recv_until(env, lambda r: not env.failed[r[0]].any() and 2 in r[0])
    finally:
        env.close()
    assert not mp.active_children()


def test_runner_goes_on_after_a_worker_is_killed():
    config = (
        AlgorithmConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=4, gym_env_vectorize_mode="shared_memory")
        .fault_tolerance(restart_failed_sub_environments=True)
        .debugging(seed=0)
    )
    runner = SingleAgentEnvRunner(config=config)
    try:
        runner.sample(num_timesteps=100)
        os.kill(runner.env.processes[0].pid, signal.SIGKILL)
        episodes = runner.sample(num_timesteps=200)
        assert sum(len(e) for e in episodes) >= 200
        for e in episodes:
            assert len(e.get_observations()) == len(e) + 1
    finally:
        runner.stop()
    assert not mp.active_children()


def test_close_stops_every_worker_and_leaves_no_shared_memory():
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    env = SharedMemoryVectorEnv(nested_fns(4), num_workers=2, batch_size=2)
    pids = [p.pid for p in env.processes]
    env.async_reset(seed=0)
    ids, *_ = env.recv()
    env.send(np.zeros(2, np.int64), ids)  # a step still in flight when closing
    env.close()
    env.close()  # a second close does nothing
    assert_closed_cleanly(pids, before)
    with pytest.raises(RuntimeError, match="closed"):
        env.recv()


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
def test_ready_first_workers_run_as_sched_batch():
    """Stepping ready-first, a worker woken by ``send`` must not preempt the parent acting
    for the other sub-envs: the workers run as ``SCHED_BATCH``. Stepping every sub-env
    together (the parent waits anyway) they keep the parent's policy."""
    for batch, policy in ((2, os.SCHED_BATCH), (None, os.sched_getscheduler(0))):
        env = SharedMemoryVectorEnv(cartpole_fns(4), num_workers=2, batch_size=batch)
        try:
            assert [os.sched_getscheduler(p.pid) for p in env.processes] == [policy] * 2
            start_stepping(env, batch)
        finally:
            env.close()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_default_num_workers_counts_the_cores_this_process_may_use():
    cores = os.sched_getaffinity(0)
    assert default_num_workers(64) == min(64, len(cores))
    os.sched_setaffinity(0, {min(cores)})  # as under ``taskset -c``: one core
    try:
        assert default_num_workers(16) == 1
        assert default_num_workers(16, batch_size=8) == 2  # a batch of 8 needs 2 shares
    finally:
        os.sched_setaffinity(0, cores)


def test_bad_batch_size_and_spaces_are_config_errors():
    with pytest.raises(
        ConfigError, match=r"batch_size=3 is not a multiple of the per-worker share 2"
    ):
        SharedMemoryVectorEnv(cartpole_fns(4), num_workers=2, batch_size=3)
    with pytest.raises(ConfigError, match=r"num_envs=4 does not split evenly over num_workers=3"):
        SharedMemoryVectorEnv(cartpole_fns(4), num_workers=3, batch_size=2)
    with pytest.raises(ConfigError, match=r"batch_size must be in \[1, num_envs=4\], got 5"):
        SharedMemoryVectorEnv(cartpole_fns(4), batch_size=5)
    text = gym.spaces.Text(5)
    with pytest.raises(ConfigError, match="no fixed shape and dtype"):
        SharedMemoryVectorEnv(
            cartpole_fns(2), observation_space=text, action_space=gym.spaces.Discrete(2)
        )
    env = SharedMemoryVectorEnv(cartpole_fns(4), num_workers=2, batch_size=2)
    try:
        env.async_reset()
        ids, *_ = env.recv()
        with pytest.raises(ValueError, match="not whole worker shares"):
            env.send(np.zeros(1, np.int64), ids[:1])
    finally:
        env.close()


class AngleModule(TorchRLModule):
    """Scripted policy: push toward the side the pole leans to (no randomness)."""

    def setup(self):
        self.unused = torch.nn.Linear(1, 1)

    def _forward(self, batch, **kwargs):
        return {Columns.ACTIONS: (batch[Columns.OBS][:, 2] > 0).long()}


def make_runner(mode, num_envs=4):
    config = (
        AlgorithmConfig()
        .environment("CartPole-v1")
        .env_runners(
            num_envs_per_env_runner=num_envs,
            gym_env_vectorize_mode=mode,
            rollout_fragment_length=50,
            # Synchronous use (every sub-env per step): "auto" could pick ready-first.
            overlap_inference=False,
        )
        .debugging(seed=0)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=AngleModule))
    )
    return SingleAgentEnvRunner(config=config)


def test_single_agent_env_runner_samples_with_shared_memory_mode():
    episodes = {}
    for mode in ("shared_memory", "sync"):
        runner = make_runner(mode)
        try:
            assert isinstance(runner.env, SharedMemoryVectorEnv) == (mode == "shared_memory")
            episodes[mode] = runner.sample(num_timesteps=400)
        finally:
            runner.stop()
    eps = episodes["shared_memory"]
    assert sum(len(e) for e in eps) >= 400 and any(e.is_done for e in eps)
    for e in eps:
        assert len(e.get_observations()) == len(e) + 1
        assert set(np.unique(e.get_actions())) <= {0, 1}
    # Same seeds, same scripted module: the same episodes as the in-process sync vector env.
    assert len(eps) == len(episodes["sync"])
    for a, b in zip(eps, episodes["sync"], strict=True):
        np.testing.assert_array_equal(a.get_observations(), b.get_observations())
        np.testing.assert_array_equal(a.get_actions(), b.get_actions())
        np.testing.assert_array_equal(a.get_rewards(), b.get_rewards())


def test_ready_first_waits_for_a_worker_that_has_not_started_its_step():
    """A worker told to step that has not started (here stopped with SIGSTOP, as the OS
    may leave one waiting for the acting parent's core) is waited for once it is over
    1 ms late: the other share is not returned again and again meanwhile."""
    env = SharedMemoryVectorEnv(cartpole_fns(4), num_workers=2, batch_size=2)
    actions = np.zeros(2, np.int64)
    try:
        env.async_reset(seed=0)
        ids = env.recv()[0]
        while ids[0] != 2:  # worker 1's share: sub-envs 2 and 3
            env.send(actions, ids)
            ids = env.recv()[0]
        os.kill(env.processes[1].pid, signal.SIGSTOP)
        env.send(actions, ids)  # worker 1 cannot take it until SIGCONT
        resumed = time.monotonic() + 0.3
        timer = threading.Timer(0.3, os.kill, (env.processes[1].pid, signal.SIGCONT))
        timer.start()
        first = []
        while True:
            ids = env.recv()[0]
            first.append(int(ids[0]))
            env.send(actions, ids)
            if ids[0] == 2:
                break
        assert time.monotonic() >= resumed
        # Worker 0 stepped for about the first millisecond only (without the wait: for
        # the whole 0.3 s, about a thousand times).
        assert first.count(0) < 100, len(first)
        timer.join()
    finally:
        os.kill(env.processes[1].pid, signal.SIGCONT)
        env.close()


def test_ready_first_does_not_wait_for_a_slow_worker_that_has_started():
    """Ready-first takes the faster share: a worker slow at stepping (it has started) is
    not waited for."""
    fns = cartpole_fns(4)
    fns[2] = fns[3] = lambda: SleepyCartPole(0.05)
    env = SharedMemoryVectorEnv(fns, num_workers=2, batch_size=2)
    actions = np.zeros(2, np.int64)
    counts = np.zeros(4, np.int64)
    try:
        env.async_reset(seed=0)
        for _ in range(60):
            ids = env.recv()[0]
            counts[ids] += 1
            env.send(actions, ids)
    finally:
        env.close()
    # The slow share (100 ms a step) came once, at the reset; the fast one took the rest.
    # Waiting for the slow one past 1 ms would give it about one in ten.
    assert counts[2] <= 2 and counts[0] >= 58, counts.tolist()


class SleepyCartPole(gym.Wrapper):
    """CartPole whose steps take ``seconds``."""

    def __init__(self, seconds):
        super().__init__(gym.make("CartPole-v1"))
        self.seconds = seconds

    def step(self, action):
        time.sleep(self.seconds)
        return self.env.step(action)
