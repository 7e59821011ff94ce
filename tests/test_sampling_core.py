"""The sampling core: vector env semantics, connectors, vector modes, callbacks, restarts."""

from __future__ import annotations

import logging

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tests.envs.simple import CountingEnv, FailingEnv

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.connectors import ConnectorPipelineV2, MeanStdFilter, NormalizeAndClipActions
from envrunners.connectors.reward_clipping import clip_rewards_fn
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.env.env_runner import ENV_STEP_FAILURE
from envrunners.env.registry import register_env, unregister_env
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.env.vector.fast_sync_vector_env import FastSyncVectorEnv
from envrunners.errors import ConfigError, StepFailedRecreateEnvError
from envrunners.sampling.sample_result import SampleResult
from envrunners.sampling.single_agent import SingleAgentSampler


class TestFastSyncVectorEnv:
    def test_matches_gymnasium_next_step_autoreset(self):
        ours = FastSyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)])
        theirs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)])
        o1, _ = ours.reset(seed=7)
        o2, _ = theirs.reset(seed=7)
        np.testing.assert_array_equal(o1, o2)
        rng = np.random.default_rng(0)
        for _ in range(200):
            a = rng.integers(0, 2, size=3)
            r1 = ours.step(a)
            r2 = theirs.step(a)
            for x, y in zip(r1[:4], r2[:4]):
                np.testing.assert_array_equal(x, y)
            assert isinstance(r1[4], list) and len(r1[4]) == 3

    def test_seed_list_length_checked(self):
        env = FastSyncVectorEnv([lambda: CountingEnv() for _ in range(2)])
        with pytest.raises(ValueError, match="got 3 seeds for 2 sub-envs"):
            env.reset(seed=[1, 2, 3])

    def test_restart_failed_marks_and_recovers(self):
        FailingEnv.failures = 0
        env = FastSyncVectorEnv(
            [lambda: FailingEnv({"fail_at_step": 2, "episode_len": 10}) for _ in range(2)],
            restart_failed=True,
        )
        env.reset()
        env.step(np.zeros(2, np.int64))
        obs, rew, term, trunc, _ = env.step(np.zeros(2, np.int64))
        assert env.failed.tolist() == [True, False]
        assert obs[0, 0] == 0.0 and obs[1, 0] == 2.0  # env 0 was reset, env 1 stepped
        assert env.num_failures == 1

    def test_without_restart_error_carries_index(self):
        FailingEnv.failures = 0
        env = FastSyncVectorEnv([lambda: FailingEnv({"fail_at_step": 1}) for _ in range(2)])
        env.reset()
        with pytest.raises(ValueError, match="simulated failure") as info:
            env.step(np.zeros(2, np.int64))
        assert info.value.sub_env_index == 0

    def test_silent_recreate_error_is_not_logged(self, caplog):
        FailingEnv.failures = 0
        env = FastSyncVectorEnv(
            [lambda: FailingEnv({"fail_at_step": 1, "error_cls": StepFailedRecreateEnvError})],
            restart_failed=True,
        )
        env.reset()
        with caplog.at_level(logging.ERROR, logger="envrunners"):
            env.step(np.zeros(1, np.int64))
        assert env.failed[0] and not caplog.records
        FailingEnv.failures = 0
        env = FastSyncVectorEnv([lambda: FailingEnv({"fail_at_step": 1})], restart_failed=True)
        env.reset()
        with caplog.at_level(logging.ERROR, logger="envrunners"):
            env.step(np.zeros(1, np.int64))
        assert len(caplog.records) == 1


class TestConnectors:
    def test_mean_std_filter_normalises_batches_and_merges(self):
        space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        a, b = MeanStdFilter(space), MeanStdFilter(space)
        rng = np.random.default_rng(0)
        xa = rng.normal(3.0, 2.0, size=(500, 2))
        xb = rng.normal(-1.0, 0.5, size=(300, 2))
        a(batch={"obs": xa})
        b(batch={"obs": xb})
        merged = a.merge_states([a.get_state(), b.get_state()])
        c = MeanStdFilter(space)
        c.set_state(merged)
        c.update = False
        data = np.concatenate([xa, xb])
        out = c(batch={"obs": data})["obs"]
        expected = (data - data.mean(0)) / (data.std(0) + 1e-8)
        np.testing.assert_allclose(out, np.clip(expected, -10, 10), rtol=1e-3, atol=1e-3)

    def test_filter_needs_box(self):
        with pytest.raises(ConfigError, match="MeanStdFilter needs a Box observation space"):
            MeanStdFilter(gym.spaces.Discrete(3))

    def test_unsquash_and_clip(self):
        space = gym.spaces.Box(-2.0, 1.0, (3,), np.float32)
        norm = NormalizeAndClipActions(None, space, normalize_actions=True)
        out = norm(batch={"actions": np.array([[-1.0, 0.0, 5.0]])})
        np.testing.assert_allclose(out["actions_for_env"], [[-2.0, -0.5, 1.0]])
        clip = NormalizeAndClipActions(None, space, normalize_actions=False, clip_actions=True)
        out = clip(batch={"actions": np.array([[-9.0, 0.5, 9.0]])})
        np.testing.assert_allclose(out["actions_for_env"], [[-2.0, 0.5, 1.0]])
        np.testing.assert_allclose(out["actions"], [[-9.0, 0.5, 9.0]])

    def test_pipeline_state_and_spaces(self):
        space = gym.spaces.Box(-5, 5, (2,), np.float32)
        pipe = ConnectorPipelineV2(space, gym.spaces.Discrete(2), [MeanStdFilter(space)])
        assert pipe.observation_space == gym.spaces.Box(-10, 10, (2,), np.float32)
        pipe(batch={"obs": np.ones((4, 2))})
        state = pipe.get_state()
        assert set(state) == {"MeanStdFilter"}
        other = ConnectorPipelineV2(space, None, [MeanStdFilter(space)])
        other.set_state(state)
        assert other["MeanStdFilter"].filter.running_stats.n == 4
        with pytest.raises(KeyError, match="no connector 'Nope'"):
            pipe["Nope"]

    def test_clip_rewards(self):
        assert clip_rewards_fn(None) is None
        np.testing.assert_array_equal(clip_rewards_fn(True)(np.array([-3.0, 0.0, 2.0])), [-1, 0, 1])
        np.testing.assert_array_equal(clip_rewards_fn(1.5)(np.array([-3.0, 2.0])), [-1.5, 1.5])
        with pytest.raises(ConfigError, match="clip_rewards=-1 is invalid"):
            clip_rewards_fn(-1)


def _runner(env=CountingEnv, env_config=None, num_envs=2, **kw):
    config = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(env, env_config=env_config or {})
        .env_runners(num_envs_per_env_runner=num_envs, **kw)
    )
    return SingleAgentEnvRunner(config=config)


class TestRunnerWiring:
    def test_observation_filter_in_runner_and_state(self):
        r = _runner(env="CartPole-v1", observation_filter="MeanStdFilter")
        eps = r.sample(num_timesteps=400)
        obs = np.concatenate([e.get_observations() for e in eps])
        assert np.abs(obs.mean(0)).max() < 1.0  # normalised
        state = r.get_state()
        assert state["env_to_module_connector"]["MeanStdFilter"]
        r2 = _runner(env="CartPole-v1", observation_filter="MeanStdFilter")
        r2.set_state(state)
        assert r2._env_to_module["MeanStdFilter"].filter.running_stats.n > 0

    def test_box_actions_unsquashed_for_env(self):
        seen = []

        class Recorder(gym.Wrapper):
            def step(self, action):
                seen.append(np.array(action))
                return super().step(action)

        r = _runner(env=lambda ctx: Recorder(gym.make("Pendulum-v1")), num_envs=1)
        eps = r.sample(num_timesteps=50)
        stored = np.concatenate([e.get_actions() for e in eps])
        sent = np.stack(seen)
        assert np.all(np.abs(sent) <= 2.0)  # Pendulum bounds
        # In float64: float32 arithmetic on (a + 1) alone errs by ~1e-7, which is a large
        # relative error for env actions near 0. The env receives float32 (the space's dtype).
        expected = -2.0 + (np.clip(stored.astype(np.float64), -1, 1) + 1.0) * 2.0
        np.testing.assert_allclose(
            sent[: len(expected)], expected[: len(sent)].astype(np.float32), rtol=1e-6, atol=1e-7
        )

    def test_reward_clipping(self):
        r = _runner(env_config={"reward": 5.0, "episode_len": 3})
        r.config.clip_rewards = 2.0
        r.make_env()
        eps = r.sample(num_episodes=2)
        assert all(e.get_return() == 6.0 for e in eps)

    def test_registered_env_gets_context(self):
        contexts = []

        def creator(ctx):
            contexts.append(ctx)
            return CountingEnv(ctx)

        register_env("counting-test-v0", creator)
        try:
            config = (
                AlgorithmConfig()
                .rl_module(rl_module_spec=RLModuleSpec())
                .environment("counting-test-v0", env_config={"episode_len": 2})
                .env_runners(num_envs_per_env_runner=2)
            )
            r = SingleAgentEnvRunner(config=config, worker_index=3, num_workers=4)
            eps = r.sample(num_episodes=2)
            assert all(len(e) == 2 for e in eps)
            assert [c.vector_index for c in contexts] == [0, 1]
            assert all(c.worker_index == 3 and c.num_workers == 4 for c in contexts)
        finally:
            unregister_env("counting-test-v0")

    @pytest.mark.parametrize("mode", ["async", "vector_entry_point"])
    def test_other_vectorize_modes(self, mode):
        if mode == "vector_entry_point":
            env = lambda ctx: gym.make_vec("CartPole-v1", num_envs=ctx["num_envs"])  # noqa: E731
        else:
            env = "CartPole-v1"
        r = _runner(env=env, num_envs=2, gym_env_vectorize_mode=mode)
        try:
            eps = r.sample(num_timesteps=100)
            assert 100 <= sum(len(e) for e in eps) <= 101
            eps = r.sample(num_episodes=3)
            assert len(eps) == 3 and all(e.is_done for e in eps)
        finally:
            r.stop()

    def test_whole_env_restart_path_for_gym_vector_envs(self, tmp_path):
        env_config = {"fail_at_step": 4, "episode_len": 50, "flag_file": str(tmp_path / "f")}
        config = (
            AlgorithmConfig()
            .rl_module(rl_module_spec=RLModuleSpec())
            .environment(FailingEnv, env_config=env_config)
            .env_runners(num_envs_per_env_runner=2, gym_env_vectorize_mode="async")
            .fault_tolerance(restart_failed_sub_environments=True)
        )
        r = SingleAgentEnvRunner(config=config)
        try:
            eps = r.sample(num_timesteps=20)
            assert sum(len(e) for e in eps) >= 20
            assert all(e.t_started == 0 for e in eps)  # in-flight chunks were dropped
            assert r.get_metrics()["num_env_step_failures"] == 1
        finally:
            r.stop()

    def test_loops_share_one_failure_marker_and_result_type(self):
        # _try_env_step hands the loops ENV_STEP_FAILURE itself; both count it as a
        # whole-env failure in the one SampleResult type and start fresh episodes.
        env = FastSyncVectorEnv([lambda: CountingEnv() for _ in range(2)])
        calls = {"n": 0}

        def step_fn(actions):
            calls["n"] += 1
            return ENV_STEP_FAILURE if calls["n"] == 3 else env.step(actions)

        sampler = SingleAgentSampler(
            env,
            observation_space=env.single_observation_space,
            action_space=env.single_action_space,
            step_fn=step_fn,
        )
        sampler.start(*env.reset(seed=0))
        result = sampler.run(act_fn=None, explore=True, num_timesteps=10, random_actions=True)
        assert isinstance(result, SampleResult)
        assert (result.num_env_failures, result.num_sub_env_failures) == (1, 0)
        assert result.num_dropped_episodes == 2
        assert result.env_steps == result.agent_steps == 10
        assert all(e.t_started == 0 for e in result.episodes)


class TestCallbacks:
    def test_counts_like_rllib_master(self):
        counts = {"created": 0, "start": 0, "step": 0, "end": 0, "sample_end": 0, "env": 0}

        class Tracker:
            def on_environment_created(self, **kw):
                counts["env"] += 1

            def on_episode_created(self, **kw):
                counts["created"] += 1

            def on_episode_start(self, **kw):
                counts["start"] += 1

            def on_episode_step(self, **kw):
                counts["step"] += 1

            def on_episode_end(self, *, episode, prev_episode_chunks, **kw):
                counts["end"] += 1
                assert sum(len(c) for c in prev_episode_chunks) + len(episode) == 4

            def on_sample_end(self, *, samples, **kw):
                counts["sample_end"] += 1

        config = (
            AlgorithmConfig()
            .rl_module(rl_module_spec=RLModuleSpec())
            .environment(CountingEnv, env_config={"episode_len": 4})
            .env_runners(num_envs_per_env_runner=1)
            .callbacks(Tracker)
        )
        r = SingleAgentEnvRunner(config=config)
        assert counts["env"] == 1
        eps = r.sample(num_episodes=2)
        assert counts["created"] == counts["start"] == counts["end"] == len(eps) == 2
        assert counts["step"] == 8 and counts["sample_end"] == 1
        r.sample(num_timesteps=3)
        r.sample(num_timesteps=3)  # finishes the episode started in the previous call
        assert counts["end"] == 3
        assert counts["sample_end"] == 3


@settings(max_examples=25, deadline=None)
@given(
    num_envs=st.integers(1, 4),
    episode_len=st.integers(1, 6),
    calls=st.lists(st.integers(0, 15), min_size=1, max_size=5),
)
def test_chunks_reassemble_into_true_episodes(num_envs, episode_len, calls):
    """Whatever the call pattern, chunks of an id concatenate into a real episode."""
    r = _runner(env_config={"episode_len": episode_len}, num_envs=num_envs)
    chunks = []
    for n in calls:
        got = r.sample(num_timesteps=n)
        assert n <= sum(len(e) for e in got) <= max(n + num_envs - 1, 0) or n == 0
        chunks += got
    by_id = {}
    for c in chunks:
        if c.id_ in by_id:
            by_id[c.id_].concat_episode(c)
        else:
            by_id[c.id_] = c
    for ep in by_id.values():
        obs = ep.get_observations()[:, 0]
        np.testing.assert_array_equal(obs, np.arange(ep.t_started, ep.t + 1, dtype=np.float32))
        assert ep.t_started == 0
        assert ep.get_return() == len(ep)
        if ep.is_done:
            assert len(ep) == episode_len


@pytest.mark.parametrize("num_envs", [1, 3])
def test_returned_episodes_are_not_changed_by_later_calls(num_envs):
    """Episodes hold their own arrays: later sample() calls never write into them."""
    r = _runner(env_config={"episode_len": 3}, num_envs=num_envs)
    first = r.sample(num_timesteps=7)
    snapshot = [
        (e.get_observations().copy(), e.get_actions().copy(), e.get_rewards().copy()) for e in first
    ]
    for n in (0, 1, 5, 9):
        r.sample(num_timesteps=n)
    r.sample(num_episodes=2)
    for e, (obs, act, rew) in zip(first, snapshot, strict=True):
        np.testing.assert_array_equal(e.get_observations(), obs)
        np.testing.assert_array_equal(e.get_actions(), act)
        np.testing.assert_array_equal(e.get_rewards(), rew)


@settings(max_examples=25, deadline=None)
@given(
    lookback=st.integers(0, 4),
    num_envs=st.integers(1, 3),
    episode_len=st.integers(1, 7),
    calls=st.lists(st.tuples(st.integers(0, 12), st.booleans()), min_size=1, max_size=5),
)
@example(lookback=1, num_envs=1, episode_len=2, calls=[(1, False), (0, False), (1, False)])
@example(lookback=3, num_envs=2, episode_len=9, calls=[(6, False), (2, True), (6, False)])
def test_continuation_chunks_carry_their_lookback(lookback, num_envs, episode_len, calls):
    """A continuing chunk's lookback is the previous chunk's last steps (obs = t here).

    Mixed random-action calls: their chunks have no model outputs, so a following
    chunk's carried ``action_logp`` is zero-filled, as RLlib pads missing lookback.
    """
    r = _runner(
        env_config={"episode_len": episode_len},
        num_envs=num_envs,
        episode_lookback_horizon=lookback,
    )
    last_seen = {}  # id -> actions and rewards so far, and the last chunk's action_logp
    for n, random in calls:
        for ep in r.sample(num_timesteps=n, random_actions=random):
            k = ep.observations.lookback
            np.testing.assert_array_equal(
                ep.observations.data[:, 0], np.arange(ep.t_started - k, ep.t + 1)
            )
            assert k == (min(lookback, ep.t_started) if ep.t_started else 0)
            acts = ep.actions.data
            prev = last_seen.get(ep.id_)
            if k:
                assert prev is not None
                np.testing.assert_array_equal(acts[:k], prev["actions"][-k:])
                np.testing.assert_array_equal(ep.rewards.data[:k], prev["rewards"][-k:])
                if "action_logp" in ep.extra_model_outputs:
                    want = prev["logp"][-k:] if prev["logp"] is not None else np.zeros(k)
                    np.testing.assert_array_equal(
                        ep.extra_model_outputs["action_logp"].data[:k], want
                    )
            logp = ep.extra_model_outputs.get("action_logp")
            last_seen[ep.id_] = {
                "actions": acts[k:]
                if prev is None
                else np.concatenate([prev["actions"], acts[k:]]),
                "rewards": ep.rewards.data[k:]
                if prev is None
                else np.concatenate([prev["rewards"], ep.rewards.data[k:]]),
                "logp": None if logp is None else logp.data,
            }


def test_lookback_after_a_random_action_call_has_zero_model_outputs():
    """act -> random -> act: the last chunk's carried action_logp rows are zeros."""
    r = _runner(env_config={"episode_len": 100}, num_envs=2, episode_lookback_horizon=2)
    r.sample(num_timesteps=6)
    r.sample(num_timesteps=4, random_actions=True)
    for ep in r.sample(num_timesteps=6):
        assert ep.observations.lookback == 2
        logp = ep.extra_model_outputs["action_logp"].data
        np.testing.assert_array_equal(logp[:2], np.zeros(2))
        assert np.all(logp[2:] < 0)
