"""The default module's categorical acting path: same draws, actions and log-probs as torch."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from envrunners.core.columns import Columns
from envrunners.core.rl_module.default_torch_rl_module import (
    DefaultTorchRLModule,
    _sample_categorical,
    _sample_categorical_numpy,
)

OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)


def _module(num_actions: int, **model_config) -> DefaultTorchRLModule:
    torch.manual_seed(0)
    return DefaultTorchRLModule(
        observation_space=OBS,
        action_space=gym.spaces.Discrete(num_actions),
        model_config={"fcnet_hiddens": [32, 32], **model_config},
    )


def _torch_reference(module, obs, seed):
    """Actions and log-probs from the module's torch layers and torch sampling ops."""
    with torch.inference_mode():
        logits = module.pi(module.encoder(torch.from_numpy(obs)))
        actions, logp = _sample_categorical(logits, True, torch.Generator().manual_seed(seed))
    return logits.numpy(), actions.numpy(), logp.numpy()


@pytest.mark.parametrize("width", [2, 3, 7, 18])
@pytest.mark.parametrize("rows", [1, 5, 130])
def test_transposed_log_normaliser_is_bitwise_the_row_one(width, rows):
    """``logits_t`` only changes the reduction's memory order, not its result."""
    rng = np.random.default_rng(width * rows)
    logits = (rng.normal(size=(rows, width)) * rng.choice([0.1, 5.0, 60.0])).astype(np.float32)
    logits_t = np.ascontiguousarray(logits.T)
    plain = _sample_categorical_numpy(logits, torch.Generator().manual_seed(1))
    fast = _sample_categorical_numpy(logits, torch.Generator().manual_seed(1), logits_t)
    np.testing.assert_array_equal(fast[0], plain[0])
    np.testing.assert_array_equal(fast[1], plain[1])
    assert fast[1].dtype == np.float32 and fast[0].dtype == plain[0].dtype


@pytest.mark.parametrize("num_actions", [2, 6])
@pytest.mark.parametrize("rows", [1, 16, 128])
def test_numpy_acting_equals_torch_layers_and_sampling(num_actions, rows):
    """Same weights, same generator: the same actions; logits and log-probs within 1e-5."""
    module = _module(num_actions)
    obs = np.random.default_rng(rows).uniform(-1, 1, (rows, 4)).astype(np.float32)
    for seed in range(3):
        out = module.compute_actions_numpy(
            obs, explore=True, generator=torch.Generator().manual_seed(seed)
        )
        logits, actions, logp = _torch_reference(module, obs, seed)
        np.testing.assert_array_equal(out[Columns.ACTIONS], actions)
        np.testing.assert_allclose(out[Columns.ACTION_DIST_INPUTS], logits, atol=1e-5)
        np.testing.assert_allclose(out[Columns.ACTION_LOGP], logp, atol=1e-5)
        assert out[Columns.ACTIONS].dtype == np.int64
        assert out[Columns.ACTION_LOGP].dtype == np.float32
        assert out[Columns.ACTION_DIST_INPUTS].flags.c_contiguous


def test_values_come_from_current_weights_after_acting_without_them():
    """Acting without values checks only the policy's views; asking for values later
    still sees a value branch whose storage was replaced in between."""
    module = _module(3, vf_share_layers=False)
    obs = np.random.default_rng(0).uniform(-1, 1, (5, 4)).astype(np.float32)
    module.compute_actions_numpy(obs, explore=False, with_values=True)
    with torch.no_grad():
        for p in module.vf.parameters():
            p.data = p.detach() + 1.0  # a new storage
        for p in module.vf_encoder.parameters():
            p.data = p.detach() * 2.0
    module.compute_actions_numpy(obs, explore=False)  # policy views unchanged: no rebuild
    got = module.compute_actions_numpy(obs, explore=False, with_values=True)
    with torch.inference_mode():
        want = module.compute_values({Columns.OBS: torch.from_numpy(obs)}).numpy()
    np.testing.assert_allclose(got[Columns.VF_PREDS], want, atol=1e-5)
    with torch.no_grad():
        for p in module.pi.parameters():
            p.data = p.detach() - 0.5
    got = module.compute_actions_numpy(obs, explore=False)
    with torch.inference_mode():
        logits = module.pi(module.encoder(torch.from_numpy(obs))).numpy()
    np.testing.assert_allclose(got[Columns.ACTION_DIST_INPUTS], logits, atol=1e-5)


def test_sampled_actions_follow_the_softmax():
    """Fixed seed, generous bound: frequencies of 60k draws at 2 actions match the softmax."""
    module = _module(2)
    with torch.no_grad():
        module.pi.layers[-1].weight.zero_()
        module.pi.layers[-1].bias.copy_(torch.tensor([0.3, -0.4]))
    torch.manual_seed(7)
    out = module.compute_actions_numpy(np.zeros((60_000, 4), np.float32), explore=True)
    p1 = float(torch.softmax(torch.tensor([0.3, -0.4]), -1)[1])
    freq = out[Columns.ACTIONS].mean()
    assert abs(freq - p1) < 5 * np.sqrt(p1 * (1 - p1) / 60_000)
    np.testing.assert_allclose(
        out[Columns.ACTION_LOGP],
        np.log(np.where(out[Columns.ACTIONS] == 1, p1, 1 - p1)),
        atol=1e-5,
    )
