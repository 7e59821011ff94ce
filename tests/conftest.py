"""Shared fixtures: one real local Ray session for the integration tests, and episodes
with Dict observations and actions."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray (2 CPUs, no dashboard) started once and shut down at the end.

    Started the way envrunners starts one (``init_local_ray``: loopback only, token
    auth), so the suite runs against what users get; test_ray_security checks it.
    """
    import ray

    from envrunners.env._ray_setup import init_local_ray

    started = False
    if not ray.is_initialized():
        init_local_ray(
            2,
            ignore_reinit_error=True,
            log_to_driver=False,
            configure_logging=False,
        )
        started = True
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(autouse=True)
def _fresh_failure_log():
    """Each test sees the first env failure of each kind logged in full (a per-process log)."""
    from envrunners.utils.failure_log import FAILURE_LOG

    FAILURE_LOG.reset()
    yield


@pytest.fixture
def dict_space_episodes():
    """Three finished episodes of ``DictSpacesEnv`` (Dict observations and actions),
    sampled by a local runner with the default module."""
    from tests.envs.simple import DictSpacesEnv

    from envrunners.algorithms.algorithm_config import AlgorithmConfig
    from envrunners.core.rl_module.rl_module import RLModuleSpec
    from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner

    config = (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment(DictSpacesEnv)
        .env_runners(num_envs_per_env_runner=2)
    )
    runner = SingleAgentEnvRunner(config=config)
    try:
        return runner.sample(num_episodes=3)
    finally:
        runner.stop()
