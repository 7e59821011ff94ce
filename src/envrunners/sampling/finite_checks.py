"""Detection of non-finite (NaN, +-inf) observations, rewards and module outputs.

A sampling loop checks every step's whole observation and reward batch at once:
a sum (of the elements, or of their squares with ``vdot``) is finite exactly when
every element is (NaN and inf propagate), unless it overflows, which only the rare
slow path that names the bad sub-env tells apart. The test is planned once per
space and vector size: small batches sum Python floats (``tolist``), which costs
a fraction of a numpy call; large ones use ``vdot`` without numpy's dispatch layer.
Integer leaves (pixels, discrete observations) cannot hold a NaN and are skipped
at plan time. A module's distribution inputs (logits, means) are checked the same
way before its actions go anywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import chain
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.core.columns import Columns
from envrunners.errors import NonFiniteEnvDataError, NonFiniteModuleOutputError

__all__ = [
    "AgentObsRewardCheck",
    "ObsRewardCheck",
    "all_finite_fast",
    "check_module_outputs",
    "episode_step_error",
    "float_leaf_getters",
    "non_finite_rows",
    "restart_bad_agent_sub_envs",
    "restart_bad_sub_envs",
]

_isfinite = math.isfinite
#: ``np.vdot`` minus the ``__array_function__`` dispatch (a third of its cost on
#: small arrays); the public function where a numpy version lacks the attribute.
_vdot = getattr(np.vdot, "_implementation", np.vdot)
_ravel = np.ndarray.ravel
_tolist = np.ndarray.tolist
_sum = sum
#: Up to this many elements per step (observations and rewards), summing them as
#: Python floats is faster than two ``vdot`` calls.
SMALL_BATCH = 24


def float_leaf_getters(space: gym.Space | None) -> list[tuple[str, Callable[[Any], Any]]]:
    """``(column name, getter)`` of every float leaf of ``space`` (batch or single value).

    ``Box`` spaces of a float dtype are leaves; ``Dict``/``Tuple`` spaces are walked;
    integer Boxes, ``Discrete``, ``MultiDiscrete`` and ``MultiBinary`` have none. An
    unknown space (``None`` or another kind) is checked whole, as one leaf.
    """
    if space is None:
        return [("obs", lambda x: x)]
    if isinstance(space, gym.spaces.Box):
        return [("obs", lambda x: x)] if np.issubdtype(space.dtype, np.floating) else []
    if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete | gym.spaces.MultiBinary):
        return []
    if isinstance(space, gym.spaces.Dict):
        items = space.spaces.items()
    elif isinstance(space, gym.spaces.Tuple):
        items = enumerate(space.spaces)
    else:
        return [("obs", lambda x: x)]
    getters = []
    for key, sub in items:
        for name, get in float_leaf_getters(sub):
            getters.append((f"{name}[{key!r}]", _nested(key, get)))
    return getters


def _nested(key: Any, get: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda x: get(x[key])


def _all_finite(x: Any) -> bool:
    """Whether every element of ``x`` is finite (the one-call fast test, then exact)."""
    try:
        if _isfinite(_vdot(x, x)):
            return True
    except (TypeError, ValueError):  # object arrays, ragged lists: the exact test decides
        pass
    return bool(np.isfinite(np.asarray(x, dtype=np.float64)).all())


def non_finite_rows(x: Any) -> np.ndarray:
    """Indices of the rows (first axis) of ``x`` that hold a non-finite value."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 0:
        return np.zeros(0, np.int64) if np.isfinite(arr) else np.zeros(1, np.int64)
    bad = ~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1)
    return np.flatnonzero(bad)


class ObsRewardCheck:
    """The per-step check of a vector env's observation and reward batches.

    Args:
        observation_space: The single (per sub-env) observation space of the env.
    """

    def __init__(self, observation_space: gym.Space | None, num_envs: int | None = None):
        self.obs_leaves = float_leaf_getters(observation_space)
        self._getters = tuple(get for _, get in self.obs_leaves)
        #: The observation batch is one float array.
        self.single_array = (
            isinstance(observation_space, gym.spaces.Box) and len(self.obs_leaves) == 1
        )
        #: ``ok(obs, rewards)``: True when every float observation leaf and every
        #: reward is finite (False may be an overflow of large finite values: ``find``
        #: decides). Planned once for the space and ``num_envs`` sub-envs.
        self.ok: Callable[[Any, Any], bool] = self._plan(observation_space, num_envs)
        self._space = observation_space
        self._plans = {num_envs: self.ok}

    def ok_for(self, num_envs: int) -> Callable[[Any, Any], bool]:
        """``ok`` planned for batches of ``num_envs`` sub-envs (made once, then cached)."""
        plan = self._plans.get(num_envs)
        if plan is None:
            plan = self._plans[num_envs] = self._plan(self._space, num_envs)
        return plan

    def _plan(self, space: gym.Space | None, num_envs: int | None) -> Callable[[Any, Any], bool]:
        generic = self.generic_ok
        if not (self.single_array or not self.obs_leaves):
            return generic
        size = None
        if num_envs is not None:
            per_env = int(np.prod(space.shape)) if self.single_array else 0
            size = num_envs * (per_env + 1)
        small = size is not None and size <= SMALL_BATCH
        isfinite, vdot, ravel, tolist, fsum = _isfinite, _vdot, _ravel, _tolist, _sum
        # Each test falls back to ``generic_ok`` for data that is not an ndarray.
        if not self.obs_leaves:  # integer observations: the rewards alone
            if small:

                def ok(obs: Any, rewards: Any) -> bool:
                    try:
                        return isfinite(fsum(tolist(rewards)))
                    except (TypeError, ValueError):
                        return generic(obs, rewards)

            else:

                def ok(obs: Any, rewards: Any) -> bool:
                    try:
                        return isfinite(vdot(rewards, rewards))
                    except (TypeError, ValueError):
                        return generic(obs, rewards)

        elif small:

            def ok(obs: Any, rewards: Any) -> bool:
                try:
                    return isfinite(fsum(tolist(ravel(obs)), fsum(tolist(rewards))))
                except (TypeError, ValueError):
                    return generic(obs, rewards)

        else:

            def ok(obs: Any, rewards: Any) -> bool:
                try:
                    return isfinite(vdot(obs, obs) + vdot(rewards, rewards))
                except (TypeError, ValueError):
                    return generic(obs, rewards)

        return ok

    def generic_ok(self, obs: Any, rewards: Any) -> bool:
        """``ok`` for any data: every float leaf, then the exact test where one fails."""
        if not _all_finite(rewards):
            return False
        return self._obs_ok(obs)

    def _obs_ok(self, obs: Any) -> bool:
        return all(_all_finite(get(obs)) for get in self._getters)

    def find(self, obs: Any, rewards: Any) -> list[tuple[int, str, Any]]:
        """``(sub-env index, column, value)`` of every bad value, ordered by sub-env."""
        found: dict[int, tuple[int, str, Any]] = {}
        for i in non_finite_rows(rewards).tolist():
            found[i] = (i, "rewards", np.asarray(rewards)[i])
        for name, get in self.obs_leaves:
            leaf = get(obs)
            for i in non_finite_rows(leaf).tolist():
                found.setdefault(i, (i, name, np.asarray(leaf)[i]))
        return [found[i] for i in sorted(found)]


class AgentObsRewardCheck:
    """The per-step check of a multi-agent vector env's per-sub-env obs and reward dicts.

    Every agent's observation (also the final one of an agent whose episode ends)
    and reward is checked. When every agent's space is a ``Box``, ``ok`` is one sum
    over all of them, run by ``map`` without a Python loop per agent.

    Args:
        observation_spaces: Per agent id, its observation space.
    """

    def __init__(self, observation_spaces: dict):
        self.observation_spaces = observation_spaces
        self._leaves = {aid: float_leaf_getters(sp) for aid, sp in observation_spaces.items()}
        boxes = all(isinstance(sp, gym.spaces.Box) for sp in observation_spaces.values())
        self._flat = boxes
        #: Every observation is 1-D: ``tolist`` gives flat lists without a ``ravel``.
        self._one_dim = boxes and all(len(sp.shape) == 1 for sp in observation_spaces.values())

    def ok(self, obs_l: list[dict], rew_l: list[dict]) -> bool:
        """True when every agent's float observation leaves and reward are finite."""
        if self._flat:
            try:
                values, fsum = dict.values, _sum
                obs = chain.from_iterable(map(values, obs_l))
                obs = map(_tolist, obs if self._one_dim else map(_ravel, obs))
                return _isfinite(fsum(map(fsum, map(values, rew_l)), fsum(map(fsum, obs))))
            except (TypeError, ValueError):  # not arrays: the exact test decides
                pass
        return not self.find(obs_l, rew_l)

    def _obs_leaves(self, aid: Any) -> list[tuple[str, Callable[[Any], Any]]]:
        leaves = self._leaves.get(aid)
        if leaves is None:
            leaves = self._leaves[aid] = float_leaf_getters(self.observation_spaces.get(aid))
        return leaves

    def find(self, obs_l: list[dict], rew_l: list[dict]) -> list[tuple[int, str, Any]]:
        """``(sub-env index, column, value)`` of the first bad value of each bad sub-env."""
        found = []
        for i, (obs_i, rew_i) in enumerate(zip(obs_l, rew_l)):
            bad = next(
                ((f"rewards[{a!r}]", r) for a, r in rew_i.items() if not _all_finite(r)), None
            )
            if bad is None:
                for aid, o in obs_i.items():
                    for name, get in self._obs_leaves(aid):
                        leaf = get(o)
                        if not _all_finite(leaf):
                            bad = (f"{name}[{aid!r}]", leaf)
                            break
                    if bad is not None:
                        break
            if bad is not None:
                found.append((i, *bad))
        return found


def check_module_outputs(module_id: Any, out: dict) -> None:
    """Raise ``NonFiniteModuleOutputError`` if ``out``'s distribution inputs are not finite.

    Called after every forward, before the actions reach any env.
    """
    inputs = out.get(Columns.ACTION_DIST_INPUTS)
    if inputs is None or all_finite_fast(inputs):
        return
    rows = non_finite_rows(inputs)
    if not len(rows):
        return
    raise NonFiniteModuleOutputError(
        f"module {module_id!r} returned non-finite {Columns.ACTION_DIST_INPUTS} (logits or "
        f"distribution parameters) for batch row(s) {rows[:10].tolist()}, e.g. "
        f"{np.asarray(inputs)[rows[0]]!r}; no action was sent to the env. The weights or the "
        "observations fed to the module are broken (check the learner's loss and the "
        "observation filter).",
        module_id=module_id,
    )


def all_finite_fast(x: Any) -> bool:
    """One sum: True when ``x`` is all finite (False may be an overflow)."""
    try:
        if type(x) is np.ndarray and x.size <= SMALL_BATCH:
            return _isfinite(_sum(_tolist(_ravel(x))))
        return _isfinite(_vdot(x, x))
    except (TypeError, ValueError):
        return False


def episode_step_error(
    sub_env: int, column: str, value: Any, step: int, episode_id: str | None
) -> NonFiniteEnvDataError:
    """The error for a non-finite ``column`` value of ``sub_env`` at episode step ``step``."""
    where = f" of episode {episode_id}" if episode_id is not None else ""
    return NonFiniteEnvDataError(
        f"sub-environment {sub_env} returned a non-finite {column} at step {step}{where}: "
        f"{value!r}. Fix the env, or set config.fault_tolerance("
        "restart_failed_sub_environments=True) to recreate a sub-env that does this.",
        sub_env_index=sub_env,
        step=step,
        column=column,
    )


def restart_bad_sub_envs(
    restart: Callable[[int, BaseException], tuple[Any, dict]],
    errors: list[NonFiniteEnvDataError],
    results: tuple,
) -> tuple:
    """Recreate each bad sub-env of a vector env step; its reset replaces its row.

    ``restart(index, error)`` (a vector env's ``restart_sub_env``) recreates and
    resets the sub-env as if its step had raised ``error`` and returns ``(obs, info)``;
    its row of ``results`` (batched ``obs, rewards, terms, truncs, infos``) becomes
    that observation with no reward and no flags.
    """
    obs, rewards, terms, truncs, infos = results
    for err in errors:
        i = err.sub_env_index
        new_obs, info = restart(i, err)
        _set_row(obs, i, new_obs)
        rewards[i] = 0.0
        terms[i] = truncs[i] = False
        infos[i] = info
    return obs, rewards, terms, truncs, infos


def restart_bad_agent_sub_envs(
    restart: Callable[[int, BaseException], tuple],
    errors: list[NonFiniteEnvDataError],
    results: tuple,
) -> tuple:
    """``restart_bad_sub_envs`` for a multi-agent vector env (per-sub-env dict results).

    ``restart(index, error)`` returns the new sub-env's reset as a step result.
    """
    columns = [list(column) for column in results]
    for err in errors:
        i = err.sub_env_index
        for column, value in zip(columns, restart(i, err), strict=True):
            column[i] = value
    return tuple(columns)


def _set_row(batch: Any, index: int, value: Any) -> None:
    """``batch[index] = value`` for an array or a dict/tuple tree of arrays."""
    if isinstance(batch, dict):
        for key, sub in batch.items():
            _set_row(sub, index, value[key])
    elif isinstance(batch, tuple):
        for sub, item in zip(batch, value, strict=True):
            _set_row(sub, index, item)
    else:
        batch[index] = value
