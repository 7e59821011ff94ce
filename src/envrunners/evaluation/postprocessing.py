"""Trajectory postprocessing for the old API stack: discounted sums, returns and GAE.

Why: policies turn a sampled episode chunk into learning targets right after
sampling (``Policy.postprocess_trajectory``). Everything here works on whole
columns of one trajectory at once: ``discount_cumsum`` is a single IIR filter
(``scipy.signal.lfilter``) when SciPy is installed and otherwise a numpy loop over
time steps only, so postprocessing never walks rows in Python per column.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envrunners.core.columns import Columns

__all__ = [
    "Postprocessing",
    "compute_advantages",
    "compute_bootstrap_value",
    "compute_gae_for_sample_batch",
    "discount_cumsum",
]

try:  # SciPy is optional: lfilter is one C loop for the whole trajectory.
    from scipy.signal import lfilter as _lfilter
except ImportError:  # pragma: no cover - exercised only without SciPy
    _lfilter = None


class Postprocessing:
    """Names of the columns postprocessing adds (RLlib's constants)."""

    ADVANTAGES = "advantages"
    VALUE_TARGETS = "value_targets"


def _discount_cumsum_numpy(x: np.ndarray, gamma: float) -> np.ndarray:
    out = np.empty_like(x)
    running = np.zeros_like(x[0]) if len(x) else 0.0
    for t in range(len(x) - 1, -1, -1):
        running = x[t] + gamma * running
        out[t] = running
    return out


def discount_cumsum(x: np.ndarray, gamma: float) -> np.ndarray:
    """Return ``y`` with ``y[t] = sum_k gamma**k * x[t + k]`` along axis 0.

    Args:
        x: A float array whose first axis is time.
        gamma: The discount factor.

    Returns:
        An array of ``x``'s shape (float64 for non-float input).

    Example:
        >>> discount_cumsum(np.array([1.0, 1.0, 1.0]), 0.5).tolist()
        [1.75, 1.5, 1.0]
    """
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    if len(x) == 0:
        return x.copy()
    if _lfilter is not None:
        return _lfilter([1.0], [1.0, -float(gamma)], x[::-1], axis=0)[::-1].astype(
            x.dtype, copy=False
        )
    return _discount_cumsum_numpy(x, float(gamma))


def compute_advantages(
    rollout: Any,
    last_r: float,
    gamma: float = 0.9,
    lambda_: float = 1.0,
    use_gae: bool = True,
    use_critic: bool = True,
    rewards: np.ndarray | None = None,
    vf_preds: np.ndarray | None = None,
) -> Any:
    """Add ``advantages`` and ``value_targets`` to one trajectory (in place; returned).

    Args:
        rollout: A ``SampleBatch`` (or dict of columns) of a single trajectory.
        last_r: The value after the last step: 0 if the trajectory terminated,
            else a bootstrap estimate ``V(new_obs[-1])``.
        gamma: Discount factor.
        lambda_: GAE's lambda (used only with ``use_gae``).
        use_gae: Generalized Advantage Estimation from ``vf_preds``.
        use_critic: Without GAE, subtract ``vf_preds`` from the discounted returns
            (else the advantages are the plain discounted returns, REINFORCE).
        rewards: Rewards to use instead of ``rollout["rewards"]``.
        vf_preds: Value predictions to use instead of ``rollout["vf_preds"]``.

    Returns:
        ``rollout`` with float32 ``advantages`` and ``value_targets`` columns.

    Raises:
        ValueError: ``use_gae`` without ``use_critic``, or a missing ``vf_preds``.
    """
    r = np.asarray(rollout[Columns.REWARDS] if rewards is None else rewards, dtype=np.float32)
    if use_gae and not use_critic:
        raise ValueError("compute_advantages: use_gae=True needs use_critic=True.")
    if use_critic or use_gae:
        if vf_preds is None:
            if Columns.VF_PREDS not in rollout:
                raise ValueError(
                    "compute_advantages: use_critic/use_gae need a 'vf_preds' column; "
                    "compute actions with a value head or pass use_critic=False."
                )
            vf_preds = rollout[Columns.VF_PREDS]
        v = np.asarray(vf_preds, dtype=np.float32)
    last = np.float32(last_r)
    if use_gae:
        v_next = np.empty_like(v)
        v_next[:-1] = v[1:]
        if len(v):
            v_next[-1] = last
        deltas = r + np.float32(gamma) * v_next - v
        advantages = discount_cumsum(deltas, gamma * lambda_)
        targets = advantages + v
    else:
        returns = discount_cumsum(np.append(r, last), gamma)[:-1]
        if use_critic:
            advantages = returns - v
            targets = returns
        else:
            advantages = returns
            targets = np.zeros_like(returns)
    rollout[Postprocessing.ADVANTAGES] = np.asarray(advantages, dtype=np.float32)
    rollout[Postprocessing.VALUE_TARGETS] = np.asarray(targets, dtype=np.float32)
    return rollout


def compute_bootstrap_value(sample_batch: Any, policy: Any) -> float:
    """The value after a trajectory's last step: 0 if it terminated, else ``V(new_obs[-1])``.

    Truncated trajectories (time limits, fragment ends) are bootstrapped with the
    last ``values_bootstrapped`` entry if the batch has one, else with the policy's
    value function (``policy._value``); ``0.0`` if it has none.
    """
    n = len(sample_batch[Columns.REWARDS])
    if n == 0:
        return 0.0
    terminateds = sample_batch.get(Columns.TERMINATEDS)
    if terminateds is not None and bool(np.asarray(terminateds)[-1]):
        return 0.0
    if Columns.VALUES_BOOTSTRAPPED in sample_batch:  # precomputed for the whole batch
        return float(np.asarray(sample_batch[Columns.VALUES_BOOTSTRAPPED])[-1])
    value_fn = getattr(policy, "_value", None)
    if value_fn is None:
        return 0.0
    new_obs = sample_batch[Columns.NEXT_OBS]
    last = _last_item(new_obs)
    is_recurrent = getattr(policy, "is_recurrent", None)
    if is_recurrent is not None and is_recurrent():
        # The value after the last step reads the state that step returned (and,
        # for models fed them, that step's action and reward as the "previous" ones).
        state = [
            np.asarray(sample_batch[f"state_out_{i}"])[-1]
            for i in range(policy.num_state_tensors())
        ]
        prev = {
            "prev_actions": _last_item(sample_batch[Columns.ACTIONS]),
            "prev_rewards": np.asarray(sample_batch[Columns.REWARDS])[-1],
        }
        return float(value_fn(last, state, **prev))
    return float(value_fn(last))


def _last_item(column: Any) -> Any:
    if isinstance(column, dict):
        return {k: _last_item(v) for k, v in column.items()}
    if isinstance(column, tuple):
        return tuple(_last_item(v) for v in column)
    return np.asarray(column)[-1]


def compute_gae_for_sample_batch(
    policy: Any,
    sample_batch: Any,
    other_agent_batches: dict | None = None,
    episode: Any = None,
) -> Any:
    """Add GAE advantages and value targets to one trajectory, as PPO postprocessing does.

    Reads ``gamma``, ``lambda`` (or ``lambda_``), ``use_gae`` and ``use_critic``
    from ``policy.config``; bootstraps non-terminated trajectories with
    :func:`compute_bootstrap_value`.
    """
    config = policy.config
    lam = config.get("lambda", config.get("lambda_", 1.0))
    use_critic = bool(config.get("use_critic", True))
    last_r = compute_bootstrap_value(sample_batch, policy) if use_critic else 0.0
    return compute_advantages(
        sample_batch,
        last_r,
        gamma=float(config.get("gamma", 0.99)),
        lambda_=float(lam),
        use_gae=bool(config.get("use_gae", True)),
        use_critic=use_critic,
    )
