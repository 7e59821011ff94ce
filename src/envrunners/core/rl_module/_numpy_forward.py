"""The default module's acting forward on numpy views of its torch parameters.

Runners act once per vector step for all sub-envs; at those batch sizes torch's
per-op dispatch costs more than the arithmetic, so the acting path runs the MLP
layers with numpy (:class:`NumpyForward`) or, where numpy cannot, with cached
parameter references and in-place activations (:func:`mlp_plan`, :func:`run_plan`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["NumpyForward", "NumpyPlan", "mlp_plan", "run_plan"]


def mlp_plan(mlp: Any, numpy_tanh: bool) -> list[tuple[torch.Tensor, torch.Tensor, Any]]:
    """``(weight, bias, in-place activation or None)`` per layer of an ``MLP`` (no LayerNorm)."""
    last = len(mlp.layers) - 1
    out = []
    for i, layer in enumerate(mlp.layers):
        act = None
        if mlp.activation not in ("linear", None) and (i < last or mlp.activate_last):
            act = _inplace_activation(mlp.activation, numpy_tanh)
        out.append((layer.weight, layer.bias, act))
    return out


def _np_tanh_(x: torch.Tensor) -> None:
    """In-place tanh through numpy's SIMD kernel (this torch CPU build's tanh is scalar)."""
    array = x.numpy()
    np.tanh(array, out=array)


def _inplace_activation(name: str, numpy_tanh: bool) -> Any:
    """An in-place activation callable for the acting path."""
    if name == "tanh":
        return _np_tanh_ if numpy_tanh else torch.Tensor.tanh_
    if name == "relu":
        return torch.Tensor.relu_
    if name in ("swish", "silu"):
        return lambda x: F.silu(x, inplace=True)
    return lambda x: F.elu(x, inplace=True)


def run_plan(plan: list[tuple[torch.Tensor, torch.Tensor, Any]], x: torch.Tensor) -> torch.Tensor:
    """Apply a :func:`mlp_plan` to ``x`` (no autograd bookkeeping beyond the caller's mode)."""
    for weight, bias, act in plan:
        x = F.linear(x, weight, bias)
        if act is not None:
            act(x)
    return x


_DATA_PTR = torch.Tensor.data_ptr
_NUMPY_ACTIVATIONS = {
    "tanh": lambda h: np.tanh(h, out=h),
    "relu": lambda h: np.maximum(h, 0.0, out=h),
    "linear": None,
    None: None,
}


class NumpyPlan:
    """An ``MLP`` run by numpy on views of its (CPU, float32) parameters.

    Why: at acting batch sizes (a few to a few dozen rows) this torch build's
    ``F.linear`` spends most of its time outside the arithmetic (dispatch, and a
    slower small-matrix product than numpy's BLAS): the whole default forward at
    10 rows measured 42 us in torch and 30 us here. Activations are kept
    transposed, ``(features, B)``, so every product is ``W @ h`` on the weights'
    own C-contiguous storage: no transposed copies that could go stale when
    weights change in place (optimizer steps, ``copy_``, writes through
    ``.data`` or numpy all show through the views). Only a replaced storage
    (``param.data = ...``, ``.to()``) invalidates the views;
    :meth:`NumpyForward.current` detects that from the parameters' data pointers.
    """

    __slots__ = ("layers", "params", "pointers")

    def __init__(self, layers: list, params: list[torch.Tensor]):
        #: Per layer ``(W (out, in), bias column (out, 1), in-place activation or None)``.
        self.layers = layers
        self.params = params
        self.pointers = [p.data_ptr() for p in params]

    @classmethod
    def build(cls, mlp: Any) -> NumpyPlan | None:
        """For an ``MLP`` whose activation numpy has and that has no LayerNorm, else None."""
        if mlp.activation not in _NUMPY_ACTIVATIONS or mlp.norms is not None:
            return None
        params = [p for layer in mlp.layers for p in (layer.weight, layer.bias)]
        if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in params):
            return None
        last = len(mlp.layers) - 1
        layers = []
        for i, layer in enumerate(mlp.layers):
            act = _NUMPY_ACTIVATIONS[mlp.activation] if (i < last or mlp.activate_last) else None
            layers.append(
                (layer.weight.detach().numpy(), layer.bias.detach().numpy()[:, None], act)
            )
        return cls(layers, params)

    def run_transposed(self, h: np.ndarray) -> np.ndarray:
        """``(in, B)`` float32 input -> ``(out, B)`` output (a fresh array)."""
        for weight, bias, act in self.layers:
            h = weight @ h
            h += bias
            if act is not None:
                act(h)
        return h


class NumpyForward:
    """The default module's acting forward (encoder, policy head, optional values) on numpy.

    Built only for CPU float32 modules with flat (Box/MultiBinary) observations
    whose stacks all have a numpy activation; see :class:`NumpyPlan` for why.
    """

    __slots__ = ("encoder", "pi", "vf_encoder", "vf", "params", "pointers")

    def __init__(self, encoder: NumpyPlan, pi: NumpyPlan, vf_encoder: Any, vf: Any):
        self.encoder, self.pi, self.vf_encoder, self.vf = encoder, pi, vf_encoder, vf
        plans = [p for p in (encoder, pi, vf_encoder, vf) if p is not None]
        self.params = [p for plan in plans for p in plan.params]
        self.pointers = [q for plan in plans for q in plan.pointers]

    @classmethod
    def build(cls, module: Any) -> NumpyForward | None:
        """For a ``DefaultTorchRLModule`` (its ``encoder``/``pi``/``vf_encoder``/``vf``)."""
        stacks = [getattr(module, name, None) for name in ("encoder", "pi", "vf_encoder", "vf")]
        if module.inference_only:
            stacks[2:] = [None, None]
        plans = [None if s is None else NumpyPlan.build(s) for s in stacks]
        if any(p is None for s, p in zip(stacks, plans) if s is not None):
            return None
        return cls(*plans)

    def current(self) -> bool:
        """Whether every view still shows its parameter's storage (checked per call)."""
        return list(map(_DATA_PTR, self.params)) == self.pointers

    def __call__(self, x: np.ndarray, with_values: bool) -> tuple[np.ndarray, Any]:
        """``(B, in)`` float32 -> (policy output ``(B, D)``, values ``(B,)`` or None)."""
        xt = np.ascontiguousarray(x.T)
        ht = self.encoder.run_transposed(xt)
        pi_out = np.ascontiguousarray(self.pi.run_transposed(ht).T)
        values = None
        if with_values and self.vf is not None:
            hv = ht if self.vf_encoder is None else self.vf_encoder.run_transposed(xt)
            values = self.vf.run_transposed(hv).reshape(-1)
        return pi_out, values
