"""StatelessCartPole (envrunners.examples.envs.classes): CartPole with the velocities removed."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import CartPoleEnv

import envrunners.env.registry  # noqa: F401  (registers envrunners/StatelessCartPole-v1)
from envrunners.algorithms.ppo import PPOConfig
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.examples.envs.classes.stateless_cartpole import StatelessCartPole


def test_observation_is_cartpole_position_and_angle():
    env, full = StatelessCartPole(), CartPoleEnv()
    space = env.observation_space
    assert space.shape == (2,) and space.dtype == np.float32
    assert np.allclose(space.high, [4.8, 2 * 12 * 2 * np.pi / 360])
    obs, _ = env.reset(seed=5)
    full_obs, _ = full.reset(seed=5)
    assert obs.dtype == np.float32 and space.contains(obs)
    assert np.array_equal(obs, full_obs[[0, 2]])
    for action in [0, 1, 1, 0, 1, 0, 0, 1] * 3:
        obs, reward, terminated, truncated, _ = env.step(action)
        full_obs, full_reward, full_terminated, *_ = full.step(action)
        assert obs.shape == (2,) and np.array_equal(obs, full_obs[[0, 2]])
        assert (reward, terminated, truncated) == (full_reward, full_terminated, False)
        if terminated:
            break


def test_class_takes_an_env_config_and_has_no_time_limit():
    env = StatelessCartPole({"ignored": 1})
    assert env.spec is None  # RLlib's class: no TimeLimit of its own


def test_registered_gymnasium_id_has_cartpole_v1_limit():
    env = gym.make("envrunners/StatelessCartPole-v1")
    assert isinstance(env.unwrapped, StatelessCartPole)
    assert env.spec.max_episode_steps == 500
    assert env.reset(seed=0)[0].shape == (2,)


def test_runner_samples_it_by_class_and_by_id():
    for env in (StatelessCartPole, "envrunners/StatelessCartPole-v1"):
        config = PPOConfig().environment(env).env_runners(num_envs_per_env_runner=2)
        runner = SingleAgentEnvRunner(config=config)
        try:
            episodes = runner.sample(num_timesteps=40, random_actions=True)
        finally:
            runner.stop()
        # At least the asked-for steps; a vector step may add up to one per sub-env.
        assert 40 <= sum(len(e) for e in episodes) <= 42
        assert np.asarray(episodes[0].get_observations()).shape[1:] == (2,)
