"""Envs registered by name in the driver are known to runners in other processes.

``register_env(name, creator)`` fills the calling process's registry; a config naming
the env travels to Ray actors (remote runners, their shared-memory workers), which
must build the same env. RLlib keeps its registry in the Ray cluster; here the
config carries the creator (``registry._EnvRegistration``). Real Ray, real runners.
"""

from __future__ import annotations

import logging
import pickle
import sys
import threading
import types

import gymnasium as gym
import pytest
from ray import cloudpickle

from envrunners.algorithms.ppo import PPOConfig
from envrunners.env import registry
from envrunners.env.env_runner_group import EnvRunnerGroup
from envrunners.env.registry import register_env, unregister_env
from envrunners.errors import EnvCreatorError

# Ray's workers cannot import this file: its functions travel by value, as a script's.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

NAME = "envrunners-test-registered-remote-v0"
MAX_STEPS = 7  # the creator's own episode limit: proves the creator built the env


def _short_cartpole(env_config):
    return gym.make("CartPole-v1", max_episode_steps=env_config.get("max_steps", MAX_STEPS))


@pytest.fixture
def registered():
    # A lambda of this module, like a creator registered in a user's script.
    register_env(NAME, lambda cfg: _short_cartpole(cfg))  # noqa: PLW0108
    yield NAME
    unregister_env(NAME)


def _episode_lengths(mode: str) -> list[int]:
    config = (
        PPOConfig()
        .environment(NAME)
        .env_runners(
            num_env_runners=1,
            num_envs_per_env_runner=2,
            gym_env_vectorize_mode=mode,
            num_cpus_per_env_runner=0.5,
        )
        .rl_module(model_config={"fcnet_hiddens": [8]})
    )
    group = EnvRunnerGroup(config=config, local_env_runner=False)
    try:
        results = group.foreach_env_runner(
            lambda runner: [len(e) for e in runner.sample(num_episodes=4)],
            local_env_runner=False,
        )
    finally:
        group.stop()
    return [n for lengths in results for n in lengths]


@pytest.mark.parametrize("mode", ["sync", "shared_memory"])
def test_a_name_registered_here_builds_in_remote_runners(ray_session, registered, mode):
    """Before: every remote runner failed with UnknownEnvError and the group had none."""
    lengths = _episode_lengths(mode)
    assert len(lengths) >= 4
    assert all(1 <= n <= MAX_STEPS for n in lengths), lengths


def test_tune_register_env_names_build_in_remote_runners(ray_session):
    tune_registry = pytest.importorskip("ray.tune.registry")
    tune_registry.register_env(NAME, _short_cartpole)
    try:
        lengths = _episode_lengths("sync")
    finally:
        tune_registry._global_registry.unregister(tune_registry.ENV_CREATOR, NAME)
    assert all(1 <= n <= MAX_STEPS for n in lengths), lengths


def test_a_config_unpickled_elsewhere_registers_the_creator(registered):
    """Simulated other process: this process's token differs from the sender's."""
    config = PPOConfig().environment(NAME)
    payload = cloudpickle.dumps(config)
    unregister_env(NAME)
    restored = _restored_elsewhere(payload)
    assert restored.env == NAME
    assert not hasattr(restored, "_env_registrations")
    env = registry.resolve_env_creator(NAME, {})()
    assert env.spec.max_episode_steps == MAX_STEPS


def _restored_elsewhere(payload: bytes):
    token = registry._PROCESS_TOKEN
    registry._PROCESS_TOKEN = "another process"
    try:
        return cloudpickle.loads(payload)
    finally:
        registry._PROCESS_TOKEN = token


def test_a_creator_that_cannot_load_there_fails_naming_the_env_and_why():
    module = types.ModuleType("envrunners_test_gone_module")
    exec("def make(cfg):\n    raise AssertionError('never built')\n", module.__dict__)
    sys.modules[module.__name__] = module
    register_env(NAME, module.make)
    try:
        payload = cloudpickle.dumps(PPOConfig().environment(NAME))  # (by reference)
        unregister_env(NAME)
        del sys.modules[module.__name__]
        _restored_elsewhere(payload)
        build = registry.resolve_env_creator(NAME, {})
        with pytest.raises(EnvCreatorError, match="envrunners_test_gone_module") as info:
            build()
        assert NAME in str(info.value) and "register_env" in str(info.value)
    finally:
        sys.modules.pop(module.__name__, None)
        unregister_env(NAME)


def test_copies_in_this_process_leave_its_registry_alone(registered):
    config = PPOConfig().environment(NAME)
    unregister_env(NAME)
    copied = config.copy()
    assert copied.env == NAME
    assert NAME not in registry._REGISTRY
    # Plain pickle works too (the creator, a lambda, travels as cloudpickle bytes).
    assert pickle.loads(pickle.dumps(PPOConfig().environment(NAME))).env == NAME


def test_an_unpicklable_creator_is_named_and_the_config_still_pickles(caplog):
    lock = threading.Lock()
    register_env(NAME, lambda cfg: (lock, _short_cartpole(cfg))[1])
    registry._WARNED_UNPICKLABLE.discard(NAME)
    try:
        with caplog.at_level(logging.WARNING, logger="envrunners"):
            payload = cloudpickle.dumps(PPOConfig().environment(NAME))
            cloudpickle.dumps(PPOConfig().environment(NAME))  # (warned once per name)
    finally:
        unregister_env(NAME)
    assert cloudpickle.loads(payload).env == NAME
    assert any(
        NAME in r.getMessage() and "cannot be pickled" in r.getMessage() for r in caplog.records
    )
