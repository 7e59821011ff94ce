"""The stateful default module's numpy acting step equals its torch forward."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from envrunners.core.columns import Columns
from envrunners.core.rl_module._acting import act, initial_state_batch
from envrunners.core.rl_module._numpy_forward import NumpyRecurrentForward
from envrunners.core.rl_module.default_torch_rl_module import DefaultTorchRLModule

OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ROWS = 6


def _module(act_space=None, inference_only=False, **model_config) -> DefaultTorchRLModule:
    torch.manual_seed(0)
    config = {"fcnet_hiddens": [16, 8], "use_lstm": True, "lstm_cell_size": 12, **model_config}
    return DefaultTorchRLModule(
        observation_space=OBS,
        action_space=act_space or gym.spaces.Discrete(3),
        inference_only=inference_only,
        model_config=config,
    )


def _torch_act(module, *args, **kwargs):
    """``act`` through the module's torch forward (the numpy step switched off)."""
    saved, module._fast_recurrent = module._fast_recurrent, False
    try:
        return act(module, *args, **kwargs)
    finally:
        module._fast_recurrent = saved


def _seeded(seed):
    return torch.Generator().manual_seed(seed)


def _flat(state, prefix=""):
    if isinstance(state, dict):
        return {k2: v2 for k, v in state.items() for k2, v2 in _flat(v, prefix + k + "/").items()}
    return {prefix: np.asarray(state)}


def _assert_same(fast, ref):
    actions, extras, state = fast
    ref_actions, ref_extras, ref_state = ref
    np.testing.assert_array_equal(actions, ref_actions)
    assert actions.dtype == ref_actions.dtype
    assert set(extras) == set(ref_extras)
    for key, value in ref_extras.items():
        assert extras[key].shape == value.shape and extras[key].dtype == value.dtype, key
        np.testing.assert_allclose(extras[key], value, atol=1e-5, rtol=0)
    flat, ref_flat = _flat(state), _flat(ref_state)
    assert set(flat) == set(ref_flat)
    for key, value in ref_flat.items():
        assert flat[key].shape == value.shape, key
        np.testing.assert_allclose(flat[key], value, atol=1e-5, rtol=0)


def _extra_inputs(rng, prev_action, prev_reward):
    extra = {}
    if prev_action:
        extra["prev_actions"] = rng.integers(0, 3, ROWS)
    if prev_reward:
        extra["prev_rewards"] = rng.normal(size=ROWS).astype(np.float32)
    return extra or None


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("prev_action,prev_reward", [(False, False), (True, True), (True, False)])
@pytest.mark.parametrize("explore", [True, False])
def test_numpy_step_equals_torch_forward(share, prev_action, prev_reward, explore):
    module = _module(
        vf_share_layers=share, lstm_use_prev_action=prev_action, lstm_use_prev_reward=prev_reward
    )
    rng = np.random.default_rng(0)
    state = ref_state = initial_state_batch(module, ROWS)
    for step in range(4):  # the state carries over steps on both paths
        obs = rng.uniform(-1, 1, (ROWS, 4)).astype(np.float32)
        extra = _extra_inputs(rng, prev_action, prev_reward)
        with_values = step % 2 == 1
        kwargs = {"extra_inputs": extra, "with_values": with_values}
        fast = act(module, obs, explore, state, generator=_seeded(step), **kwargs)
        ref = _torch_act(module, obs, explore, ref_state, generator=_seeded(step), **kwargs)
        assert isinstance(module._fast_recurrent, NumpyRecurrentForward)
        _assert_same(fast, ref)
        assert (Columns.VF_PREDS in fast[1]) == with_values
        state, ref_state = fast[2], ref[2]
    if not share:
        assert set(state) == {"actor", "critic"}


@pytest.mark.parametrize("explore", [True, False])
def test_numpy_step_equals_torch_forward_for_dict_observations(explore):
    """Dict observations (Box, Discrete and MultiDiscrete leaves) are encoded on numpy
    and stepped by the numpy LSTM: the torch forward's actions, outputs and states."""
    space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
            "d": gym.spaces.Discrete(4),
            "md": gym.spaces.MultiDiscrete([2, 3]),
        }
    )
    torch.manual_seed(0)
    module = DefaultTorchRLModule(
        observation_space=space,
        action_space=gym.spaces.Discrete(3),
        model_config={"fcnet_hiddens": [16], "use_lstm": True, "lstm_cell_size": 12},
    )
    space.seed(0)
    state = ref_state = initial_state_batch(module, ROWS)
    for step in range(3):
        rows = [space.sample() for _ in range(ROWS)]
        obs = {k: np.stack([r[k] for r in rows]) for k in space.spaces}
        fast = act(module, obs, explore, state, generator=_seeded(step), with_values=True)
        ref = _torch_act(module, obs, explore, ref_state, generator=_seeded(step), with_values=True)
        assert isinstance(module._fast_recurrent, NumpyRecurrentForward)
        _assert_same(fast, ref)
        state, ref_state = fast[2], ref[2]


def test_numpy_step_sees_weight_changes():
    """In-place updates show through the views; replaced storage rebuilds the step."""
    module = _module(vf_share_layers=False)
    obs = np.random.default_rng(1).uniform(-1, 1, (ROWS, 4)).astype(np.float32)
    state = initial_state_batch(module, ROWS)
    state["actor"]["h"][:] = 0.3
    state["critic"]["c"][:] = -0.2

    def check():
        fast = act(module, obs, True, state, with_values=True, generator=torch.Generator())
        ref = _torch_act(module, obs, True, state, with_values=True, generator=torch.Generator())
        _assert_same(fast, ref)
        return fast[1][Columns.ACTION_DIST_INPUTS]

    before = check()
    plan = module._fast_recurrent
    with torch.no_grad():
        for param in module.parameters():
            param.mul_(1.5).add_(0.01)
    changed = check()
    assert module._fast_recurrent is plan  # same views, new values
    assert not np.allclose(before, changed)
    with torch.no_grad():
        module.lstm.weight_hh_l0.data = module.lstm.weight_hh_l0.data * -1.0
        module.vf_lstm.bias_ih_l0.data = module.vf_lstm.bias_ih_l0.data + 1.0
    check()
    assert module._fast_recurrent is not plan
    module.load_state_dict(_module(vf_share_layers=False).state_dict())
    assert module._fast_recurrent is None
    check()


def test_set_state_copied_in_place_keeps_the_acting_path_current():
    """Weights that ``set_state`` copies into the same storage act at once, with the
    same acting path (not rebuilt); the numpy forward equals the torch one after it."""
    module = _module(use_lstm=False)
    obs = np.random.default_rng(2).uniform(-1, 1, (ROWS, 4)).astype(np.float32)
    module.compute_actions_numpy(obs, explore=False)
    plan = module._fast
    new = {k: v * 1.5 + 0.01 for k, v in module.get_state().items()}
    module.set_state(new)
    assert module._fast is plan
    out = module.compute_actions_numpy(obs, explore=False, with_values=True)
    fresh = _module(use_lstm=False)
    fresh.set_state(new)
    with torch.no_grad():
        ref = fresh.forward_inference({Columns.OBS: torch.from_numpy(obs)})
    np.testing.assert_allclose(
        out[Columns.ACTION_DIST_INPUTS], ref[Columns.ACTION_DIST_INPUTS].numpy(), rtol=1e-5
    )
    np.testing.assert_allclose(
        out[Columns.VF_PREDS],
        fresh.compute_values({Columns.OBS: torch.from_numpy(obs)}).detach().numpy(),
        rtol=1e-5,
        atol=1e-6,
    )


def test_inference_only_module_steps_on_numpy():
    module = _module(vf_share_layers=False, inference_only=True)
    obs = np.zeros((ROWS, 4), np.float32)
    state = initial_state_batch(module, ROWS)
    fast = act(module, obs, True, state, with_values=True, generator=torch.Generator())
    ref = _torch_act(module, obs, True, state, with_values=True, generator=torch.Generator())
    assert isinstance(module._fast_recurrent, NumpyRecurrentForward)
    _assert_same(fast, ref)
    assert Columns.VF_PREDS not in fast[1]


def test_box_actions_and_missing_inputs_fall_back_to_torch():
    module = _module(act_space=gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    obs = np.zeros((ROWS, 4), np.float32)
    actions, extras, state = act(module, obs, True, initial_state_batch(module, ROWS))
    assert module._fast_recurrent is False
    assert actions.shape == (ROWS, 2) and state["h"].shape == (ROWS, 1, 12)
    module = _module(lstm_use_prev_reward=True)
    with pytest.raises(KeyError):  # the torch forward's error for a missing input
        act(module, obs, True, initial_state_batch(module, ROWS))


@pytest.mark.parametrize("shape", [(84, 84, 4), (42, 42, 3), (10, 10, 1)])
def test_cnn_with_folded_padding_equals_the_layer_by_layer_stack(shape):
    """Symmetric "same" pads go into the conv call; the numbers equal ZeroPad2d + conv."""
    torch.manual_seed(0)
    module = DefaultTorchRLModule(
        observation_space=gym.spaces.Box(0, 255, shape, np.uint8),
        action_space=gym.spaces.Discrete(3),
        model_config={},
    )
    cnn = module.encoder
    assert any(isinstance(layer, torch.nn.ZeroPad2d) for layer in cnn.convs)
    frames = torch.randint(0, 256, (3, *shape), dtype=torch.uint8)

    def layer_by_layer(x):
        x = (x.float() / 128.0 - 1.0).permute(0, 3, 1, 2)
        for layer in cnn.convs:
            x = layer(x)
            if isinstance(layer, torch.nn.Conv2d):
                x = torch.relu(x)
        return x.flatten(1)

    with torch.no_grad():
        expected = layer_by_layer(frames)
        torch.testing.assert_close(cnn(frames), expected, atol=1e-5, rtol=1e-5)
        floats = frames.float() / 128.0 - 1.0
        torch.testing.assert_close(cnn(floats), expected, atol=1e-5, rtol=1e-5)
    loss = cnn(frames).square().sum()
    loss.backward()  # the learner's forward is differentiable as before
    assert all(p.grad is not None for p in cnn.parameters())
