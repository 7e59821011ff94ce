"""The frequency-domain form of large-kernel stride-1 convs equals torch's conv."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

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
    "change",
    ["torch_in_place", "data_write", "numpy_write", "load_state_dict", "new_parameter"],
)
def test_weight_changes_are_seen(change):
    """The cached transformed kernel follows every way the weights can change, also
    writes that torch's version counter does not see (``.data``, numpy views)."""
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(8, 16, 7)
    freq = FrequencyConv(conv, (3, 3), (7, 7))
    x = torch.randn(2, 8, 7, 7)
    with torch.no_grad():
        freq(x)  # builds the cache
        new = 0.1 * torch.randn_like(conv.weight)  # (an initializer's scale)
        if change == "torch_in_place":
            conv.weight.mul_(-2.0)
        elif change == "data_write":
            conv.weight.data.copy_(new)
        elif change == "numpy_write":
            conv.weight.detach().numpy()[0, 0, 0, 0] += 1.0  # one entry only
        elif change == "load_state_dict":
            conv.load_state_dict({"weight": new, "bias": conv.bias})
        else:
            conv.weight = torch.nn.Parameter(new)
        conv.bias.add_(0.5)  # the bias is read live
        np.testing.assert_allclose(
            freq(x).numpy(), _direct(conv, x, (3, 3)).numpy(), atol=2e-5, rtol=0
        )


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
