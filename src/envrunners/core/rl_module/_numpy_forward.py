"""The default module's acting forward on numpy views of its torch parameters.

Runners act once per vector step for all sub-envs; at those batch sizes torch's
per-op dispatch costs more than the arithmetic, so the acting path runs the MLP
layers with numpy (:class:`NumpyForward`; the LSTM module's step:
:class:`NumpyRecurrentForward`) or, where numpy cannot, with cached parameter
references and in-place activations (:func:`mlp_plan`, :func:`run_plan`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "NumpyForward",
    "NumpyLSTM",
    "NumpyPlan",
    "NumpyRecurrentForward",
    "mlp_plan",
    "run_plan",
]


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
#: Per activation name: ``(ufunc, second operand or None)``, applied in place as
#: ``ufunc(h, h)`` / ``ufunc(h, operand, out=h)`` (no Python frame per layer).
_NUMPY_ACTIVATIONS: dict[Any, tuple[Any, Any]] = {
    "tanh": (np.tanh, None),
    "relu": (np.maximum, np.float32(0.0)),
    "linear": (None, None),
    None: (None, None),
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
        #: Per layer ``(W (out, in), bias column (out, 1), activation ufunc or None, its
        #: second operand or None)``.
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
            act, operand = _NUMPY_ACTIVATIONS[mlp.activation]
            if i == last and not mlp.activate_last:
                act = operand = None
            weight, bias = layer.weight.detach().numpy(), layer.bias.detach().numpy()[:, None]
            layers.append((weight, bias, act, operand))
        return cls(layers, params)

    def run_transposed(self, h: np.ndarray) -> np.ndarray:
        """``(in, B)`` float32 input -> ``(out, B)`` output (a fresh array)."""
        return _run_layers(self.layers, h)


def _run_layers(layers: list, h: np.ndarray) -> np.ndarray:
    """Apply :class:`NumpyPlan` layers to the ``(in, B)`` input ``h``: one loop for any
    number of stacks (a unary ufunc gets its output positionally: parsed faster than ``out=``)."""
    for weight, bias, act, operand in layers:
        h = weight @ h
        h += bias
        if act is not None:
            if operand is None:
                act(h, h)
            else:
                act(h, operand, out=h)  # (np.maximum takes ``out`` by keyword only)
    return h


class NumpyForward:
    """The default module's acting forward (encoder, policy head, optional values) on numpy.

    Built only for CPU float32 modules with non-image observations (flat Box/MultiBinary
    as they are; Discrete, MultiDiscrete, Dict and Tuple encoded on numpy first, see
    ``ObservationLayout.encode_numpy``) whose stacks all have a numpy activation; see
    :class:`NumpyPlan` for why.
    """

    __slots__ = (
        "encoder",
        "pi",
        "vf_encoder",
        "vf",
        "params",
        "pointers",
        "pi_params",
        "pi_pointers",
        "pi_layers",
    )

    def __init__(self, encoder: NumpyPlan, pi: NumpyPlan, vf_encoder: Any, vf: Any):
        self.encoder, self.pi, self.vf_encoder, self.vf = encoder, pi, vf_encoder, vf
        plans = [p for p in (encoder, pi, vf_encoder, vf) if p is not None]
        self.params = [p for plan in plans for p in plan.params]
        self.pointers = [q for plan in plans for q in plan.pointers]
        #: The policy path's own parameters (acting without values reads no others).
        self.pi_params = [*encoder.params, *pi.params]
        self.pi_pointers = [*encoder.pointers, *pi.pointers]
        #: The encoder's and the policy head's layers in one list (one loop runs both).
        self.pi_layers = [*encoder.layers, *pi.layers]

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

    def current(self, with_values: bool = True) -> bool:
        """Whether every view still shows its parameter's storage (checked per call);
        with ``with_values=False`` only the views of the policy path, the ones it runs."""
        if not with_values:
            return list(map(_DATA_PTR, self.pi_params)) == self.pi_pointers
        return list(map(_DATA_PTR, self.params)) == self.pointers

    def __call__(self, x: np.ndarray, with_values: bool) -> tuple[np.ndarray, Any]:
        """``(B, in)`` float32 -> (policy output ``(B, D)``, values ``(B,)`` or None)."""
        pi_t, values = self.forward_transposed(x, with_values)
        return np.ascontiguousarray(pi_t.T), values

    def forward_transposed(self, x: np.ndarray, with_values: bool) -> tuple[np.ndarray, Any]:
        """``(B, in)`` float32 -> (policy output ``(D, B)``, values ``(B,)`` or None).

        The policy output in the layers' own layout (fresh, C-contiguous): a
        reduction over its ``D`` rows runs along contiguous ``B``-long rows.
        """
        xt = x.T.copy()  # C order (a copy, as ``ascontiguousarray`` makes here, in half the time)
        if not with_values or self.vf is None:
            return _run_layers(self.pi_layers, xt), None
        ht = self.encoder.run_transposed(xt)
        pi_t = self.pi.run_transposed(ht)
        hv = ht if self.vf_encoder is None else self.vf_encoder.run_transposed(xt)
        return pi_t, self.vf.run_transposed(hv).reshape(-1)


class NumpyLSTM:
    """One time step of a one-layer ``nn.LSTM`` on numpy views of its (CPU, float32) weights.

    Why: the runner steps the LSTM once per vector step with a few dozen rows, where
    ``nn.LSTM`` costs milliseconds of dispatch and a slow small-matrix product; here
    it is two BLAS products and a few whole-array passes. The layout is transposed
    like :class:`NumpyPlan` (``(features, B)``), so the gates ``i, f, g, o`` are
    contiguous row blocks and the weights are used in their own storage (in-place
    updates show through; a replaced storage changes the data pointers).
    """

    __slots__ = ("w_ih", "w_hh", "b_ih", "b_hh", "cell", "params", "pointers")

    def __init__(self, lstm: Any):
        self.params = [lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0]
        self.pointers = [p.data_ptr() for p in self.params]
        self.w_ih, self.w_hh, b_ih, b_hh = (p.detach().numpy() for p in self.params)
        self.b_ih, self.b_hh = b_ih[:, None], b_hh[:, None]
        self.cell = int(lstm.hidden_size)

    @classmethod
    def build(cls, lstm: Any) -> NumpyLSTM | None:
        """For a one-layer, unidirectional CPU float32 ``nn.LSTM`` with biases, else None."""
        if lstm.num_layers != 1 or lstm.bidirectional or not lstm.bias or lstm.proj_size:
            return None
        weights = (lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)
        if any(p.device.type != "cpu" or p.dtype != torch.float32 for p in weights):
            return None
        return cls(lstm)

    def step(self, xt: np.ndarray, ht: np.ndarray, ct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``x (in, B)``, ``h``, ``c`` ``(cell, B)`` -> the next ``h``, ``c`` (fresh arrays)."""
        cell = self.cell
        gates = self.w_ih @ xt
        gates += self.w_hh @ ht
        gates += self.b_ih + self.b_hh  # (4 cell, 1): one broadcast pass over the gates
        # sigmoid(x) = 0.5 tanh(x / 2) + 0.5: one tanh pass (numpy's SIMD kernel) for all
        # four gates; the halving runs on the contiguous i, f and o row blocks.
        sigmoids = (gates[: 2 * cell], gates[3 * cell :])
        for sigmoid in sigmoids:
            sigmoid *= 0.5
        np.tanh(gates, out=gates)
        for sigmoid in sigmoids:
            sigmoid *= 0.5
            sigmoid += 0.5
        c = gates[cell : 2 * cell] * ct
        c += gates[:cell] * gates[2 * cell : 3 * cell]
        h = np.tanh(c)
        h *= gates[3 * cell :]
        return h, c


class NumpyRecurrentForward:
    """The default LSTM module's acting step (encoder, LSTM, policy head, critic) on numpy.

    Computes exactly what the module's torch forward computes for one time step:
    the actor's logits and state, the critic's state too when it has its own
    encoder and LSTM (``vf_share_layers=False``: RLlib records both in
    ``STATE_OUT``), and values on request. Previous actions (one-hot, Discrete
    actions) and rewards join the LSTM input as in the torch forward. Built only
    for CPU float32 modules with non-image observations (the encoder input: nested or
    discrete ones encoded on numpy first) and stacks numpy can run.
    """

    __slots__ = (
        "actor",
        "critic",
        "pi",
        "vf",
        "share",
        "num_actions",
        "prev_actions",
        "prev_rewards",
        "params",
        "pointers",
    )

    def __init__(self, module: Any, actor: tuple, critic: tuple | None, pi: Any, vf: Any):
        cfg = module._cfg
        self.actor, self.critic, self.pi, self.vf = actor, critic, pi, vf
        self.share = critic is None
        self.num_actions = int(module.action_space.n)
        self.prev_actions = bool(cfg["lstm_use_prev_action"])
        self.prev_rewards = bool(cfg["lstm_use_prev_reward"])
        parts = [*actor, *(critic or ()), pi, *([vf] if vf is not None else [])]
        self.params = [p for part in parts for p in part.params]
        self.pointers = [q for part in parts for q in part.pointers]

    @classmethod
    def build(cls, module: Any) -> NumpyRecurrentForward | None:
        """For a stateful ``DefaultTorchRLModule`` with Discrete actions, else None."""
        if not isinstance(module.action_space, gym.spaces.Discrete):
            return None
        branches = [(module.encoder, module.lstm)]
        if not module._share:
            branches.append((module.vf_encoder, module.vf_lstm))
        built = []
        for encoder, lstm in branches:
            pair = (NumpyPlan.build(encoder), NumpyLSTM.build(lstm))
            if None in pair:
                return None
            built.append(pair)
        pi = NumpyPlan.build(module.pi)
        vf = None if module.inference_only else NumpyPlan.build(module.vf)
        if pi is None or (vf is None and not module.inference_only):
            return None
        return cls(module, built[0], built[1] if len(built) > 1 else None, pi, vf)

    def current(self) -> bool:
        """Whether every view still shows its parameter's storage (checked per call)."""
        return list(map(_DATA_PTR, self.params)) == self.pointers

    def __call__(
        self, x: np.ndarray, state: Any, extra_inputs: Any, with_values: bool
    ) -> tuple[np.ndarray, np.ndarray | None, Any] | None:
        """``(B, in)`` float32 obs, the ``(B, 1, cell)`` state -> (logits ``(B, D)``,
        values ``(B,)`` or None, state out); None when an input the LSTM reads is missing."""
        extras = []
        if self.prev_actions or self.prev_rewards:
            if extra_inputs is None:
                return None
            if self.prev_actions:
                if "prev_actions" not in extra_inputs:
                    return None
                prev = np.asarray(extra_inputs["prev_actions"]).reshape(-1)
                one_hot = np.zeros((self.num_actions, prev.shape[0]), np.float32)
                one_hot[prev, np.arange(prev.shape[0])] = 1.0
                extras.append(one_hot)
            if self.prev_rewards:
                if "prev_rewards" not in extra_inputs:
                    return None
                extras.append(np.asarray(extra_inputs["prev_rewards"], np.float32).reshape(1, -1))
        xt = np.ascontiguousarray(x.T)
        if self.share:
            h, actor_state = _lstm_branch(self.actor, xt, extras, state)
            state_out = actor_state
            hv = h
        else:
            h, actor_state = _lstm_branch(self.actor, xt, extras, state["actor"])
            hv, critic_state = _lstm_branch(self.critic, xt, extras, state["critic"])
            state_out = {"actor": actor_state, "critic": critic_state}
        logits = np.ascontiguousarray(self.pi.run_transposed(h).T)
        values = None
        if with_values and self.vf is not None:
            values = self.vf.run_transposed(hv).reshape(-1)
        return logits, values, state_out


def _lstm_branch(
    branch: tuple[NumpyPlan, NumpyLSTM], xt: np.ndarray, extras: list, state: Any
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Encoder and one LSTM step: ``(cell, B)`` output and the ``(B, 1, cell)`` state out."""
    encoder, lstm = branch
    features = encoder.run_transposed(xt)
    if extras:
        features = np.concatenate([features, *extras], axis=0)
    h_in = np.asarray(state["h"])
    c_in = np.asarray(state["c"])
    h, c = lstm.step(features, h_in.reshape(h_in.shape[0], -1).T, c_in.reshape(c_in.shape[0], -1).T)
    return h, {"h": h.T[:, None], "c": c.T[:, None]}
