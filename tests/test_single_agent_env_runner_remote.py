"""SingleAgentEnvRunner as Ray actors (spec §18.1 test_distributed_env_runner)."""

from __future__ import annotations

import pytest
from tests.envs.simple import CountingEnv

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner


@pytest.mark.parametrize(
    ("env", "remote_worker_envs"), [("CartPole-v1", False), (CountingEnv, True)]
)
def test_remote_runners_sample_fragments(ray_session, env, remote_worker_envs):
    ray = ray_session
    config = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(env)
        .env_runners(
            num_env_runners=2,
            num_envs_per_env_runner=5,
            rollout_fragment_length=10,
            remote_worker_envs=remote_worker_envs,
            num_cpus_per_env_runner=0,
        )
    )
    actor_cls = ray.remote(num_cpus=0)(SingleAgentEnvRunner)
    actors = [actor_cls.remote(config=config, worker_index=i + 1) for i in range(2)]
    try:
        results = ray.get([a.sample.remote(random_actions=True) for a in actors], timeout=120)
        for episodes in results:
            assert 50 <= sum(len(e) for e in episodes) <= 54
        pings = ray.get([a.apply.remote(lambda w: w.worker_index) for a in actors], timeout=60)
        assert pings == [1, 2]
        ref, state, metrics = ray.get(actors[0].sample_get_state_and_metrics.remote(), timeout=60)
        assert "rl_module" not in state and "num_env_steps_sampled_lifetime" in state
        assert sum(len(e) for e in ray.get(ref)) >= 50
        assert metrics["num_env_steps_sampled"] >= 50
    finally:
        for a in actors:
            ray.kill(a)
