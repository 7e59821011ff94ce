"""The frequency-domain form of large-kernel stride-1 convs equals torch's conv."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from envrunners.core.rl_module import _frequency_conv as fc_module
from envrunners.core.rl_module._frequency_conv import FrequencyConv, frequency_conv_for
from envrunners.core.rl_module._torch_encoders import CNN, default_conv_filters


def _direct(conv: torch.nn.Conv2d, x: torch.Tensor, padding) -> torch.Tensor:
    return F.conv2d(x, conv.weight, conv.bias, 1, padding)


@pytest.mark.parametrize(
    "cin, cout, kernel, hw, padding, batch",
    [
        (32, 256, 11, (11, 11), (5, 5), 4),  # the 84x84 table's last layer
        (3, 8, 7, (9, 9), (3, 3), 1),
        (3, 8, 7, (9, 9), (3, 3), 150),  # in chunks of 64
        (4, 6, 5, (10, 10), (0, 0), 5),  # "valid"
        (2, 3, (5, 3), (7, 9), (2, 1), 3),  # non-square kernel, image and padding
        (5, 4, 6, (8, 8), (2, 2), 2),  # even kernel: an output fewer than the input
    ],
)
def test_equals_torch_conv(cin, cout, kernel, hw, padding, batch):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(cin, cout, kernel)
    freq = FrequencyConv(conv, padding, hw)
    x = torch.randn(batch, cin, *hw)
    with torch.inference_mode():
        expected = _direct(conv, x, padding)
        got = freq(x)
    assert got.shape == expected.shape and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=2e-5, rtol=0)


def test_cost_model_picks_only_large_kernels():
    """In the 84x84 default CNN only the 11x11 stride-1 layer is worth it; small kernels
    on large images, strides, dilations and groups keep torch's conv."""
    cnn = CNN((84, 84, 4), default_conv_filters((84, 84, 4)), {"conv_activation": "relu"})
    picked = [type(f).__name__ for f in cnn._frequency if f is not None]
    assert picked == ["FrequencyConv"] and cnn._frequency[-1].in_hw == (11, 11)
    assert frequency_conv_for(torch.nn.Conv2d(16, 16, 3), (1, 1), (64, 64)) is None
    assert frequency_conv_for(torch.nn.Conv2d(32, 256, 11, stride=2), (5, 5), (11, 11)) is None
    assert frequency_conv_for(torch.nn.Conv2d(32, 256, 11, dilation=2), (5, 5), (21, 21)) is None
    assert frequency_conv_for(torch.nn.Conv2d(32, 256, 11, groups=2), (5, 5), (11, 11)) is None
    assert frequency_conv_for(torch.nn.Conv2d(32, 256, 11).double(), (5, 5), (11, 11)) is None


@pytest.mark.parametrize(
    "change", ["torch_in_place", "load_state_dict", "new_parameter", "module_set_state"]
)
def test_weight_changes_are_seen_at_once(change):
    """A change torch counts (or new storage, or a module's ``set_state``, whose numpy
    copies bump the version) rebuilds the cached kernel on the next call."""
    torch.manual_seed(1)
    cnn = CNN((42, 42, 4), default_conv_filters((42, 42, 4)), {"conv_activation": "relu"})
    conv, freq = cnn.convs[-1], cnn._frequency[-1]
    x = torch.randn(2, 32, 11, 11)
    with torch.no_grad():
        freq(x)  # builds the cache
        new = 0.02 * torch.randn_like(conv.weight)  # (about an initializer's scale)
        if change == "torch_in_place":
            conv.weight.mul_(-2.0)
        elif change == "load_state_dict":
            conv.load_state_dict({"weight": new, "bias": conv.bias})
        elif change == "new_parameter":
            conv.weight = torch.nn.Parameter(new)
        else:
            state = {k: v.numpy().copy() for k, v in cnn.state_dict().items()}
            state["convs.5.weight"] = new.numpy()
            _set_state_like_a_module(cnn, state)
        conv.bias.add_(0.5)  # the bias is read live
        np.testing.assert_allclose(
            freq(x).numpy(), _direct(conv, x, (5, 5)).numpy(), atol=2e-5, rtol=0
        )


def _set_state_like_a_module(module: torch.nn.Module, state: dict) -> None:
    """What ``RLModule.set_state`` does with numpy state: copy in place, bump versions."""
    params = dict(module.named_parameters())
    for name, value in state.items():
        np.copyto(params[name].detach().numpy(), value)
    torch.autograd.graph.increment_version(list(params.values()))


@pytest.mark.parametrize("change", ["data_write", "numpy_write"])
def test_writes_torch_does_not_count_are_found_within_the_full_check(change, caplog):
    """``.data`` and numpy writes leave torch's version counter alone: the periodic
    bitwise comparison finds them (within ``FULL_CHECK_EVERY`` calls) and warns once."""
    torch.manual_seed(5)
    conv = torch.nn.Conv2d(8, 16, 7)
    freq = FrequencyConv(conv, (3, 3), (7, 7))
    x = torch.randn(2, 8, 7, 7)
    with torch.no_grad():
        freq(x)
        if change == "data_write":
            conv.weight.data.copy_(0.1 * torch.randn_like(conv.weight))
        else:
            conv.weight.detach().numpy()[0, 0, 0, 0] += 1.0  # one entry only
        expected = _direct(conv, x, (3, 3)).numpy()
        with caplog.at_level("WARNING", logger="envrunners"):
            outs = [freq(x).numpy() for _ in range(fc_module.FULL_CHECK_EVERY)]
    np.testing.assert_allclose(outs[-1], expected, atol=2e-5, rtol=0)
    assert sum("without torch counting the write" in r.getMessage() for r in caplog.records) == 1


def test_cnn_acts_in_the_frequency_domain_and_trains_through_torch():
    """Without autograd the CNN's output equals the one torch's convs give (float32
    rounding apart); with autograd it is torch's own conv, gradients included."""
    torch.manual_seed(2)
    cnn = CNN((84, 84, 4), default_conv_filters((84, 84, 4)), {"conv_activation": "relu"})
    frames = torch.randint(0, 256, (3, 84, 84, 4), dtype=torch.uint8)
    calls = []
    freq = cnn._frequency[-1]
    original = freq.__call__

    class Spy(FrequencyConv):
        def __call__(self, x):
            calls.append(x.shape[0])
            return original(x)

    freq.__class__ = Spy
    with torch.inference_mode():
        acting = cnn(frames)
    assert calls == [3]
    trained = cnn(frames)
    assert calls == [3] and trained.requires_grad
    np.testing.assert_allclose(acting.numpy(), trained.detach().numpy(), atol=1e-5, rtol=0)
    trained.sum().backward()
    assert cnn.convs[-1].weight.grad is not None


def test_tracing_keeps_torch_convs():
    """A traced CNN (``torch.jit.trace``, ONNX export) records torch's convs, not numpy."""
    torch.manual_seed(4)
    cnn = CNN((84, 84, 4), default_conv_filters((84, 84, 4)), {"conv_activation": "relu"})
    frames = torch.randint(0, 256, (2, 84, 84, 4), dtype=torch.uint8)
    with torch.no_grad():
        traced = torch.jit.trace(cnn, frames)
        other = torch.randint(0, 256, (2, 84, 84, 4), dtype=torch.uint8)
        np.testing.assert_allclose(traced(other).numpy(), cnn(other).numpy(), atol=1e-5)
    assert "conv" in str(traced.graph).lower() and "numpy" not in str(traced.graph)


def test_pickle_and_deepcopy_leave_the_cache_behind():
    torch.manual_seed(3)
    cnn = CNN((84, 84, 4), default_conv_filters((84, 84, 4)), {"conv_activation": "relu"})
    frames = torch.randint(0, 256, (2, 84, 84, 4), dtype=torch.uint8)
    with torch.no_grad():
        expected = cnn(frames)
    assert cnn._frequency[-1]._cache is not None
    for clone in (pickle.loads(pickle.dumps(cnn)), copy.deepcopy(cnn)):
        freq = clone._frequency[-1]
        assert freq._cache is None and freq.conv is clone.convs[-1]
        with torch.no_grad():
            np.testing.assert_allclose(clone(frames).numpy(), expected.numpy(), atol=1e-6)


def test_default_module_acts_with_new_weights_after_set_state():
    """The default module on 84x84x4 frames acts through the frequency form, and after
    ``set_state`` (numpy weights, as a weight sync brings them) with the new weights."""
    import gymnasium as gym

    from envrunners.core.columns import Columns
    from envrunners.core.rl_module.default_torch_rl_module import DefaultTorchRLModule

    def module(seed):
        torch.manual_seed(seed)
        return DefaultTorchRLModule(
            observation_space=gym.spaces.Box(0, 255, (84, 84, 4), np.uint8),
            action_space=gym.spaces.Discrete(6),
            model_config={},
        )

    acting, other = module(0), module(1)
    frames = np.random.default_rng(0).integers(0, 256, (4, 84, 84, 4), dtype=np.uint8)

    def torch_logits(m):  # torch's convs: autograd on
        return m.pi(m.encoder(torch.from_numpy(frames))).detach().numpy()

    first = acting.compute_actions_numpy(frames, explore=False)[Columns.ACTION_DIST_INPUTS]
    np.testing.assert_allclose(first, torch_logits(acting), atol=1e-4, rtol=1e-4)
    acting.set_state({k: v.numpy().copy() for k, v in other.state_dict().items()})
    second = acting.compute_actions_numpy(frames, explore=False)[Columns.ACTION_DIST_INPUTS]
    np.testing.assert_allclose(second, torch_logits(other), atol=1e-4, rtol=1e-4)
    assert not np.allclose(first, second, atol=1e-3)
