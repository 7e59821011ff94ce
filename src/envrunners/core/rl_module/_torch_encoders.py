"""Torch layer stacks of the default module: MLP, CNN (with RLlib's filter table), initializers.

The CNN follows RLlib's new-stack encoder: every conv layer pads ``"same"`` unless
its spec says ``"valid"`` (TF-style padding, so the output is ``ceil(in / stride)``),
an activation follows every conv layer, and the last feature map is flattened.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from envrunners.core.rl_module._frequency_conv import FrequencyConv, frequency_conv_for
from envrunners.errors import ConfigError

__all__ = [
    "ACTIVATIONS",
    "CNN",
    "MLP",
    "conv_layer_shapes",
    "default_conv_filters",
    "init_layer",
]

ACTIVATIONS: dict[str | None, Any] = {
    "tanh": torch.tanh,
    "relu": torch.relu,
    "swish": F.silu,
    "silu": F.silu,
    "elu": F.elu,
    "linear": None,
    None: None,
}

#: RLlib's default ``conv_filters`` by image size (``ray.rllib.models.utils.get_filter_config``).
DEFAULT_FILTERS: dict[int, list[list]] = {
    96: [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 2]],
    84: [[16, [8, 8], 4], [32, [4, 4], 2], [256, [11, 11], 1]],
    64: [[16, [4, 4], 2], [32, [4, 4], 2], [64, [4, 4], 2], [128, [4, 4], 2]],
    42: [[16, [4, 4], 2], [32, [4, 4], 2], [256, [11, 11], 1]],
    10: [[16, [5, 5], 2], [32, [5, 5], 2]],
}

#: 1/128 and -1: RLlib's Atari wrapper (``NormalizedImageEnv``) maps uint8 pixels to
#: ``x / 128 - 1``; the CNN applies the same map to uint8 input, so frames can stay
#: uint8 (4x smaller) in buffers and episodes and the network still sees RLlib's numbers.
_PIXEL_SCALE = 1.0 / 128.0


def default_conv_filters(shape: Sequence[int]) -> list[list]:
    """RLlib's default filters for an ``H x W x C`` image.

    Raises:
        ConfigError: No default for this size; the message names ``conv_filters`` and
            the Atari wrapper that resizes frames to 84x84.
    """
    height, width = int(shape[0]), int(shape[1])
    if height == width and height in DEFAULT_FILTERS:
        return DEFAULT_FILTERS[height]
    sizes = ", ".join(f"{n}x{n}" for n in DEFAULT_FILTERS)
    raise ConfigError(
        f"The default RLModule has no CNN for {'x'.join(str(int(d)) for d in shape)} image "
        f"observations: default conv filters exist only for {sizes} (H x W x C). Set "
        "model_config['conv_filters'] (a list of [out_channels, kernel, stride]), or, for "
        "Atari, wrap the env with envrunners.env.wrappers.atari_wrappers."
        "wrap_atari_for_new_api_stack(env, dim=84) to get 84x84 frames."
    )


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[1])
    return int(value), int(value)


def _parse_filter(spec: Any, index: int) -> tuple[int, tuple[int, int], tuple[int, int], str]:
    """``(out_channels, kernel, stride, padding)`` of one ``conv_filters`` entry."""
    if not isinstance(spec, (list, tuple)) or len(spec) not in (3, 4):
        raise ConfigError(
            f"model_config['conv_filters'][{index}]={spec!r}: each entry must be "
            "[out_channels, kernel, stride] or [out_channels, kernel, stride, 'same'|'valid']."
        )
    padding = spec[3] if len(spec) == 4 else "same"
    if padding not in ("same", "valid"):
        raise ConfigError(
            f"model_config['conv_filters'][{index}]: padding must be 'same' or 'valid', "
            f"got {padding!r}."
        )
    return int(spec[0]), _pair(spec[1]), _pair(spec[2]), padding


def conv_layer_shapes(
    image_shape: Sequence[int], conv_filters: Sequence[Any]
) -> list[tuple[int, int, int]]:
    """The ``(H, W, C)`` after each conv layer.

    Raises:
        ConfigError: A layer's output is empty (a ``"valid"`` kernel larger than its
            input); the message lists every layer's computed shape.
    """
    height, width, channels = (int(d) for d in image_shape)
    shapes = []
    fits = True
    for index, spec in enumerate(conv_filters):
        out, (kh, kw), (sh, sw), padding = _parse_filter(spec, index)
        if padding == "same":
            height, width = math.ceil(height / sh), math.ceil(width / sw)
        else:
            height, width = (height - kh) // sh + 1, (width - kw) // sw + 1
        channels = out
        shapes.append((height, width, channels))
        fits = fits and height > 0 and width > 0
    if not conv_filters:
        raise ConfigError("model_config['conv_filters'] is empty; give at least one layer.")
    if not fits:
        shown = "; ".join(
            f"layer {i} {list(spec)} -> {h}x{w}x{c}"
            for i, (spec, (h, w, c)) in enumerate(zip(conv_filters, shapes))
        )
        raise ConfigError(
            f"model_config['conv_filters'] do not fit the "
            f"{'x'.join(str(int(d)) for d in image_shape)} image: {shown}. A 'valid' layer "
            "needs an input at least as large as its kernel; use 'same' padding, smaller "
            "kernels or strides, or fewer layers."
        )
    return shapes


def _initializer(name_or_fn: Any, key: str) -> Any:
    """A ``torch.nn.init`` function from its name (with or without the trailing ``_``)."""
    if name_or_fn is None or callable(name_or_fn):
        return name_or_fn
    name = str(name_or_fn)
    fn = getattr(nn.init, name if name.endswith("_") else name + "_", None)
    if fn is None:
        raise ConfigError(
            f"model_config[{key!r}]={name_or_fn!r} is not a torch.nn.init initializer "
            "(e.g. 'xavier_uniform', 'orthogonal', 'zeros')."
        )
    return fn


def init_layer(layer: nn.Module, cfg: dict[str, Any], prefix: str) -> None:
    """Apply ``<prefix>_kernel_initializer`` / ``<prefix>_bias_initializer`` from ``cfg``.

    Weights are the parameters named ``weight*`` (``weight_ih_l0`` of an LSTM too),
    biases those named ``bias*``; ``None`` keeps torch's default initialisation.
    """
    for part, stem in (("kernel", "weight"), ("bias", "bias")):
        key = f"{prefix}_{part}_initializer"
        fn = _initializer(cfg.get(key), key)
        if fn is None:
            continue
        kwargs = cfg.get(f"{key}_kwargs") or {}
        with torch.no_grad():
            for name, param in layer.named_parameters(recurse=False):
                if name.startswith(stem):
                    fn(param, **kwargs)


class MLP(nn.Module):
    """Linear layers with an activation after each (the last one only if ``activate_last``).

    With ``layernorm`` a LayerNorm follows each activated layer's linear part.
    """

    def __init__(
        self,
        sizes: list[int],
        activation: str | None,
        activate_last: bool,
        *,
        layernorm: bool = False,
        cfg: dict[str, Any] | None = None,
        init_prefix: str = "fcnet",
    ):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        self.activation = activation
        self.activate_last = activate_last
        last = len(self.layers) - 1
        self.norms = (
            nn.ModuleList(
                nn.LayerNorm(b) if (i < last or activate_last) else nn.Identity()
                for i, b in enumerate(sizes[1:])
            )
            if layernorm
            else None
        )
        if cfg is not None:
            for layer in self.layers:
                init_layer(layer, cfg, init_prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = ACTIVATIONS[self.activation]
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if self.norms is not None:
                x = self.norms[i](x)
            if act is not None and (i < last or self.activate_last):
                x = act(x)
        return x


class CNN(nn.Module):
    """Conv stack for ``(B, H, W, C)`` images, flattened to ``(B, out_dim)``.

    uint8 input becomes float inside (``x / 128 - 1``, RLlib's Atari normalisation);
    float input is used as given. Symmetric "same" paddings go into the conv call
    itself rather than through the ``ZeroPad2d`` layer before it (the same numbers;
    torch's CPU conv with its own padding ran the 84x84 filter table's 11x11 layer
    in about 60% of the time); ``convs`` keeps the layers (and state-dict keys).

    Without autograd (acting, value estimates), on CPU float32, a stride-1 layer whose
    kernel is large for its input (the 84x84 table's 11x11 one) runs as a product in
    the frequency domain (:class:`FrequencyConv`: equal up to float32 rounding, ~8x
    faster for that layer at acting batch sizes); training passes use torch's conv.
    """

    def __init__(self, image_shape: Sequence[int], conv_filters: Sequence[Any], cfg: dict):
        super().__init__()
        shapes = conv_layer_shapes(image_shape, conv_filters)
        layers: list[nn.Module] = []
        #: Per layer of ``convs``: a conv's own zero padding ``(h, w)``, or None for a
        #: ``ZeroPad2d`` the forward applies itself, or False for one folded into the
        #: next conv (see :meth:`forward`).
        self._paddings: list[tuple[int, int] | bool | None] = []
        #: Per layer of ``convs``: its frequency-domain form where that is cheaper.
        self._frequency: list[FrequencyConv | None] = []
        height, width, channels = (int(d) for d in image_shape)
        for index, spec in enumerate(conv_filters):
            out, (kh, kw), (sh, sw), padding = _parse_filter(spec, index)
            conv_padding = (0, 0)
            if padding == "same":
                pad_h = max((shapes[index][0] - 1) * sh + kh - height, 0)
                pad_w = max((shapes[index][1] - 1) * sw + kw - width, 0)
                pads = (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2)
                if any(pads):
                    layers.append(nn.ZeroPad2d(pads))
                    symmetric = pads[0] == pads[1] and pads[2] == pads[3]
                    self._paddings.append(False if symmetric else None)
                    self._frequency.append(None)
                    conv_padding = (pads[2], pads[0]) if symmetric else (0, 0)
                    if not symmetric:  # padded by the layer before: the conv sees more
                        height, width = height + pads[2] + pads[3], width + pads[0] + pads[1]
            conv = nn.Conv2d(channels, out, (kh, kw), (sh, sw))
            init_layer(conv, cfg, "conv")
            layers.append(conv)
            self._paddings.append(conv_padding)
            self._frequency.append(frequency_conv_for(conv, conv_padding, (height, width)))
            height, width, channels = shapes[index]
        self.convs = nn.Sequential(*layers)
        self.activation = cfg.get("conv_activation")
        self.out_dim = height * width * channels
        self.layer_shapes = shapes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NHWC -> a contiguous NCHW float copy in one pass (the convs run markedly faster
        # on it than on the channels-last strides the permuted view has).
        x = x.permute(0, 3, 1, 2)
        if x.dtype == torch.uint8:
            x = x.to(torch.float32, memory_format=torch.contiguous_format)
            x = x.mul_(_PIXEL_SCALE).sub_(1.0)
        else:
            x = x.to(torch.float32, memory_format=torch.contiguous_format)
        act = ACTIVATIONS[self.activation]
        frequency = (  # (numpy inside: not while torch traces or compiles the graph)
            any(self._frequency)
            and not torch.is_grad_enabled()
            and x.device.type == "cpu"
            and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling()
        )
        for layer, padding, freq in zip(self.convs, self._paddings, self._frequency):
            if padding is None:  # an asymmetric "same" padding
                x = layer(x)
            elif padding is not False:
                if frequency and freq is not None and freq.applies(x):
                    x = freq(x)
                else:
                    x = F.conv2d(x, layer.weight, layer.bias, layer.stride, padding)
                if act is not None:
                    x = act(x)
        return x.flatten(1)
