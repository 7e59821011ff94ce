"""One acting step of any RLModule: numpy observations in; numpy actions, extras and state out.

The sampler calls :func:`act` once per vector step for all ``B`` sub-envs, with
whatever module the config built: the default module (stateless flat MLP and
CNN modules take their ``compute_actions_numpy`` fast path, the LSTM module on
flat observations with Discrete actions its ``act_recurrent_numpy`` step), user
``TorchRLModule`` subclasses, and stateful modules. For a stateful module the
observations (and ``extra_inputs``) get a time axis of length 1 and the state
goes in as ``Columns.STATE_IN``, as RLlib's ``AddTimeDimToBatchAndZeroPad``
does at inference; the time axis is removed from the outputs again. A module
that returns ``Columns.ACTIONS`` is trusted; otherwise actions are sampled from
``Columns.ACTION_DIST_INPUTS`` with the module's exploration (or inference,
made deterministic) distribution class, as RLlib's ``GetActions`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from envrunners.core import _nested
from envrunners.core.columns import Columns
from envrunners.core.rl_module._space_layout import cast_to_space
from envrunners.errors import ModuleActingError
from envrunners.utils.torch_utils import convert_to_torch_tensor

__all__ = ["act", "initial_state_batch", "reset_state_rows"]


def act(
    module: Any,
    obs: Any,
    explore: bool,
    state: Any = None,
    *,
    extra_inputs: Mapping[str, Any] | None = None,
    with_values: bool = False,
    generator: torch.Generator | None = None,
    **forward_kwargs: Any,
) -> tuple[Any, dict[str, np.ndarray], Any]:
    """Compute actions for a batch of ``B`` observations with any RLModule.

    Args:
        module: The RLModule (default or user module; stateful or not).
        obs: ``(B, *obs_shape)`` numpy observations, or dicts / tuples of such
            arrays for ``Dict`` / ``Tuple`` spaces. Dtypes are kept (uint8 frames
            stay uint8 until the module casts them).
        explore: Sample (``forward_exploration``) or act greedily (``forward_inference``;
            a sampled distribution is made deterministic, ``action_logp`` is 0).
        state: For stateful modules (``module.is_stateful()``): the recurrent state,
            nested like ``module.get_initial_state()`` with a leading ``B`` axis on
            every leaf (e.g. ``{"h": (B, 1, cell), "c": (B, 1, cell)}``), numpy or
            tensors; see :func:`initial_state_batch`. ``None`` for stateless modules.
        extra_inputs: More ``(B, ...)`` batch columns for the forward pass (for
            example ``"prev_actions"`` / ``"prev_rewards"``); they get the time axis too.
        with_values: Also return ``Columns.VF_PREDS`` (from the forward outputs or
            the module's ``compute_values``) when the module can give them.
        generator: torch RNG for sampling; default torch's global RNG.
        **forward_kwargs: Passed to the forward pass (e.g. the timestep ``t``);
            the default module's fast path ignores them.

    Returns:
        ``(actions, extra_model_outputs, state_out)``: ``actions`` ``(B, ...)`` numpy
        in the action space's dtype (nested like a ``Dict`` / ``Tuple`` action space);
        ``extra_model_outputs`` every other output as numpy with ``B`` rows and no
        time axis (``action_logp`` ``(B,)`` float32, ``action_dist_inputs`` ``(B, D)``
        and ``vf_preds`` ``(B,)`` where the module gives them); ``state_out`` the next
        state, nested like ``state`` with numpy ``(B, ...)`` leaves (``None`` for
        stateless modules).

    Raises:
        ModuleActingError: A stateful module without ``state``, or a forward output
            with neither ``Columns.ACTIONS`` nor ``Columns.ACTION_DIST_INPUTS``.
    """
    fast = getattr(module, "compute_actions_numpy", None)
    stateful = module.is_stateful()
    if fast is not None and not stateful and not extra_inputs:
        out = fast(obs, explore=explore, with_values=with_values, generator=generator)
        return out.pop(Columns.ACTIONS), out, None
    if stateful and state is not None:
        recurrent_fast = getattr(module, "act_recurrent_numpy", None)
        if recurrent_fast is not None:
            result = recurrent_fast(
                obs,
                state,
                explore=explore,
                extra_inputs=extra_inputs,
                with_values=with_values,
                generator=generator,
            )
            if result is not None:
                return result
    elif stateful:
        raise ModuleActingError(
            f"{type(module).__name__} is stateful (is_stateful() is True) but act() got no "
            "state: pass state=initial_state_batch(module, B) for new episodes and the "
            "returned state_out afterwards."
        )
    device = _module_device(module)
    with torch.inference_mode():
        batch = {Columns.OBS: obs, **(extra_inputs or {})}
        batch = convert_to_torch_tensor(batch, device=device)
        if stateful:  # T=1: (B, ...) -> (B, 1, ...), as RLlib's AddTimeDimToBatchAndZeroPad
            batch = _nested.map_structure(_add_time, batch)
            batch[Columns.STATE_IN] = convert_to_torch_tensor(state, device=device)
        forward = module.forward_exploration if explore else module.forward_inference
        out = dict(forward(batch, **forward_kwargs))
        state_out = out.pop(Columns.STATE_OUT, None)
        if stateful:
            out = {k: _nested.map_structure(_drop_time, v) for k, v in out.items()}
        if Columns.ACTIONS not in out:
            _sample_actions(module, out, explore, generator)
        if with_values and Columns.VF_PREDS not in out and hasattr(module, "compute_values"):
            if not getattr(module, "inference_only", False):
                values = module.compute_values(batch)
                out[Columns.VF_PREDS] = _drop_time(values) if stateful else values
        result = {k: _nested.map_structure(_to_numpy, v) for k, v in out.items()}
        if stateful:
            if state_out is None:
                raise ModuleActingError(
                    f"{type(module).__name__} is stateful but its forward pass returned no "
                    f"Columns.STATE_OUT ({Columns.STATE_OUT!r}); outputs: {sorted(out)}."
                )
            state_out = _nested.map_structure(_to_numpy, state_out)
    actions = cast_to_space(result.pop(Columns.ACTIONS), getattr(module, "action_space", None))
    if Columns.ACTION_LOGP in result:
        result[Columns.ACTION_LOGP] = np.asarray(result[Columns.ACTION_LOGP], dtype=np.float32)
    return actions, result, state_out if stateful else None


def _sample_actions(
    module: Any, out: dict[str, Any], explore: bool, generator: torch.Generator | None
) -> None:
    """Add ``ACTIONS`` (and ``ACTION_LOGP`` unless given) sampled from ``ACTION_DIST_INPUTS``."""
    if Columns.ACTION_DIST_INPUTS not in out:
        raise ModuleActingError(
            f"{type(module).__name__}'s forward pass returned neither Columns.ACTIONS "
            f"({Columns.ACTIONS!r}) nor Columns.ACTION_DIST_INPUTS "
            f"({Columns.ACTION_DIST_INPUTS!r}); it returned {sorted(out)}. Return the actions "
            "themselves, or the inputs of the distribution named by "
            "get_exploration_action_dist_cls() / get_inference_action_dist_cls()."
        )
    if explore:
        dist_cls = module.get_exploration_action_dist_cls()
    else:
        dist_cls = module.get_inference_action_dist_cls()
    dist = dist_cls.from_logits(out[Columns.ACTION_DIST_INPUTS])
    if not explore:
        dist = dist.to_deterministic()
    actions = dist.sample(generator=generator)
    out[Columns.ACTIONS] = actions
    if Columns.ACTION_LOGP not in out:
        out[Columns.ACTION_LOGP] = dist.logp(actions)


def initial_state_batch(module: Any, batch_size: int) -> Any:
    """``module.get_initial_state()`` repeated ``batch_size`` times on a new leading axis.

    Returns:
        The state nested like ``get_initial_state()`` with numpy ``(B, ...)`` leaves
        (``{}`` for stateless modules). Fresh, writable arrays.
    """
    initial = module.get_initial_state()
    return _nested.map_structure(
        lambda v: np.repeat(_to_numpy(v)[None], batch_size, axis=0), initial
    )


def reset_state_rows(state: Any, initial_state: Any, rows: Sequence[int] | np.ndarray) -> None:
    """Set the given rows of a batched ``state`` back to ``initial_state`` (in place).

    Args:
        state: A batched state as :func:`act` returns it (numpy leaves ``(B, ...)``).
        initial_state: ``module.get_initial_state()`` (one row, tensors or numpy).
        rows: Indices or a boolean mask of the sub-envs whose episode (re)started.
    """

    def reset(leaf: np.ndarray, init: Any) -> None:
        leaf[rows] = _to_numpy(init)

    _nested.map_structure(reset, state, initial_state)


def _module_device(module: Any) -> torch.device:
    parameters = getattr(module, "parameters", None)
    if parameters is not None:
        for param in parameters():
            return param.device
    return torch.device("cpu")


def _add_time(value: Any) -> Any:
    return value.unsqueeze(1) if isinstance(value, torch.Tensor) else value


def _drop_time(value: Any) -> Any:
    """``(B, 1, ...)`` -> ``(B, ...)`` (RLlib removes the single-step time axis)."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim >= 2:
        return value[:, 0]
    return value


def _to_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return value
