"""Sampling under faults: crashing sub-envs, poisoned (NaN/inf) data, bounded metrics, logs.

Real envs throughout: CartPole wrapped to raise or to return a NaN/inf at a given
step of a given sub-env, and a small Dict-observation env.
"""

from __future__ import annotations

import logging
import sys

import gymnasium as gym
import numpy as np
import pytest
import ray

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.env.multi_agent_env import make_multi_agent
from envrunners.env.multi_agent_env_runner import MultiAgentEnvRunner
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.errors import (
    EnvRunnerError,
    NonFiniteEnvDataError,
    NonFiniteModuleOutputError,
    NonFiniteValueError,
)
from envrunners.sampling.finite_checks import ObsRewardCheck
from envrunners.utils.failure_log import FAILURE_LOG
from envrunners.utils.filter import MeanStdFilter
from envrunners.utils.metrics_logger import MetricsLogger

# Ray workers cannot import this test module by name: ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Poisoned(gym.Wrapper):
    """CartPole that, at step ``at`` of an episode, raises or returns a NaN obs / inf reward.

    ``env_config``: ``at``, ``what`` (``"raise"``, ``"obs"``, ``"reward"``, or
    ``"final_obs"``: a NaN in the observation that ends the episode, whatever the step),
    ``only_index`` (poison only this sub-env's ``vector_index``) and ``limit``
    (poisonings per process, counted in ``Poisoned.count``).
    """

    count = 0

    def __init__(self, config):
        super().__init__(gym.make("CartPole-v1"))
        vector_index = getattr(config, "vector_index", 0)
        config = dict(config or {})
        self.at = int(config.get("at", 5))
        self.what = config.get("what", "obs")
        only = config.get("only_index")
        self.poisons = only is None or vector_index == only
        self.limit = int(config.get("limit", 1))
        self.t = 0
        self.total_steps = 0

    def reset(self, **kwargs):
        self.t = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, term, trunc, info = self.env.step(action)
        self.t += 1
        self.total_steps += 1
        final = self.what == "final_obs" and (term or trunc)
        if self.poisons and (final or self.t == self.at) and Poisoned.count < self.limit:
            Poisoned.count += 1
            if self.what == "raise":
                raise ValueError(f"crash at step {self.t}")
            if self.what in ("obs", "final_obs"):
                obs = obs.copy()
                obs[2] = np.nan
            elif self.what == "reward":
                reward = float("inf")
        return obs, reward, term, trunc, info


class DictObsEnv(gym.Env):
    """Dict observations (a float ``pos`` and a uint8 ``count``); ``pos`` is NaN at step 3."""

    observation_space = gym.spaces.Dict(
        {
            "count": gym.spaces.Box(0, 255, (2,), np.uint8),
            "pos": gym.spaces.Box(-np.inf, np.inf, (3,), np.float32),
        }
    )
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config=None):
        self.t = 0

    def _obs(self):
        pos = np.full(3, float(self.t), np.float32)
        if self.t == 3:
            pos[1] = np.nan
        return {"count": np.full(2, self.t, np.uint8), "pos": pos}

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, self.t >= 20, False, {}


@pytest.fixture(autouse=True)
def _fresh_counter():
    Poisoned.count = 0
    yield


def config(what="obs", *, at=5, only_index=None, limit=1, num_envs=3, restart=False):
    env_config = {"at": at, "what": what, "only_index": only_index, "limit": limit}
    return (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(Poisoned, env_config=env_config)
        .env_runners(num_envs_per_env_runner=num_envs)
        .fault_tolerance(restart_failed_sub_environments=restart)
        .debugging(seed=0)
    )


def total(episodes):
    return sum(len(e) for e in episodes)


def all_finite(episodes):
    return all(
        np.isfinite(e.get_observations()).all() and np.isfinite(e.get_rewards()).all()
        for e in episodes
    )


# -- crashes: the batch keeps its size (issue 15) ------------------------------------
@pytest.mark.parametrize("n", [10, 20])
def test_crashed_sub_envs_do_not_shrink_the_batch(n):
    r = SingleAgentEnvRunner(config=config("raise", at=3, limit=3, num_envs=2, restart=True))
    try:
        episodes = r.sample(num_timesteps=n)
        assert total(episodes) >= n
        m = r.get_metrics()
        assert m["num_env_step_failures"] == 3
        assert m["num_episodes_dropped_lifetime"] == 3
        # The dropped partial episodes are not in the batch: every chunk starts at t=0
        # and no obs comes from a crashed instance (CartPole obs stay continuous).
        assert all(e.t_started == 0 for e in episodes)
    finally:
        r.stop()


def test_crashed_sub_envs_do_not_shrink_the_multi_agent_batch():
    r = MultiAgentEnvRunner(config=_ma_config(restart=True, what="raise", at=3, limit=3))
    try:
        episodes = r.sample(num_timesteps=20)
        assert total(episodes) >= 20
        assert r.get_metrics()["num_env_step_failures"] == 3
    finally:
        r.stop()


def test_sub_envs_that_always_fail_give_up_instead_of_looping():
    r = SingleAgentEnvRunner(config=config("raise", at=2, limit=10**9, num_envs=2, restart=True))
    try:
        with pytest.raises(EnvRunnerError, match="sub-environments keep failing"):
            r.sample(num_timesteps=10)
    finally:
        r.stop()


# -- bounded memory (issue 16 item 3) -------------------------------------------------
def test_episode_stats_stay_in_the_smoothing_window_without_get_metrics():
    cfg = config("obs", limit=0, num_envs=1).reporting(metrics_num_episodes_for_smoothing=4)
    r = SingleAgentEnvRunner(config=cfg)
    try:
        returns = []
        for _ in range(10):
            (episode,) = r.sample(num_episodes=1)
            returns.append(episode.get_return())
            assert len(r._done_stats) <= 4
        # Every metric holds a bounded number of values, logged or not.
        for stat in r.metrics._stats.values():
            assert stat.values is None or len(stat.values) <= 4
        m = r.get_metrics()
        assert m["episode_return_mean"] == pytest.approx(np.mean(returns[-4:]))
        assert m["episode_return_max"] == pytest.approx(max(returns[-4:]))
        assert m["num_episodes"] == 10
    finally:
        r.stop()


def test_metrics_logger_keeps_running_numbers_for_unwindowed_metrics():
    log = MetricsLogger()
    values = np.random.default_rng(0).normal(size=5000)
    for v in values:
        for reduce in ("mean", "min", "max", "sum", "last"):
            log.log_value(reduce, v, reduce=reduce)
        log.log_value("windowed", v, window=10)
    assert all(
        s.values is None for k, s in log._stats.items() if k != ("windowed",)
    )  # constant memory
    out = log.reduce()
    assert out["mean"] == pytest.approx(values.mean())
    assert (out["min"], out["max"], out["last"]) == (values.min(), values.max(), values[-1])
    assert out["sum"] == pytest.approx(values.sum())
    assert out["windowed"] == pytest.approx(values[-10:].mean())
    assert log.reduce()["sum"] == 0 and np.isnan(log.reduce()["last"])  # cleared per reduce


# -- poisoned data (issue 16 item 4) --------------------------------------------------
@pytest.mark.parametrize(("what", "column"), [("obs", "obs"), ("reward", "rewards")])
def test_non_finite_env_data_names_sub_env_step_and_column(what, column):
    r = SingleAgentEnvRunner(config=config(what, at=5, only_index=1))
    try:
        with pytest.raises(NonFiniteEnvDataError, match="sub-environment 1 .* at step 5") as info:
            r.sample(num_timesteps=60)
        err = info.value
        assert isinstance(err, ValueError) and isinstance(err, NonFiniteValueError)
        assert (err.sub_env_index, err.step, err.column) == (1, 5, column)
    finally:
        r.stop()


@pytest.mark.parametrize("what", ["obs", "reward"])
def test_non_finite_env_data_is_a_sub_env_failure_with_restarts(what):
    r = SingleAgentEnvRunner(config=config(what, at=5, only_index=1, restart=True))
    try:
        episodes = r.sample(num_timesteps=60)
        assert total(episodes) >= 60 and all_finite(episodes)
        m = r.get_metrics()
        assert m["num_env_step_failures"] == 1
        assert m["num_episodes_dropped_lifetime"] == 1
        # Sub-envs 0 and 2 were not touched: their first episode goes on from t=0.
        assert sorted(e.t_started for e in episodes).count(0) == len(episodes)
    finally:
        r.stop()


def test_dict_observations_check_each_float_leaf():
    check = ObsRewardCheck(DictObsEnv.observation_space)
    assert [name for name, _ in check.obs_leaves] == ["obs['pos']"]
    assert ObsRewardCheck(gym.spaces.Box(0, 255, (84, 84), np.uint8)).obs_leaves == []
    assert ObsRewardCheck(gym.spaces.Discrete(3)).obs_leaves == []
    cfg = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(DictObsEnv)
        .env_runners(num_envs_per_env_runner=2)
    )
    r = SingleAgentEnvRunner(config=cfg.rl_module(model_config={"fcnet_hiddens": [8]}))
    try:
        with pytest.raises(NonFiniteEnvDataError) as info:
            r.sample(num_timesteps=20, random_actions=True)
        assert (info.value.sub_env_index, info.value.step, info.value.column) == (
            0,
            3,
            "obs['pos']",
        )
    finally:
        r.stop()


@pytest.mark.parametrize("num_envs", [1, 16, 128])
@pytest.mark.parametrize("int_obs", [False, True])
def test_planned_checks_find_every_bad_value(num_envs, int_obs):
    space = gym.spaces.Box(0, 9, (4,), np.int64 if int_obs else np.float32)
    ok = ObsRewardCheck(space).ok_for(num_envs)
    obs, rewards = np.ones((num_envs, 4), space.dtype), np.ones(num_envs)
    assert ok(obs, rewards) and ok(obs.tolist(), rewards.tolist())  # lists: the exact test
    for bad in (np.nan, np.inf, -np.inf):
        r = rewards.copy()
        r[-1] = bad
        assert not ok(obs, r)
        if not int_obs:
            o = obs.copy()
            o[-1, 2] = bad
            assert not ok(o, rewards) and not ok(o.tolist(), rewards)
    big = np.full((num_envs, 4), 1e300)  # squares overflow: a false alarm that find() clears
    assert ObsRewardCheck(None).find(big, rewards) == []


def test_non_finite_module_outputs_are_raised_before_acting():
    r = SingleAgentEnvRunner(config=config("obs", limit=0, num_envs=2))
    try:
        r.sample(num_timesteps=4)
        weights = r.get_state(components="rl_module")["rl_module"]
        r.set_state({"rl_module": {k: np.full_like(v, np.nan) for k, v in weights.items()}})
        steps = [env.total_steps for env in r.env.envs]
        with pytest.raises(NonFiniteModuleOutputError, match="module 'default_policy'") as info:
            r.sample(num_timesteps=4)
        assert info.value.module_id == "default_policy" and isinstance(info.value, ValueError)
        assert [env.total_steps for env in r.env.envs] == steps  # no env got an action
    finally:
        r.stop()


def _ma_config(restart, what="obs", at=4, limit=1, only_index=None):
    env_config = {"num_agents": 2, "at": at, "what": what, "limit": limit}
    return (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(
            make_multi_agent(Poisoned), env_config={**env_config, "only_index": only_index}
        )
        .env_runners(num_envs_per_env_runner=2)
        .multi_agent(policies={"p0"}, policy_mapping_fn=lambda aid, ep, **kw: "p0")
        .fault_tolerance(restart_failed_sub_environments=restart)
        .debugging(seed=0)
    )


@pytest.mark.parametrize(("what", "column"), [("obs", "obs["), ("reward", "rewards[")])
def test_multi_agent_non_finite_data_names_sub_env_step_and_column(what, column):
    r = MultiAgentEnvRunner(config=_ma_config(restart=False, what=what, only_index=1))
    try:
        with pytest.raises(NonFiniteEnvDataError, match="sub-environment 1 .* at step 4") as info:
            r.sample(num_timesteps=40)
        assert info.value.step == 4 and info.value.column.startswith(column)
        assert info.value.sub_env_index == 1
    finally:
        r.stop()


def test_multi_agent_final_observations_are_checked():
    r = MultiAgentEnvRunner(config=_ma_config(restart=False, what="final_obs"))
    try:
        with pytest.raises(NonFiniteEnvDataError, match="non-finite obs"):
            r.sample(num_timesteps=400)
    finally:
        r.stop()


@pytest.mark.parametrize("what", ["obs", "reward", "final_obs"])
def test_multi_agent_non_finite_data_recreates_only_that_sub_env(what):
    r = MultiAgentEnvRunner(config=_ma_config(restart=True, what=what, only_index=1))
    try:
        envs = list(r.env.envs)
        episodes = r.sample(num_timesteps=400)
        assert Poisoned.count == 1
        assert total(episodes) >= 400
        for e in episodes:
            for sa in e.agent_episodes.values():
                assert np.isfinite(sa.get_observations()).all()
                assert np.isfinite(sa.get_rewards()).all()
        assert r.get_metrics()["num_env_step_failures"] == 1
        # Only sub-env 1 was recreated.
        assert r.env.envs[0] is envs[0] and r.env.envs[1] is not envs[1]
    finally:
        r.stop()


def test_mean_std_filter_never_absorbs_non_finite_values():
    f = MeanStdFilter((2,))
    f(np.array([[1.0, 2.0], [np.nan, 3.0], [3.0, np.inf]]))
    assert f.running_stats.n == 1
    np.testing.assert_allclose(f.running_stats.mean, [1.0, 2.0])
    f(np.array([-np.inf, 0.0]))
    f(np.array([[3.0, 4.0], [5.0, 6.0]]))
    assert f.running_stats.n == 3 and f.buffer.n == 3
    np.testing.assert_allclose(f.running_stats.mean, [3.0, 4.0])


# -- logs (issue 16 item 6) -----------------------------------------------------------
def test_failures_are_logged_once_per_kind_then_counted(caplog, monkeypatch):
    r = SingleAgentEnvRunner(config=config("raise", at=2, limit=30, num_envs=2, restart=True))
    monkeypatch.setattr(FAILURE_LOG, "interval_s", 0.0)
    try:
        with caplog.at_level(logging.WARNING, logger="envrunners"):
            r.sample(num_timesteps=200)
        assert Poisoned.count == 30
        full = [rec for rec in caplog.records if rec.exc_info]
        assert len(full) == 1 and "crash at step 2" in full[0].getMessage()
        counts = [
            rec.getMessage() for rec in caplog.records if "More env failures" in rec.getMessage()
        ]
        assert counts and sum(int(m.split(": ")[1].split(" x ")[0]) for m in counts) == 29
        assert FAILURE_LOG.totals[("sub-env step", "ValueError")] == 30
        assert r.get_metrics()["num_env_step_failures"] == 30
    finally:
        r.stop()


def test_remote_runners_report_and_recover_from_poisoned_data(ray_session):
    from envrunners.env.env_runner_group import EnvRunnerGroup

    cfg = config("obs", at=5, only_index=1, num_envs=2).env_runners(
        num_env_runners=1, num_cpus_per_env_runner=0
    )
    group = EnvRunnerGroup(config=cfg, num_env_runners=1, local_env_runner=False)
    try:
        with pytest.raises(NonFiniteEnvDataError, match="sub-environment 1 .* at step 5"):
            group.foreach_env_runner(
                lambda r: r.sample(num_timesteps=40), local_env_runner=False, remote_worker_ids=[1]
            )
    finally:
        group.stop()
    cfg = cfg.fault_tolerance(restart_failed_sub_environments=True)
    group = EnvRunnerGroup(config=cfg, num_env_runners=1, local_env_runner=False)
    try:
        results = group.foreach_env_runner(
            lambda r: (r.sample(num_timesteps=40), r.get_metrics()), local_env_runner=False
        )
        assert len(results) == 1
        for episodes, metrics in results:
            assert total(episodes) >= 40 and all_finite(episodes)
            assert metrics["num_env_step_failures"] == 1
    finally:
        group.stop()


# -- the old stack (RolloutWorker / SyncSampler) ---------------------------------------
def _old_worker(what, *, multi_agent=False, restart=False, only_index=1):
    from tests.envs.old_stack import MockPolicy

    from envrunners.evaluation.rollout_worker import RolloutWorker

    env_config = {"at": 4, "what": what, "only_index": only_index, "limit": 1}
    cfg = (
        AlgorithmConfig()
        .environment(env_config=env_config)
        .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=50)
        .fault_tolerance(restart_failed_sub_environments=restart)
    )
    if multi_agent:
        make, env_config = make_multi_agent(Poisoned), {**env_config, "num_agents": 2}
        cfg = cfg.environment(env_config=env_config).multi_agent(
            policies={"p0"}, policy_mapping_fn=lambda aid, ep, **kw: "p0"
        )
        return RolloutWorker(env_creator=make, config=cfg, default_policy_class=MockPolicy)
    return RolloutWorker(env_creator=Poisoned, config=cfg, default_policy_class=MockPolicy)


@pytest.mark.parametrize("multi_agent", [False, True])
@pytest.mark.parametrize(("what", "column"), [("obs", "obs"), ("reward", "rewards")])
def test_rollout_worker_checks_every_step(what, column, multi_agent):
    worker = _old_worker(what, multi_agent=multi_agent)
    try:
        with pytest.raises(NonFiniteEnvDataError, match="sub-environment 1 .* at step 4") as info:
            worker.sample()
        err = info.value
        assert (err.sub_env_index, err.step) == (1, 4) and err.column.startswith(column)
    finally:
        worker.stop()


@pytest.mark.parametrize("multi_agent", [False, True])
def test_rollout_worker_recreates_the_bad_sub_env(multi_agent):
    worker = _old_worker("obs", multi_agent=multi_agent, restart=True)
    try:
        envs = list(worker.async_env.envs)
        batch = worker.sample()
        assert Poisoned.count == 1
        batches = batch.policy_batches.values() if multi_agent else [batch]
        for b in batches:
            assert np.isfinite(b["obs"]).all() and np.isfinite(b["rewards"]).all()
        assert worker.async_env.envs[0] is envs[0] and worker.async_env.envs[1] is not envs[1]
    finally:
        worker.stop()
