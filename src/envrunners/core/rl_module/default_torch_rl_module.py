"""The default module (MLP / CNN encoder, optional LSTM, policy and value heads) and its acting path.

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
Stateful (LSTM) modules with flat observations and Discrete actions step their
encoders and LSTMs on numpy too (``act_recurrent_numpy``); other stateful modules
act through ``forward_exploration`` / ``forward_inference`` on time-ranked
batches (see ``envrunners.core.rl_module._acting``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from envrunners.core import _nested
from envrunners.core.columns import Columns
from envrunners.core.rl_module._acting import act
from envrunners.core.rl_module._numpy_forward import (
    NumpyForward,
    NumpyRecurrentForward,
    mlp_plan,
    run_plan,
)
from envrunners.core.rl_module._space_layout import (
    ActionLayout,
    ObservationLayout,
    cast_to_space,
    is_image_space,
)
from envrunners.core.rl_module._torch_encoders import (
    CNN,
    MLP,
    conv_layer_shapes,
    default_conv_filters,
    init_layer,
)
from envrunners.core.rl_module.apis.value_function_api import ValueFunctionAPI
from envrunners.core.rl_module.default_model_config import (
    check_model_config_keys,
    resolve_model_config,
)
from envrunners.core.rl_module.rl_module import (
    RLModule,
    RLModuleSpec,
    StateDict,
    _model_config_dict,
)
from envrunners.core.rl_module.torch.torch_rl_module import TorchRLModule

__all__ = ["DefaultTorchRLModule", "compute_actions_numpy", "default_rl_module_spec"]

_LOG_2PI = math.log(2.0 * math.pi)
_LOGADDEXP = np.logaddexp
_FLOAT32 = np.dtype(np.float32)  # (a dtype compares with a dtype faster than with a type)
_LOGADDEXP_REDUCE = np.logaddexp.reduce
_NO_CONTEXT = contextlib.nullcontext()
#: Batch keys of the previous actions / rewards an LSTM with
#: ``lstm_use_prev_action`` / ``lstm_use_prev_reward`` reads (RLlib's old-stack names).
PREV_ACTIONS = "prev_actions"
PREV_REWARDS = "prev_rewards"


class DefaultTorchRLModule(TorchRLModule, ValueFunctionAPI):
    """RLlib-style default actor-critic module, built from ``DefaultModelConfig``.

    Encoder: a CNN for image observations (3-D ``Box``, ``H x W x C``; uint8 frames
    are cast inside), else an ``fcnet_hiddens`` MLP over the flattened / one-hot
    observation (``Dict`` and ``Tuple`` observations are flattened leaf by leaf).
    With ``use_lstm`` an LSTM follows the encoder and the module is stateful:
    batches are time-ranked ``(B, T, ...)``, ``Columns.STATE_IN`` holds
    ``{"h": (B, 1, cell), "c": (B, 1, cell)}`` (nested under ``"actor"`` and
    ``"critic"`` when ``vf_share_layers`` is False) and outputs carry
    ``Columns.STATE_OUT`` alike. A linear policy head (after ``head_fcnet_hiddens``)
    gives ``ACTION_DIST_INPUTS`` for a categorical, multi-categorical, diagonal
    Gaussian or, for ``Dict``/``Tuple`` actions, a ``TorchMultiDistribution``. A
    value head (own encoder unless ``vf_share_layers``) exists unless
    ``inference_only``.
    """

    def setup(self) -> None:
        """Build encoder (CNN or MLP), optional LSTM, policy head and the value branch.

        Raises:
            ConfigError: A space the module cannot handle, an image size without
                default conv filters, or ``conv_filters`` that do not fit the image.
        """
        cfg = resolve_model_config(self.model_config)
        self._cfg = cfg
        self._obs_layout = ObservationLayout(self.observation_space)
        self._act_layout = ActionLayout(self.action_space)
        act = self.action_space
        self.action_dist_cls = self._act_layout.dist_cls
        if self._act_layout.kind == "multi_categorical":
            self._nvec = [int(n) for n in act.nvec.ravel()]
        self._free_log_std = isinstance(act, gym.spaces.Box) and bool(cfg["free_log_std"])
        self._stateful = bool(cfg["use_lstm"])
        self._share = bool(cfg["vf_share_layers"])
        dist_dim = self._act_layout.dist_dim
        self.encoder, enc_dim = self._build_encoder()
        if self._stateful:
            self.lstm = self._build_lstm(enc_dim)
            enc_dim = int(cfg["lstm_cell_size"])
        heads = list(cfg["head_fcnet_hiddens"])
        pi_out = dist_dim // 2 if self._free_log_std else dist_dim
        self.pi = self._head([enc_dim, *heads, pi_out])
        if self._free_log_std:
            self.log_std = nn.Parameter(torch.zeros(pi_out))
        # A stateful critic with its own layers runs even in an inference-only copy: the
        # runner records its state for the learner (as RLlib does).
        if not self._share and (not self.inference_only or self._stateful):
            self.vf_encoder, vf_dim = self._build_encoder()
            if self._stateful:
                self.vf_lstm = self._build_lstm(vf_dim)
        if not self.inference_only:
            self.vf = self._head([enc_dim, *heads, 1])
        self._fast: dict[str, Any] | None = None
        #: The stateful acting step (None: not built yet, False: not available).
        self._fast_recurrent: NumpyRecurrentForward | bool | None = None

    def _build_encoder(self) -> tuple[nn.Module, int]:
        cfg = self._cfg
        if self._obs_layout.image:
            shape = self.observation_space.shape
            filters = cfg["conv_filters"] or default_conv_filters(shape)
            cnn = CNN(shape, filters, cfg)
            return cnn, cnn.out_dim
        hiddens = list(cfg["fcnet_hiddens"])
        in_dim = int(self._obs_layout.in_dim)
        mlp = MLP(
            [in_dim, *hiddens],
            cfg["fcnet_activation"],
            activate_last=True,
            layernorm=bool(cfg["fcnet_use_layernorm"]),
            cfg=cfg,
            init_prefix="fcnet",
        )
        return mlp, hiddens[-1] if hiddens else in_dim

    def _build_lstm(self, enc_dim: int) -> nn.LSTM:
        cfg = self._cfg
        extra = self._act_layout.one_hot_dim if cfg["lstm_use_prev_action"] else 0
        extra += 1 if cfg["lstm_use_prev_reward"] else 0
        lstm = nn.LSTM(enc_dim + extra, int(cfg["lstm_cell_size"]), batch_first=True)
        init_layer(lstm, cfg, "lstm")
        return lstm

    def _head(self, sizes: list[int]) -> MLP:
        cfg = self._cfg
        return MLP(
            sizes,
            cfg["head_fcnet_activation"],
            activate_last=False,
            layernorm=bool(cfg["head_fcnet_use_layernorm"]),
            cfg=cfg,
            init_prefix="head_fcnet",
        )

    # ------------------------------------------------------------------ state
    def get_initial_state(self) -> dict[str, Any]:
        """``{"h": (1, cell), "c": (1, cell)}`` zeros (RLlib's layout: one LSTM layer).

        Nested under ``"actor"`` and ``"critic"`` when the value branch has its own
        LSTM (``vf_share_layers=False``); ``{}`` for a stateless module.
        """
        if not self._stateful:
            return {}
        cell = int(self._cfg["lstm_cell_size"])
        device = self.device

        def zeros() -> dict[str, torch.Tensor]:
            return {
                "h": torch.zeros(1, cell, device=device),
                "c": torch.zeros(1, cell, device=device),
            }

        return zeros() if self._share else {"actor": zeros(), "critic": zeros()}

    def is_stateful(self) -> bool:
        """Whether the module has an LSTM (``use_lstm``)."""
        return self._stateful

    # ------------------------------------------------------------------ torch path
    def _encode_obs(self, obs: Any) -> torch.Tensor:
        """The encoder input for a batch of raw observations (``(N, ...)``, nested or not)."""
        layout = self._obs_layout
        return layout.encode(layout.to_tensor(obs, self.device))

    def _features(
        self, batch: dict[str, Any], encoder: nn.Module, lstm: nn.LSTM | None, state: Any
    ) -> tuple[torch.Tensor, Any]:
        """Encoder (and LSTM) output for ``batch`` and the LSTM's state out (None if none).

        Stateless: ``(B, F)``. Stateful: ``(B, T, cell)`` from ``(B, T, ...)`` inputs.
        """
        obs = batch[Columns.OBS]
        if lstm is None:
            return encoder(self._encode_obs(obs)), None
        leaves = _nested.flatten(obs)
        rows, steps = int(leaves[0].shape[0]), int(leaves[0].shape[1])

        def merge_time(x: Any) -> Any:
            return x.reshape(rows * steps, *x.shape[2:])

        h = encoder(self._encode_obs(_nested.map_structure(merge_time, obs)))
        parts = [h.reshape(rows, steps, -1)]
        if self._cfg["lstm_use_prev_action"]:
            prev = self._obs_layout.to_tensor(batch[PREV_ACTIONS], self.device)
            encoded = self._act_layout.prev_action_encoding(_nested.map_structure(merge_time, prev))
            parts.append(encoded.reshape(rows, steps, -1))
        if self._cfg["lstm_use_prev_reward"]:
            prev = self._obs_layout.to_tensor(batch[PREV_REWARDS], self.device)
            parts.append(prev.reshape(rows, steps, 1).float())
        x = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
        h0 = state["h"].transpose(0, 1).contiguous()
        c0 = state["c"].transpose(0, 1).contiguous()
        out, (hn, cn) = _run_lstm(lstm, x, (h0, c0))
        return out, {"h": hn.transpose(0, 1), "c": cn.transpose(0, 1)}

    def _actor_features(self, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        state = None
        if self._stateful:
            state = batch[Columns.STATE_IN]
            state = state if self._share else state["actor"]
        return self._features(batch, self.encoder, getattr(self, "lstm", None), state)

    def _critic_features(self, batch: dict[str, Any]) -> tuple[torch.Tensor, Any]:
        state = batch[Columns.STATE_IN]["critic"] if self._stateful else None
        return self._features(batch, self.vf_encoder, getattr(self, "vf_lstm", None), state)

    def _dist_inputs(self, pi_out: torch.Tensor) -> torch.Tensor:
        clip = float(self._cfg["log_std_clip_param"])
        if self._free_log_std:
            return torch.cat([pi_out, self.log_std.expand_as(pi_out)], dim=-1)
        if isinstance(self.action_space, gym.spaces.Box):
            mean, log_std = pi_out.chunk(2, dim=-1)
            return torch.cat([mean, log_std.clamp(-clip, clip)], dim=-1)
        mask = self._act_layout.log_std_mask
        if mask is not None:
            return torch.where(mask.to(pi_out.device), pi_out.clamp(-clip, clip), pi_out)
        return pi_out

    def _state_out(self, batch: dict[str, Any], actor_state: Any) -> Any:
        """The full ``STATE_OUT``: the actor's, plus the critic's when it has its own LSTM."""
        if self._share:
            return actor_state
        return {"actor": actor_state, "critic": self._critic_features(batch)[1]}

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        embeddings, state = self._actor_features(batch)
        out = {Columns.ACTION_DIST_INPUTS: self._dist_inputs(self.pi(embeddings))}
        if self._stateful:
            out[Columns.STATE_OUT] = self._state_out(batch, state)
        return out

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        self._require_value_head()
        embeddings, state = self._actor_features(batch)
        out = {Columns.ACTION_DIST_INPUTS: self._dist_inputs(self.pi(embeddings))}
        if self._share:
            out[Columns.VF_PREDS] = self.vf(embeddings).squeeze(-1)
            if self._stateful:
                out[Columns.STATE_OUT] = state
        else:
            critic, critic_state = self._critic_features(batch)
            out[Columns.VF_PREDS] = self.vf(critic).squeeze(-1)
            if self._stateful:
                out[Columns.STATE_OUT] = {"actor": state, "critic": critic_state}
        return out

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        """Value estimates ``(B,)`` (``(B, T)`` when stateful) for ``batch``.

        Raises:
            RuntimeError: The module was built ``inference_only`` (no value head).
        """
        self._require_value_head()
        if self._share:
            h = self._actor_features(batch)[0] if embeddings is None else embeddings
        else:
            h = self._critic_features(batch)[0]
        return self.vf(h).squeeze(-1)

    def _require_value_head(self) -> None:
        if self.inference_only:
            raise RuntimeError(
                "This DefaultTorchRLModule was built inference_only=True and has no value "
                "head; build it with inference_only=False to compute values."
            )

    def _inference_only_get_state_hook(self, state: StateDict) -> StateDict:
        dropped = ("vf.",) if self._stateful else ("vf.", "vf_encoder.")
        return {k: v for k, v in state.items() if not k.startswith(dropped)}

    # ------------------------------------------------------------------ fast path
    def _apply(self, *args: Any, **kwargs: Any) -> Any:
        self._fast = None  # parameters may be new objects after .to() / .float()
        self._fast_recurrent = None
        return super()._apply(*args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fast"] = None  # holds callables and parameter references; rebuilt on use
        state["_fast_recurrent"] = None
        return state

    def set_state(self, state: StateDict) -> None:
        """``RLModule.set_state``; also drops the acting path's views of replaced storage.

        Why: adopted weights replace parameter storage; numpy views of the old
        storage would otherwise keep it (and its object-store pages) alive. Weights
        copied in place keep the views valid: the acting path is kept (not rebuilt
        on the next forward).
        """
        super().set_state(state)
        if self._storage_replaced:
            self._fast = self._fast_recurrent = None

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """``nn.Module.load_state_dict`` that also refreshes the acting path's references."""
        self._fast = self._fast_recurrent = None
        return super().load_state_dict(*args, **kwargs)

    def _stack_runner(self, stack: nn.Module | None, cpu: bool) -> Any:
        """A callable running ``stack`` for the acting path (cached MLP references if it can)."""
        if stack is None:
            return None
        if isinstance(stack, MLP) and stack.norms is None:
            return functools.partial(run_plan, mlp_plan(stack, numpy_tanh=cpu))
        return stack

    def _fast_plan(self) -> dict[str, Any]:
        """Collect parameter references and per-space decisions once, not per call."""
        if self._stateful:
            raise RuntimeError(
                "compute_actions_numpy acts without recurrent state; this module is stateful "
                "(use_lstm=True): act with envrunners.core.rl_module._acting.act(module, obs, "
                "explore, state) instead."
            )
        device = self.device
        cpu = device.type == "cpu"
        space = self.action_space
        kind = self._act_layout.kind
        box_obs = cpu and self._obs_layout.flat
        # Discrete, MultiDiscrete, Dict and Tuple observations: encoded on numpy (one-hot,
        # concatenated leaves), then the same numpy layers as a flat Box's.
        encoded_obs = cpu and not box_obs and not self._obs_layout.image
        has_vf_encoder = not self.inference_only and not self._share
        fast: dict[str, Any] = {
            "device": device,
            "cpu": cpu,
            "encoder": self._stack_runner(self.encoder, cpu),
            "pi": self._stack_runner(self.pi, cpu),
            "box_obs": box_obs,
            "kind": kind,
            "to_numpy": torch.Tensor.numpy if cpu else _cpu_numpy,
            "action_dtype": None if kind == "multi" else np.dtype(space.dtype),
            "action_shape": tuple(space.shape or ()),
            "vf": None if self.inference_only else self._stack_runner(self.vf, cpu),
            "vf_encoder": self._stack_runner(self.vf_encoder, cpu) if has_vf_encoder else None,
            # Flat float input on CPU: the layers run on numpy (see NumpyForward).
            "numpy": (
                NumpyForward.build(self) if (box_obs or encoded_obs) and kind != "multi" else None
            ),
            "encode_numpy": self._obs_layout.encode_numpy if encoded_obs else None,
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
        """Act for a batch of observations: numpy in, numpy out, no autograd (stateless only).

        Args:
            obs: ``(B, *obs_shape)`` observations (the vector env's batch; nested
                dicts / tuples of such arrays for ``Dict`` / ``Tuple`` spaces).
            explore: Sample (Gumbel-max / Gaussian noise) if True, else act greedily
                (argmax / mean) with ``action_logp`` 0.
            with_values: Also return ``vf_preds`` (needs a non-inference-only module).
            generator: torch RNG to draw from; default torch's global RNG.

        Returns:
            ``actions`` (B, ...) in the action space's dtype (nested like a ``Dict`` /
            ``Tuple`` action space), ``action_logp`` (B,) float32,
            ``action_dist_inputs`` (B, D) float32 and, if asked, ``vf_preds`` (B,)
            float32. The arrays are fresh (not reused by later calls).

        Raises:
            RuntimeError: The module is stateful (act with ``_acting.act`` and a state).
        """
        fast = self._fast or self._fast_plan()
        numpy_forward = fast["numpy"]
        if numpy_forward is not None and not numpy_forward.current(with_values):
            fast = self._fast_plan()  # a parameter's storage was replaced
            numpy_forward = fast["numpy"]
        to_numpy = fast["to_numpy"]
        kind = fast["kind"]
        if fast["box_obs"]:
            if type(obs) is not np.ndarray:
                obs = np.asarray(obs)
            # torch.from_numpy (the torch layers) needs writable memory; numpy does not.
            if obs.dtype != _FLOAT32 or (numpy_forward is None and not obs.flags.writeable):
                obs = obs.astype(np.float32)
        elif numpy_forward is not None:
            obs = fast["encode_numpy"](obs)
        values = None
        if numpy_forward is not None:
            if with_values and numpy_forward.vf is None:
                self._require_value_head()
            pi_t, values = numpy_forward.forward_transposed(
                obs if obs.ndim == 2 else obs.reshape(obs.shape[0], -1), with_values
            )
            pi_np = pi_t.T.copy()  # C order, fresh (``ascontiguousarray`` takes twice as long)
            if kind == "categorical":  # no torch call but the exponential draws
                return _categorical_numpy_outputs(pi_np, pi_t, values, explore, generator, fast)
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
                    x = self._encode_obs(obs)
                h = fast["encoder"](x)
                pi_out = fast["pi"](h)
            if kind == "categorical":
                if fast["cpu"] and explore:  # numpy results (see the function)
                    actions, logp = _sample_categorical_cpu(pi_out, generator)
                else:
                    actions, logp = _sample_categorical(pi_out, explore, generator)
                inputs = pi_out
            elif kind == "gaussian":
                actions, logp, inputs = self._sample_gaussian(pi_out, explore, generator)
            elif kind == "multi_categorical":
                parts = [
                    _sample_categorical(p, explore, generator) for p in pi_out.split(self._nvec, -1)
                ]
                actions = torch.stack([a for a, _ in parts], dim=-1)
                actions = actions.reshape((actions.shape[0], *fast["action_shape"]))
                logp = None if not explore else sum(lp for _, lp in parts)
                inputs = pi_out
            else:  # Dict / Tuple actions: one TorchMultiDistribution
                inputs = self._dist_inputs(pi_out)
                dist = self.action_dist_cls.from_logits(inputs)
                if not explore:
                    dist = dist.to_deterministic()
                actions = dist.sample(generator=generator)
                logp = dist.logp(actions) if explore else None
                actions = _nested.map_structure(to_numpy, actions)
            rows = int(pi_out.shape[0])
            out = {
                Columns.ACTIONS: actions if kind == "multi" else _as_numpy(actions, to_numpy),
                Columns.ACTION_LOGP: np.zeros(rows, np.float32)
                if logp is None
                else _as_numpy(logp, to_numpy),
                Columns.ACTION_DIST_INPUTS: to_numpy(inputs),
            }
            if values is not None:
                out[Columns.VF_PREDS] = values
            elif with_values:
                if fast["vf"] is None:
                    self._require_value_head()
                hv = h if fast["vf_encoder"] is None else fast["vf_encoder"](x)
                out[Columns.VF_PREDS] = to_numpy(fast["vf"](hv).reshape(-1))
        if kind == "multi":
            out[Columns.ACTIONS] = cast_to_space(out[Columns.ACTIONS], self.action_space)
            return out
        return _with_action_dtype(out, fast)

    def act_recurrent_numpy(
        self,
        obs: np.ndarray,
        state: Any,
        *,
        explore: bool,
        extra_inputs: Any = None,
        with_values: bool = False,
        generator: torch.Generator | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], Any] | None:
        """One acting step of the stateful module on numpy (``_acting.act``'s result).

        Same outputs as the torch forward plus sampling (the same torch draws):
        actions, ``action_logp``, ``action_dist_inputs`` (and ``vf_preds`` if asked
        and the module has a value head) and the state out (``(B, 1, cell)`` leaves,
        the critic's too when it has its own LSTM).

        Returns:
            ``(actions, extra_model_outputs, state_out)``, or None where this module
            has no numpy step (not CPU float32, image observations, non-Discrete
            actions, LayerNorm, or a ``prev_*`` input missing): act through torch then.
        """
        plan = self._fast_recurrent
        if plan is None or (plan is not False and not plan.current()):
            plan = self._fast_recurrent = self._recurrent_plan()
        if plan is False:
            return None
        if not self._obs_layout.flat:  # Dict/Tuple/Discrete: the encoder input, on numpy
            obs = self._obs_layout.encode_numpy(obs)
        elif type(obs) is not np.ndarray:
            obs = np.asarray(obs)
        if obs.dtype != np.float32:
            obs = obs.astype(np.float32)
        result = plan(
            obs if obs.ndim == 2 else obs.reshape(obs.shape[0], -1),
            state,
            extra_inputs,
            with_values,
        )
        if result is None:
            return None
        logits, values, state_out = result
        if explore:
            actions, logp = _sample_categorical_numpy(logits, generator)
        else:
            actions, logp = logits.argmax(-1), np.zeros(len(logits), np.float32)
        if actions.dtype != self.action_space.dtype:
            actions = actions.astype(self.action_space.dtype)
        out = {Columns.ACTION_LOGP: logp, Columns.ACTION_DIST_INPUTS: logits}
        if values is not None:
            out[Columns.VF_PREDS] = values
        return actions, out, state_out

    def _recurrent_plan(self) -> NumpyRecurrentForward | bool:
        """The numpy LSTM step for this module, or False where it has none."""
        if not self._stateful or self._obs_layout.image:
            return False
        return NumpyRecurrentForward.build(self) or False

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


def _run_lstm(lstm: nn.LSTM, x: torch.Tensor, state: tuple) -> Any:
    """``lstm(x, state)``; one time step without autograd on the CPU (acting) runs on
    torch's own kernels instead of oneDNN's.

    Why: oneDNN prepares the weights on every call, which for a single step costs more
    than the step (torch 2.13, one thread, batch 8: 64 -> 64 cells 86 vs 50 us, 256 -> 256
    at batch 16 661 vs 314 us, the Atari CNN's 30,976 features -> 128 cells 42 vs 8 ms).
    Over sequences with autograd (the learner) oneDNN is the faster and is left on. The
    switch is torch's process-wide flag, put back at once; a torch op on another thread
    meanwhile runs on torch's kernels too (the same results). A torch without that
    switch runs the LSTM as it is.
    """
    get = getattr(torch._C, "_get_mkldnn_enabled", None)
    put = getattr(torch._C, "_set_mkldnn_enabled", None)
    if x.shape[1] != 1 or torch.is_grad_enabled() or x.device.type != "cpu" or put is None:
        return lstm(x, state)
    enabled = get()
    put(False)
    try:
        return lstm(x, state)
    finally:
        put(enabled)


def _categorical_numpy_outputs(
    logits: np.ndarray,
    logits_t: np.ndarray,
    values: np.ndarray | None,
    explore: bool,
    generator: torch.Generator | None,
    fast: dict[str, Any],
) -> dict[str, np.ndarray]:
    """The acting outputs of a categorical policy from the numpy forward's logits
    (``(B, D)`` and the same values transposed, ``(D, B)``)."""
    if explore:
        actions, logp = _sample_categorical_numpy(logits, generator, logits_t)
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


#: ``(torch buffer, its numpy view, row starts, scratch)`` (see ``_NoiseBuffers``).
_NoiseEntry = tuple[torch.Tensor, np.ndarray, np.ndarray, np.ndarray]


class _NoiseBuffers(threading.local):
    """Per thread, per ``(rows, width)``: a torch buffer for the exponential draws, its
    numpy view, the flat index of each row's start and a scratch array for the
    perturbed scores (read only by the ``argmax`` that follows)."""

    def __init__(self) -> None:
        self.by_shape: dict[tuple[int, int], _NoiseEntry] = {}

    def get(self, rows: int, width: int) -> _NoiseEntry:
        entry = self.by_shape.get((rows, width))
        if entry is None:
            with torch.inference_mode(False):  # a normal tensor: filled in and out of the mode
                buffer = torch.empty((rows, width))
            noise = buffer.numpy()
            entry = self.by_shape[(rows, width)] = (
                buffer,
                noise,
                np.arange(rows) * width,
                np.empty_like(noise),
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
    logits: np.ndarray, generator: torch.Generator | None, logits_t: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Gumbel-max sample and its log-probability for numpy logits (torch's draws).

    ``argmax(l - log E)`` is ``argmax(log_softmax(l) - log E)`` (a per-row shift);
    the log-probability is ``l - logsumexp(l)``, with numpy's stable
    ``logaddexp.reduce`` (one reduction instead of max, shift, exp, sum and log).
    ``logits_t``, the logits as a C-contiguous ``(D, B)`` array, makes that
    reduction run along ``B``-long rows (the same sequence of operations per
    row, so bitwise the same result: 3x faster at 128 rows than ``D``-long rows).
    """
    actions, starts = _gumbel_max(logits, generator)
    if logits_t is None:
        log_norm = _LOGADDEXP_REDUCE(logits, axis=-1)
    elif logits_t.shape[0] == 2:  # what the reduction computes over two rows, in one call
        log_norm = _LOGADDEXP(logits_t[0], logits_t[1])
    else:
        log_norm = _LOGADDEXP_REDUCE(logits_t, axis=0)
    logp = logits.take(starts + actions)
    logp -= log_norm
    return actions, logp


def _gumbel_max(
    scores: np.ndarray, generator: torch.Generator | None
) -> tuple[np.ndarray, np.ndarray]:
    """``argmax(scores - log E)`` per row, ``E`` torch's exponential draws; also the flat
    index of each row's start (to pick the chosen entries out of ``scores``)."""
    shape = scores.shape
    entry = _NOISE.by_shape.get(shape)
    buffer, noise, starts, perturbed = _NOISE.get(*shape) if entry is None else entry
    if generator is None:  # the same draws; a call without keywords parses faster
        buffer.exponential_()
    else:
        buffer.exponential_(generator=generator)
    # Outputs passed positionally: a ufunc parses them faster than ``out=``.
    np.log(noise, perturbed)  # the torch buffer itself is only read
    return np.subtract(scores, perturbed, perturbed).argmax(-1), starts


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
            the leaf's path, what is supported and how to plug in a custom module), or
            an image size with no default ``conv_filters`` / filters that do not fit.
    """
    if model_config is not None:
        check_model_config_keys(_model_config_dict(model_config))
    ObservationLayout(observation_space)
    ActionLayout(action_space)
    if is_image_space(observation_space):
        filters = resolve_model_config(_model_config_dict(model_config))["conv_filters"]
        shape = observation_space.shape
        conv_layer_shapes(shape, filters or default_conv_filters(shape))
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
    """Act with any stateless RLModule on a numpy batch (the one-dict form of ``_acting.act``).

    Modules with their own ``compute_actions_numpy`` (the default module) use it;
    others run ``forward_exploration`` / ``forward_inference`` and, unless they
    returned ``actions`` themselves, sample from their action distribution class
    (made deterministic when ``explore`` is False).

    Returns:
        Every output the forward pass returned, as numpy, plus ``actions`` and
        ``action_logp`` (and ``vf_preds`` if ``with_values`` and computable).
    """
    fast = getattr(module, "compute_actions_numpy", None)
    if fast is not None:  # forward kwargs such as the timestep ``t`` do not apply to it
        return fast(obs, explore=explore, with_values=with_values, generator=generator)
    actions, out, _ = act(
        module, obs, explore, with_values=with_values, generator=generator, **forward_kwargs
    )
    out[Columns.ACTIONS] = actions
    return out
