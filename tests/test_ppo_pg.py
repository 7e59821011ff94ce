"""PG and PPO torch policies: postprocessing arithmetic, loss terms and real learning."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.spaces import Box, Discrete
from hypothesis import given, settings
from hypothesis import strategies as st

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.algorithms.pg import PGConfig, PGTorchPolicy
from envrunners.algorithms.ppo import PPOConfig
from envrunners.algorithms.ppo.ppo_torch_policy import PPOTorchPolicy
from envrunners.evaluation import postprocessing as pp
from envrunners.evaluation.postprocessing import (
    Postprocessing,
    compute_advantages,
    compute_gae_for_sample_batch,
    discount_cumsum,
)
from envrunners.evaluation.rollout_worker import RolloutWorker
from envrunners.policy.sample_batch import SampleBatch


def loop_discount(x: np.ndarray, gamma: float) -> np.ndarray:
    out, running = np.zeros_like(x, dtype=np.float64), 0.0
    for t in reversed(range(len(x))):
        running = x[t] + gamma * running
        out[t] = running
    return out


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(-100, 100), min_size=0, max_size=50),
    st.floats(0.0, 1.0),
)
def test_discount_cumsum_matches_loop(values, gamma):
    x = np.asarray(values, dtype=np.float64)
    np.testing.assert_allclose(discount_cumsum(x, gamma), loop_discount(x, gamma), atol=1e-6)
    np.testing.assert_allclose(
        pp._discount_cumsum_numpy(x, gamma), loop_discount(x, gamma), atol=1e-6
    )


def test_compute_advantages_variants():
    rewards = np.array([1.0, 0.0, 2.0], np.float32)
    vf = np.array([0.5, 0.25, 1.0], np.float32)
    gamma, lam, last_r = 0.9, 0.8, 3.0
    gae = compute_advantages(
        SampleBatch(rewards=rewards, vf_preds=vf), last_r, gamma, lam, use_gae=True
    )
    deltas = rewards + gamma * np.append(vf[1:], last_r) - vf
    expected = loop_discount(deltas, gamma * lam)
    np.testing.assert_allclose(gae[Postprocessing.ADVANTAGES], expected, rtol=1e-5)
    np.testing.assert_allclose(gae[Postprocessing.VALUE_TARGETS], expected + vf, rtol=1e-5)
    returns = loop_discount(np.append(rewards, last_r), gamma)[:-1]
    critic = compute_advantages(
        SampleBatch(rewards=rewards, vf_preds=vf), last_r, gamma, 1.0, False
    )
    np.testing.assert_allclose(critic["advantages"], returns - vf, rtol=1e-5)
    np.testing.assert_allclose(critic["value_targets"], returns, rtol=1e-5)
    plain = compute_advantages(
        SampleBatch(rewards=rewards), 0.0, gamma, use_gae=False, use_critic=False
    )
    np.testing.assert_allclose(plain["advantages"], loop_discount(rewards, gamma), rtol=1e-5)
    assert plain["value_targets"].tolist() == [0.0, 0.0, 0.0]
    assert plain["advantages"].dtype == np.float32
    with pytest.raises(ValueError, match="use_critic/use_gae need a 'vf_preds' column"):
        compute_advantages(SampleBatch(rewards=rewards), 0.0, use_gae=True)
    with pytest.raises(ValueError, match="use_gae=True needs use_critic=True"):
        compute_advantages(SampleBatch(rewards=rewards), 0.0, use_gae=True, use_critic=False)


def test_gae_bootstraps_only_unterminated_trajectories():
    class Valued:
        config = {"gamma": 0.5, "lambda": 1.0}

        def _value(self, obs):
            return 10.0

    base = {
        "rewards": np.zeros(2, np.float32),
        "vf_preds": np.zeros(2, np.float32),
        "new_obs": np.zeros((2, 1), np.float32),
    }
    cut = compute_gae_for_sample_batch(Valued(), SampleBatch(**base, terminateds=[False, False]))
    assert cut["advantages"][-1] == pytest.approx(5.0)
    end = compute_gae_for_sample_batch(Valued(), SampleBatch(**base, terminateds=[False, True]))
    assert end["advantages"][-1] == 0.0


def test_ppo_kl_coefficient_adapts():
    policy = PPOTorchPolicy(Box(-1, 1, (2,), np.float32), Discrete(2), {"kl_target": 0.01})
    start = policy.kl_coeff
    assert policy.update_kl(0.1) == pytest.approx(start * 1.5)
    assert policy.update_kl(0.001) == pytest.approx(start * 0.75)
    assert policy.update_kl(0.01) == pytest.approx(start * 0.75)


def test_ppo_loss_terms_on_a_fixed_batch():
    torch.manual_seed(0)
    policy = PPOTorchPolicy(
        Box(-1, 1, (3,), np.float32),
        Discrete(2),
        {"model": {"fcnet_hiddens": [16]}, "lr": 0.01, "entropy_coeff": 0.01, "num_epochs": 5,
         "minibatch_size": 16},
    )  # fmt: skip
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 3)).astype(np.float32)
    actions, _, extras = policy.compute_actions(obs)
    batch = SampleBatch(obs=obs, new_obs=obs, actions=actions, **extras)
    batch["rewards"] = (actions == 1).astype(np.float32)  # action 1 is good
    batch["terminateds"] = np.ones(64, bool)
    batch = compute_gae_for_sample_batch(policy, batch)
    before = policy.compute_actions(obs, explore=False)[2]["action_dist_inputs"]
    info = policy.learn_on_batch(batch)["learner_stats"]
    assert {"total_loss", "policy_loss", "vf_loss", "entropy", "kl", "cur_kl_coeff"} <= set(info)
    assert policy.num_grad_updates == 5 * 4
    after = policy.compute_actions(obs, explore=False)[2]["action_dist_inputs"]
    prob_good = lambda logits: np.exp(logits[:, 1]) / np.exp(logits).sum(1)  # noqa: E731
    assert prob_good(after).mean() > prob_good(before).mean()


def mean_return(worker: RolloutWorker, rets: list[float]) -> float:
    rets.extend(m.episode_reward for m in worker.get_metrics())
    return float(np.mean(rets[-20:])) if rets else 0.0


def test_ppo_learns_cartpole():
    """learn_on_batch really improves the policy: mean return >= 150 within a small budget."""
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(rollout_fragment_length=512, num_envs_per_env_runner=4)
        .training(
            lr=0.001,
            num_epochs=8,
            minibatch_size=128,
            lambda_=0.95,
            gamma=0.99,
            vf_loss_coeff=0.5,
            clip_param=0.2,
        )
        .rl_module(model_config={"fcnet_hiddens": [64, 64]})
        .debugging(seed=1)
    )
    worker = RolloutWorker(
        env_creator=lambda _: gym.make("CartPole-v1"),
        config=config,
        default_policy_class=PPOTorchPolicy,
    )
    start, rets, best = time.time(), [], 0.0
    for _ in range(25):
        worker.learn_on_batch(worker.sample())
        best = mean_return(worker, rets)
        if len(rets) >= 20 and best >= 150:
            break
    assert best >= 150, f"mean return {best:.1f} after {time.time() - start:.0f}s"


def test_pg_learn_on_batch_improves_returns():
    config = (
        PGConfig()
        .env_runners(rollout_fragment_length=1000, num_envs_per_env_runner=4)
        .training(lr=0.01, gamma=0.99)
        .rl_module(model_config={"fcnet_hiddens": [32]})
        .debugging(seed=3)
    )
    worker = RolloutWorker(
        env_creator=lambda _: gym.make("CartPole-v1"),
        config=config,
        default_policy_class=PGTorchPolicy,
    )
    worker.sample()
    first = np.mean([m.episode_reward for m in worker.get_metrics()])
    rets: list[float] = []
    for _ in range(12):
        worker.learn_on_batch(worker.sample())
        mean_return(worker, rets)
    assert np.mean(rets[-20:]) > 1.5 * first
    assert isinstance(PGConfig().lr, float) and PGConfig().lr == 0.0004
    assert AlgorithmConfig.overrides(gamma=0.5) == {"gamma": 0.5}
