"""``FastSyncVectorEnv``: a lean synchronous single-agent vector env with per-sub-env recovery.

Gymnasium's ``SyncVectorEnv`` merges per-env info dicts into arrays and
concatenates observations every step; the sampler wants neither. This vector env
keeps gymnasium's ``NEXT_STEP`` autoreset contract (the step after a done returns
the reset observation and ignores that sub-env's action) but writes observations
straight into one preallocated array and returns ``infos`` as a list of the
sub-envs' own dicts (like ``DictInfoToList``).

With ``restart_failed=True`` a sub-env whose ``reset``/``step`` raises is closed,
recreated and reset on the spot; ``failed`` marks it for that call so the sampler
drops its partial episode while sibling sub-envs go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from envrunners.env.vector._sub_env_lifecycle import (
    MAX_SUB_ENV_RESTART_ATTEMPTS,
    recreate_sub_env,
    sub_env_seeds,
    tag_sub_env,
)

__all__ = ["FastSyncVectorEnv", "MAX_SUB_ENV_RESTART_ATTEMPTS"]

logger = logging.getLogger("envrunners")


def _is_flat_array_space(space: gym.Space) -> bool:
    return isinstance(
        space,
        gym.spaces.Box | gym.spaces.Discrete | gym.spaces.MultiDiscrete | gym.spaces.MultiBinary,
    )


class FastSyncVectorEnv(gym.vector.VectorEnv):
    """Steps ``len(env_fns)`` envs in this process, writing into one batch array.

    Args:
        env_fns: Zero-arg functions, each building one sub-env.
        restart_failed: Recreate a sub-env whose ``reset``/``step`` raises instead of
            raising; the call then reports it in ``failed``.
        check_env: Called as ``check_env(env)`` on every sub-env after it is built.
        copy: Return a copy of the observation batch (``False`` returns the internal
            array, which the next call overwrites; the sampler copies it anyway).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        restart_failed: bool = False,
        check_env: Callable[[gym.Env], Any] | None = None,
        copy: bool = True,
    ):
        self.copy = copy
        self.env_fns = list(env_fns)
        self._check_env = check_env
        self.envs = [self._build(i) for i in range(len(self.env_fns))]
        self.num_envs = len(self.envs)
        first = self.envs[0]
        self.metadata = dict(getattr(first, "metadata", {}) or {})
        self.metadata["autoreset_mode"] = gym.vector.AutoresetMode.NEXT_STEP
        self.render_mode = getattr(first, "render_mode", None)
        self.spec = getattr(first, "spec", None)
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.restart_failed = restart_failed
        self._flat_obs = _is_flat_array_space(self.single_observation_space)
        self._obs = create_empty_array(self.single_observation_space, self.num_envs, fn=np.zeros)
        self._rewards = np.zeros(self.num_envs, dtype=np.float64)
        self._terminations = np.zeros(self.num_envs, dtype=np.bool_)
        self._truncations = np.zeros(self.num_envs, dtype=np.bool_)
        self._autoreset = np.zeros(self.num_envs, dtype=np.bool_)
        #: Sub-envs recreated (after an exception) during the last reset()/step().
        self.failed = np.zeros(self.num_envs, dtype=np.bool_)
        #: Total number of sub-env failures recovered so far.
        self.num_failures = 0
        #: (index, exception) of every failure in the last call, for logging/metrics.
        self.last_errors: list[tuple[int, BaseException]] = []
        self.closed = False

    # -- construction and recovery -------------------------------------------------
    def _build(self, index: int) -> gym.Env:
        env = self.env_fns[index]()
        if self._check_env is not None:
            self._check_env(env)
        return env

    def _fail(self, index: int, error: BaseException, phase: str) -> tuple[Any, dict]:
        """Recreate and reset sub-env ``index`` (``restart_failed``), else re-raise ``error``."""
        if not self.restart_failed:
            tag_sub_env(error, index)
            raise error
        self.failed[index] = True
        self.num_failures += 1
        self.last_errors.append((index, error))
        self.envs[index], reset = recreate_sub_env(
            lambda: self._build(index), self.envs[index], index, error, phase=phase
        )
        return reset

    def restart_sub_env(self, index: int, error: BaseException) -> tuple[Any, dict]:
        """Recreate sub-env ``index`` after ``error`` found in its last step's results.

        As if its ``step`` had raised ``error`` (``restart_failed`` must be set): it is
        recreated and reset, marked in ``failed`` and ``last_errors``, and its next
        step is a normal step. Returns the reset ``(obs, info)``; the caller puts
        them in place of the rejected results.
        """
        obs, info = self._fail(index, error, "step")
        self._autoreset[index] = False
        if self._flat_obs:
            self._obs[index] = obs
        return obs, info

    # -- gymnasium VectorEnv API ---------------------------------------------------
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None
    ) -> tuple[Any, list[dict]]:
        """Reset every sub-env; an int seed gives sub-env ``i`` the seed ``seed + i``."""
        seeds = sub_env_seeds(seed, self.num_envs)
        self.failed[:] = False
        self.last_errors = []
        infos: list[dict] = []
        obs_items = []
        for i, env in enumerate(self.envs):
            try:
                obs, info = env.reset(seed=seeds[i], options=options)
            except Exception as err:  # noqa: BLE001
                obs, info = self._fail(i, err, "reset")
            self._write_obs(i, obs, obs_items)
            infos.append(info)
        if not self._flat_obs:
            self._obs = concatenate(self.single_observation_space, obs_items, self._obs)
        self._autoreset[:] = False
        return self._out_obs(), infos

    def _out_obs(self) -> Any:
        if not self.copy:
            return self._obs
        if self._flat_obs:
            return self._obs.copy()
        import copy as _copy

        return _copy.deepcopy(self._obs)

    def _write_obs(self, index: int, obs: Any, items: list) -> None:
        if self._flat_obs:
            self._obs[index] = obs
        else:
            items.append(obs)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        """Step every sub-env (or autoreset it if its last step ended its episode).

        Sub-env ``i`` gets ``actions[i]`` (for an array: a numpy scalar or row, as with
        gymnasium's ``SyncVectorEnv``; gymnasium's ``Discrete.contains`` checks a numpy
        integer faster than a Python int). A batch of ``Dict`` / ``Tuple`` actions (one
        array per leaf) gives each sub-env its own dict / tuple, as gymnasium's ``iterate``.
        """
        if self.last_errors:
            self.failed[:] = False
            self.last_errors = []
        infos: list[dict] = []
        rewards: list[float] = []
        terms: list[bool] = []
        truncs: list[bool] = []
        flat = self._flat_obs
        out_obs = self._obs
        obs_items: list = []
        # Iterating an array gives what ``actions[i]`` gives (numpy scalars or row views),
        # without one indexing call per sub-env.
        if type(actions) is np.ndarray:
            per_env = list(actions)
        elif isinstance(actions, dict | tuple):
            per_env = list(iterate(self.action_space, actions))
        else:
            per_env = actions
        autoreset = self._autoreset.tolist()
        for i, env in enumerate(self.envs):
            if autoreset[i]:
                try:
                    obs, info = env.reset()
                except Exception as err:  # noqa: BLE001
                    obs, info = self._fail(i, err, "reset")
                reward, terminated, truncated = 0.0, False, False
            else:
                try:
                    obs, reward, terminated, truncated, info = env.step(per_env[i])
                except Exception as err:  # noqa: BLE001
                    obs, info = self._fail(i, err, "step")
                    reward, terminated, truncated = 0.0, False, False
            if flat:
                out_obs[i] = obs
            else:
                obs_items.append(obs)
            rewards.append(reward)
            terms.append(terminated)
            truncs.append(truncated)
            infos.append(info)
        if not flat:
            self._obs = concatenate(self.single_observation_space, obs_items, self._obs)
        self._rewards[:] = rewards
        self._terminations[:] = terms
        self._truncations[:] = truncs
        np.logical_or(self._terminations, self._truncations, out=self._autoreset)
        if self.copy:
            return (
                self._out_obs(),
                self._rewards.copy(),
                self._terminations.copy(),
                self._truncations.copy(),
                infos,
            )
        return self._obs, self._rewards, self._terminations, self._truncations, infos

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call ``name(*args, **kwargs)`` on every sub-env (or read it if not callable)."""
        results = []
        for env in self.envs:
            attr = env.get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        return tuple(results)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Read attribute ``name`` from every sub-env."""
        return tuple(env.get_wrapper_attr(name) for env in self.envs)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` on every sub-env (one value, or one per sub-env)."""
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        for env, value in zip(self.envs, values, strict=True):
            env.set_wrapper_attr(name, value)

    def render(self) -> tuple[Any, ...] | None:
        """Render every sub-env."""
        return tuple(env.render() for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        """Close every sub-env (none when the constructor failed before building them)."""
        for env in getattr(self, "envs", ()):
            try:
                env.close()
            except Exception:  # closing must not hide the reason we are closing
                logger.warning("closing a sub-environment failed", exc_info=True)
