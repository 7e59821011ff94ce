"""Multi-agent ready-first stepping over ``SharedMemoryVectorMultiAgentEnv``.

Every sub-env's multi-agent episodes must be the ones the synchronous loop over
``SyncVectorMultiAgentEnv`` gives it under the same seeds and scripted actions (a
deterministic function of the observation, or of a recurrent state counting the
agent's steps): same observations, actions, rewards and extra outputs per agent,
whole episodes joined across ``run()`` calls. Checked on the multi-agent CartPole
(agents end one by one), on schedule-driven envs (agents join late, skip steps and
leave; the env asserts it gets actions for exactly the agents that should act) and
on a PettingZoo parallel env through the runner. Also: a raising sub-env, a
SIGKILLed worker, ``close`` leaving nothing behind, and the runner's config keys.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest
from tests.envs.multi_agent import BadMultiAgentEnv, LeavingParallelEnv, ScheduleEnv, make_schedule
from tests.test_ready_first_sampling import CountingAngleModule, runner_episodes
from tests.test_shared_memory_vector_env import assert_closed_cleanly

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.columns import Columns
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.env.multi_agent_env import make_multi_agent
from envrunners.env.multi_agent_env_runner import MultiAgentEnvRunner
from envrunners.env.multi_agent_episode import MultiAgentEpisode
from envrunners.env.vector import SyncVectorMultiAgentEnv
from envrunners.env.vector.shared_memory_vector_env import _PARENT_POLL_S
from envrunners.env.vector.shared_memory_vector_multi_agent_env import (
    SharedMemoryVectorMultiAgentEnv,
)
from envrunners.errors import (
    ConfigError,
    EnvRunnerError,
    NonFiniteEnvDataError,
    SpaceError,
    SubEnvError,
    VectorEnvWorkerDiedError,
    VectorEnvWorkerHungError,
)
from envrunners.sampling.multi_agent import MultiAgentSampler

MultiAgentCartPole = make_multi_agent("CartPole-v1")


def cartpole_fns(n):
    return [lambda: MultiAgentCartPole({"num_agents": 2})] * n


def schedule_fns(n):
    """Sub-env ``i`` follows its own schedule of 3 agents that come and go."""
    return [
        functools.partial(ScheduleEnv, {"schedule": make_schedule(i, num_agents=3, length=9)})
        for i in range(n)
    ]


# -- the sampler over a real vector env -----------------------------------------------------
def scripted_act(mid, batch, explore, t):
    """Actions (and an extra output) from the observations alone."""
    return {
        "actions": (np.abs(batch).sum(axis=1) * 1000).astype(np.int64) % 2,
        "vf_preds": batch.sum(axis=1).astype(np.float32),
    }


class StepCounter:
    """A stateful module for the sampler: its state counts the agent's steps."""

    model_config: dict = {}

    def get_initial_state(self):
        return {"count": np.zeros(1, np.float32)}

    def is_stateful(self):
        return True


def counting_act(mid, batch, explore, t, state, extra_inputs):
    """Acts on the observation and the step count; records the count it got."""
    count = state["count"][:, 0]
    return {
        "actions": ((np.abs(batch).sum(axis=1) * 1000).astype(np.int64) + count.astype(int)) % 2,
        "count_in": count.copy(),
        Columns.STATE_OUT: {"count": state["count"] + 1},
    }


def make_sampler(env, stateful=False):
    def new_episode(i):
        return MultiAgentEpisode(
            observation_space=env.single_observation_spaces,
            action_space=env.single_action_spaces,
            agent_to_module_mapping_fn=lambda aid, episode: "p",
        )

    sampler = MultiAgentSampler(
        num_envs=env.num_envs,
        new_episode=new_episode,
        reset_fn=lambda: env.reset(seed=5),
        step_fn=env.step,
        observation_spaces=env.single_observation_spaces,
        action_spaces=env.single_action_spaces,
        failed_fn=lambda: getattr(env, "failed", None),
        recv_fn=getattr(env, "recv", None),
        send_fn=getattr(env, "send", None),
        async_reset_fn=lambda: env.async_reset(),
    )
    if stateful:
        sampler.use_states({"p": StepCounter()})
    return sampler


def whole_episodes(env, calls, timesteps, stateful=False, defer=True):
    """Per sub-env, its finished episodes in order, chunks joined: per agent
    ``[observations, actions, rewards, extra output]`` lists."""
    sampler = make_sampler(env, stateful)
    if getattr(env, "is_async", False):
        env.async_reset(seed=5)
        sampler.start_async()
    else:
        sampler.start()
    act = counting_act if stateful else scripted_act
    extra = "count_in" if stateful else "vf_preds"
    streams: dict[int, dict] = {}
    finished = set()
    for _ in range(calls):
        res = sampler.run(act_fn=act, explore=False, num_timesteps=timesteps, defer_extras=defer)
        assert timesteps <= res.env_steps <= timesteps + env.num_envs - 1
        chunks = [*zip(res.done, res.done_env_index), *zip(res.ongoing, res.ongoing_env_index)]
        for episode, i in chunks:
            episode.to_numpy()
            agents = streams.setdefault(i, {}).setdefault(episode.id_, {})
            for aid, sa in episode.agent_episodes.items():
                rec = agents.setdefault(aid, [[], [], [], []])
                obs = np.asarray(sa.get_observations()).tolist()
                rec[0] += obs[1:] if rec[0] else obs  # a continuation repeats its first obs
                rec[1] += np.asarray(sa.get_actions()).tolist()
                rec[2] += np.asarray(sa.get_rewards()).tolist()
                rec[3] += np.asarray(sa.get_extra_model_outputs(extra)).reshape(-1).tolist()
        finished.update(e.id_ for e in res.done)
    return {i: [v for k, v in eps.items() if k in finished] for i, eps in streams.items()}


def assert_same_episodes(sync, ready, num_envs):
    """Each sub-env's episodes finished in both runs are the same (on a loaded machine a
    ready-first worker may get few steps, so the count per sub-env is not fixed)."""
    compared = 0
    for i in range(num_envs):
        k = min(len(sync.get(i, [])), len(ready.get(i, [])))
        assert sync.get(i, [])[:k] == ready.get(i, [])[:k], f"sub-env {i}'s episodes differ"
        compared += k
    assert compared >= 2 * num_envs


@pytest.mark.parametrize(
    ("num_envs", "batch", "workers"), [(4, 1, 4), (4, 2, 2), (5, 3, 5)], ids=str
)
def test_each_sub_env_gets_the_synchronous_episodes(num_envs, batch, workers):
    for fns, calls, steps in ((cartpole_fns, 3, 150), (schedule_fns, 2, 100)):
        sync_env = SyncVectorMultiAgentEnv(fns(num_envs))
        ready_env = SharedMemoryVectorMultiAgentEnv(
            fns(num_envs), num_workers=workers, batch_size=batch
        )
        try:
            assert ready_env.is_async and ready_env.batch_size == batch
            sync = whole_episodes(sync_env, calls, steps)
            ready = whole_episodes(ready_env, calls, steps, defer=batch != 2)
        finally:
            sync_env.close()
            ready_env.close()
        assert_same_episodes(sync, ready, num_envs)


def test_recurrent_state_follows_its_sub_env():
    sync_env = SyncVectorMultiAgentEnv(cartpole_fns(4))
    ready_env = SharedMemoryVectorMultiAgentEnv(cartpole_fns(4), num_workers=4, batch_size=1)
    try:
        sync = whole_episodes(sync_env, 3, 120, stateful=True)
        ready = whole_episodes(ready_env, 3, 120, stateful=True)
    finally:
        sync_env.close()
        ready_env.close()
    assert_same_episodes(sync, ready, 4)
    for episodes in ready.values():
        for agents in episodes:
            for _, actions, _, counts in agents.values():
                assert counts == list(range(len(actions)))  # the agent's own steps


def test_synchronous_api_matches_the_sync_vector_env():
    sync_env = SyncVectorMultiAgentEnv(schedule_fns(3))
    env = SharedMemoryVectorMultiAgentEnv(schedule_fns(3), num_workers=2)
    try:
        assert not env.is_async and env.possible_agents == ["a0", "a1", "a2"]
        a, b = sync_env.reset(seed=1), env.reset(seed=1)
        assert a[1] == b[1]
        ended = [{}] * 3  # per sub-env, the agents that ended (or "__all__")
        for _ in range(25):
            assert [o.keys() for o in a[0]] == [o.keys() for o in b[0]]
            for x, y in zip(a[0], b[0]):
                assert all(np.array_equal(x[k], y[k]) for k in x)
            acts = [
                {} if done.get("__all__") else {k: 1 for k in o if not done.get(k)}
                for o, done in zip(a[0], ended)
            ]
            a, b = sync_env.step(acts), env.step(acts)
            assert a[1:] == b[1:]
            ended = [
                {k: True for k in {**te, **tr} if te.get(k) or tr.get(k)}
                for te, tr in zip(a[2], a[3])
            ]
        assert env.get_attr("possible_agents") == (["a0", "a1", "a2"],) * 3
    finally:
        sync_env.close()
        env.close()


# -- failures -------------------------------------------------------------------------------
def bad_fns():
    return [lambda: BadMultiAgentEnv({}), lambda: BadMultiAgentEnv({"bug": "raise"})]


def test_a_raising_sub_env_is_an_error_naming_it():
    env = SharedMemoryVectorMultiAgentEnv(bad_fns(), num_workers=2, batch_size=1)
    try:
        env.async_reset(seed=0)
        with pytest.raises(SubEnvError, match="sub-environment 1: raised ValueError") as info:
            for _ in range(10_000):  # until sub-env 1 (failing at its second step) is received
                ids, obs, *_ = env.recv()
                env.send([dict.fromkeys(o, 0) for o in obs], ids)
        assert info.value.sub_env_index == 1
        assert "boom from BadMultiAgentEnv" in info.value.remote_traceback
    finally:
        env.close()


def test_a_raising_sub_env_is_recreated_and_only_its_episode_dropped():
    env = SharedMemoryVectorMultiAgentEnv(
        bad_fns(), num_workers=2, batch_size=1, restart_failed=True
    )
    try:
        sampler = make_sampler(env)
        env.async_reset(seed=0)
        sampler.start_async()
        # Sub-env 1 fails at each second step: it never gets past one step. How often it
        # is ready within one call depends on the scheduler (its worker restarts it), so
        # sample until it failed 3 times, checking every call.
        failures = 0
        for _ in range(500):
            res = sampler.run(act_fn=scripted_act, explore=False, num_timesteps=20)
            failures += res.num_sub_env_failures
            assert res.env_steps >= 20
            lengths = {i: len(e) for e, i in zip(res.ongoing, res.ongoing_env_index)}
            assert lengths.get(1, 0) <= 1 < lengths[0]
            assert 1 not in res.done_env_index
            if failures >= 3:
                break
        assert failures >= 3 and env.num_failures >= 3
    finally:
        env.close()
    assert not mp.active_children()


def test_a_killed_worker_is_an_error_naming_it_and_its_sub_envs():
    env = SharedMemoryVectorMultiAgentEnv(cartpole_fns(4), num_workers=2)
    env.reset(seed=0)
    victim = env.processes[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    with pytest.raises(VectorEnvWorkerDiedError, match=r"worker 1 .*sub-envs 2\.\.3") as info:
        env.step([{0: 0, 1: 0}] * 4)
    assert info.value.sub_env_indices == [2, 3]
    assert env._pool.closed and not mp.active_children()


def test_a_killed_worker_is_respawned_when_restarting_failed_sub_envs():
    env = SharedMemoryVectorMultiAgentEnv(
        cartpole_fns(4), num_workers=2, batch_size=2, restart_failed=True
    )
    try:
        sampler = make_sampler(env)
        env.async_reset(seed=0)
        sampler.start_async()
        sampler.run(act_fn=scripted_act, explore=False, num_timesteps=20)
        old = env.processes[0].pid
        os.kill(old, signal.SIGKILL)
        env.processes[0].join(10)
        # The other worker keeps answering; the dead one is noticed at the next poll.
        time.sleep(2 * _PARENT_POLL_S)
        res = sampler.run(act_fn=scripted_act, explore=False, num_timesteps=60)
        assert res.num_sub_env_failures == 2 and res.env_steps >= 60
        assert env.processes[0].pid != old and env.processes[0].is_alive()
    finally:
        env.close()
    assert not mp.active_children()


def test_close_stops_every_worker_and_leaves_no_shared_memory():
    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    env = SharedMemoryVectorMultiAgentEnv(schedule_fns(4), num_workers=2, batch_size=2)
    pids = [p.pid for p in env.processes]
    env.async_reset(seed=0)
    ids, obs, *_ = env.recv()
    env.send([dict.fromkeys(o, 0) for o in obs], ids)  # a step still in flight
    env.close()
    env.close()
    assert_closed_cleanly(pids, before)


# -- the runner -----------------------------------------------------------------------------
def ma_runner(
    num_envs=4,
    env=MultiAgentCartPole,
    env_config=None,
    spec=None,
    restart=False,
    checking=True,
    **env_runners,
):
    env_runners.setdefault("overlap_inference", False)
    env_runners.setdefault("gym_env_vectorize_mode", "shared_memory")
    config = (
        AlgorithmConfig()
        .environment(
            env, env_config=env_config or {"num_agents": 2}, disable_env_checking=not checking
        )
        .env_runners(num_envs_per_env_runner=num_envs, **env_runners)
        .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda aid, ep, **kw: "p0")
        .debugging(seed=0)
    )
    if spec is not None:
        config = config.rl_module(rl_module_spec=spec)
    if restart:
        config = config.fault_tolerance(restart_failed_sub_environments=True)
    return MultiAgentEnvRunner(config=config)


def agents_first_obs_key(episode):
    """A multi-agent episode's first observation of each agent (in agent order), as bytes."""
    first = episode.agent_episodes
    return b"".join(first[a].get_observations()[0].tobytes() for a in sorted(first))


def test_runner_with_a_stateful_module_matches_the_sync_runner():
    spec = RLModuleSpec(module_class=CountingAngleModule)
    results = []
    for batch in (None, 2):
        runner = ma_runner(spec=spec, ready_first_batch_size=batch)
        try:
            assert runner.env.is_async == (batch is not None)
            if batch is None:
                results.append(runner_episodes(runner, 4, 100, key=agents_first_obs_key))
            else:  # how evenly the sub-envs advance depends on the scheduler: go on until
                # 8 of the sync runner's episodes are finished here too
                sync_keys = set(results[0])
                enough = lambda finished, keys=sync_keys: len(keys & set(finished)) >= 8  # noqa: E731
                results.append(runner_episodes(runner, 40, 100, enough, agents_first_obs_key))
        finally:
            runner.stop()
    sync, ready = results
    common = set(sync) & set(ready)
    assert len(common) >= 8
    for key in common:
        for aid in (0, 1):
            per_mode = []
            for parts in (sync[key], ready[key]):
                sas = [p.agent_episodes[aid] for p in parts if aid in p.agent_episodes]
                count = np.concatenate([sa.get_extra_model_outputs("count_in") for sa in sas])
                np.testing.assert_array_equal(count.reshape(-1), np.arange(len(count)))
                per_mode.append(np.concatenate([sa.get_actions() for sa in sas]))
            np.testing.assert_array_equal(*per_mode)


def test_runner_steps_a_pettingzoo_env_ready_first_and_overlaps_on_request():
    runner = ma_runner(env=LeavingParallelEnv, env_config={"num_agents": 3}, overlap_inference=True)
    try:
        assert runner.env.is_async and runner.env.batch_size == 2
        episodes = runner.sample(num_episodes=6)
        assert len(episodes) == 6
        for e in episodes:  # agent_i leaves after 3 + 2 i steps, the rest at 6
            assert {a: len(sa) for a, sa in e.agent_episodes.items()} == {
                "agent_0": 3,
                "agent_1": 5,
                "agent_2": 6,
            }
        assert sum(len(e) for e in runner.sample(num_timesteps=50)) >= 50
    finally:
        runner.stop()
    assert not mp.active_children()


def test_runner_goes_on_after_a_worker_is_killed():
    runner = ma_runner(ready_first_batch_size=2, restart=True)
    try:
        runner.sample(num_timesteps=40)
        os.kill(runner.env.processes[0].pid, signal.SIGKILL)
        assert sum(len(e) for e in runner.sample(num_timesteps=100)) >= 100
    finally:
        runner.stop()
    assert not mp.active_children()


class HangingCartPole(MultiAgentCartPole):
    """Sub-envs 2 and 3 block forever in ``step`` once ``marker`` exists (the first to
    step removes it, so a recreated sub-env finds none)."""

    def __init__(self, config):
        super().__init__({"num_agents": 2})
        index = getattr(config, "vector_index", config.get("index", 0))
        self.marker = config["marker"] if index >= 2 else None

    def step(self, actions):
        if self.marker is not None:
            try:
                os.remove(self.marker)
            except FileNotFoundError:
                pass
            else:
                time.sleep(1e6)
        return super().step(actions)


def hanging_fns(marker):
    return [functools.partial(HangingCartPole, {"marker": marker, "index": i}) for i in range(4)]


def test_a_hung_worker_without_restarts_is_an_error_naming_it(tmp_path):
    marker = tmp_path / "hang"
    env = SharedMemoryVectorMultiAgentEnv(hanging_fns(str(marker)), num_workers=2, timeout_s=1)
    assert env.timeout_s == 1.0
    env.reset(seed=0)
    pid = env.processes[1].pid
    marker.write_text("")
    with pytest.raises(VectorEnvWorkerHungError, match=r"worker 1 .*sub-envs 2\.\.3") as info:
        env.step([{0: 0, 1: 0}] * 4)
    assert info.value.sub_env_indices == [2, 3] and info.value.timeout_s == 1.0
    assert "timeout_s=1.0" in str(info.value)
    assert env._pool.closed and not mp.active_children()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_hung_worker_is_killed_and_replaced_when_restarting_failed_sub_envs(tmp_path):
    marker = tmp_path / "hang"
    env = SharedMemoryVectorMultiAgentEnv(
        hanging_fns(str(marker)), num_workers=2, batch_size=2, restart_failed=True, timeout_s=1
    )
    try:
        old = env.processes[1].pid
        env.async_reset(seed=0)
        ids, obs, *_ = env.recv()
        env.send([dict.fromkeys(o, 0) for o in obs], ids)
        marker.write_text("")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the other worker answers meanwhile
            ids, obs, rew, term, trunc, _ = env.recv()
            if env.failed[ids].any():
                break
            env.send([dict.fromkeys(o, 0) for o in obs], ids)
        assert sorted(ids.tolist()) == [2, 3] and env.failed[[2, 3]].all()
        assert all(isinstance(e, VectorEnvWorkerHungError) for _, e in env.last_errors)
        assert all(r == {} for r in rew) and not any(t["__all__"] for t in term)
        assert all(set(o) == {0, 1} for o in obs)  # the recreated sub-envs' reset observations
        assert env.processes[1].pid != old and env.processes[1].is_alive()
    finally:
        env.close()
    assert not mp.active_children()


def test_runner_cuts_a_hung_sub_env_short_within_sample_timeout_s(tmp_path):
    """Before, the multi-agent shared-memory env had no deadline: the runner waited for
    the hung worker until the group's request deadline replaced the whole runner."""
    marker = tmp_path / "hang"
    runner = ma_runner(
        env=HangingCartPole,
        env_config={"marker": str(marker)},
        ready_first_batch_size=2,
        restart=True,
        sample_timeout_s=2.0,
    )
    try:
        assert runner.env.timeout_s == 2.0
        runner.sample(num_timesteps=40)
        marker.write_text("")
        # Ready-first, the other worker's sub-envs step on while the hung one is awaited,
        # so a call can end before the deadline has passed: sample until it has.
        start = time.monotonic()
        while not runner.env.num_failures and time.monotonic() - start < 60:
            episodes = runner.sample(num_timesteps=100)
            assert sum(len(e) for e in episodes) >= 100
        assert not marker.exists()
        # The hung worker's 2 sub-envs; on a loaded machine a replacement that takes
        # over 2 s for its first reset is replaced again (whole shares each time).
        assert runner.env.num_failures >= 2 and runner.env.num_failures % 2 == 0
        assert runner.get_metrics()["num_env_step_failures"] >= 1
        for e in runner.sample(num_timesteps=100):
            for sa in e.agent_episodes.values():
                assert len(sa.get_observations()) == len(sa) + 1
    finally:
        runner.stop()
    assert not mp.active_children()


#: Calls of 100 steps within which sub-env 1 surely takes its 5th step (it takes one
#: every few ms however the OS schedules the workers).
MAX_CALLS_FOR_THE_NAN = 50


class NanOnceCartPole(MultiAgentCartPole):
    """Sub-env 1's agent 0 observes NaN at its 5th step, once per ``marker`` file."""

    def __init__(self, config):
        super().__init__({"num_agents": 2})
        self.marker, self.index, self.t = config["marker"], config.vector_index, 0

    def step(self, actions):
        obs, *rest = super().step(actions)
        self.t += 1
        if self.index == 1 and self.t == 5 and 0 in obs and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            obs[0] = np.full_like(obs[0], np.nan)
        return (obs, *rest)


@pytest.mark.parametrize("restart", [False, True])
def test_non_finite_observations_name_the_sub_env_or_recreate_the_env(tmp_path, restart):
    """Ready-first gives no sub-env a share of one call's steps (a worker the OS leaves
    waiting a few ms may step 5 times while the other steps 45), so the runner samples
    until the planted NaN has arrived, a bounded number of calls."""
    runner = ma_runner(
        env=NanOnceCartPole,
        env_config={"marker": str(tmp_path / "nan")},
        ready_first_batch_size=2,
        restart=restart,
    )
    try:
        if not restart:
            with pytest.raises(NonFiniteEnvDataError, match="sub-env(ironment)? 1") as info:
                for _ in range(MAX_CALLS_FOR_THE_NAN):
                    runner.sample(num_timesteps=100)
            assert info.value.sub_env_index == 1 and info.value.column == "obs[0]"
            return
        failures = 0
        for _ in range(MAX_CALLS_FOR_THE_NAN):
            assert sum(len(e) for e in runner.sample(num_timesteps=100)) >= 100
            failures += runner.get_metrics().get("num_env_step_failures", 0)
            if failures:
                break
        assert (tmp_path / "nan").exists()  # it happened: the env was recreated whole
        assert failures == 1
        for e in runner.sample(num_timesteps=50):
            for sa in e.agent_episodes.values():
                assert np.isfinite(np.asarray(sa.get_observations())).all()
    finally:
        runner.stop()


def test_runner_without_restarts_names_the_raising_sub_env():
    runner = ma_runner(
        num_envs=2,
        env=BadMultiAgentEnv,
        env_config={"bug": "raise"},
        ready_first_batch_size=1,
    )
    try:
        with pytest.raises(EnvRunnerError, match="sub-environment [01]: raised ValueError"):
            runner.sample(num_timesteps=20)
    finally:
        runner.stop()


def test_config_keys_need_the_shared_memory_mode_and_fit_the_shares():
    with pytest.raises(ConfigError, match="ready_first_batch_size"):
        ma_runner(gym_env_vectorize_mode="sync", ready_first_batch_size=2)
    with pytest.raises(ConfigError, match=r"ready_first_batch_size must be an int in \[1, "):
        ma_runner(ready_first_batch_size=5, num_envs=4)
    runner = ma_runner(
        overlap_inference="auto", spec=RLModuleSpec(module_class=CountingAngleModule)
    )
    try:  # the auto rule timed the env and the forward (its choice depends on the machine)
        assert runner._overlap_costs is not None and all(c > 0 for c in runner._overlap_costs)
        assert runner.env.is_async == (runner._ready_batch == 2)
        assert sum(len(e) for e in runner.sample(num_timesteps=20)) >= 20
    finally:
        runner.stop()


class OutOfSpaceResetCartPole(MultiAgentCartPole):
    """Sub-env 2's agent 1 starts with its cart far outside the observation space."""

    def __init__(self, config):
        super().__init__({"num_agents": 2})
        self.index = config.vector_index

    def reset(self, *, seed=None, options=None):
        obs, infos = super().reset(seed=seed, options=options)
        if self.index == 2:
            obs[1] = obs[1].copy()
            obs[1][0] = 100.0
        return obs, infos


@pytest.mark.parametrize(
    "keys", [{"gym_env_vectorize_mode": "sync"}, {"ready_first_batch_size": 2}]
)
def test_reset_observations_outside_the_space_name_the_sub_env_in_both_modes(keys):
    runner = ma_runner(env=OutOfSpaceResetCartPole, **keys)
    try:
        with pytest.raises(
            SpaceError, match=r"(?s)sub-environment 2 returned observation .* for agent 1"
        ):
            runner.sample(num_timesteps=20)
    finally:
        runner.stop()
    # The user's way out, as the message says: no check, and sampling goes on.
    runner = ma_runner(env=OutOfSpaceResetCartPole, checking=False, **keys)
    try:
        assert sum(len(e) for e in runner.sample(num_timesteps=20)) >= 20
    finally:
        runner.stop()


def test_auto_overlap_leaves_the_sampled_actions_to_the_seed(monkeypatch):
    """Timing forwards draws actions from torch's RNG; it is put back, so a runner that
    "auto" left stepping all sub-envs samples what one set to False samples."""
    import envrunners.env.multi_agent_env_runner as runner_module

    monkeypatch.setattr(runner_module, "decide_overlap", lambda *args: False)
    actions = []
    for overlap in ("auto", False):
        runner = ma_runner(spec=RLModuleSpec(), overlap_inference=overlap)
        try:
            assert (runner._overlap_costs is not None) == (overlap == "auto")
            eps = runner.sample(num_timesteps=60)
            actions.append(
                [{a: np.asarray(x).tolist() for a, x in e.get_actions().items()} for e in eps]
            )
        finally:
            runner.stop()
    assert actions[0] == actions[1]
