"""Ready-first stepping: the sampler acts on whichever sub-envs an asynchronous env has ready.

Every sub-env's trajectory must be the one the synchronous loop gives it under the
same seeds and scripted actions (a deterministic function of the observation):
same episodes, observations, actions, rewards, extra outputs, infos, flags, and
the same chunking rules across ``sample()`` calls (ids, ``t_started``, lookback).
Checked on EnvPool's CartPole (``batch_size < num_envs``) and on a Dict-observation
gymnasium env stepped in a seeded shuffled order by ``ShuffledReadyEnv`` below (the
same ``is_async``/``async_reset``/``recv``/``send`` contract). Also: recurrent
state follows its env, the ``num_timesteps`` bounds, failures, the config keys and
the ``overlap_inference="auto"`` rule.
"""

from __future__ import annotations

import types

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array
from tests.envs.simple import SubEnvMarkedEnv
from torch import nn

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.connectors.env_to_module import FrameStackingEnvToModule, PrevActionsPrevRewards
from envrunners.connectors.vector_episodes import VectorEpisodeTracker
from envrunners.core._nested import map_structure
from envrunners.core.columns import Columns
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.core.rl_module.torch.torch_rl_module import TorchRLModule
from envrunners.env import runner_setup
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.env.vector.fast_sync_vector_env import FastSyncVectorEnv
from envrunners.errors import ConfigError, EnvRunnerError, NonFiniteEnvDataError
from envrunners.sampling._overlap_choice import MIN_COST_S, available_cpus, choose_overlap
from envrunners.sampling.buffers import RecurrentState, cell_writer
from envrunners.sampling.finite_checks import ObsRewardCheck
from envrunners.sampling.single_agent import SingleAgentSampler

SO = Columns.STATE_OUT


# -- a Dict-observation env and a ready-first vector env over gymnasium envs -------------
class DictWalkEnv(gym.Env):
    """A walk with Dict observations and non-empty infos; episodes of 3..25 steps."""

    observation_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-100.0, 100.0, (2,), np.float32),
            "t": gym.spaces.Box(0.0, 100.0, (1,), np.float32),
        }
    )
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.np_random.normal(size=2).astype(np.float32)
        self.t = 0
        self.limit = int(self.np_random.integers(3, 25))
        return self._obs(), {"t": 0}

    def _obs(self):
        return {"pos": self.pos.copy(), "t": np.array([self.t], np.float32)}

    def step(self, action):
        self.t += 1
        self.pos = (
            self.pos + (int(action) - 1) * 0.5 + self.np_random.normal(size=2) * 0.1
        ).astype(np.float32)
        terminated = bool(abs(self.pos[0]) > 2.5)
        truncated = not terminated and self.t >= self.limit
        return self._obs(), float(self.pos[1]), terminated, truncated, {"t": self.t}


class ShuffledReadyEnv(gym.vector.VectorEnv):
    """An asynchronous vector env over gymnasium envs: ``recv()`` returns ``batch_size`` of
    the ready sub-envs in a seeded random order; ``send`` steps them (NEXT_STEP autoreset).

    ``fail_on`` maps a sub-env to its step counts at which it raises; that sub-env is then
    recreated and reset, and ``failed``/``last_errors`` report it on that ``recv()``.
    ``nan_on`` likewise gives NaN rewards.
    """

    is_async = True

    def __init__(self, fns, batch_size, order_seed=0, fail_on=None, nan_on=None):
        self.fns = fns
        self.envs = [fn() for fn in fns]
        self.num_envs = len(self.envs)
        self.batch_size = batch_size
        self.single_observation_space = self.envs[0].observation_space
        self.single_action_space = self.envs[0].action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.rng = np.random.default_rng(order_seed)
        self.fail_on = fail_on or {}
        self.nan_on = nan_on or {}  # sub-env -> its step counts that return a NaN reward
        self.steps = [0] * self.num_envs
        self.failed = np.zeros(self.num_envs, np.bool_)
        self.last_errors: list = []
        self.ready: dict = {}
        self.done = [False] * self.num_envs
        self.awaiting: set[int] = set()  # received, not yet sent an action

    def async_reset(self, *, seed=None):
        self.ready, self.awaiting = {}, set()
        for i, env in enumerate(self.envs):
            obs, info = env.reset(seed=None if seed is None else seed + i)
            self.ready[i] = (obs, 0.0, False, False, info, False)
            self.done[i] = False

    def send(self, actions, env_ids):
        for j, i in enumerate(np.asarray(env_ids).tolist()):
            assert i in self.awaiting, f"sub-env {i} was sent an action it did not wait for"
            self.awaiting.discard(i)
            failed = False
            if self.done[i]:
                obs, info = self.envs[i].reset()
                r, te, tr = 0.0, False, False
            else:
                self.steps[i] += 1
                if self.steps[i] in self.fail_on.get(i, ()):
                    self.envs[i] = self.fns[i]()
                    obs, info = self.envs[i].reset()
                    r, te, tr, failed = 0.0, False, False, True
                else:
                    obs, r, te, tr, info = self.envs[i].step(actions[j])
                    if self.steps[i] in self.nan_on.get(i, ()):
                        r = float("nan")
            self.done[i] = te or tr
            self.ready[i] = (obs, r, te, tr, info, failed)

    def recv(self):
        ids = self.rng.permutation(sorted(self.ready))[: self.batch_size]
        rows = [self.ready.pop(int(i)) for i in ids]
        self.awaiting.update(ids.tolist())
        self.failed[:] = False
        self.last_errors = []
        for i, row in zip(ids, rows, strict=True):
            if row[5]:
                self.failed[i] = True
                self.last_errors.append((int(i), RuntimeError("boom")))
        space = self.single_observation_space
        obs = concatenate(space, [r[0] for r in rows], create_empty_array(space, len(rows)))
        return (
            ids,
            obs,
            np.array([r[1] for r in rows]),
            np.array([r[2] for r in rows]),
            np.array([r[3] for r in rows]),
            [r[4] for r in rows],
        )


# -- scripted acting --------------------------------------------------------------------
def angle_act(obs, explore, t):
    """CartPole: push toward the side the pole leans to; an extra output from the obs."""
    return (obs[:, 2] > 0).astype(np.int64), {"vf_preds": obs[:, 0] * 2.0}


def walk_act(obs, explore, t):
    """DictWalkEnv: an action from the position (0, 1 or 2), an extra output too."""
    pos = obs["pos"]
    return (np.sign(pos[:, 0]) + 1).astype(np.int64), {"vf_preds": pos[:, 1].copy()}


def counting_act(obs, explore, t, state, extra_inputs):
    """Stateful: the state counts each sub-env's steps (and, nested, minus the steps,
    where it has that leaf); the action is the angle rule."""
    actions, extras = angle_act(obs, explore, t)
    extras["count_in"] = state["count"][:, 0].copy()
    extras["prev_a_seen"] = extra_inputs["prev_actions"].copy()
    state_out = {"count": state["count"] + 1}
    if "nested" in state:
        extras["minus_in"] = state["nested"]["minus"][:, 0].copy()
        state_out["nested"] = {"minus": state["nested"]["minus"] - 1}
    return actions, extras, state_out


def envpool_env(n, batch, seed):
    from envrunners.env.vector.envpool_vector_env import EnvPoolVectorEnv

    return EnvPoolVectorEnv("CartPole-v1", n, batch_size=batch, seed=seed)


def make_sampler(env, lookback=2):
    sampler = SingleAgentSampler(
        env,
        observation_space=env.single_observation_space,
        action_space=env.single_action_space,
        step_fn=env.step,
        lookback=lookback,
    )
    if getattr(env, "is_async", False):
        env.async_reset(seed=5) if isinstance(env, ShuffledReadyEnv) else env.async_reset()
        sampler.start_async()
    else:
        sampler.start(*env.reset(seed=5))
    return sampler


def _concat(parts):
    return map_structure(lambda *leaves: np.concatenate(leaves), *parts)


def collect(sampler, calls, timesteps, act_fn, lookbacks=None, **kw):
    """Per sub-env, its episodes (finished, then the open one) rebuilt from the chunks.

    Checks each call's count (``num_timesteps .. num_timesteps + num_envs - 1``), that
    a chunk continues its predecessor (same id, ``t_started``, lookback = its tail).
    ``lookbacks``: the sampler's lookback for each call (changed between calls).
    """
    n = sampler.num_envs
    per_env: list[list[dict]] = [[] for _ in range(n)]
    open_: list[dict | None] = [None] * n
    for call in range(calls):
        if lookbacks is not None:
            sampler.lookback = lookbacks[call]
        result = sampler.run(act_fn=act_fn, explore=False, num_timesteps=timesteps, **kw)
        assert timesteps <= result.env_steps <= timesteps + n - 1
        assert result.env_steps == sum(len(e) for e in result.episodes)
        if isinstance(sampler.env, ShuffledReadyEnv):  # every received sub-env was sent on
            assert not sampler.env.awaiting
        pairs = list(zip(result.done_env_index, result.done, strict=True))
        pairs += list(zip(result.ongoing_env_index, result.ongoing, strict=True))
        for i, chunk in pairs:
            prev = open_[i]
            if prev is not None and prev["id"] == chunk.id_:
                assert chunk.t_started == prev["len"]
                if chunk.observations.lookback:  # the observation before its first one
                    look = chunk.get_observations(-1, neg_index_as_lookback=True)
                    seen = _concat(prev["obs"])
                    map_structure(lambda x, y: np.testing.assert_array_equal(x, y[-2]), look, seen)
                prev["obs"].append(map_structure(lambda a: a[1:], chunk.get_observations()))
            else:
                assert chunk.t_started == 0 and (prev is None or prev["done"])
                prev = open_[i] = {"id": chunk.id_, "obs": [chunk.get_observations()], "len": 0}
                prev["actions"], prev["rewards"], prev["extras"], prev["infos"] = [], [], [], []
                per_env[i].append(prev)
            prev["len"] += len(chunk)
            prev["actions"].append(chunk.get_actions())
            prev["rewards"].append(chunk.get_rewards())
            prev["extras"].append(
                {k: chunk.get_extra_model_outputs(k) for k in chunk.extra_model_outputs}
            )
            prev["infos"].extend(chunk.get_infos()[: len(chunk)])
            prev["done"] = chunk.is_done
            prev["flags"] = (chunk.is_terminated, chunk.is_truncated)
    return per_env


def _equal_prefix(m, where):
    return lambda x, y: np.testing.assert_array_equal(x[:m], y[:m], where)


def assert_same_trajectories(sync_eps, async_eps, min_episodes=2, extras=("vf_preds",)):
    """Each sub-env's episodes agree as far as both runs got (the open one as a prefix)."""
    compared = 0
    for i, (s_list, a_list) in enumerate(zip(sync_eps, async_eps, strict=True)):
        for k, (s, a) in enumerate(zip(s_list, a_list, strict=False)):
            m = min(s["len"], a["len"])
            where = f"sub-env {i}, episode {k}"
            if s["done"] and a["done"]:
                assert s["len"] == a["len"] and s["flags"] == a["flags"], where
                compared += 1
            obs_s, obs_a = _concat(s["obs"]), _concat(a["obs"])
            map_structure(_equal_prefix(m + 1, where), obs_s, obs_a)
            np.testing.assert_array_equal(
                np.concatenate(s["actions"])[:m], np.concatenate(a["actions"])[:m], where
            )
            np.testing.assert_array_equal(
                np.concatenate(s["rewards"])[:m], np.concatenate(a["rewards"])[:m], where
            )
            for key in extras:
                x = _concat([e[key] for e in s["extras"]])
                y = _concat([e[key] for e in a["extras"]])
                map_structure(_equal_prefix(m, where), x, y)
            assert s["infos"][:m] == a["infos"][:m], where
    assert compared >= min_episodes * len(sync_eps)


# -- trajectory equivalence -------------------------------------------------------------
@pytest.mark.parametrize(("n", "batch"), [(6, 2), (5, 3), (4, 1)])
def test_envpool_async_gives_each_sub_env_the_synchronous_episodes(n, batch):
    pytest.importorskip("envpool")
    sync = make_sampler(envpool_env(n, None, 5))
    ready = make_sampler(envpool_env(n, batch, 5))
    assert not sync.env.is_async and ready.env.is_async
    try:
        sync_eps = collect(sync, 8, 150, angle_act)
        async_eps = collect(ready, 8, 150, angle_act)
    finally:
        sync.env.close()
        ready.env.close()
    assert_same_trajectories(sync_eps, async_eps)


@pytest.mark.parametrize("lookback", [0, 1, 3])
def test_dict_env_shuffled_ready_order_gives_the_synchronous_episodes(lookback):
    fns = [DictWalkEnv] * 5
    sync = make_sampler(FastSyncVectorEnv(fns), lookback)
    ready = make_sampler(ShuffledReadyEnv(fns, batch_size=2, order_seed=lookback), lookback)
    sync_eps = collect(sync, 6, 40, walk_act)
    async_eps = collect(ready, 6, 40, walk_act)
    assert_same_trajectories(sync_eps, async_eps, min_episodes=1)
    assert any(info.get("t", 0) > 0 for eps in async_eps for e in eps for info in e["infos"])


def test_lookback_change_between_calls_keeps_the_in_flight_rows():
    fns = [DictWalkEnv] * 4
    lookbacks = [1, 1, 3, 3, 0, 0, 2]
    sync = make_sampler(FastSyncVectorEnv(fns), 1)
    ready = make_sampler(ShuffledReadyEnv(fns, batch_size=3, order_seed=1), 1)
    sync_eps = collect(sync, len(lookbacks), 30, walk_act, lookbacks)
    async_eps = collect(ready, len(lookbacks), 30, walk_act, lookbacks)
    assert_same_trajectories(sync_eps, async_eps, min_episodes=1)


def test_random_actions_and_episode_mode():
    env = ShuffledReadyEnv([DictWalkEnv] * 4, batch_size=2)
    sampler = make_sampler(env)
    result = sampler.run(act_fn=None, explore=True, num_timesteps=50, random_actions=True)
    assert 50 <= result.env_steps <= 53
    result = sampler.run(act_fn=walk_act, explore=False, num_episodes=6)
    assert len(result.done) == 6 and not result.ongoing
    for e in result.done:  # episodes open at the call's start end here (their tail)
        t = e.get_observations()["t"][:, 0]
        assert e.is_done and len(t) == len(e) + 1
        np.testing.assert_array_equal(t, np.arange(e.t_started, e.t_started + len(e) + 1))
    assert not env.awaiting
    result = sampler.run(act_fn=walk_act, explore=False, num_timesteps=30)  # goes on
    assert 30 <= result.env_steps <= 33 and not env.awaiting
    for e in result.episodes:
        t = e.get_observations()["t"][:, 0]
        np.testing.assert_array_equal(t, np.arange(t[0], t[0] + len(e) + 1))


# -- recurrent state follows its env ----------------------------------------------------
def test_recurrent_state_rows_follow_their_sub_envs():
    pytest.importorskip("envpool")
    out = []
    for batch in (None, 2):
        sampler = make_sampler(envpool_env(5, batch, 5))
        initial = {"count": np.zeros(1, np.float32), "nested": {"minus": np.zeros(1, np.int64)}}
        sampler.recurrent = RecurrentState(initial, 5, prev_action_example=np.int64(0))
        sampler.recurrent.reset()
        try:
            eps = collect(sampler, 6, 120, counting_act)
        finally:
            sampler.env.close()
        for env_eps in eps:
            for e in env_eps:
                count_in = np.concatenate([x["count_in"] for x in e["extras"]])
                np.testing.assert_array_equal(count_in, np.arange(e["len"]))
                minus_in = np.concatenate([x["minus_in"] for x in e["extras"]])
                np.testing.assert_array_equal(minus_in, -np.arange(e["len"]))
                # Every leaf of the recorded state out, nested ones too.
                state_out = np.concatenate([x[SO]["count"] for x in e["extras"]])
                np.testing.assert_array_equal(state_out[:, 0], np.arange(1, e["len"] + 1))
                minus_out = np.concatenate([x[SO]["nested"]["minus"] for x in e["extras"]])
                np.testing.assert_array_equal(minus_out[:, 0], -np.arange(1, e["len"] + 1))
                prev_a = np.concatenate([x["prev_a_seen"] for x in e["extras"]])
                actions = np.concatenate(e["actions"])
                np.testing.assert_array_equal(prev_a[1:], actions[:-1])
                assert prev_a[0] == 0
        out.append(eps)
    assert_same_trajectories(*out, extras=("vf_preds", "count_in", "minus_in", SO))


class CountingAngleModule(TorchRLModule):
    """Stateful torch module: state counts the episode's steps; acts by the angle rule."""

    def setup(self):
        self.dummy = nn.Linear(1, 1)

    def get_initial_state(self):
        return {"count": torch.zeros(1)}

    def _forward(self, batch, **kwargs):
        obs = batch[Columns.OBS]
        obs = obs[:, -1] if obs.dim() == 3 else obs
        count = batch[Columns.STATE_IN]["count"]
        return {
            Columns.ACTIONS: (obs[:, 2] > 0).long(),
            "count_in": count.clone(),
            Columns.STATE_OUT: {"count": count + 1},
        }


def make_runner(num_envs=4, spec=None, env_config=None, **env_runners):
    env_runners.setdefault("overlap_inference", False)
    config = (
        AlgorithmConfig()
        .environment("envpool:CartPole-v1", env_config=env_config or {})
        .env_runners(num_envs_per_env_runner=num_envs, **env_runners)
        .debugging(seed=0)
    )
    if spec is not None:
        config = config.rl_module(rl_module_spec=spec)
    return SingleAgentEnvRunner(config=config)


def first_obs_key(episode):
    """A single-agent episode's first observation, as bytes."""
    return episode.get_observations()[0].tobytes()


def runner_episodes(runner, calls, timesteps, enough=None, key=first_obs_key):
    """Finished episodes by ``key(first chunk)`` (default: its first observation), chunks
    joined by id (at most ``calls`` calls; fewer once ``enough(finished)`` holds)."""
    chunks: dict[str, list] = {}
    finished = {}
    for _ in range(calls):
        eps = runner.sample(num_timesteps=timesteps)
        assert timesteps <= sum(len(e) for e in eps) <= timesteps + runner.num_envs - 1
        for e in eps:
            chunks.setdefault(e.id_, []).append(e)
            if e.is_done:
                parts = chunks.pop(e.id_)
                finished[key(parts[0])] = parts
        if enough is not None and enough(finished):
            break
    return finished


def test_runner_async_envpool_with_stateful_module_matches_sync():
    pytest.importorskip("envpool")
    spec = RLModuleSpec(module_class=CountingAngleModule)
    results = []
    for batch in (None, 2):
        runner = make_runner(4, spec, ready_first_batch_size=batch)
        try:
            assert runner.env.is_async == (batch is not None)
            if batch is None:
                results.append(runner_episodes(runner, 5, 200))
            else:  # how evenly EnvPool's threads advance the sub-envs varies: go on until
                # 12 of the sync runner's episodes are finished here too
                keys = set(results[0])
                enough = lambda finished, keys=keys: len(keys & set(finished)) >= 12  # noqa: E731
                results.append(runner_episodes(runner, 50, 200, enough))
        finally:
            runner.stop()
    sync, ready = results
    common = set(sync) & set(ready)
    assert len(common) >= 12
    for key in common:
        s, a = sync[key], ready[key]
        assert sum(len(p) for p in s) == sum(len(p) for p in a)
        for parts in (s, a):
            count = np.concatenate([p.get_extra_model_outputs("count_in") for p in parts])
            np.testing.assert_array_equal(count.reshape(-1), np.arange(len(count)))
        for get in ("get_actions", "get_rewards"):
            np.testing.assert_array_equal(
                np.concatenate([getattr(p, get)() for p in s]),
                np.concatenate([getattr(p, get)() for p in a]),
            )
        np.testing.assert_array_equal(
            np.concatenate([p.get_extra_model_outputs(SO)["count"] for p in s]),
            np.concatenate([p.get_extra_model_outputs(SO)["count"] for p in a]),
        )


# -- failures -------------------------------------------------------------------------
def test_sub_env_failures_drop_only_their_episode():
    env = ShuffledReadyEnv([DictWalkEnv] * 4, batch_size=2, fail_on={1: (5, 30), 3: (12,)})
    sampler = make_sampler(env)
    total_failures = dropped = 0
    for _ in range(4):
        result = sampler.run(act_fn=walk_act, explore=False, num_timesteps=40)
        assert 40 <= result.env_steps <= 43
        assert result.env_steps == sum(len(e) for e in result.episodes)
        total_failures += result.num_sub_env_failures
        dropped += result.num_dropped_episodes
        for e in result.episodes:  # every returned step is real: t counts from 0
            t = e.get_observations()["t"][:, 0]
            np.testing.assert_array_equal(t, np.arange(e.t_started, e.t_started + len(e) + 1))
    assert total_failures == 3 and 1 <= dropped <= 3


def test_non_finite_reward_names_the_sub_env_and_its_episode_step():
    env = ShuffledReadyEnv([DictWalkEnv] * 3, batch_size=2, nan_on={2: (2,)})
    sampler = make_sampler(env)
    sampler.finite_check = ObsRewardCheck(env.single_observation_space)
    with pytest.raises(
        NonFiniteEnvDataError, match="sub-environment 2 returned a non-finite"
    ) as info:
        sampler.run(act_fn=walk_act, explore=False, num_timesteps=200)
    assert info.value.sub_env_index == 2 and info.value.column == "rewards"
    assert info.value.step == env.envs[2].t  # the step of its episode that gave the NaN


@pytest.mark.parametrize("call", ["recv", "send"])
def test_whole_env_failure_recreates_and_restarts_the_call(call):
    pytest.importorskip("envpool")
    runner = make_runner(4, ready_first_batch_size=2)
    try:
        runner.sample(num_timesteps=50)
        real, calls = getattr(runner.env, call), [0]

        def flaky(*args):
            calls[0] += 1
            if calls[0] == 3:
                raise RuntimeError("pool died")
            return real(*args)

        setattr(runner.env, call, flaky)
        runner.config.restart_failed_sub_environments = True
        eps = runner.sample(num_timesteps=60)
        assert 60 <= sum(len(e) for e in eps) <= 63
        assert runner.env.is_async and getattr(runner.env, call) is not flaky
        assert all(e.t_started == 0 for e in eps)  # everything restarted
        assert 40 <= sum(len(e) for e in runner.sample(num_timesteps=40)) <= 43
    finally:
        runner.stop()


def test_env_failure_without_restarts_names_the_call():
    pytest.importorskip("envpool")
    runner = make_runner(4, ready_first_batch_size=2)
    try:
        runner.sample(num_timesteps=20)

        def dead_recv():
            raise RuntimeError("pool died")

        runner.env.recv = dead_recv
        with pytest.raises(EnvRunnerError, match=r"raised RuntimeError\('pool died'\) in recv\(\)"):
            runner.sample(num_timesteps=20)
    finally:
        runner.stop()


# -- config keys and the auto rule ---------------------------------------------------------
def test_config_keys_are_checked_with_the_bad_value():
    config = AlgorithmConfig()
    assert config.ready_first_batch_size is None and config.overlap_inference == "auto"
    with pytest.raises(ConfigError, match="ready_first_batch_size must be an int > 0 or None"):
        config.env_runners(ready_first_batch_size=0)
    with pytest.raises(ConfigError, match=r"overlap_inference must be one of True, False, 'auto'"):
        config.env_runners(overlap_inference="yes")
    assert config.env_runners(overlap_inference=False).overlap_inference is False


def test_runner_setup_resolves_and_refuses_batches():
    def cfg(env="envpool:CartPole-v1", mode="sync", **kw):
        return AlgorithmConfig().environment(env).env_runners(gym_env_vectorize_mode=mode, **kw)

    resolve = runner_setup.ready_first_batch_size
    assert resolve(cfg(), 8) is None
    assert resolve(cfg(ready_first_batch_size=3), 8) == 3
    assert resolve(cfg(ready_first_batch_size=8), 8) is None
    assert resolve(cfg(), 8, {"batch_size": 2}) == 2
    assert resolve(cfg(overlap_inference=True), 8) == 4
    assert resolve(cfg("CartPole-v1", "envpool", overlap_inference=True), 5) == 2
    with pytest.raises(ConfigError, match=r"ready_first_batch_size must be an int in \[1, "):
        resolve(cfg(ready_first_batch_size=9), 8)
    with pytest.raises(ConfigError, match=r"env_config\['batch_size'\] must be an int in"):
        resolve(cfg(), 4, {"batch_size": 5})
    with pytest.raises(ConfigError, match="disagree"):
        resolve(cfg(ready_first_batch_size=2), 8, {"batch_size": 4})
    with pytest.raises(ConfigError, match="needs a backend that steps asynchronously"):
        resolve(cfg("CartPole-v1", "sync", ready_first_batch_size=2), 4)
    with pytest.raises(ConfigError, match="gym_env_vectorize_mode='async'"):
        resolve(cfg("CartPole-v1", "async", overlap_inference=True), 4)
    with pytest.raises(ConfigError, match="num_envs_per_env_runner >= 2"):
        resolve(cfg(overlap_inference=True), 1)
    assert not runner_setup.auto_overlap_applies(cfg("CartPole-v1"), {}, 4)
    assert runner_setup.auto_overlap_applies(cfg(), {}, 4)
    assert not runner_setup.auto_overlap_applies(cfg(), {"batch_size": 2}, 4)
    assert not runner_setup.auto_overlap_applies(cfg(overlap_inference=False), {}, 4)


def test_envpool_batch_size_in_env_config_steps_ready_first():
    pytest.importorskip("envpool")
    runner = make_runner(4, env_config={"batch_size": 2})
    try:
        assert runner.env.is_async and runner.env.batch_size == 2
        for _ in range(2):
            eps = runner.sample(num_timesteps=80)
            assert 80 <= sum(len(e) for e in eps) <= 83
        eps = runner.sample(num_episodes=3)
        assert len(eps) == 3 and all(e.is_done for e in eps)
        eps = runner.sample(num_timesteps=40, force_reset=True)
        assert all(e.t_started == 0 for e in eps)
    finally:
        runner.stop()


class AngleModule(TorchRLModule):
    """Stateless torch module: the angle rule."""

    def setup(self):
        self.dummy = nn.Linear(1, 1)

    def _forward(self, batch, **kwargs):
        return {Columns.ACTIONS: (batch[Columns.OBS][:, 2] > 0).long()}


class PassThrough(ConnectorV2):
    """A connector that (by ConnectorV2's default) reads episodes."""

    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        return batch


def test_connectors_that_read_episodes_are_refused_with_ready_first_stepping():
    pytest.importorskip("envpool")
    runner = make_runner(4, ready_first_batch_size=2)
    try:
        runner.add_connector_step(PassThrough())
        with pytest.raises(ConfigError, match=r"pieces that read episodes \(PassThrough\)"):
            runner.sample(num_timesteps=10)
    finally:
        runner.stop()


# -- connectors that read episodes, on ready-first batches ----------------------------------
class SeesSubEnvs(PassThrough):
    """Reads episodes and says it takes ready-first batches; notes what it was given."""

    supports_ready_first = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def __call__(self, *, rl_module, batch, episodes, **kwargs):
        ids = [view.env_index for view in episodes]
        self.seen.append((ids, episodes.num_envs, len(batch["obs"])))
        return batch


def test_a_piece_that_takes_ready_first_batches_sees_which_sub_envs_they_hold():
    pytest.importorskip("envpool")
    runner = make_runner(4, ready_first_batch_size=2)
    try:
        piece = SeesSubEnvs()
        runner.add_connector_step(piece)
        runner.sample(num_timesteps=40)
        assert len(piece.seen) >= 20
        for ids, num_envs, rows in piece.seen:
            assert num_envs == 4 and rows == 2 == len(set(ids)) and set(ids) <= {0, 1, 2, 3}
        assert {i for ids, _, _ in piece.seen for i in ids} == {0, 1, 2, 3}
    finally:
        runner.stop()


def test_tracker_keeps_each_sub_env_episode_across_ready_first_batches():
    env = types.SimpleNamespace(last_errors=[], failed=np.zeros(4, np.bool_))
    tracker = VectorEpisodeTracker(4, "FAILED", lambda: env)
    tracker.forget()
    no = np.zeros(2, np.bool_)

    def batch(ids, rewards=(0.0, 0.0), terms=no, actions=None):
        ids = np.array(ids)
        tracker.after_recv((ids, None, np.array(rewards), np.asarray(terms), no, [{}, {}]))
        eps = tracker.observe(ids * 10.0)
        if actions is not None:
            tracker.after_actions(np.array(actions))
        return eps

    eps = batch([2, 0], actions=[1, 2])  # first observations: both start
    assert eps.starts.tolist() == [True, True] and eps.lengths.tolist() == [0, 0]
    assert [v.env_index for v in eps] == [2, 0] and eps.num_envs == 4
    eps = batch([0, 3], rewards=(5.0, 0.0), terms=[False, False], actions=[0, 1])
    assert eps.starts.tolist() == [False, True] and eps.lengths.tolist() == [1, 0]
    assert eps[0].get_actions() == 2 and eps[0].get_rewards() == 5.0  # sub-env 0's own
    with pytest.raises(IndexError, match="no actions yet"):
        eps[1].get_actions()
    eps = batch([2, 0], rewards=(1.0, 2.0), terms=[True, False], actions=[2, 2])
    assert eps.starts.tolist() == [False, False] and eps.lengths.tolist() == [1, 2]
    assert eps.dones.tolist() == [True, False] and eps.actions.tolist() == [1, 0]
    eps = batch([2, 3], actions=[0, 0])  # sub-env 2's episode ended: this is its reset
    assert eps.starts.tolist() == [True, False] and eps.lengths.tolist() == [0, 1]
    env.last_errors, env.failed[3] = [(3, RuntimeError("x"))], True
    eps = batch([3, 0], actions=[1, 1])  # a failed sub-env starts over
    assert eps.starts.tolist() == [True, False] and eps.lengths.tolist() == [0, 3]
    env.last_errors, env.failed[3] = [], False
    tracker.forget()  # a reset
    assert batch([0, 1]).starts.tolist() == [True, True]
    eps = batch([1, 2])
    assert eps.starts.tolist() == [False, True]
    env = types.SimpleNamespace(last_errors=[], failed=np.zeros(4, np.bool_))  # recreated
    assert batch([1, 0]).starts.tolist() == [True, True]


class PrevAngleModule(TorchRLModule):
    """Acts by the angle rule on ``_orig_obs`` (PrevActionsPrevRewards' Dict observations)."""

    def setup(self):
        self.dummy = nn.Linear(1, 1)

    def _forward(self, batch, **kwargs):
        return {Columns.ACTIONS: (batch[Columns.OBS]["_orig_obs"][:, 2] > 0).long()}


def _joined(parts, key):
    """One episode's observations (leaf ``key``) from its chunks (each repeats the last one)."""
    return np.concatenate([p.get_observations()[key][1 if k else 0 :] for k, p in enumerate(parts)])


def test_prev_actions_and_rewards_follow_their_sub_envs_ready_first():
    pytest.importorskip("envpool")
    spec = RLModuleSpec(module_class=PrevAngleModule)
    results = []
    for batch in (None, 2):
        runner = make_runner(
            4,
            spec,
            ready_first_batch_size=batch,
            env_to_module_connector=lambda env, spaces, device: PrevActionsPrevRewards(
                n_prev_actions=2, n_prev_rewards=2
            ),
        )
        try:
            assert runner.env.is_async == (batch is not None)
            key = lambda e: e.get_observations()["_orig_obs"][0].tobytes()  # noqa: E731
            if batch is None:
                results.append(runner_episodes(runner, 5, 200, key=key))
            else:
                keys = set(results[0])
                enough = lambda finished, keys=keys: len(keys & set(finished)) >= 12  # noqa: E731
                results.append(runner_episodes(runner, 50, 200, enough, key=key))
        finally:
            runner.stop()
    one_hot = np.eye(2, dtype=np.float32)
    for finished in results:  # each step sees its own episode's last two actions and rewards
        for parts in finished.values():
            acts = np.concatenate([p.get_actions() for p in parts])
            rews = np.concatenate([p.get_rewards() for p in parts])
            prev_a, prev_r = _joined(parts, "prev_n_actions"), _joined(parts, "prev_n_rewards")
            for t in range(len(acts) + 1):
                want_a = [one_hot[acts[t - k]] if t >= k else np.zeros(2) for k in (2, 1)]
                want_r = [rews[t - k] if t >= k else 0.0 for k in (2, 1)]
                np.testing.assert_array_equal(prev_a[t], np.concatenate(want_a))
                np.testing.assert_array_equal(prev_r[t], want_r)
    sync, ready = results
    common = set(sync) & set(ready)
    assert len(common) >= 12
    for key in common:
        for leaf in ("_orig_obs", "prev_n_actions", "prev_n_rewards"):
            np.testing.assert_array_equal(_joined(sync[key], leaf), _joined(ready[key], leaf))


def _frame_stacking_config(env):
    """4 sub-envs on shared memory, ready-first 2, frames stacked by the 3-frame piece."""
    return (
        AlgorithmConfig()
        .environment(env)
        .env_runners(
            num_envs_per_env_runner=4,
            gym_env_vectorize_mode="shared_memory",
            ready_first_batch_size=2,
            env_to_module_connector=lambda env, spaces, device: FrameStackingEnvToModule(
                num_frames=3
            ),
        )
    )


def test_auto_overlap_times_the_forward_on_what_the_pipeline_makes():
    pytest.importorskip("envpool")
    # The module takes PrevActionsPrevRewards' Dict observations, not the env's Box.
    runner = make_runner(
        4,
        RLModuleSpec(),
        overlap_inference="auto",
        env_to_module_connector=lambda env, spaces, device: PrevActionsPrevRewards(),
    )
    try:
        assert runner._overlap_costs is not None and min(runner._overlap_costs) > 0
        eps = runner.sample(num_timesteps=40)
        assert 40 <= sum(len(e) for e in eps) <= 43
        assert set(eps[0].get_observations()) == {"_orig_obs", "prev_n_actions", "prev_n_rewards"}
    finally:
        runner.stop()


def test_frame_stacking_follows_its_sub_envs_ready_first_on_shared_memory():
    config = _frame_stacking_config(SubEnvMarkedEnv)
    runner = SingleAgentEnvRunner(config=config)
    try:
        assert runner.env.is_async
        chunks: dict[str, list] = {}
        for _ in range(4):
            for e in runner.sample(num_timesteps=60):
                chunks.setdefault(e.id_, []).append(e)
    finally:
        runner.stop()
    whole = [parts for parts in chunks.values() if parts[-1].is_done]
    assert len(whole) >= 20
    for parts in whole:
        obs = np.concatenate([p.get_observations()[1 if k else 0 :] for k, p in enumerate(parts)])
        newest = obs[:, -1]
        assert len(set((newest // 100).tolist())) == 1  # one sub-env's one episode
        np.testing.assert_array_equal(newest % 100, np.arange(len(newest)))
        for t in range(len(obs)):  # oldest frame first, zeros before the episode's first
            want = [newest[t - k] if t >= k else 0.0 for k in (2, 1, 0)]
            np.testing.assert_array_equal(obs[t], want)


def test_auto_overlap_measures_and_decides_at_runner_start():
    pytest.importorskip("envpool")
    spec = RLModuleSpec(module_class=AngleModule)
    runner = make_runner(4, spec, overlap_inference="auto")
    try:
        # The choice follows the rule on the costs measured (they vary with the load).
        env_s, fwd_s = runner._overlap_costs
        assert env_s > 0 and fwd_s > 0
        chosen = choose_overlap(env_s, fwd_s, num_envs=4, num_cpus=available_cpus())
        assert runner.env.is_async == chosen
        assert runner._ready_batch == (2 if chosen else None)
        assert 40 <= sum(len(e) for e in runner.sample(num_timesteps=40)) <= 43
    finally:
        runner.stop()
    runner = make_runner(4, overlap_inference=True)
    try:
        assert runner.env.is_async and runner.env.batch_size == 2
    finally:
        runner.stop()


def _auto_runner(monkeypatch, spec, rule, rates=None):
    """A runner under ``overlap_inference="auto"`` whose rule says ``rule``; with ``rates``,
    the two sampler timings of a stateful module return them (stepping all sub-envs,
    ready-first) after really running."""
    import envrunners.env.single_agent_env_runner as runner_module

    monkeypatch.setattr(runner_module, "decide_overlap", lambda *args: rule)
    if rates is not None:
        scripted, real = iter(rates), SingleAgentEnvRunner._sampling_rate

        def sampling_rate(self, *args, **kwargs):
            assert real(self, *args, **kwargs) > 0
            return next(scripted)

        monkeypatch.setattr(SingleAgentEnvRunner, "_sampling_rate", sampling_rate)
    return make_runner(4, spec, overlap_inference="auto")


@pytest.mark.parametrize("rates", [(1000.0, 2000.0), (2000.0, 1000.0)])
def test_auto_overlap_times_sampling_both_ways_for_a_stateful_module(monkeypatch, rates):
    pytest.importorskip("envpool")
    spec = RLModuleSpec(module_class=CountingAngleModule)
    runner = _auto_runner(monkeypatch, spec, True, rates)
    try:
        ready_first = rates[1] > rates[0]
        assert runner._overlap_rates == rates
        assert runner.env.is_async == ready_first
        assert runner._ready_batch == (2 if ready_first else None)
        # The timed runs left nothing behind: every sub-env starts an episode at its
        # first step, from the initial state.
        eps = runner.sample(num_timesteps=40)
        assert 40 <= sum(len(e) for e in eps) <= 43
        for e in eps:
            assert e.t_started == 0
            count = e.get_extra_model_outputs("count_in").reshape(-1)
            np.testing.assert_array_equal(count, np.arange(len(e)))
    finally:
        runner.stop()


def test_auto_overlap_times_sampling_only_for_stateful_modules(monkeypatch):
    pytest.importorskip("envpool")
    runner = _auto_runner(monkeypatch, RLModuleSpec(module_class=AngleModule), True)
    try:
        assert runner._overlap_rates is None and runner.env.is_async
    finally:
        runner.stop()


def test_auto_overlap_leaves_the_sampled_actions_to_the_seed(monkeypatch):
    """Timing forwards draws actions from torch's RNG; it is put back, so a runner that
    "auto" left stepping all sub-envs samples what one set to False samples."""
    pytest.importorskip("envpool")
    actions = []
    for overlap in ("auto", False):
        if overlap == "auto":
            runner = _auto_runner(monkeypatch, RLModuleSpec(), False)
        else:
            runner = make_runner(4, RLModuleSpec(), overlap_inference=False)
        try:
            assert (runner._overlap_costs is not None) == (overlap == "auto")
            eps = runner.sample(num_timesteps=100)
            actions.append([e.get_actions().tolist() for e in eps])
        finally:
            runner.stop()
    assert actions[0] == actions[1]


def test_overlap_rule():
    ms = 1e-3
    assert choose_overlap(5 * ms, 4 * ms, num_envs=8, num_cpus=2)
    assert choose_overlap(2 * ms, 6 * ms, num_envs=8, num_cpus=4)
    assert not choose_overlap(1 * ms, 10 * ms, num_envs=8, num_cpus=2)  # not comparable
    assert not choose_overlap(5 * ms, 4 * ms, num_envs=8, num_cpus=1)  # no second core
    assert not choose_overlap(5 * ms, 4 * ms, num_envs=1, num_cpus=2)  # no two halves
    tiny = MIN_COST_S / 2
    assert not choose_overlap(tiny, tiny, num_envs=16, num_cpus=2)  # overhead dominates
    assert not choose_overlap(float("nan"), 4 * ms, num_envs=8, num_cpus=2)
    assert not choose_overlap(0.0, 4 * ms, num_envs=8, num_cpus=2)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_cell_writer_writes_what_fancy_assignment_writes(dtype):
    """``cell_writer`` (rows written as opaque items) stores exactly what
    ``flat[cells] = value`` stores, for matching rows and for every fallback."""
    rng = np.random.default_rng(0)
    cells = np.array([7, 2, 11, 4], np.intp)
    values = [
        rng.normal(size=(4, 3)).astype(dtype),  # the column's dtype: written as items
        rng.normal(size=(4, 3)) * 5,  # float64: cast
        np.asfortranarray(rng.normal(size=(4, 3)).astype(dtype)),  # rows not contiguous
        rng.normal(size=(3, 4)).astype(dtype).T,  # a transposed view
        rng.normal(size=(4, 5)).astype(dtype)[:, 1:4],  # contiguous rows, strided batch
        rng.normal(size=(1, 3)).astype(dtype),  # broadcast to every cell
        [[1, 0, 1]] * 4,  # not an array
    ]
    for value in values:
        expected = np.zeros((12, 3), dtype)
        expected[cells] = value
        column = np.zeros((12, 3), dtype)
        cell_writer(column)(cells, value)
        np.testing.assert_array_equal(column, expected)
    flat = np.zeros(12, dtype)  # a 1-D column: plain assignment
    cell_writer(flat)(cells, np.arange(4).astype(dtype))
    assert flat[cells].tolist() == np.arange(4).astype(dtype).tolist()
    with pytest.raises(ValueError):  # a wrong row width still fails
        cell_writer(np.zeros((12, 3), dtype))(cells, np.zeros((4, 2), dtype))
