"""Stride-1 convolutions with large kernels, run as products in the frequency domain.

Why: RLlib's default filter table for 84x84 frames ends in a 256-channel 11x11 conv
with "same" padding over an 11x11 input. That one layer is ~120M multiply-adds per
frame, 95% of the CNN, and 43% of them multiply padding zeros; torch runs it near
this CPU's peak and still acts on only ~650 frames/s on one core. Transformed to the
frequency domain (a discrete Fourier transform of size ``H + pad`` per axis, big
enough that the circular product equals the zero-padded one on every output), the
layer becomes one small complex matrix product per frequency: ~15M multiply-adds.

The transforms are plain matrix products with precomputed DFT matrices (no FFT call:
the sizes are small and odd): a dense forward transform (the inputs are small), the
per-frequency products, and a separable inverse (along H, then W) that writes the
``(B, Cout, H', W')`` output directly. The products take the spectra on the left,
so the kernel is stored once per frequency as ``[Re; Im]`` (half the bytes of the
``[[Re, -Im], [Im, Re]]`` block form, which the products stream from memory at
acting batch sizes) and the small spectra carry the complex structure instead.
The results equal the direct convolution up to float32 rounding (about 1e-6
relative); they are not bitwise the same, which is why only acting (no autograd)
uses this path and the learner's gradients go through torch's own conv.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

logger = logging.getLogger("envrunners")
_WARNED: set[int] = set()

__all__ = ["FrequencyConv", "frequency_conv_for"]

#: Use the frequency form only when it needs at most this fraction of the direct
#: form's multiply-adds: its products stream a larger weight array (memory-bound
#: at acting batch sizes), and it pays a layout copy of the spectra.
MAX_COST_FRACTION = 0.25
#: ... and only if its frequency-domain weights stay below this many bytes.
MAX_WEIGHT_BYTES = 64 * 2**20
#: Images per pass through the products (bounds their temporaries).
CHUNK = 64
#: Compare the weight with the one the kernel was built from, bit by bit, every this
#: many calls (it reads the weight twice: ~0.4 ms for the 11x11 layer under load).
FULL_CHECK_EVERY = 32


def _transform_size(size: int, padding: int) -> int:
    """The DFT length along one axis: the smallest whose circular product has no wrapped
    term on any output (the full linear convolution spans ``size + kernel - 1``)."""
    return size + padding


def _costs(
    in_hw: tuple[int, int],
    out_hw: tuple[int, int],
    kernel: tuple[int, int],
    padding: tuple[int, int],
    cin: int,
    cout: int,
) -> tuple[int, int, int]:
    """``(direct multiply-adds, frequency multiply-adds, frequency weight bytes)`` per image."""
    n_h = _transform_size(in_hw[0], padding[0])
    n_w = _transform_size(in_hw[1], padding[1])
    freqs = n_h * (n_w // 2 + 1)
    direct = out_hw[0] * out_hw[1] * cin * cout * kernel[0] * kernel[1]
    frequency = (
        cin * in_hw[0] * in_hw[1] * 2 * freqs  # forward transform
        + freqs * 4 * cin * cout  # the per-frequency complex products
        + cout * (n_w // 2 + 1) * 2 * out_hw[0] * 2 * n_h  # inverse along H
        + cout * out_hw[0] * out_hw[1] * 2 * (n_w // 2 + 1)  # inverse along W
    )
    return direct, frequency, freqs * 2 * cin * cout * 4


def frequency_conv_for(
    conv: torch.nn.Conv2d, padding: tuple[int, int], in_hw: tuple[int, int]
) -> FrequencyConv | None:
    """A :class:`FrequencyConv` for ``conv`` (run with ``padding`` on ``in_hw`` inputs)
    when the frequency form is much cheaper on the CPU, else None (strides, dilations,
    groups, small kernels, large images: the direct conv stays)."""
    if (
        tuple(conv.stride) != (1, 1)
        or tuple(conv.dilation) != (1, 1)
        or conv.groups != 1
        or conv.weight.device.type != "cpu"
        or conv.weight.dtype != torch.float32
        or conv.padding_mode != "zeros"
    ):
        return None
    kh, kw = conv.kernel_size
    ph, pw = padding
    out_hw = (in_hw[0] + 2 * ph - kh + 1, in_hw[1] + 2 * pw - kw + 1)
    if min(out_hw) < 1 or ph >= kh or pw >= kw:  # (rows of padding alone: never worth it)
        return None
    direct, frequency, weight_bytes = _costs(
        in_hw, out_hw, (kh, kw), (ph, pw), conv.in_channels, conv.out_channels
    )
    if frequency > MAX_COST_FRACTION * direct or weight_bytes > MAX_WEIGHT_BYTES:
        return None
    return FrequencyConv(conv, (ph, pw), in_hw)


class FrequencyConv:
    """``F.conv2d(x, conv.weight, conv.bias, 1, padding)`` for ``(B, C, H, W)`` float32 CPU
    inputs without autograd, computed in the frequency domain.

    The transformed kernel is cached and rebuilt when the conv's weight changes (see
    :meth:`_current_kernel`); the bias is read live. ``padding`` is the conv's own zero
    padding per axis (symmetric, as ``F.conv2d`` takes it).
    """

    def __init__(self, conv: torch.nn.Conv2d, padding: tuple[int, int], in_hw: tuple[int, int]):
        self.conv = conv
        kh, kw = conv.kernel_size
        h, w = in_hw
        ph, pw = padding
        self.in_hw = in_hw
        self.out_hw = (h + 2 * ph - kh + 1, w + 2 * pw - kw + 1)
        n_h, n_w = _transform_size(h, ph), _transform_size(w, pw)
        half = n_w // 2 + 1
        self._half = half
        self.num_freqs = n_h * half
        # Forward DFT of an (H, W) image: full along H, half spectrum along W. Rows
        # ([re | im], frequency (w, h)), so that ``forward_dft @ images.T`` has the
        # parts and frequencies first (the products' batch axis) and images last.
        f_h = np.exp(-2j * np.pi * np.outer(np.arange(n_h), np.arange(h)) / n_h)
        f_w = np.exp(-2j * np.pi * np.outer(np.arange(half), np.arange(w)) / n_w)
        forward = np.einsum("kp,lq->lkpq", f_h, f_w).reshape(self.num_freqs, h * w)
        self.forward_dft = np.concatenate([forward.real, forward.imag], 0).astype(np.float32)
        # Kernel transform matrices: correlation = convolution with the flipped kernel.
        self._g_h = np.exp(-2j * np.pi * np.outer(np.arange(n_h), np.arange(kh)) / n_h)
        self._g_w = np.exp(-2j * np.pi * np.outer(np.arange(half), np.arange(kw)) / n_w)
        # Inverse onto the outputs (full linear-convolution index = output + kernel - 1 -
        # padding), separable: along H a complex product, as one real matrix from rows
        # (frequency h, [re, im]) to rows ([re, im], output row); then along W, where the
        # half spectrum stands for its conjugate mirror, the real part onto the output
        # columns from rows (frequency w, [re, im]).
        rows = np.arange(self.out_hw[0]) + kh - 1 - ph
        cols = np.arange(self.out_hw[1]) + kw - 1 - pw
        i_h = np.exp(2j * np.pi * np.outer(rows, np.arange(n_h)) / n_h) / n_h
        along_h = np.empty((2, self.out_hw[0], n_h, 2))
        along_h[0, :, :, 0], along_h[0, :, :, 1] = i_h.real, -i_h.imag
        along_h[1, :, :, 0], along_h[1, :, :, 1] = i_h.imag, i_h.real
        self.inverse_h = along_h.reshape(2 * self.out_hw[0], 2 * n_h).astype(np.float32)
        weights = np.full(half, 2.0)
        weights[0] = 1.0
        if n_w % 2 == 0:
            weights[-1] = 1.0
        i_w = np.exp(2j * np.pi * np.outer(cols, np.arange(half)) / n_w) * weights / n_w
        self.inverse_w = (
            np.stack([i_w.real, -i_w.imag], 2)
            .reshape(self.out_hw[1], 2 * half)
            .T.astype(np.float32)
        )
        #: ``((data pointer, version) of the weight, the weight it was built from, the
        #: kernel (freqs, [re; im] x Cin, Cout))``: one attribute, so that a thread never sees
        #: one part without the others.
        self._cache: tuple[tuple[int, int], np.ndarray, np.ndarray] | None = None
        self._calls = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None  # rebuilt on first use: not shipped with the module
        return state

    def applies(self, x: torch.Tensor) -> bool:
        """Whether this form can run ``x`` (CPU float32 input and weights, the built size)."""
        weight = self.conv.weight
        return (
            x.dtype == torch.float32
            and weight.dtype == torch.float32
            and weight.device.type == "cpu"
            and x.dim() == 4
            and tuple(x.shape[2:]) == self.in_hw
        )

    def _current_kernel(self) -> np.ndarray:
        """The transformed kernel of the conv's current weight (rebuilt when it changed).

        A change through torch (optimizer steps, ``copy_``, ``load_state_dict``), a
        module's ``set_state`` (its numpy copies bump the version too) or new storage
        is seen at once, from the weight's data pointer and version counter. Writes
        torch does not count (``.data``, a numpy view) are found by a full bitwise
        comparison every ``FULL_CHECK_EVERY`` calls, with a warning: until then the
        layer acts with the weights it had.
        """
        weight = self.conv.weight
        key = (weight.data_ptr(), weight._version)
        cache = self._cache
        self._calls += 1
        if cache is not None and cache[0] == key:
            if self._calls % FULL_CHECK_EVERY or _same_bits(weight.detach().numpy(), cache[1]):
                return cache[2]
            _warn_untracked_write(self.conv)
        source = weight.detach().numpy().copy()
        cache = self._cache = (key, source, self._transform(source))
        return cache[2]

    def _transform(self, weight: np.ndarray) -> np.ndarray:
        cout, cin = weight.shape[:2]
        flipped = weight[:, :, ::-1, ::-1].astype(np.float64)
        along_w = flipped @ self._g_w.T  # (Cout, Cin, kh, half)
        spectrum = self._g_h @ along_w  # (Cout, Cin, n_h, half)
        spectrum = spectrum.transpose(3, 2, 1, 0).reshape(self.num_freqs, cin, cout)
        return np.ascontiguousarray(
            np.concatenate([spectrum.real, spectrum.imag], 1), dtype=np.float32
        )

    def _run(self, kernel: np.ndarray, images: np.ndarray, out: np.ndarray) -> None:
        """The layer (no bias) for ``(B, Cin, H, W)`` float32 images, into ``out``
        (``(B, Cout, H', W')``, C-contiguous: the last product writes through a
        reshaped view of it, which only a contiguous array gives)."""
        batch, cin = images.shape[:2]
        cout = kernel.shape[2]
        freqs = self.num_freqs
        spectra = (self.forward_dft @ images.reshape(batch * cin, -1).T).reshape(
            2, freqs, batch, cin
        )
        # Per frequency [[Re, -Im], [Im, Re]] of the spectra, (([re; im], B), [re | im] x
        # Cin): times the kernel's [Re; Im] it gives the complex product's parts.
        blocks = np.empty((freqs, 2, batch, 2, cin), np.float32)
        re, im = spectra
        blocks[:, 0, :, 0] = re
        np.negative(im, out=blocks[:, 0, :, 1])
        blocks[:, 1, :, 0] = im
        blocks[:, 1, :, 1] = re
        products = np.matmul(blocks.reshape(freqs, 2 * batch, 2 * cin), kernel)
        # (freqs (w, h), [re; im], B Cout): the inverse along H per frequency w ...
        n = batch * cout
        out_h, out_w = self.out_hw
        half_inverse = np.matmul(self.inverse_h, products.reshape(self._half, -1, n))
        # ... then along W per output row, written in the output's own layout.
        rows = half_inverse.reshape(2 * self._half, out_h, n).transpose(1, 2, 0)
        np.matmul(rows, self.inverse_w, out=out.reshape(n, out_h, out_w).transpose(1, 0, 2))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        kernel = self._current_kernel()
        batch = x.shape[0]
        cout = kernel.shape[2]
        images = x.detach().contiguous().numpy()
        out = np.empty((batch, cout, *self.out_hw), np.float32)
        # Large batches (a learner's value pass) in chunks: the products' temporaries
        # grow with the batch (~0.6 MB per image for the 11x11 layer).
        for start in range(0, batch, CHUNK):
            stop = min(start + CHUNK, batch)
            self._run(kernel, images[start:stop], out[start:stop])
        result = torch.from_numpy(out)
        if self.conv.bias is not None:
            result += self.conv.bias.detach().view(1, cout, 1, 1)
        return result


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two float32 arrays of one shape hold the same bits (a NaN equals itself),
    compared 8 bytes at a time where the size allows (30% faster)."""
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    as_type = np.uint64 if flat_a.size % 2 == 0 else np.uint32
    return bool(np.array_equal(flat_a.view(as_type), flat_b.view(as_type)))


def _warn_untracked_write(conv: torch.nn.Conv2d) -> None:
    """Say once per layer that its weight changed where torch's version counter did not."""
    if id(conv) in _WARNED:
        return
    _WARNED.add(id(conv))
    logger.warning(
        "The weight of %s changed without torch counting the write (through `.data` or a "
        "numpy view); its acting path noticed it up to %d calls late. Write module weights "
        "with torch ops under torch.no_grad() (param.copy_(...)), load_state_dict() or "
        "set_state().",
        conv,
        FULL_CHECK_EVERY,
    )
