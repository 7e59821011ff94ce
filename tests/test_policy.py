"""Policy (base) and TorchPolicy: acting, gradients, weights, state and checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium.spaces import Box, Discrete

from envrunners.algorithms.pg import PGTorchPolicy
from envrunners.algorithms.ppo.ppo_torch_policy import PPOTorchPolicy
from envrunners.errors import ConfigError
from envrunners.policy.policy import Policy, PolicySpec
from envrunners.policy.sample_batch import SampleBatch
from envrunners.policy.torch_policy import TorchPolicy

OBS = Box(-1.0, 1.0, (4,), np.float32)
ACT = Discrete(3)
CONFIG = {"model": {"fcnet_hiddens": [16]}, "lr": 0.01}


def batch_for(policy, n: int = 32, seed: int = 0) -> SampleBatch:
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-1, 1, (n, 4)).astype(np.float32)
    actions, _, extras = policy.compute_actions(obs)
    data = {
        "obs": obs,
        "new_obs": obs,
        "actions": actions,
        "rewards": rng.normal(size=n).astype(np.float32),
        "terminateds": np.zeros(n, bool),
        "truncateds": np.zeros(n, bool),
        **extras,
    }
    data["terminateds"][-1] = True
    return policy.postprocess_trajectory(SampleBatch(data))


def test_base_policy_interface():
    policy = Policy(OBS, ACT, {"gamma": 0.5})
    assert policy.config["gamma"] == 0.5
    assert policy.get_initial_state() == [] and not policy.is_recurrent()
    assert policy.num_state_tensors() == 0
    with pytest.raises(NotImplementedError, match="Policy must implement compute_actions"):
        policy.compute_actions(np.zeros((1, 4)))
    with pytest.raises(NotImplementedError, match="must implement get_weights"):
        policy.get_state()
    batch = SampleBatch({"obs": np.zeros((2, 4))})
    assert policy.postprocess_trajectory(batch) is batch
    policy.on_global_var_update({"timestep": 42, "num_grad_updates": 3})
    assert (policy.global_timestep, policy.num_grad_updates) == (42, 3)
    assert policy.apply(lambda p, x: x + 1, 1) == 2
    assert "prev_actions" in policy.view_requirements
    assert PolicySpec is not None and policy.get_session() is None


def test_torch_policy_acting():
    torch.manual_seed(0)
    policy = PPOTorchPolicy(OBS, ACT, CONFIG)
    obs = np.zeros((5, 4), np.float32)
    actions, states, extras = policy.compute_actions(obs)
    assert actions.shape == (5,) and states == []
    assert set(extras) >= {"action_logp", "action_prob", "action_dist_inputs", "vf_preds"}
    np.testing.assert_allclose(extras["action_prob"], np.exp(extras["action_logp"]), rtol=1e-6)
    assert policy.global_timestep == 5
    action, state, info = policy.compute_single_action(np.zeros(4, np.float32), explore=False)
    assert ACT.contains(int(action)) and state == [] and info["action_dist_inputs"].shape == (3,)
    action2, _, _ = policy.compute_single_action(input_dict={"obs": np.zeros(4, np.float32)})
    assert ACT.contains(int(action2))
    greedy, _, _ = policy.compute_actions(obs, explore=False)
    assert np.all(greedy == greedy[0])
    logp = policy.compute_log_likelihoods(actions, obs)
    np.testing.assert_allclose(logp.numpy(), extras["action_logp"], atol=1e-5)
    out = policy.compute_actions_from_input_dict({"obs": obs}, explore=False)
    np.testing.assert_array_equal(out[0], greedy)
    with pytest.raises(ValueError, match="needs `obs`"):
        policy.compute_single_action()


def test_batched_value_predictions_match_acting():
    torch.manual_seed(0)
    policy = PPOTorchPolicy(OBS, ACT, CONFIG)
    obs = np.random.default_rng(1).uniform(-1, 1, (6, 4)).astype(np.float32)
    _, _, extras = policy.compute_actions(obs)
    actions, fast_extras = policy.compute_actions_for_sampling(obs, True)
    assert "vf_preds" not in fast_extras
    b1 = SampleBatch({"obs": obs[:4], "new_obs": obs[1:5], "terminateds": np.zeros(4, bool)})
    b2 = SampleBatch({"obs": obs[4:], "new_obs": obs[5:6].repeat(2, 0), "terminateds": [0, 1]})
    policy.add_value_predictions([b1, b2])
    np.testing.assert_allclose(b1["vf_preds"], extras["vf_preds"][:4], atol=1e-5)
    np.testing.assert_allclose(b2["vf_preds"], extras["vf_preds"][4:], atol=1e-5)
    assert b1["values_bootstrapped"][-1] == pytest.approx(extras["vf_preds"][4], abs=1e-5)
    assert b2["values_bootstrapped"][-1] == 0.0  # terminated
    assert policy._value(obs[4]) == pytest.approx(extras["vf_preds"][4], abs=1e-5)


def test_gradients_match_learn_on_batch():
    config = {**CONFIG, "num_epochs": 1, "minibatch_size": None, "shuffle_batch_per_epoch": False}
    torch.manual_seed(0)
    a = PGTorchPolicy(OBS, ACT, config)
    b = PGTorchPolicy(OBS, ACT, config)
    b.set_weights(a.get_weights())
    batch = batch_for(a)
    grads, info = a.compute_gradients(batch)
    assert info["batch_count"] == 32 and "policy_loss" in info["learner_stats"]
    assert len(grads) == len(list(a.model.parameters()))
    a.apply_gradients(grads)
    stats = b.learn_on_batch(batch)
    assert stats["num_agent_steps_trained"] == 32 and b.num_grad_updates == 1
    for k, v in a.get_weights().items():
        np.testing.assert_allclose(v, b.get_weights()[k], atol=1e-6)
    with pytest.raises(ValueError, match="gradients for"):
        a.apply_gradients(grads[:1])


def test_weights_state_and_from_state():
    torch.manual_seed(0)
    policy = PPOTorchPolicy(OBS, ACT, CONFIG)
    policy.learn_on_batch(batch_for(policy))
    policy.kl_coeff = 0.123
    state = policy.get_state()
    assert state["policy_spec"]["policy_class"].endswith("PPOTorchPolicy")
    assert state["num_grad_updates"] == policy.num_grad_updates > 0
    clone = Policy.from_state(state)
    assert isinstance(clone, PPOTorchPolicy) and clone.kl_coeff == 0.123
    probe = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(
        clone.compute_actions(probe, explore=False)[2]["action_dist_inputs"],
        policy.compute_actions(probe, explore=False)[2]["action_dist_inputs"],
    )
    opt_a = policy._optimizer.state_dict()["state"]
    opt_b = clone._optimizer.state_dict()["state"]
    np.testing.assert_allclose(opt_a[0]["exp_avg"].numpy(), opt_b[0]["exp_avg"].numpy())
    with pytest.raises(ConfigError, match="no 'policy_spec'"):
        Policy.from_state({"weights": {}})


def test_export_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    policy = PGTorchPolicy(OBS, ACT, CONFIG)
    policy.export_checkpoint(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "state.json").is_file()
    restored = Policy.from_checkpoint(tmp_path / "ckpt")
    assert isinstance(restored, PGTorchPolicy)
    assert restored.config["model"]["fcnet_hiddens"] == [16]
    for k, v in policy.get_weights().items():
        np.testing.assert_array_equal(restored.get_weights()[k], v)
    policy.export_checkpoint(tmp_path / "algo" / "policies" / "p1")
    many = Policy.from_checkpoint(tmp_path / "algo", policy_ids=["p1"])
    assert set(many) == {"p1"}
    policy.export_model(tmp_path / "model")
    assert (tmp_path / "model" / "module_state.npz").is_file()


def test_lr_schedule_and_global_vars():
    policy = PGTorchPolicy(OBS, ACT, {**CONFIG, "lr": [[0, 0.1], [100, 0.0]]})
    assert policy.cur_lr == pytest.approx(0.1)
    policy.on_global_var_update({"timestep": 50})
    assert policy.cur_lr == pytest.approx(0.05)
    assert policy._optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


def test_custom_module_spec_and_bad_spec():
    from envrunners.core.rl_module.default_torch_rl_module import DefaultTorchRLModule
    from envrunners.core.rl_module.rl_module import RLModuleSpec

    spec = RLModuleSpec(module_class=DefaultTorchRLModule, model_config={"fcnet_hiddens": [5]})
    policy = TorchPolicy(OBS, ACT, {"rl_module_spec": spec})
    assert policy.model.encoder.layers[0].out_features == 5
    with pytest.raises(ConfigError, match="must be an RLModuleSpec"):
        TorchPolicy(OBS, ACT, {"rl_module_spec": "nope"})
    with pytest.raises(NotImplementedError, match="has no loss"):
        policy.learn_on_batch(SampleBatch({"obs": np.zeros((2, 4), np.float32)}))
