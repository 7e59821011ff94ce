"""SamplerInput / SyncSampler / RolloutMetrics and the episode-to-batch edge conversion."""

from __future__ import annotations

import numpy as np
import pytest
from tests.envs.old_stack import MockEnv, MockPolicy

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.env.single_agent_episode import SingleAgentEpisode
from envrunners.evaluation.episode_to_batch import episode_to_sample_batch
from envrunners.evaluation.metrics import RolloutMetrics
from envrunners.evaluation.rollout_worker import RolloutWorker
from envrunners.evaluation.sampler import SamplerInput, SyncSampler
from envrunners.offline.input_reader import InputReader


class Callbacks:
    def __init__(self):
        self.events: list[str] = []

    def on_episode_start(self, *, worker, base_env, policies, episode, env_index):
        self.events.append("start")

    def on_episode_step(self, *, worker, base_env, policies, episode, env_index):
        self.events.append("step")

    def on_episode_end(self, *, worker, base_env, policies, episode, env_index):
        self.events.append("end")

    def on_sample_end(self, *, worker, samples):
        self.events.append("sample_end")

    def on_postprocess_trajectory(self, *, worker, episode, agent_id, policy_id, **kwargs):
        self.events.append("postprocess")

    def on_create_policy(self, *, policy_id, policy):
        self.events.append(f"create:{policy_id}")

    def on_sub_environment_created(self, *, worker, sub_environment, env_context):
        self.events.append(f"env:{env_context.vector_index}")


def worker(**env_runners) -> RolloutWorker:
    return RolloutWorker(
        env_creator=lambda _: MockEnv(10),
        config=AlgorithmConfig().env_runners(**env_runners),
        default_policy_class=MockPolicy,
    )


def test_rollout_metrics_defaults():
    m = RolloutMetrics()
    assert m == (0, 0, {}, {}, {}, {}, {}, False, {})
    assert RolloutMetrics(episode_length=3).episode_faulty is False


def test_sampler_input_is_abstract():
    assert issubclass(SamplerInput, InputReader)
    with pytest.raises(NotImplementedError):
        SamplerInput().get_data()
    with pytest.raises(NotImplementedError):
        SamplerInput().get_metrics()


def test_sync_sampler_directly():
    w = worker(rollout_fragment_length=7)
    sampler = SyncSampler(
        worker=w,
        env=w.async_env,
        rollout_fragment_length=7,
        multiple_episodes_in_batch=True,
    )
    batch = sampler.get_data()
    assert batch.count == 7 and sampler.get_extra_batches() == []
    assert sampler.next().count == 7
    assert sampler.get_metrics()[0].episode_length == 10
    assert sampler.get_metrics() == []
    whole = SyncSampler(worker=w, env=w.async_env, rollout_fragment_length=3)
    assert whole.get_data().count == 10  # one complete episode per get_data()


def test_removed_and_obsolete_arguments(caplog):
    w = worker()
    with pytest.raises(ValueError, match="horizon=...\\) was removed"):
        SyncSampler(worker=w, env=w.async_env, rollout_fragment_length=5, horizon=10)
    SyncSampler(worker=w, env=w.async_env, rollout_fragment_length=5, obs_filters={})
    assert "obs_filters" in caplog.text


def test_callbacks_fire_with_old_stack_arguments():
    config = (
        AlgorithmConfig()
        .env_runners(rollout_fragment_length=4, num_envs_per_env_runner=2)
        .callbacks(Callbacks)
    )
    w = RolloutWorker(
        env_creator=lambda _: MockEnv(10), config=config, default_policy_class=MockPolicy
    )
    w.sample()
    events = w.callbacks[0].events
    assert events[:3] == ["env:0", "create:default_policy", "env:1"]
    assert events.count("start") == 2 and events.count("end") == 0
    assert events.count("step") == 8 and events.count("postprocess") == 2
    assert events[-1] == "sample_end"
    w.sample()
    w.sample()
    assert events.count("end") == 2 and events.count("start") == 4


def test_episode_to_sample_batch_continuation_chunk():
    obs = np.arange(6, dtype=np.float32).reshape(6, 1)
    episode = SingleAgentEpisode.from_columns(
        id_="e1",
        observations=obs,
        actions=np.array([1, 0, 1, 1, 0]),
        rewards=np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32),
        infos=[{}] * 6,
        extra_model_outputs={"action_logp": np.zeros(5, np.float32)},
        t_started=7,
        len_lookback_buffer=2,
        terminated=True,
    )
    batch = episode_to_sample_batch(episode, env_id=3, agent_index=1, unroll_id=9)
    assert batch.count == 3
    np.testing.assert_array_equal(batch["obs"][:, 0], [2, 3, 4])
    np.testing.assert_array_equal(batch["new_obs"][:, 0], [3, 4, 5])
    np.testing.assert_array_equal(batch["actions"], [1, 1, 0])
    np.testing.assert_array_equal(batch["prev_actions"], [0, 1, 1])
    np.testing.assert_array_equal(batch["prev_rewards"], [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(batch["t"], [7, 8, 9])
    assert batch["terminateds"].tolist() == [False, False, True]
    assert set(batch["eps_id"]) == {"e1"} and set(batch["env_id"]) == {3}
    assert set(batch["agent_index"]) == {1} and set(batch["unroll_id"]) == {9}
    first = episode_to_sample_batch(episode, with_prev=False)
    assert "prev_actions" not in first
