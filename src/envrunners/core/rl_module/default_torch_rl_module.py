"""The default MLP module, its spec helper, and the numpy-in/numpy-out acting path.

Runners act once per vector step for all sub-envs, so acting cost is paid
``steps / num_envs`` times per sample. ``compute_actions_numpy`` keeps that cost
near the cost of the matrix products: on CPU, for flat observations, the layers
run on numpy views of the parameters (``NumpyForward``: at acting batch sizes
torch's per-op dispatch costs more than the arithmetic) and a categorical is
sampled with numpy too (Gumbel-max from the logits); otherwise cached parameter
references, no module ``__call__`` machinery and numpy's SIMD ``tanh`` on the
torch buffers (this torch build's CPU ``tanh`` is scalar). Gaussians get their
log-density from the drawn noise. Randomness always comes from torch's RNG
(global, or the ``generator`` argument), so ``torch.manual_seed`` reproduces it.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from envrunners.core.columns import Columns
from envrunners.core.distributions import (
    TorchCategorical,
    TorchDiagGaussian,
    TorchMultiCategorical,
)
from envrunners.core.rl_module._default_parts import (
    _MLP,
    NumpyForward,
    _check_spaces,
    _resolve_model_config,
    _run,
)
from envrunners.core.rl_module.rl_module import RLModule, RLModuleSpec, StateDict

__all__ = ["DefaultTorchRLModule", "compute_actions_numpy", "default_rl_module_spec"]

_LOG_2PI = math.log(2.0 * math.pi)
_NO_CONTEXT = contextlib.nullcontext()


class DefaultTorchRLModule(RLModule):
    """RLlib-style default actor-critic MLP for flat observations.

    Observations are flattened (Box, MultiBinary) or one-hot encoded (Discrete,
    MultiDiscrete), go through an ``fcnet_hiddens`` encoder and a linear policy head
    producing ``ACTION_DIST_INPUTS`` for a categorical, multi-categorical or diagonal
    Gaussian (mean and log-std). A value head (own encoder unless
    ``vf_share_layers``) exists unless ``inference_only``.
    """

    def setup(self) -> None:
        """Build encoder, policy head and (unless inference-only) the value branch."""
        _check_spaces(self.observation_space, self.action_space)
        cfg = _resolve_model_config(self.model_config)
        self._cfg = cfg
        obs, act = self.observation_space, self.action_space
        if isinstance(obs, gym.spaces.Discrete):
            in_dim = int(obs.n)
        elif isinstance(obs, gym.spaces.MultiDiscrete):
            in_dim = int(obs.nvec.sum())
            offsets = np.concatenate([[0], np.cumsum(obs.nvec.ravel())[:-1]])
            self._obs_offsets = torch.as_tensor(offsets, dtype=torch.int64)
        else:
            in_dim = int(np.prod(obs.shape)) if obs.shape else 1
        if isinstance(act, gym.spaces.Discrete):
            self.action_dist_cls = TorchCategorical
        elif isinstance(act, gym.spaces.MultiDiscrete):
            self._nvec = [int(n) for n in act.nvec.ravel()]
            self.action_dist_cls = TorchMultiCategorical.get_partial_dist_cls(input_lens=self._nvec)
        else:
            self.action_dist_cls = TorchDiagGaussian
        self._free_log_std = isinstance(act, gym.spaces.Box) and bool(cfg["free_log_std"])
        dist_dim = self.action_dist_cls.required_input_dim(act)
        hiddens, heads = list(cfg["fcnet_hiddens"]), list(cfg["head_fcnet_hiddens"])
        enc_dim = hiddens[-1] if hiddens else in_dim
        self.encoder = _MLP([in_dim, *hiddens], cfg["fcnet_activation"], activate_last=True)
        pi_out = dist_dim // 2 if self._free_log_std else dist_dim
        self.pi = _MLP([enc_dim, *heads, pi_out], cfg["head_fcnet_activation"], False)
        if self._free_log_std:
            self.log_std = nn.Parameter(torch.zeros(pi_out))
        self._share = bool(cfg["vf_share_layers"])
        if not self.inference_only:
            if not self._share:
                self.vf_encoder = _MLP([in_dim, *hiddens], cfg["fcnet_activation"], True)
            self.vf = _MLP([enc_dim, *heads, 1], cfg["head_fcnet_activation"], False)
        self._fast: dict[str, Any] | None = None

    # ------------------------------------------------------------------ torch path
    def _encode_obs(self, obs: Any) -> torch.Tensor:
        """The float32 ``(B, in_dim)`` network input for a batch of raw observations."""
        if not isinstance(obs, torch.Tensor):
            obs = np.asarray(obs)
            obs = torch.from_numpy(obs if obs.flags.writeable else obs.copy())
        space = self.observation_space
        if isinstance(space, gym.spaces.Discrete):
            return F.one_hot(obs.long().reshape(-1), int(space.n)).float()
        if isinstance(space, gym.spaces.MultiDiscrete):
            index = obs.long().reshape(obs.shape[0], -1) + self._obs_offsets.to(obs.device)
            out = torch.zeros(obs.shape[0], int(space.nvec.sum()), device=obs.device)
            return out.scatter_(1, index, 1.0)
        x = obs.reshape(obs.shape[0], -1)
        return x if x.dtype == torch.float32 else x.float()

    def _dist_inputs(self, pi_out: torch.Tensor) -> torch.Tensor:
        if self._free_log_std:
            return torch.cat([pi_out, self.log_std.expand_as(pi_out)], dim=-1)
        if isinstance(self.action_space, gym.spaces.Box):
            mean, log_std = pi_out.chunk(2, dim=-1)
            clip = float(self._cfg["log_std_clip_param"])
            return torch.cat([mean, log_std.clamp(-clip, clip)], dim=-1)
        return pi_out

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        x = self._encode_obs(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: self._dist_inputs(self.pi(self.encoder(x)))}

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        x = self._encode_obs(batch[Columns.OBS])
        embeddings = self.encoder(x)
        return {
            Columns.ACTION_DIST_INPUTS: self._dist_inputs(self.pi(embeddings)),
            Columns.VF_PREDS: self._values(x, embeddings),
        }

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """Value estimates ``(B,)`` for ``batch[Columns.OBS]`` (learners, GAE bootstrap).

        Raises:
            RuntimeError: The module was built ``inference_only`` (no value head).
        """
        return self._values(self._encode_obs(batch[Columns.OBS]), embeddings)

    def _values(self, x: torch.Tensor, embeddings: torch.Tensor | None) -> torch.Tensor:
        if self.inference_only:
            raise RuntimeError(
                "This DefaultTorchRLModule was built inference_only=True and has no value "
                "head; build it with inference_only=False to compute values."
            )
        if self._share:
            h = self.encoder(x) if embeddings is None else embeddings
        else:
            h = self.vf_encoder(x)
        return self.vf(h).squeeze(-1)

    def _inference_only_get_state_hook(self, state: StateDict) -> StateDict:
        return {k: v for k, v in state.items() if not k.startswith(("vf.", "vf_encoder."))}

    # ------------------------------------------------------------------ fast path
    def _apply(self, *args: Any, **kwargs: Any) -> Any:
        self._fast = None  # parameters may be new objects after .to() / .float()
        return super()._apply(*args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fast"] = None  # holds callables and parameter references; rebuilt on use
        return state

    def set_state(self, state: StateDict) -> None:
        """``RLModule.set_state``; also drops the acting path's views of replaced storage.

        Why: adopted weights replace parameter storage; numpy views of the old
        storage would otherwise keep it (and its object-store pages) alive.
        """
        self._fast = None
        super().set_state(state)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """``nn.Module.load_state_dict`` that also refreshes the acting path's references."""
        self._fast = None
        return super().load_state_dict(*args, **kwargs)

    def _fast_plan(self) -> dict[str, Any]:
        """Collect parameter references and per-space decisions once, not per call."""
        device = next(self.parameters()).device
        cpu = device.type == "cpu"
        space = self.action_space
        if isinstance(space, gym.spaces.Box):
            kind = "gaussian"
        elif isinstance(space, gym.spaces.MultiDiscrete):
            kind = "multi_categorical"
        else:
            kind = "categorical"
        box_obs = cpu and isinstance(
            self.observation_space, (gym.spaces.Box, gym.spaces.MultiBinary)
        )
        fast: dict[str, Any] = {
            "device": device,
            "cpu": cpu,
            "encoder": self.encoder.plan(numpy_tanh=cpu),
            "pi": self.pi.plan(numpy_tanh=cpu),
            "box_obs": box_obs,
            "kind": kind,
            "to_numpy": torch.Tensor.numpy if cpu else _cpu_numpy,
            "action_dtype": np.dtype(space.dtype),
            "action_shape": tuple(space.shape),
            "vf": None if self.inference_only else self.vf.plan(numpy_tanh=cpu),
            "vf_encoder": None
            if self.inference_only or self._share
            else self.vf_encoder.plan(numpy_tanh=cpu),
            # Flat float input on CPU: the layers run on numpy (see NumpyForward).
            "numpy": NumpyForward.build(self) if box_obs else None,
        }
        if kind == "gaussian":
            k = int(space.shape[0])
            # logp = -0.5 |noise|^2 - sum(log_std) - k/2 log(2 pi), as one addmv.
            fast["logp_weights"] = torch.tensor([-0.5] * k + [-1.0] * k, device=device)
            fast["logp_const"] = torch.tensor(-0.5 * k * _LOG_2PI, device=device)
        self._fast = fast
        return fast

    def compute_actions_numpy(
        self,
        obs: np.ndarray,
        *,
        explore: bool,
        with_values: bool = False,
        generator: torch.Generator | None = None,
    ) -> dict[str, np.ndarray]:
        """Act for a batch of observations: numpy in, numpy out, no autograd.

        Args:
            obs: ``(B, *obs_shape)`` observations (the vector env's batch).
            explore: Sample (Gumbel-max / Gaussian noise) if True, else act greedily
                (argmax / mean) with ``action_logp`` 0.
            with_values: Also return ``vf_preds`` (needs a non-inference-only module).
            generator: torch RNG to draw from; default torch's global RNG.

        Returns:
            ``actions`` (B, ...) in the action space's dtype, ``action_logp`` (B,)
            float32, ``action_dist_inputs`` (B, D) float32 and, if asked, ``vf_preds``
            (B,) float32. The arrays are fresh (not reused by later calls).
        """
        fast = self._fast or self._fast_plan()
        numpy_forward = fast["numpy"]
        if numpy_forward is not None and not numpy_forward.current():
            fast = self._fast_plan()  # a parameter's storage was replaced
            numpy_forward = fast["numpy"]
        to_numpy = fast["to_numpy"]
        kind = fast["kind"]
        if fast["box_obs"]:
            if type(obs) is not np.ndarray:
                obs = np.asarray(obs)
            # torch.from_numpy (the torch layers) needs writable memory; numpy does not.
            if obs.dtype != np.float32 or (numpy_forward is None and not obs.flags.writeable):
                obs = obs.astype(np.float32)
        values = None
        if numpy_forward is not None:
            if with_values and numpy_forward.vf is None:
                self._values(None, None)  # raises the inference-only error
            pi_np, values = numpy_forward(
                obs if obs.ndim == 2 else obs.reshape(obs.shape[0], -1), with_values
            )
            if kind == "categorical":  # no torch call but the exponential draws
                return _categorical_numpy_outputs(pi_np, values, explore, generator, fast)
            pi_out = torch.from_numpy(pi_np)
        # Only torch layers (and the Gaussian's log-std parameter) need autograd off;
        # the numpy forward's outputs are plain tensors (entering the mode costs ~1.5 us).
        no_autograd = numpy_forward is None or kind == "gaussian"
        with torch.inference_mode() if no_autograd else _NO_CONTEXT:
            if numpy_forward is None:
                if fast["box_obs"]:
                    x = torch.from_numpy(obs)
                    if x.dim() != 2:
                        x = x.reshape(x.shape[0], -1)
                else:
                    x = self._encode_obs(torch.from_numpy(np.array(obs)).to(fast["device"]))
                h = _run(fast["encoder"], x)
                pi_out = _run(fast["pi"], h)
            if kind == "categorical":
                if fast["cpu"] and explore:  # numpy results (see the function)
                    actions, logp = _sample_categorical_cpu(pi_out, generator)
                else:
                    actions, logp = _sample_categorical(pi_out, explore, generator)
                inputs = pi_out
            elif kind == "gaussian":
                actions, logp, inputs = self._sample_gaussian(pi_out, explore, generator)
            else:
                parts = [
                    _sample_categorical(p, explore, generator) for p in pi_out.split(self._nvec, -1)
                ]
                actions = torch.stack([a for a, _ in parts], dim=-1)
                actions = actions.reshape((actions.shape[0], *fast["action_shape"]))
                logp = None if not explore else sum(lp for _, lp in parts)
                inputs = pi_out
            out = {
                Columns.ACTIONS: _as_numpy(actions, to_numpy),
                Columns.ACTION_LOGP: np.zeros(len(obs), np.float32)
                if logp is None
                else _as_numpy(logp, to_numpy),
                Columns.ACTION_DIST_INPUTS: to_numpy(inputs),
            }
            if values is not None:
                out[Columns.VF_PREDS] = values
            elif with_values:
                if fast["vf"] is None:
                    self._values(x, h)  # raises the inference-only error
                hv = h if fast["vf_encoder"] is None else _run(fast["vf_encoder"], x)
                out[Columns.VF_PREDS] = to_numpy(_run(fast["vf"], hv).reshape(-1))
        return _with_action_dtype(out, fast)

    def _sample_gaussian(
        self, pi_out: torch.Tensor, explore: bool, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Sample (or take the mean); returns actions, logp (None if greedy), dist inputs.

        Few, fused ops: each tiny torch op costs microseconds here, the math nothing.
        """
        fast = self._fast
        if self._free_log_std:
            mean, log_std = pi_out, self.log_std.expand_as(pi_out)
            inputs = torch.cat([mean, log_std], dim=-1)
        else:
            inputs = pi_out  # fresh from F.linear: clip its log-std half in place
            k = inputs.shape[-1] // 2
            clip = float(self._cfg["log_std_clip_param"])
            mean, log_std = inputs[:, :k], inputs[:, k:].clamp_(-clip, clip)
        if not explore:
            return mean.clone(), None, inputs
        noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        actions = torch.addcmul(mean, log_std.exp(), noise)
        stacked = torch.cat([noise.square_(), log_std], dim=-1)
        return actions, torch.addmv(fast["logp_const"], stacked, fast["logp_weights"]), inputs


def _categorical_numpy_outputs(
    logits: np.ndarray,
    values: np.ndarray | None,
    explore: bool,
    generator: torch.Generator | None,
    fast: dict[str, Any],
) -> dict[str, np.ndarray]:
    """The acting outputs of a categorical policy from the numpy forward's logits."""
    if explore:
        actions, logp = _sample_categorical_numpy(logits, generator)
    else:
        actions, logp = logits.argmax(-1), np.zeros(len(logits), np.float32)
    out = {
        Columns.ACTIONS: actions,
        Columns.ACTION_LOGP: logp,
        Columns.ACTION_DIST_INPUTS: logits,
    }
    if values is not None:
        out[Columns.VF_PREDS] = values
    return _with_action_dtype(out, fast)


def _with_action_dtype(out: dict[str, np.ndarray], fast: dict[str, Any]) -> dict[str, np.ndarray]:
    """``out`` with its actions in the action space's dtype."""
    actions = out[Columns.ACTIONS]
    if actions.dtype != fast["action_dtype"]:
        out[Columns.ACTIONS] = actions.astype(fast["action_dtype"])
    return out


def _cpu_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.cpu().numpy()


def _as_numpy(value: Any, to_numpy: Any) -> np.ndarray:
    """``value`` as numpy: already one, or a tensor through ``to_numpy``."""
    return value if type(value) is np.ndarray else to_numpy(value)


class _NoiseBuffers(threading.local):
    """Per thread, per ``(rows, width)``: a torch buffer for the exponential draws, its
    numpy view and the flat index of each row's start."""

    def __init__(self) -> None:
        self.by_shape: dict[tuple[int, int], tuple[torch.Tensor, np.ndarray, np.ndarray]] = {}

    def get(self, rows: int, width: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        entry = self.by_shape.get((rows, width))
        if entry is None:
            with torch.inference_mode(False):  # a normal tensor: filled in and out of the mode
                buffer = torch.empty((rows, width))
            entry = self.by_shape[(rows, width)] = (
                buffer,
                buffer.numpy(),
                np.arange(rows) * width,
            )
        return entry


_NOISE = _NoiseBuffers()


def _sample_categorical_cpu(
    logits: torch.Tensor, generator: torch.Generator | None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_sample_categorical` (explore) for CPU logits, returning numpy arrays.

    The same torch draws and the same arithmetic, but the steps after the draw run
    on numpy views of the tensors, and the draws fill a reused (per-thread) buffer:
    on a few dozen logits each torch call costs microseconds of dispatch, each numpy
    call a fraction of that.
    """
    log_probs = torch.log_softmax(logits, dim=-1).numpy()
    actions, starts = _gumbel_max(log_probs, generator)
    return actions, log_probs.reshape(-1)[starts + actions]


def _sample_categorical_numpy(
    logits: np.ndarray, generator: torch.Generator | None
) -> tuple[np.ndarray, np.ndarray]:
    """Gumbel-max sample and its log-probability for numpy logits (torch's draws).

    ``argmax(l - log E)`` is ``argmax(log_softmax(l) - log E)`` (a per-row shift);
    the log-probability is ``l - logsumexp(l)``, with numpy's stable
    ``logaddexp.reduce`` (one reduction instead of max, shift, exp, sum and log).
    """
    actions, starts = _gumbel_max(logits, generator)
    log_norm = np.logaddexp.reduce(logits, axis=-1)
    return actions, logits.reshape(-1)[starts + actions] - log_norm


def _gumbel_max(
    scores: np.ndarray, generator: torch.Generator | None
) -> tuple[np.ndarray, np.ndarray]:
    """``argmax(scores - log E)`` per row, ``E`` torch's exponential draws; also the flat
    index of each row's start (to pick the chosen entries out of ``scores``)."""
    rows, width = scores.shape
    buffer, noise, starts = _NOISE.get(rows, width)
    buffer.exponential_(generator=generator)
    perturbed = np.log(noise)  # a fresh array: the buffer is only read here
    return np.subtract(scores, perturbed, out=perturbed).argmax(-1), starts


def _sample_categorical(
    logits: torch.Tensor, explore: bool, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gumbel-max sample (or argmax) and its log-probability (``None`` when greedy).

    ``argmax(log_softmax(l) - log(E))`` with ``E ~ Exp(1)``; logits here are finite
    network outputs, so an ``E`` of exactly 0 just wins its row, as in the limit.
    """
    if not explore:
        return logits.argmax(-1), None
    log_probs = torch.log_softmax(logits, dim=-1)
    scores = torch.empty_like(logits).exponential_(generator=generator).log_()
    actions = torch.sub(log_probs, scores, out=scores).argmax(-1, keepdim=True)
    return actions.squeeze(-1), log_probs.gather(-1, actions).squeeze(-1)


def default_rl_module_spec(
    observation_space: gym.Space,
    action_space: gym.Space,
    model_config: Any = None,
    inference_only: bool = False,
) -> RLModuleSpec:
    """An ``RLModuleSpec`` for :class:`DefaultTorchRLModule`, checked against the spaces.

    Raises:
        ConfigError: A space the default module cannot handle (the message names it,
            what is supported and how to plug in a custom module).
    """
    _check_spaces(observation_space, action_space)
    return RLModuleSpec(
        module_class=DefaultTorchRLModule,
        observation_space=observation_space,
        action_space=action_space,
        inference_only=inference_only,
        model_config=model_config,
    )


def compute_actions_numpy(
    module: RLModule,
    obs: np.ndarray,
    explore: bool,
    *,
    with_values: bool = False,
    generator: torch.Generator | None = None,
    **forward_kwargs: Any,
) -> dict[str, np.ndarray]:
    """Act with any RLModule on a numpy batch; the sampler's single entry point.

    Modules with their own ``compute_actions_numpy`` (the default module) use it;
    others run ``forward_exploration`` / ``forward_inference`` on ``{OBS: tensor}``
    and, unless they returned ``actions`` themselves, sample from their action
    distribution class (made deterministic when ``explore`` is False).

    Returns:
        Every tensor the forward pass returned, as numpy, plus ``actions`` and
        ``action_logp`` (and ``vf_preds`` if ``with_values`` and computable).
    """
    fast = getattr(module, "compute_actions_numpy", None)
    if fast is not None:  # forward kwargs such as the timestep ``t`` do not apply to it
        return fast(obs, explore=explore, with_values=with_values, generator=generator)
    from envrunners.utils.torch_utils import convert_to_torch_tensor

    with torch.inference_mode():
        device = next(iter(module.parameters()), torch.empty(0)).device
        batch = {Columns.OBS: convert_to_torch_tensor(np.asarray(obs), device=device)}
        if explore:
            out = dict(module.forward_exploration(batch, **forward_kwargs))
        else:
            out = dict(module.forward_inference(batch, **forward_kwargs))
        if Columns.ACTIONS not in out:
            if explore:
                dist_cls = module.get_exploration_action_dist_cls()
            else:
                dist_cls = module.get_inference_action_dist_cls()
            dist = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
            if not explore:
                dist = dist.to_deterministic()
            out[Columns.ACTIONS] = dist.sample(generator=generator)
            if Columns.ACTION_LOGP not in out:
                out[Columns.ACTION_LOGP] = dist.logp(out[Columns.ACTIONS])
        if with_values and Columns.VF_PREDS not in out and hasattr(module, "compute_values"):
            out[Columns.VF_PREDS] = module.compute_values(batch)
        result = {
            k: (v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v)
            for k, v in out.items()
        }
    space = getattr(module, "action_space", None)
    dtype = getattr(space, "dtype", None)
    if dtype is not None:
        result[Columns.ACTIONS] = np.asarray(result[Columns.ACTIONS]).astype(dtype, copy=False)
    if Columns.ACTION_LOGP in result:
        result[Columns.ACTION_LOGP] = np.asarray(result[Columns.ACTION_LOGP], dtype=np.float32)
    return result
