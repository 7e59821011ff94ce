"""The EnvPool backend: ``gym_env_vectorize_mode="envpool"`` and ``"envpool:<task>"`` ids.

Same episodes as the gymnasium path: EnvPool seeds its sub-envs its own way, so the
gymnasium CartPoles here start each episode from the state EnvPool started it from
(set on the unwrapped env after its reset); from there the same actions must give
the same observations (float32 rounding apart), rewards, flags, episode lengths and
reset placement, through the bare vector envs and through ``SingleAgentEnvRunner``.
The asynchronous ``async_reset``/``recv``/``send`` interface gives every sub-env
the same trajectory as the synchronous pool with the same seed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("envpool")

from envrunners.algorithms.algorithm_config import AlgorithmConfig  # noqa: E402
from envrunners.core.columns import Columns  # noqa: E402
from envrunners.core.rl_module.rl_module import RLModuleSpec  # noqa: E402
from envrunners.core.rl_module.torch.torch_rl_module import TorchRLModule  # noqa: E402
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner  # noqa: E402
from envrunners.env.vector.envpool_vector_env import (  # noqa: E402
    EnvPoolVectorEnv,
    async_num_threads,
    envpool_task_id,
)
from envrunners.env.vector.fast_sync_vector_env import FastSyncVectorEnv  # noqa: E402
from envrunners.errors import (  # noqa: E402
    ConfigError,
    EnvPoolNotInstalledError,
    UnknownEnvError,
)


class ReplayStarts(gym.Wrapper):
    """CartPole that starts its episodes from the given states, in order."""

    def __init__(self, env: gym.Env, starts: list[np.ndarray]):
        super().__init__(env)
        self.starts = list(starts)

    def reset(self, **kwargs):
        super().reset(**kwargs)
        state = self.starts.pop(0)
        self.env.unwrapped.state = np.asarray(state, np.float64)
        return np.asarray(state, np.float32), {}


class AngleModule(TorchRLModule):
    """Scripted policy: push toward the side the pole leans to (episodes of ~25-60 steps)."""

    def setup(self):
        self.unused = torch.nn.Linear(1, 1)

    def _forward(self, batch, **kwargs):
        return {Columns.ACTIONS: (batch[Columns.OBS][:, 2] > 0).long()}


def reset_rows(obs: np.ndarray, terms: np.ndarray, truncs: np.ndarray) -> list[list[np.ndarray]]:
    """Per sub-env: the observations that start an episode (row 0, and the row after a
    done's terminal row: step ``t`` ends in row ``t + 1``, its autoreset fills ``t + 2``)."""
    starts = [[obs[0, i]] for i in range(obs.shape[1])]
    for t, i in zip(*np.nonzero(terms | truncs), strict=True):
        if t + 2 < len(obs):
            starts[i].append(obs[t + 2, i])
    return starts


def envpool_rollout(num_envs, steps, seed, actions=None, **kwargs):
    """Run EnvPool; ``actions`` (steps, num_envs) or the angle policy. Returns the arrays."""
    env = EnvPoolVectorEnv("CartPole-v1", num_envs, seed=seed, **kwargs)
    obs, _ = env.reset(seed=seed)
    rows = [obs.copy()]
    acts, rews, terms, truncs = [], [], [], []
    for t in range(steps):
        a = (obs[:, 2] > 0).astype(np.int64) if actions is None else actions[t]
        obs, r, te, tr, infos = env.step(a)
        assert infos == [{}] * num_envs
        rows.append(obs.copy())
        acts.append(a)
        rews.append(r)
        terms.append(te)
        truncs.append(tr)
    env.close()
    return tuple(np.array(x) for x in (rows, acts, rews, terms, truncs))


# -- bare vector envs: the same episodes -----------------------------------------------
@pytest.mark.parametrize("max_steps", [500, 30])
def test_same_episodes_as_gymnasium_from_the_same_starts(max_steps):
    n, steps = 4, 300
    actions = np.random.default_rng(0).integers(0, 2, (steps, n))
    if max_steps == 30:  # a balancing policy reaches the time limit: truncation rows
        actions = None
    obs, acts, rews, terms, truncs = envpool_rollout(
        n, steps, seed=3, actions=actions, max_episode_steps=max_steps
    )
    starts = reset_rows(obs, terms, truncs)
    gym_env = FastSyncVectorEnv(
        [
            (lambda s=s: ReplayStarts(gym.make("CartPole-v1", max_episode_steps=max_steps), s))
            for s in starts
        ]
    )
    g_obs, _ = gym_env.reset()
    np.testing.assert_array_equal(g_obs, obs[0])
    for t in range(steps):
        g_obs, g_r, g_te, g_tr, _ = gym_env.step(acts[t])
        np.testing.assert_allclose(g_obs, obs[t + 1], atol=1e-5, err_msg=f"step {t}")
        np.testing.assert_array_equal(g_r, rews[t])
        np.testing.assert_array_equal(g_te, terms[t])
        np.testing.assert_array_equal(g_tr, truncs[t])
    assert terms.sum() >= 4
    if max_steps == 30:
        assert truncs.sum() >= 4
        # A truncated episode has exactly max_episode_steps steps.
        assert all(not terms[t - 29 : t, i].any() for t, i in zip(*np.nonzero(truncs)))
    # NEXT_STEP: the step after a done is the reset row: reward 0, flags False.
    done = terms[:-1] | truncs[:-1]
    assert (rews[1:][done] == 0).all() and not (terms[1:][done] | truncs[1:][done]).any()


def test_seeded_reset_repeats_and_rows_are_in_env_id_order():
    env = EnvPoolVectorEnv("CartPole-v1", 3, seed=5)
    try:
        first, _ = env.reset(seed=5)
        env.step(np.ones(3, np.int64))
        again, _ = env.reset(seed=5)  # rebuilds the pool: same starts
        np.testing.assert_array_equal(first, again)
        other, _ = env.reset(seed=6)
        assert not np.array_equal(first, other)
        assert len({o.tobytes() for o in first}) == 3  # sub-envs have their own streams
    finally:
        env.close()
    unseeded = [EnvPoolVectorEnv("CartPole-v1", 3) for _ in range(2)]
    try:  # no seed: a fresh one per pool, as unseeded gymnasium envs
        a, b = (env.reset()[0] for env in unseeded)
        assert not np.array_equal(a, b)
    finally:
        for env in unseeded:
            env.close()


# -- through SingleAgentEnvRunner --------------------------------------------------------
def make_runner(env, mode="sync", num_envs=4, env_config=None, spec=None, **runners):
    config = (
        AlgorithmConfig()
        .environment(env, env_config=env_config or {})
        .env_runners(
            num_envs_per_env_runner=num_envs,
            gym_env_vectorize_mode=mode,
            rollout_fragment_length=50,
            # Chunks are compared in order: step every sub-env together whatever the load.
            overlap_inference=runners.pop("overlap_inference", False),
            **runners,
        )
        .debugging(seed=0)
    )
    if spec is not None:
        config = config.rl_module(rl_module_spec=spec)
    return SingleAgentEnvRunner(config=config)


@pytest.mark.parametrize(
    ("env", "mode"), [("CartPole-v1", "envpool"), ("envpool:CartPole-v1", "sync")]
)
def test_runner_builds_and_samples_cartpole(env, mode):
    runner = make_runner(env, mode)
    try:
        assert isinstance(runner.env, EnvPoolVectorEnv)
        assert runner.env.single_observation_space.shape == (4,)
        episodes = runner.sample(num_timesteps=200)
        assert sum(len(e) for e in episodes) >= 200
        assert any(e.is_done for e in episodes)
        for e in episodes:
            assert len(e.get_observations()) == len(e) + 1
            assert set(np.unique(e.get_actions())) <= {0, 1}
    finally:
        runner.stop()


def test_runner_episodes_match_the_gymnasium_path():
    """Scripted actions from the observations; gymnasium's CartPoles replay EnvPool's starts."""
    n, timesteps = 4, 600
    spec = RLModuleSpec(module_class=AngleModule)
    pool_runner = make_runner("envpool:CartPole-v1", spec=spec)
    try:
        pool_eps = pool_runner.sample(num_timesteps=timesteps)
        pool_eps += pool_runner.sample(num_timesteps=timesteps)  # chunks continue across calls
    finally:
        pool_runner.stop()
    # The starts EnvPool used: the runner's pool is seeded with config.seed (0).
    obs, _, _, terms, truncs = envpool_rollout(n, 2 * timesteps // n + 60, seed=0)
    starts = reset_rows(obs, terms, truncs)

    def creator(ctx):
        return ReplayStarts(gym.make("CartPole-v1"), starts[ctx.vector_index])

    gym_runner = make_runner(creator, spec=spec)
    try:
        gym_eps = gym_runner.sample(num_timesteps=timesteps)
        gym_eps += gym_runner.sample(num_timesteps=timesteps)
    finally:
        gym_runner.stop()
    assert len(pool_eps) == len(gym_eps) > 20
    for p, g in zip(pool_eps, gym_eps, strict=True):
        assert (len(p), p.t_started, p.is_terminated, p.is_truncated) == (
            len(g),
            g.t_started,
            g.is_terminated,
            g.is_truncated,
        )
        np.testing.assert_allclose(p.get_observations(), g.get_observations(), atol=1e-5)
        np.testing.assert_array_equal(p.get_actions(), g.get_actions())
        np.testing.assert_array_equal(p.get_rewards(), g.get_rewards())
    assert sum(e.is_terminated for e in pool_eps) >= 20


def test_runner_steps_an_asynchronous_pool_ready_first_and_refuses_a_too_large_batch():
    runner = make_runner("envpool:CartPole-v1", env_config={"batch_size": 2})
    try:
        assert runner.env.is_async and runner.env.batch_size == 2
        assert 100 <= sum(len(e) for e in runner.sample(num_timesteps=100)) <= 103
    finally:
        runner.stop()
    with pytest.raises(ConfigError, match=r"env_config\['batch_size'\] must be an int in \[1, "):
        make_runner("envpool:CartPole-v1", env_config={"batch_size": 5})


def test_atari_pong_frames_match_the_wrapped_gymnasium_layout():
    runner = make_runner("ale_py:ALE/Pong-v5", "envpool", num_envs=2)
    try:
        space = runner.env.single_observation_space
        assert (space.shape, space.dtype) == ((84, 84, 4), np.uint8)
        assert runner.env.single_action_space == gym.spaces.Discrete(6)
        episodes = runner.sample(num_timesteps=20)
        frames = episodes[0].get_observations()
        assert frames.shape[1:] == (84, 84, 4) and frames.dtype == np.uint8
        # The stack shifts by one frame per step along the last (channel) axis.
        np.testing.assert_array_equal(frames[2][..., :3], frames[1][..., 1:])
    finally:
        runner.stop()


def test_mujoco_continuous_actions_through_the_runner():
    runner = make_runner("envpool:HalfCheetah-v5", num_envs=2)
    try:
        assert runner.env.single_action_space.shape == (6,)
        episodes = runner.sample(num_timesteps=20)
        actions = np.concatenate([e.get_actions() for e in episodes])
        assert actions.shape == (20, 6) and np.isfinite(actions).all()
        assert episodes[0].get_observations().shape[1:] == (17,)
    finally:
        runner.stop()


# -- asynchronous interface --------------------------------------------------------------
def test_async_recv_send_gives_each_sub_env_the_synchronous_trajectory():
    n, batch, per_env = 4, 2, 120
    script = np.random.default_rng(1).integers(0, 2, (n, per_env + 1))
    sync_obs, _, sync_r, sync_te, sync_tr = envpool_rollout(n, per_env, 7, script.T[:per_env])
    env = EnvPoolVectorEnv("CartPole-v1", n, batch_size=batch, seed=7)
    try:
        assert env.is_async
        with pytest.raises(ConfigError, match="async_reset"):
            env.reset()
        env.async_reset()
        seen: list[list[tuple]] = [[] for _ in range(n)]
        while min(len(s) for s in seen) <= per_env:
            ids, obs, rew, te, tr, infos = env.recv()
            assert len(ids) == batch == len(obs) and infos == [{}] * batch
            for j, i in enumerate(ids.tolist()):
                seen[i].append((obs[j].copy(), rew[j], te[j], tr[j]))
            env.send(np.array([script[i, min(len(seen[i]) - 1, per_env)] for i in ids]), ids)
    finally:
        env.close()
    for i in range(n):
        np.testing.assert_array_equal([s[0] for s in seen[i][: per_env + 1]], sync_obs[:, i])
        np.testing.assert_array_equal([s[1] for s in seen[i][1 : per_env + 1]], sync_r[:, i])
        np.testing.assert_array_equal([s[2] for s in seen[i][1 : per_env + 1]], sync_te[:, i])
        np.testing.assert_array_equal([s[3] for s in seen[i][1 : per_env + 1]], sync_tr[:, i])
    assert sync_te.sum() >= 4  # the trajectories cross episode ends (autoresets)


def test_return_infos_splits_envpool_infos_per_sub_env():
    env = EnvPoolVectorEnv("CartPole-v1", 3, return_infos=True)
    try:
        _, infos = env.reset()
        assert [int(i["env_id"]) for i in infos] == [0, 1, 2]
        _, _, _, _, infos = env.step(np.zeros(3, np.int64))
        assert [int(i["elapsed_step"]) for i in infos] == [1, 1, 1]
    finally:
        env.close()


# -- errors --------------------------------------------------------------------------------
def test_unknown_task_names_close_matches():
    with pytest.raises(UnknownEnvError, match="no task 'CartPol-v1'.*CartPole-v1"):
        envpool_task_id("envpool:CartPol-v1")
    with pytest.raises(UnknownEnvError, match="Pong-v4"):
        make_runner("ALE/Pong-v4", "envpool")
    with pytest.raises(ConfigError, match="task id string"):
        envpool_task_id(lambda ctx: None)


def test_unknown_option_and_bad_batch_size():
    with pytest.raises(ConfigError, match=r"no option\(s\) \['frame_skip'\]"):
        EnvPoolVectorEnv("CartPole-v1", 2, frame_skip=4)
    with pytest.raises(ConfigError, match="batch_size must be in"):
        EnvPoolVectorEnv("CartPole-v1", 2, batch_size=3)


def test_missing_envpool_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)  # what an install without it gives
    with pytest.raises(EnvPoolNotInstalledError, match=r"envrunners\[envpool\]") as info:
        make_runner("envpool:CartPole-v1")
    assert isinstance(info.value, ImportError) and isinstance(info.value, ConfigError)


def test_config_accepts_envpool_mode_and_names_it_in_errors():
    config = AlgorithmConfig().env_runners(gym_env_vectorize_mode="envpool")
    assert config.gym_env_vectorize_mode == "envpool"
    with pytest.raises(ConfigError, match="'envpool'"):
        AlgorithmConfig().env_runners(gym_env_vectorize_mode="envpol")


def test_direct_send_recv_gives_what_envpools_own_calls_give():
    """The fast path to the pool's C++ ``_send``/``_recv`` changes nothing in the results."""
    n, steps = 3, 150
    script = np.random.default_rng(3).integers(0, 2, (steps, n))
    runs = []
    for direct in (True, False):
        env = EnvPoolVectorEnv("CartPole-v1", n, seed=11)
        try:
            assert env._recv_index is not None and env._send_order is not None
            if not direct:  # EnvPool's own Python send/recv
                env._recv_index = env._send_order = None
            obs, _ = env.reset()
            rows = [(obs.copy(),)]
            for t in range(steps):
                obs, rew, te, tr, infos = env.step(script[t])
                assert infos == [{}] * n
                rows.append((obs.copy(), rew.copy(), te.copy(), tr.copy()))
            runs.append(rows)
        finally:
            env.close()
    for fast, own in zip(*runs, strict=True):
        for a, b in zip(fast, own, strict=True):
            np.testing.assert_array_equal(a, b)
            assert a.dtype == b.dtype
    assert sum(row[2].sum() for row in runs[0][1:]) >= 2  # episode ends (autoresets) crossed


def test_asynchronous_pools_leave_a_core_to_the_acting_thread():
    """EnvPool's own default (0: a thread per core) stays for synchronous pools; an
    asynchronous one gets ``min(batch, cores - 1)`` threads unless asked otherwise,
    also after ``async_reset`` rebuilt it."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert async_num_threads(3) == max(1, min(3, cores - 1))
    assert async_num_threads(1) == 1
    pools = [
        EnvPoolVectorEnv("CartPole-v1", 4, seed=1),
        EnvPoolVectorEnv("CartPole-v1", 4, batch_size=3, seed=1),
        EnvPoolVectorEnv("CartPole-v1", 4, batch_size=2, seed=1, num_threads=2),
    ]
    try:
        sync, default, explicit = pools
        assert sync.pool.config["num_threads"] == 0
        assert default.pool.config["num_threads"] == async_num_threads(3)
        assert explicit.pool.config["num_threads"] == 2
        for env in (default, explicit):
            env.async_reset()
            env.async_reset()  # a used pool is rebuilt with the same options
        assert default.pool.config["num_threads"] == async_num_threads(3)
        assert explicit.pool.config["num_threads"] == 2
    finally:
        for env in pools:
            env.close()


def test_a_pool_left_open_closes_silently_at_interpreter_exit():
    """A runner on an EnvPool env that is never stopped: the pool is closed by the
    vector env's ``__del__`` while the interpreter shuts down, without a traceback."""
    script = textwrap.dedent(
        """
        from envrunners.algorithms.algorithm_config import AlgorithmConfig
        from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
        config = AlgorithmConfig().environment("envpool:CartPole-v1").env_runners(
            num_envs_per_env_runner=4, ready_first_batch_size=2)
        runner = SingleAgentEnvRunner(config=config)
        runner.sample(num_timesteps=32)
        print("sampled")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "sampled"
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr
