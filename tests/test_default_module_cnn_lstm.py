"""The default module's CNN encoder (images) and LSTM (use_lstm), against RLlib 2.60's layouts."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from envrunners.core.columns import Columns
from envrunners.core.rl_module._acting import act, initial_state_batch
from envrunners.core.rl_module.default_model_config import DefaultModelConfig
from envrunners.core.rl_module.default_torch_rl_module import (
    DefaultTorchRLModule,
    _run_lstm,
    default_rl_module_spec,
)
from envrunners.errors import ConfigError


def _image_module(shape, dtype=np.uint8, act=None, **model_config) -> DefaultTorchRLModule:
    torch.manual_seed(0)
    return DefaultTorchRLModule(
        observation_space=gym.spaces.Box(0, 255, shape, dtype),
        action_space=act or gym.spaces.Discrete(3),
        model_config=model_config,
    )


# ---------------------------------------------------------------------------- config
def test_default_model_config_has_rllib_fields_and_defaults():
    fields = {f.name: f for f in dataclasses.fields(DefaultModelConfig)}
    assert len(fields) == 38
    config = DefaultModelConfig()
    assert config.fcnet_hiddens == [256, 256] and config.fcnet_activation == "tanh"
    assert config.conv_filters is None and config.conv_activation == "relu"
    assert config.head_fcnet_hiddens == [] and config.head_fcnet_activation == "relu"
    assert config.vf_share_layers is True and config.use_lstm is False
    assert (config.max_seq_len, config.lstm_cell_size) == (20, 256)
    assert not config.lstm_use_prev_action and not config.lstm_use_prev_reward
    assert config.log_std_clip_param == 20.0 and config.free_log_std is False
    for prefix in ("fcnet", "conv", "head_fcnet", "lstm"):
        for part in ("kernel", "bias"):
            assert getattr(config, f"{prefix}_{part}_initializer") is None
            assert getattr(config, f"{prefix}_{part}_initializer_kwargs") is None


def test_initializers_by_name_apply():
    module = DefaultTorchRLModule(
        observation_space=gym.spaces.Box(-1, 1, (3,), np.float32),
        action_space=gym.spaces.Discrete(2),
        model_config={"fcnet_hiddens": [4], "fcnet_bias_initializer": "constant",
                      "fcnet_bias_initializer_kwargs": {"val": 0.5},
                      "head_fcnet_kernel_initializer": "zeros"},
    )  # fmt: skip
    assert torch.all(module.encoder.layers[0].bias == 0.5)
    assert torch.all(module.pi.layers[0].weight == 0)
    with pytest.raises(ConfigError, match="conv_kernel_initializer.*torch.nn.init"):
        _image_module((10, 10, 1), conv_kernel_initializer="no_such_init")


# ---------------------------------------------------------------------------- CNN
@pytest.mark.parametrize(
    ("size", "layer_shapes"),
    [
        (84, [(21, 21, 16), (11, 11, 32), (11, 11, 256)]),
        (64, [(32, 32, 16), (16, 16, 32), (8, 8, 64), (4, 4, 128)]),
        (42, [(21, 21, 16), (11, 11, 32), (11, 11, 256)]),
        (10, [(5, 5, 16), (3, 3, 32)]),
    ],
)
def test_cnn_default_filters_per_image_size(size, layer_shapes):
    module = _image_module((size, size, 2))
    assert module.encoder.layer_shapes == layer_shapes
    h, w, c = layer_shapes[-1]
    assert module.pi.layers[0].in_features == h * w * c  # flattened after the last conv
    frames = np.random.default_rng(0).integers(0, 256, (3, size, size, 2), dtype=np.uint8)
    out = module.compute_actions_numpy(frames, explore=True, with_values=True)
    assert out[Columns.ACTIONS].shape == (3,)
    assert out[Columns.ACTION_DIST_INPUTS].shape == (3, 3)
    assert out[Columns.VF_PREDS].shape == (3,)


def test_cnn_parameter_count_matches_rllib_for_atari():
    # RLlib 2.60's DefaultPPOTorchRLModule on 84x84x4 frames, Discrete(3): 1,127,732.
    module = _image_module((84, 84, 4))
    assert sum(p.numel() for p in module.parameters()) == 1_127_732


def test_image_without_default_filters_fails_at_build_time():
    space = gym.spaces.Box(0, 255, (210, 160, 3), np.uint8)
    match = (
        r"no CNN for 210x160x3 image observations: default conv filters exist only for "
        r"96x96, 84x84, 64x64, 42x42, 10x10 \(H x W x C\)\. Set model_config\['conv_filters'\]"
        r".*wrap_atari_for_new_api_stack\(env, dim=84\)"
    )
    with pytest.raises(ConfigError, match=match):
        default_rl_module_spec(space, gym.spaces.Discrete(6))
    with pytest.raises(ConfigError, match=match):
        DefaultTorchRLModule(observation_space=space, action_space=gym.spaces.Discrete(6))


def test_conv_filters_that_do_not_fit_show_the_layer_shapes():
    filters = [[8, [4, 4], 2, "valid"], [16, [5, 5], 1, "valid"]]
    match = (
        r"model_config\['conv_filters'\] do not fit the 12x12x1 image: "
        r"layer 0 \[8, \[4, 4\], 2, 'valid'\] -> 5x5x8; "
        r"layer 1 \[16, \[5, 5\], 1, 'valid'\] -> 1x1x16"
    )
    # That one fits (5x5 kernel on 5x5): a third layer does not.
    module = _image_module((12, 12, 1), conv_filters=filters)
    assert module.encoder.layer_shapes == [(5, 5, 8), (1, 1, 16)]
    bad = [*filters, [32, [3, 3], 1, "valid"]]
    with pytest.raises(
        ConfigError, match=match + r"; layer 2 \[32, \[3, 3\], 1, 'valid'\] -> -1x-1x32"
    ):
        _image_module((12, 12, 1), conv_filters=bad)
    with pytest.raises(ConfigError, match="do not fit"):
        default_rl_module_spec(
            gym.spaces.Box(0, 1, (12, 12, 1), np.float32),
            gym.spaces.Discrete(2),
            {"conv_filters": bad},
        )


def test_custom_conv_filters_any_image_size():
    module = _image_module((7, 9, 3), conv_filters=[[4, 3, 2], [8, [2, 3], [1, 2]]])
    assert module.encoder.layer_shapes == [(4, 5, 4), (4, 3, 8)]
    out = module.forward_inference({Columns.OBS: torch.zeros(2, 7, 9, 3, dtype=torch.uint8)})
    assert out[Columns.ACTION_DIST_INPUTS].shape == (2, 3)


def test_uint8_frames_equal_rllib_normalised_floats():
    """uint8 input is cast inside the module as RLlib's Atari wrapper does: x / 128 - 1."""
    module = _image_module((10, 10, 2), vf_share_layers=False)
    frames = np.random.default_rng(1).integers(0, 256, (4, 10, 10, 2), dtype=np.uint8)
    floats = frames.astype(np.float32) / 128.0 - 1.0
    out_u8 = module.compute_actions_numpy(frames, explore=False, with_values=True)
    out_f32 = module.compute_actions_numpy(floats, explore=False, with_values=True)
    for key in (Columns.ACTION_DIST_INPUTS, Columns.VF_PREDS, Columns.ACTIONS):
        np.testing.assert_allclose(out_u8[key], out_f32[key], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        train = module.forward_train({Columns.OBS: torch.from_numpy(frames)})
    np.testing.assert_allclose(
        train[Columns.ACTION_DIST_INPUTS].numpy(), out_f32[Columns.ACTION_DIST_INPUTS], atol=1e-5
    )


def test_cnn_with_box_actions_and_separate_value_encoder():
    module = _image_module(
        (10, 10, 1), act=gym.spaces.Box(-1, 1, (2,), np.float32), vf_share_layers=False
    )
    assert isinstance(module.vf_encoder, type(module.encoder))
    out = module.compute_actions_numpy(np.zeros((2, 10, 10, 1), np.uint8), explore=True)
    assert out[Columns.ACTIONS].shape == (2, 2) and out[Columns.ACTIONS].dtype == np.float32


# ---------------------------------------------------------------------------- LSTM
BOX3 = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


def _lstm_module(obs=BOX3, act=None, inference_only=False, **model_config):
    torch.manual_seed(0)
    config = {"fcnet_hiddens": [8], "use_lstm": True, "lstm_cell_size": 5, **model_config}
    return DefaultTorchRLModule(
        observation_space=obs,
        action_space=act or gym.spaces.Discrete(2),
        inference_only=inference_only,
        model_config=config,
    )


def _batched(state, rows):
    return {
        k: _batched(v, rows) if isinstance(v, dict) else v.expand(rows, *v.shape)
        for k, v in state.items()
    }


def test_lstm_initial_state_and_output_shapes_match_rllib():
    module = _lstm_module()
    assert module.is_stateful()
    state = module.get_initial_state()
    assert set(state) == {"h", "c"} and all(v.shape == (1, 5) for v in state.values())
    assert all(torch.all(v == 0) for v in state.values())
    batch = {Columns.OBS: torch.rand(2, 3, 3), Columns.STATE_IN: _batched(state, 2)}
    with torch.no_grad():
        out = module.forward_exploration(batch)
        train = module.forward_train(batch)
    assert out[Columns.ACTION_DIST_INPUTS].shape == (2, 3, 2)
    assert {k: v.shape for k, v in out[Columns.STATE_OUT].items()} == {
        "h": (2, 1, 5),
        "c": (2, 1, 5),
    }
    assert train[Columns.VF_PREDS].shape == (2, 3)
    assert module.compute_values(batch).shape == (2, 3)
    assert not _lstm_module(use_lstm=False).is_stateful()


def test_lstm_state_carries_over_steps():
    """Two forwards with T=1, carrying STATE_OUT into STATE_IN, equal one with T=2."""
    module = _lstm_module(vf_share_layers=False)
    state = _batched(module.get_initial_state(), 4)
    assert set(state) == {"actor", "critic"}
    obs = torch.rand(4, 2, 3)
    with torch.no_grad():
        whole = module.forward_train({Columns.OBS: obs, Columns.STATE_IN: state})
        first = module.forward_train({Columns.OBS: obs[:, :1], Columns.STATE_IN: state})
        second = module.forward_train(
            {Columns.OBS: obs[:, 1:], Columns.STATE_IN: first[Columns.STATE_OUT]}
        )
    for key in (Columns.ACTION_DIST_INPUTS, Columns.VF_PREDS):
        torch.testing.assert_close(whole[key][:, 1], second[key][:, 0])
        torch.testing.assert_close(whole[key][:, 0], first[key][:, 0])
    for part in ("actor", "critic"):
        for k in ("h", "c"):
            torch.testing.assert_close(
                whole[Columns.STATE_OUT][part][k], second[Columns.STATE_OUT][part][k]
            )


def test_lstm_inference_only_copy_keeps_the_critic_state_and_syncs():
    learner = _lstm_module(vf_share_layers=False)
    runner = _lstm_module(vf_share_layers=False, inference_only=True)
    assert not hasattr(runner, "vf") and hasattr(runner, "vf_lstm")
    runner.set_state(learner.get_state(inference_only=True))
    state = _batched(learner.get_initial_state(), 2)
    batch = {Columns.OBS: torch.rand(2, 1, 3), Columns.STATE_IN: state}
    with torch.no_grad():
        a, b = learner.forward_exploration(batch), runner.forward_exploration(batch)
    torch.testing.assert_close(a[Columns.ACTION_DIST_INPUTS], b[Columns.ACTION_DIST_INPUTS])
    torch.testing.assert_close(a[Columns.STATE_OUT], b[Columns.STATE_OUT])


def test_lstm_prev_action_and_reward_inputs():
    act = gym.spaces.MultiDiscrete([2, 3])
    module = _lstm_module(act=act, lstm_use_prev_action=True, lstm_use_prev_reward=True)
    assert module.lstm.input_size == 8 + 5 + 1  # encoder + one-hot(2 + 3) + reward
    batch = {
        Columns.OBS: torch.rand(2, 3, 3),
        Columns.STATE_IN: _batched(module.get_initial_state(), 2),
        "prev_actions": torch.zeros(2, 3, 2, dtype=torch.int64),
        "prev_rewards": torch.ones(2, 3),
    }
    with torch.no_grad():
        out = module.forward_exploration(batch)
        batch["prev_rewards"] = torch.zeros(2, 3)
        other = module.forward_exploration(batch)
    assert out[Columns.ACTION_DIST_INPUTS].shape == (2, 3, 5)
    assert not torch.allclose(out[Columns.ACTION_DIST_INPUTS], other[Columns.ACTION_DIST_INPUTS])


def test_lstm_over_cnn_encoder():
    module = _lstm_module(obs=gym.spaces.Box(0, 255, (10, 10, 1), np.uint8))
    batch = {
        Columns.OBS: torch.zeros(2, 3, 10, 10, 1, dtype=torch.uint8),
        Columns.STATE_IN: _batched(module.get_initial_state(), 2),
    }
    with torch.no_grad():
        out = module.forward_train(batch)
    assert module.lstm.input_size == 3 * 3 * 32
    assert out[Columns.ACTION_DIST_INPUTS].shape == (2, 3, 2)
    assert out[Columns.VF_PREDS].shape == (2, 3)


def test_stateful_module_refuses_the_stateless_numpy_path():
    with pytest.raises(RuntimeError, match=r"stateful \(use_lstm=True\).*_acting\.act"):
        _lstm_module().compute_actions_numpy(np.zeros((2, 3), np.float32), explore=True)


def test_acting_lstm_step_runs_on_torch_kernels_and_puts_onednn_back():
    """One acting step (no autograd, one time step) runs the LSTM with oneDNN off (it
    prepares the weights per call: several times slower for one step), the same
    numbers; sequences with autograd (the learner) keep oneDNN; the flag is put back."""
    torch.manual_seed(0)
    module = _image_module((84, 84, 4), use_lstm=True, lstm_cell_size=16)
    seen: list[bool] = []
    module.lstm.register_forward_pre_hook(lambda m, args: seen.append(_mkldnn_enabled()))
    obs = np.random.default_rng(0).integers(0, 255, (3, 84, 84, 4), dtype=np.uint8)
    state = initial_state_batch(module, 3)
    assert _mkldnn_enabled()
    actions, out, state_out = act(module, obs, True, state)
    assert seen == [False] and _mkldnn_enabled()
    # The same step with oneDNN, called directly: the same outputs.
    x = torch.randn(3, 1, module.lstm.input_size)
    h0 = c0 = torch.zeros(1, 3, 16)
    with torch.no_grad():
        ref, (ref_h, ref_c) = module.lstm(x, (h0, c0))
        got, (got_h, got_c) = _run_lstm(module.lstm, x, (h0, c0))
    for a, b in ((got, ref), (got_h, ref_h), (got_c, ref_c)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)  # sums of 30,976 terms
    seen.clear()
    x = torch.randn(3, 4, module.lstm.input_size, requires_grad=True)  # a learner's sequences
    _run_lstm(module.lstm, x, (h0, c0))[0].sum().backward()
    with torch.no_grad():
        _run_lstm(module.lstm, x, (h0, c0))
    _run_lstm(module.lstm, x[:, :1], (h0, c0))  # one step, with autograd
    assert seen == [True, True, True] and _mkldnn_enabled()


def _mkldnn_enabled() -> bool:
    return torch._C._get_mkldnn_enabled()
