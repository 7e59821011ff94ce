"""Sync and async vectorised multi-agent envs (spec §5.2) and make_vec."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import numpy as np
import pytest
from tests.envs.multi_agent import (
    BadMultiAgentEnv,
    BufferReusingEnv,
    ScheduleEnv,
    make_schedule,
)

from envrunners.env.multi_agent_env import make_multi_agent
from envrunners.env.vector import (
    AsyncVectorMultiAgentEnv,
    SyncVectorMultiAgentEnv,
    VectorMultiAgentEnv,
    make_vec,
)
from envrunners.errors import MultiAgentEnvError, SubEnvError

MultiAgentCartPole = make_multi_agent("CartPole-v1")
SCHED = make_schedule(7, num_agents=3, length=4, p_obs=1.0)


def schedule_fns(n):
    return [lambda: ScheduleEnv({"schedule": SCHED})] * n


def cartpole_fns(n, agents=2):
    return [lambda: MultiAgentCartPole({"num_agents": agents})] * n


@pytest.fixture(params=["sync", "async"])
def make(request):
    made = []

    def build(fns, **kw):
        cls = SyncVectorMultiAgentEnv if request.param == "sync" else AsyncVectorMultiAgentEnv
        env = cls(fns, **kw)
        made.append(env)
        return env

    yield build
    for env in made:
        env.close()


class TestBothModes:
    def test_spaces(self, make):
        env = make(cartpole_fns(2))
        assert isinstance(env, VectorMultiAgentEnv) and env.unwrapped is env
        assert env.num_envs == 2 and env.possible_agents == [0, 1]
        assert env.single_action_spaces == {0: gym.spaces.Discrete(2), 1: gym.spaces.Discrete(2)}
        assert isinstance(env.single_observation_space, gym.spaces.Dict)

    def test_reset_seeds(self, make):
        env = make(cartpole_fns(3))
        obs, infos = env.reset(seed=10)
        again, _ = env.reset(seed=[10, 11, 12])
        for a, b in zip(obs, again):
            assert np.array_equal(a[0], b[0])
        assert not np.array_equal(obs[0][0], obs[1][0])  # sub-env i gets seed + i
        with pytest.raises(ValueError, match="2 seeds for 3 sub-envs"):
            env.reset(seed=[1, 2])

    def test_next_step_autoreset(self, make):
        env = make(schedule_fns(2))
        obs, _ = env.reset(seed=0)
        expect = [set(o) for o in obs]
        for t in range(1, SCHED["length"] + 1):
            obs, rew, term, trunc, infos = env.step([dict.fromkeys(e, 0) for e in expect])
            assert len(obs) == 2 and all(o[a][0] == t for o in obs for a in o)
            expect = [{a for a in o if not (tm.get(a) or tr.get(a))} for o, tm, tr in
                      zip(obs, term, trunc)]  # fmt: skip
        assert all(t["__all__"] for t in term)
        # The next step resets (actions ignored): reset obs, zero rewards, no flags.
        obs, rew, term, trunc, _ = env.step([{"whatever": 1}, {}])
        assert all(o[a][0] == 0 for o in obs for a in o)
        assert rew[0] == dict.fromkeys(SCHED["agents"], 0.0)
        assert term[0]["__all__"] is False and not any(term[0].values())

    def test_call_and_attrs(self, make):
        env = make(cartpole_fns(2))
        env.reset(seed=0)
        assert env.get_attr("possible_agents") == ([0, 1], [0, 1])
        env.set_attr("tag", [1, 2])
        assert env.get_attr("tag") == (1, 2)
        assert env.call("get_action_space", 0) == (gym.spaces.Discrete(2),) * 2

    def test_close_idempotent(self, make):
        env = make(cartpole_fns(1))
        env.close()
        env.close()
        assert env.closed

    def test_restart_failed_sub_env(self, make):
        BadMultiAgentEnv.raises_left = 1
        try:
            fns = [lambda: BadMultiAgentEnv({}), lambda: BadMultiAgentEnv({"bug": "raise"})]
            env = make(fns, restart_failed=True)
            env.reset(seed=0)
            acts = [{"a0": 0, "a1": 0}] * 2
            env.step(acts)
            obs, rew, term, trunc, _ = env.step(acts)  # sub-env 1 raises: recreated + reset
            assert env.failed == [False, True]
            assert obs[0]["a0"][0] == 2 and obs[1]["a0"][0] == 0  # sub-env 1: reset obs
            assert rew[1] == {} and term[1] == {"__all__": False}
            env.step(acts)
            assert env.failed == [False, False] and env.num_failures == 1
        finally:
            BadMultiAgentEnv.raises_left = 10**9

    def test_only_next_step_autoreset(self, make):
        with pytest.raises(ValueError, match="next_step"):
            make(cartpole_fns(1), autoreset_mode="same_step")


class TestSync:
    def test_copy_flag(self):
        env = SyncVectorMultiAgentEnv(cartpole_fns(1), copy=True)
        obs, _ = env.reset(seed=0)
        obs[0][0][:] = 99.0
        assert not np.any(env.envs[0].envs[0].unwrapped.state == 99.0)

    @pytest.mark.parametrize("kind", ["box", "dict"])
    def test_copies_are_the_default_and_survive_buffer_reuse(self, kind):
        env = SyncVectorMultiAgentEnv([lambda: BufferReusingEnv({"obs_kind": kind})])
        first, _ = env.reset()
        later = [env.step([{"a": 0, "b": 0}])[0] for _ in range(2)]
        values = [o[0]["a"] if kind == "box" else o[0]["a"]["pos"] for o in [first, *later]]
        assert [float(v[0]) for v in values] == [0.0, 1.0, 2.0]
        shared = SyncVectorMultiAgentEnv([lambda: BufferReusingEnv({"obs_kind": kind})], copy=False)
        obs, _ = shared.reset()
        inner = obs[0]["a"] if kind == "box" else obs[0]["a"]["pos"]
        assert inner is shared.envs[0].buffers["a"]


class TestAsync:
    def test_same_results_as_sync(self):
        sync = SyncVectorMultiAgentEnv(cartpole_fns(2), copy=False)
        asyn = AsyncVectorMultiAgentEnv(cartpole_fns(2))
        try:
            a, b = sync.reset(seed=3), asyn.reset(seed=3)
            for t in range(20):
                acts = [{0: t % 2, 1: (t + 1) % 2}, {0: (t + 1) % 2, 1: t % 2}]
                a, b = sync.step(acts), asyn.step(acts)
                for x, y in zip(a[0], b[0]):
                    assert x.keys() == y.keys()
                    for k in x:
                        assert np.array_equal(x[k], y[k])
                assert a[1:4] == b[1:4]
        finally:
            sync.close()
            asyn.close()

    def test_child_error_names_sub_env_and_traceback(self):
        fns = [lambda: BadMultiAgentEnv({}), lambda: BadMultiAgentEnv({"bug": "raise"})]
        env = AsyncVectorMultiAgentEnv(fns)
        try:
            env.reset(seed=0)
            env.step([{"a0": 0, "a1": 0}] * 2)
            with pytest.raises(SubEnvError, match="sub-environment 1: raised ValueError") as info:
                env.step([{"a0": 0, "a1": 0}] * 2)
            assert info.value.sub_env_index == 1
            assert "boom from BadMultiAgentEnv" in info.value.remote_traceback
            env.reset()  # the pipes stayed in step: the env is still usable
        finally:
            env.close()
        assert not any(p.is_alive() for p in env.processes)

    def test_build_error_no_leak(self):
        def broken():
            raise RuntimeError("cannot build")

        before = {p.pid for p in __import__("multiprocessing").active_children()}
        with pytest.raises(SubEnvError, match="sub-environment 0: raised RuntimeError: cannot"):
            AsyncVectorMultiAgentEnv([broken, lambda: BadMultiAgentEnv({})])
        time.sleep(0)  # children were joined synchronously by close()
        after = {p.pid for p in __import__("multiprocessing").active_children()}
        assert after <= before

    def test_timeout_shuts_down(self):
        fns = [lambda: BadMultiAgentEnv({"bug": "slow", "sleep": 2.0})]
        env = AsyncVectorMultiAgentEnv(fns, timeout_s=0.3)
        env.reset()
        with pytest.raises(SubEnvError, match="sub-environment 0: no answer within"):
            env.step([{"a0": 0, "a1": 0}])
        assert env.closed and not any(p.is_alive() for p in env.processes)

    def test_workers_exit_when_parent_dies(self, tmp_path):
        script = textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {os.getcwd()!r})
            from envrunners.env.vector import AsyncVectorMultiAgentEnv
            from envrunners.env.multi_agent_env import make_multi_agent
            C = make_multi_agent("CartPole-v1")
            env = AsyncVectorMultiAgentEnv([lambda: C({{"num_agents": 1}})] * 2)
            print(" ".join(str(p.pid) for p in env.processes), flush=True)
            time.sleep(60)
            """
        )
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            pids = [int(p) for p in proc.stdout.readline().split()]
            assert len(pids) == 2
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        deadline = time.monotonic() + 10
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if _alive(p)]
            time.sleep(0.1)
        assert not alive, f"worker processes {alive} outlived their parent"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not reaped by init yet) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


class TestMakeVec:
    def test_callable_and_gym_id(self):
        env = make_vec(MultiAgentCartPole, num_envs=2, config={"num_agents": 2})
        assert isinstance(env, SyncVectorMultiAgentEnv) and env.num_envs == 2
        env.close()
        gym.register("EnvrunnersMATest-v0", entry_point=lambda **kw: MultiAgentCartPole(kw))
        try:
            env = make_vec("EnvrunnersMATest-v0", 2, "async", num_agents=3)
            assert isinstance(env, AsyncVectorMultiAgentEnv) and env.possible_agents == [0, 1, 2]
            env.close()
        finally:
            gym.registry.pop("EnvrunnersMATest-v0", None)

    def test_bad_mode(self):
        with pytest.raises(ValueError, match="only 'sync' and 'async'"):
            make_vec(MultiAgentCartPole, vectorization_mode="vector_entry_point")

    def test_missing_agent_space(self):
        class NoSpaceForB(BadMultiAgentEnv):
            def __init__(self, config=None):
                super().__init__(config)
                self.possible_agents = ["a0", "a1", "b"]

        with pytest.raises(MultiAgentEnvError, match=r"\['b'\] .*known agents: \['a0', 'a1'\]"):
            SyncVectorMultiAgentEnv([NoSpaceForB])
