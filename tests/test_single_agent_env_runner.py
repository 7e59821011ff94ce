"""SingleAgentEnvRunner: the spec §18.1 / §18.3 cases on real envs."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
from tests.envs.simple import BadObsEnv, CountingEnv, FailingEnv

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.env.env_runner import EnvRunner
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.errors import EnvCreatorError, EnvRunnerError, SpaceError


def make_runner(num_envs=1, fragment=10, env="CartPole-v1", **env_runner_kw):
    config = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(env)
        .env_runners(
            num_envs_per_env_runner=num_envs, rollout_fragment_length=fragment, **env_runner_kw
        )
        .debugging(seed=0)
    )
    return SingleAgentEnvRunner(config=config)


@pytest.fixture(params=[1, 3], ids=["1env", "3envs"])
def runner(request):
    r = make_runner(num_envs=request.param)
    yield r
    r.stop()


def total(episodes):
    return sum(len(e) for e in episodes)


class TestSampling:
    def test_is_an_env_runner(self, runner):
        assert isinstance(runner, EnvRunner)
        runner.assert_healthy()
        assert runner.ping() == "pong"

    def test_num_episodes(self, runner):
        eps = runner.sample(num_episodes=3)
        assert len(eps) == 3
        assert all(e.is_done and e.t_started == 0 for e in eps)

    def test_num_timesteps_bounds(self, runner):
        for _ in range(5):
            eps = runner.sample(num_timesteps=20)
            assert 20 <= total(eps) <= 20 + runner.num_envs - 1

    def test_default_fragment(self, runner):
        n = runner.num_envs
        eps = runner.sample()
        assert n * 10 <= total(eps) <= n * 10 + n - 1

    def test_zero_counts(self, runner):
        assert runner.sample(num_timesteps=0) == []
        assert runner.sample(num_episodes=0) == []

    def test_bad_counts(self, runner):
        with pytest.raises(AssertionError, match="Provide either `num_timesteps` or"):
            runner.sample(num_timesteps=10, num_episodes=10)
        with pytest.raises(AssertionError, match="`num_timesteps` must be a non-negative"):
            runner.sample(num_timesteps=-1)
        with pytest.raises(AssertionError, match="`num_episodes` must be a non-negative"):
            runner.sample(num_episodes=-1)

    def test_finished_first(self, runner):
        eps = runner.sample(num_timesteps=200)
        flags = [e.is_done for e in eps]
        assert flags == sorted(flags, reverse=True)

    def test_random_actions(self, runner):
        eps = runner.sample(num_timesteps=30, random_actions=True)
        assert total(eps) >= 30
        assert all("action_logp" not in e.extra_model_outputs for e in eps)

    def test_extra_model_outputs(self, runner):
        eps = runner.sample(num_timesteps=30)
        for e in eps:
            assert len(e.get_extra_model_outputs("action_logp")) == len(e)
            assert e.is_numpy


class TestContinuation:
    def test_ids_and_t_started_continue(self, runner):
        first = runner.sample(num_timesteps=5)
        ongoing = {e.id_: e.t for e in first if not e.is_done}
        second = runner.sample(num_timesteps=5)
        continued = [e for e in second if e.t_started > 0]
        assert continued
        for e in continued:
            assert e.id_ in ongoing
            assert e.t_started == ongoing[e.id_]

    def test_lookback_holds_previous_data(self):
        r = make_runner(num_envs=1, env=CountingEnv, fragment=2)
        r.config.env_config = {"episode_len": 100}
        r.make_env()
        a = r.sample(num_timesteps=2)
        b = r.sample(num_timesteps=2)
        assert b[0].id_ == a[0].id_
        assert b[0].t_started == 2
        # obs = step counter: chunk b starts at obs 2, its lookback holds obs 1
        assert b[0].get_observations(0)[0] == 2.0
        assert b[0].get_observations(-1, neg_index_as_lookback=True)[0] == 1.0

    def test_force_reset(self, runner):
        runner.sample(num_timesteps=10)
        ids = {e.id_ for e in runner.sample(num_timesteps=10)}
        eps = runner.sample(num_timesteps=10, force_reset=True)
        assert all(e.t_started == 0 for e in eps)
        assert not ids & {e.id_ for e in eps}

    def test_episode_mode_breaks_continuity(self, runner):
        a = runner.sample(num_episodes=2)
        b = runner.sample(num_episodes=2)
        assert all(e.t_started == 0 for e in a + b)
        assert not {e.id_ for e in a} & {e.id_ for e in b}

    def test_concat_chunks_rebuilds_the_episode(self):
        r = make_runner(num_envs=1, env=CountingEnv, fragment=3)
        r.config.env_config = {"episode_len": 7}
        r.make_env()
        chunks = r.sample(num_timesteps=3) + r.sample(num_timesteps=3) + r.sample(num_timesteps=3)
        first = [c for c in chunks if c.id_ == chunks[0].id_]
        whole = first[0]
        for c in first[1:]:
            whole.concat_episode(c)
        assert whole.is_terminated and len(whole) == 7
        np.testing.assert_array_equal(whole.get_observations()[:, 0], np.arange(8.0))


class TestAutoresetAndCounting:
    def test_reset_step_not_counted(self):
        r = make_runner(num_envs=2, env=CountingEnv)
        r.config.env_config = {"episode_len": 3}
        r.make_env()
        eps = r.sample(num_timesteps=12)
        done = [e for e in eps if e.is_done]
        assert all(len(e) == 3 for e in done)
        # each finished episode is obs 0..3 with exactly 3 actions
        for e in done:
            np.testing.assert_array_equal(e.get_observations()[:, 0], [0, 1, 2, 3])
            assert e.get_return() == 3.0
        assert 12 <= total(eps) <= 13

    def test_truncation_flag(self):
        r = make_runner(num_envs=1, env=CountingEnv)
        r.config.env_config = {"episode_len": 4, "truncate": True}
        r.make_env()
        eps = r.sample(num_episodes=2)
        assert all(e.is_truncated and not e.is_terminated for e in eps)

    def test_complete_episodes_mode(self):
        config = (
            AlgorithmConfig()
            .rl_module(rl_module_spec=RLModuleSpec())
            .environment(CountingEnv, env_config={"episode_len": 4})
            .env_runners(num_envs_per_env_runner=3, batch_mode="complete_episodes")
        )
        r = SingleAgentEnvRunner(config=config)
        eps = r.sample()
        assert len(eps) == 3 and all(e.is_done for e in eps)


class TestMetrics:
    def test_keys_and_values_on_deterministic_env(self):
        config = (
            AlgorithmConfig()
            .rl_module(rl_module_spec=RLModuleSpec())
            .environment(CountingEnv, env_config={"episode_len": 4, "reward": 2.0})
            .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=3)
        )
        r = SingleAgentEnvRunner(config=config)
        r.sample(num_timesteps=6)  # chunks only (3 steps each)
        m = r.get_metrics()
        assert "episode_return_mean" not in m
        assert m["num_env_steps_sampled"] == 6
        r.sample(num_timesteps=4)  # finishes both episodes (4 steps, return 8)
        m = r.get_metrics()
        assert m["episode_len_mean"] == 4
        assert m["episode_return_mean"] == 8.0
        assert m["episode_return_min"] == m["episode_return_max"] == 8.0
        assert m["agent_episode_return_mean"]["default_agent"] == 8.0
        assert m["module_episode_return_mean"]["default_policy"] == 8.0
        assert m["num_episodes"] == 2
        assert m["num_env_steps_sampled_lifetime"] == 10
        assert m["num_agent_steps_sampled"]["default_agent"] == 4
        for key in ("env_step_timer", "sample", "weights_seq_no", "episode_duration_sec_mean"):
            assert key in m
        assert math.isfinite(m["num_env_steps_sampled_lifetime_throughput"])


class TestSeeding:
    def test_same_seed_same_data(self):
        def run():
            r = make_runner(num_envs=2)
            eps = r.sample(num_timesteps=40)
            return np.concatenate([e.get_actions() for e in eps]), [
                e.get_observations()[0].tolist() for e in eps
            ]

        a, b = run(), run()
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1] == b[1]

    def test_worker_index_changes_seed(self):
        config = (
            AlgorithmConfig()
            .rl_module(rl_module_spec=RLModuleSpec())
            .environment(CountingEnv)
            .debugging(seed=10)
        )
        r1 = SingleAgentEnvRunner(config=config, worker_index=1)
        r2 = SingleAgentEnvRunner(config=config, worker_index=2)
        r1.sample(num_timesteps=1)
        r2.sample(num_timesteps=1)
        assert r1.env.envs[0].unwrapped.last_seed == 11
        assert r2.env.envs[0].unwrapped.last_seed == 12


class TestSubEnvRestart:
    def test_failing_sub_env_recreated_siblings_continue(self):
        FailingEnv.failures = 0
        config = (
            AlgorithmConfig()
            .rl_module(rl_module_spec=RLModuleSpec())
            .environment(FailingEnv, env_config={"episode_len": 50, "fail_at_step": 3})
            .env_runners(num_envs_per_env_runner=2)
            .fault_tolerance(restart_failed_sub_environments=True)
        )
        r = SingleAgentEnvRunner(config=config)
        eps = r.sample(num_timesteps=10)
        # sub-env 0 failed at its 3rd step: its 2-step partial episode is dropped,
        # sub-env 1 keeps its episode from t=0.
        assert FailingEnv.failures == 1
        ids_t0 = [e for e in eps if e.t_started == 0]
        assert len(ids_t0) == 2
        lens = sorted(len(e) for e in eps)
        assert lens[-1] >= 5
        m = r.get_metrics()
        assert m["num_env_step_failures"] == 1
        assert m["num_episodes_dropped_lifetime"] == 1
        # obs of the surviving episodes are continuous 0,1,2,...
        for e in eps:
            obs = e.get_observations()[:, 0]
            np.testing.assert_array_equal(obs, np.arange(len(obs), dtype=np.float32))

    def test_failure_without_restart_raises_with_index(self):
        FailingEnv.failures = 0
        config = (
            AlgorithmConfig()
            .rl_module(rl_module_spec=RLModuleSpec())
            .environment(FailingEnv, env_config={"fail_at_step": 2})
            .env_runners(num_envs_per_env_runner=2)
        )
        r = SingleAgentEnvRunner(config=config)
        with pytest.raises(EnvRunnerError, match="sub-environment 0 raised ValueError") as info:
            r.sample(num_timesteps=10)
        assert isinstance(info.value.__cause__, ValueError)
        assert isinstance(info.value, RuntimeError)


class TestBadInput:
    def test_creator_returning_non_env(self):
        config = (
            AlgorithmConfig().rl_module(rl_module_spec=RLModuleSpec()).environment(lambda ctx: 42)
        )
        with pytest.raises(EnvCreatorError, match=r"returned 42 \(type int\), which is not an"):
            SingleAgentEnvRunner(config=config)

    def test_unknown_env_id_suggests(self):
        config = (
            AlgorithmConfig().rl_module(rl_module_spec=RLModuleSpec()).environment("CartPol-v1")
        )
        with pytest.raises(EnvCreatorError, match="Did you mean 'CartPole-v1'"):
            SingleAgentEnvRunner(config=config)

    def test_observation_outside_space(self):
        config = AlgorithmConfig().rl_module(rl_module_spec=RLModuleSpec()).environment(BadObsEnv)
        r = SingleAgentEnvRunner(config=config)
        with pytest.raises(SpaceError, match=r"not in its observation_space Box\(0\.0"):
            r.sample(num_timesteps=2)

    def test_disable_env_checking(self):
        config = (
            AlgorithmConfig()
            .rl_module(rl_module_spec=RLModuleSpec())
            .environment(BadObsEnv, disable_env_checking=True)
        )
        r = SingleAgentEnvRunner(config=config)
        assert len(r.sample(num_timesteps=2)) >= 1

    def test_no_env_given(self):
        with pytest.raises(EnvCreatorError, match="config.env is not set"):
            SingleAgentEnvRunner(config=AlgorithmConfig().rl_module(rl_module_spec=RLModuleSpec()))


class TestStateAndWeights:
    def test_state_roundtrip_and_seq_no(self):
        a, b = make_runner(), make_runner()
        state = a.get_state()
        assert {"rl_module", "weights_seq_no", "num_env_steps_sampled_lifetime"} <= set(state)
        b.set_state({**state, "weights_seq_no": 3})
        for k, v in b.get_state()["rl_module"].items():
            np.testing.assert_array_equal(v, state["rl_module"][k])
        assert b._weights_seq_no == 3
        # stale seq no: ignored
        stale = {k: v + 1.0 for k, v in state["rl_module"].items()}
        b.set_state({"rl_module": stale, "weights_seq_no": 2})
        for k, v in b.get_weights().items():
            np.testing.assert_array_equal(v, state["rl_module"][k])
        # seq 0 forces
        b.set_weights(stale, weights_seq_no=0)
        for k, v in b.get_weights().items():
            np.testing.assert_array_equal(v, stale[k])

    def test_lifetime_steps_only_via_set_state(self):
        r = make_runner()
        r.sample(num_timesteps=10)
        assert r.num_env_steps_sampled_lifetime == 0
        r.set_state({"num_env_steps_sampled_lifetime": 1234})
        assert r.get_state(components="rl_module")["num_env_steps_sampled_lifetime"] == 1234

    def test_save_and_restore(self, tmp_path):
        a = make_runner()
        a.save_to_path(str(tmp_path / "ckpt"))
        b = SingleAgentEnvRunner.from_checkpoint(str(tmp_path / "ckpt"), config=a.config)
        for k, v in b.get_weights().items():
            np.testing.assert_array_equal(v, a.get_weights()[k])

    def test_spaces(self):
        r = make_runner(num_envs=2)
        spaces = r.get_spaces()
        assert spaces["__env_single__"][0] == gym.make("CartPole-v1").observation_space
        assert spaces["default_policy"][1] == gym.spaces.Discrete(2)
        assert spaces["__env__"][0].shape == (2, 4)

    def test_local_runner_of_group_has_no_env(self):
        config = (
            AlgorithmConfig()
            .rl_module(rl_module_spec=RLModuleSpec())
            .environment("CartPole-v1")
            .env_runners(num_env_runners=2)
        )
        r = SingleAgentEnvRunner(config=config, worker_index=0)
        assert r.env is None
        with pytest.raises(ValueError, match="doesn't have an env"):
            r.sample()


def test_random_then_module_actions_keep_extras_aligned():
    r = make_runner(num_envs=2, env=CountingEnv, fragment=3)
    r.config.env_config = {"episode_len": 100}
    r.make_env()
    r.sample(num_timesteps=4)
    r.sample(num_timesteps=4, random_actions=True)
    eps = r.sample(num_timesteps=4)
    for e in eps:
        assert len(e.get_extra_model_outputs("action_logp")) == len(e)
    eps = r.sample(num_timesteps=4, random_actions=True)
    assert all("action_logp" not in e.extra_model_outputs for e in eps)


def test_runner_records_episodes_when_output_is_set(tmp_path):
    from envrunners.offline.episode_writer import read_episodes

    config = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(CountingEnv, env_config={"episode_len": 3})
        .env_runners(num_envs_per_env_runner=2)
        .offline_data(output=str(tmp_path / "out"))
    )
    r = SingleAgentEnvRunner(config=config)
    sampled = r.sample(num_timesteps=8) + r.sample(num_timesteps=4)
    r.stop()
    read = list(read_episodes(str(tmp_path / "out")))
    assert [e.id_ for e in read] == [e.id_ for e in sampled]
    for a, b in zip(read, sampled):
        np.testing.assert_array_equal(a.get_observations(), b.get_observations())
        np.testing.assert_array_equal(a.get_actions(), b.get_actions())
        assert a.t_started == b.t_started and a.is_done == b.is_done


def test_reset_failure_without_restart_is_an_env_runner_error():
    class BadReset(CountingEnv):
        def reset(self, *, seed=None, options=None):
            raise OSError("simulator down")

    r = SingleAgentEnvRunner(
        config=AlgorithmConfig().rl_module(rl_module_spec=RLModuleSpec()).environment(BadReset),
        worker_index=2,
    )
    with pytest.raises(
        EnvRunnerError, match=r"env runner 2: sub-environment 0 raised OSError"
    ) as info:
        r.sample(num_timesteps=1)
    assert isinstance(info.value.__cause__, OSError)


class TestBaseConfigWithoutModule:
    """A base AlgorithmConfig with no rl_module_spec builds no module (RLlib 2.60)."""

    def test_samples_random_actions_as_rllib(self):
        config = AlgorithmConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=2)
        r = SingleAgentEnvRunner(config=config)
        try:
            assert r.module is None
            episodes = r.sample(num_timesteps=10)
            assert total(episodes) >= 10
            # As RLlib's module-less episodes: actions in the space, only weights_seq_no.
            for e in episodes:
                assert set(e.extra_model_outputs) == {"weights_seq_no"}
                assert all(r.env.single_action_space.contains(a) for a in e.get_actions())
            (done, *_) = r.sample(num_episodes=1)
            assert done.is_done
            assert "rlmodule_inference_timer" not in r.get_metrics()
            with pytest.raises(AttributeError, match="no module"):
                r.get_state()
        finally:
            r.stop()
        with_spec = SingleAgentEnvRunner(config=config.rl_module(rl_module_spec=RLModuleSpec()))
        assert with_spec.module is not None
        with_spec.stop()
