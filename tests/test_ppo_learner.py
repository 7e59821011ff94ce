"""``PPOLearner`` / ``PGLearner``: GAE against a plain loop, bootstrapping, Adam, state, sync."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.envs.simple import DictSpacesEnv

from envrunners.algorithms.ppo import PPOConfig
from envrunners.algorithms.ppo.ppo_learner import Adam, PGLearner, PPOLearner, compute_gae
from envrunners.env.env_runner_group import EnvRunnerGroup


def gae_loop(rewards, values, last_value, gamma, lam):
    adv, running = np.zeros(len(rewards)), 0.0
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t + 1 < len(rewards) else last_value
        running = rewards[t] + gamma * next_value - values[t] + gamma * lam * running
        adv[t] = running
    return adv


def test_compute_gae_matches_a_loop_per_row():
    rng = np.random.default_rng(0)
    lengths = np.array([5, 1, 3, 0])
    rewards = rng.normal(size=(4, 5)).astype(np.float32)
    values = rng.normal(size=(4, 5)).astype(np.float32)
    boot = rng.normal(size=4).astype(np.float32)
    adv, targets = compute_gae(rewards, values, boot, lengths, gamma=0.9, lambda_=0.8)
    for i, n in enumerate(lengths):
        want = gae_loop(rewards[i, :n], values[i, :n], boot[i], 0.9, 0.8)
        np.testing.assert_allclose(adv[i, :n], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(targets[i, :n], want + values[i, :n], rtol=1e-5, atol=1e-6)
        assert not adv[i, n:].any() and not targets[i, n:].any()  # padding stays 0


def _config(**training):
    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=2, rollout_fragment_length=32)
        .training(
            train_batch_size=64,
            minibatch_size=32,
            num_epochs=2,
            lr=1e-3,
            use_kl_loss=False,
            **training,
        )  # fmt: skip
        .rl_module(model_config={"fcnet_hiddens": [16]})
        .debugging(seed=0)
    )


@pytest.fixture(scope="module")
def setup():
    config = _config()
    group = EnvRunnerGroup(config=config)
    learner = PPOLearner.from_group(config, group)
    group.sync_weights(from_worker_or_learner_group=learner, inference_only=True)
    yield config, group, learner
    group.stop()


def test_terminated_chunks_are_not_bootstrapped(setup):
    _, group, learner = setup
    episodes = group.local_env_runner.sample(num_timesteps=200)
    batch = learner.build_batch(episodes)
    assert len(batch["advantages"]) == sum(len(e) for e in episodes)
    obs = np.concatenate([np.asarray(e.get_observations()) for e in episodes if len(e)])
    with torch.no_grad():
        values = learner.module.compute_values({"obs": torch.from_numpy(obs)}).numpy()
    row = start = 0
    for e in (e for e in episodes if len(e)):
        n = len(e)
        last = 0.0 if e.is_terminated else values[start + n]
        want = gae_loop(np.asarray(e.get_rewards()), values[start : start + n], last, 0.99, 1.0)
        np.testing.assert_allclose(batch["advantages"][row : row + n], want, rtol=1e-4, atol=1e-4)
        row, start = row + n, start + n + 1


def test_update_changes_weights_and_syncs_them_to_the_runner(setup):
    _, group, learner = setup
    runner = group.local_env_runner
    before = runner.module.get_state()
    seq = learner.weights_seq_no
    stats = learner.update(runner.sample(num_timesteps=64))
    assert learner.weights_seq_no == seq + 1
    assert {"policy_loss", "vf_loss", "entropy", "mean_kl", "explained_variance"} <= set(stats)
    group.sync_weights(from_worker_or_learner_group=learner, inference_only=True)
    after = runner.module.get_state()
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    want = learner.module.get_state(inference_only=True)
    assert all(np.array_equal(after[k], want[k]) for k in after)


def test_state_round_trip_includes_the_optimizer(setup):
    config, group, learner = setup
    learner.update(group.local_env_runner.sample(num_timesteps=64))
    state = learner.get_state()
    other = PPOLearner.from_group(config, group)
    other.set_state(state)
    again = other.get_state()
    assert again["weights_seq_no"] == state["weights_seq_no"]
    assert again["num_env_steps_trained"] == state["num_env_steps_trained"]
    assert again["optimizer"]["step"] == state["optimizer"]["step"] > 0
    for a, b in zip(again["optimizer"]["exp_avg"], state["optimizer"]["exp_avg"]):
        np.testing.assert_array_equal(a, b)
    for k, v in state["rl_module"].items():
        np.testing.assert_array_equal(again["rl_module"][k], v)
    assert set(learner.get_state(components="rl_module")) == {"rl_module", "weights_seq_no"}


def test_adam_matches_torch_adam():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    ours, theirs = (
        Adam(a.parameters(), lr=0.01),
        torch.optim.Adam(b.parameters(), lr=0.01, eps=1e-5),
    )
    for _ in range(5):
        x = torch.randn(8, 4)
        for model, opt in ((a, ours), (b, theirs)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_pg_learner_uses_discounted_returns(setup):
    config, group, _ = setup
    pg = PGLearner.from_group(config, group)
    episodes = [e for e in group.local_env_runner.sample(num_timesteps=64) if len(e)]
    batch = pg.build_batch(episodes)
    first = episodes[0]
    rewards = np.asarray(first.get_rewards())
    want = gae_loop(rewards, np.zeros(len(rewards)), 0.0, config.gamma, 1.0)
    np.testing.assert_allclose(batch["advantages"][: len(first)], want, rtol=1e-5)
    assert "policy_loss" in pg.update(episodes)


def test_build_batch_rejects_empty_input(setup):
    _, _, learner = setup
    with pytest.raises(ValueError, match="no env steps"):
        learner.build_batch([])


@pytest.mark.parametrize("learner_cls", [PPOLearner, PGLearner])
def test_dict_observations_and_actions_train(learner_cls):
    config = _config().environment(DictSpacesEnv)
    group = EnvRunnerGroup(config=config)
    try:
        learner = learner_cls.from_group(config, group)
        episodes = [e for e in group.local_env_runner.sample(num_timesteps=100) if len(e)]
        batch = learner.build_batch(episodes)
        steps = sum(len(e) for e in episodes)
        for key in ("pos", "t"):  # each step's own observation, one array per leaf
            want = np.concatenate([e.get_observations()[key][: len(e)] for e in episodes])
            np.testing.assert_array_equal(batch["obs"][key], want)
        for key in ("move", "push"):
            want = np.concatenate([e.get_actions()[key] for e in episodes])
            np.testing.assert_array_equal(batch["actions"][key], want)
        assert len(batch["advantages"]) == steps
        before = learner.module.get_state()
        stats = learner.update(episodes)
        assert np.isfinite(stats["policy_loss"])
        after = learner.module.get_state()
        assert any(not np.array_equal(before[k], after[k]) for k in before)
    finally:
        group.stop()


def test_explained_variance_is_rllibs_formula_and_never_nan():
    from envrunners.algorithms.ppo.ppo_learner import explained_variance

    targets = np.array([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(targets, targets) == pytest.approx(1.0, abs=1e-5)
    assert explained_variance(targets, np.full(4, 2.5)) == pytest.approx(0.0, abs=1e-5)
    assert explained_variance(targets, -10 * targets) == -1.0  # clamped, as in RLlib
    constant = np.full(5, 0.7)
    assert explained_variance(constant, constant) == 1.0  # RLlib: 1, not NaN
    assert explained_variance(constant, constant + np.arange(5)) == -1.0
