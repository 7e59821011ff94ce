"""``SyncVectorMultiAgentEnv``: several ``MultiAgentEnv`` copies stepped in this process.

Why: the default vectorisation of the multi-agent runner; it costs nothing beyond
the sub-envs' own steps, which is best for cheap envs (CartPole-like) where
inter-process communication would cost more than the step.
"""

from __future__ import annotations

import copy as copy_module
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from envrunners.env.vector._sub_env_lifecycle import tag_sub_env
from envrunners.env.vector.vector_multi_agent_env import (
    VectorMultiAgentEnv,
    autoreset_step,
    restart_sub_env,
    single_spaces_of,
)

__all__ = ["SyncVectorMultiAgentEnv"]


class SyncVectorMultiAgentEnv(VectorMultiAgentEnv):
    """Steps ``len(env_fns)`` multi-agent envs one after the other.

    Args:
        env_fns: Zero-argument functions, each building one ``MultiAgentEnv``.
        copy: Return copies of the observations (arrays copied, anything else
            deep-copied): an env may reuse and overwrite its observation arrays,
            which would otherwise change observations already recorded.
        autoreset_mode: Only ``"next_step"`` is supported.
        restart_failed: Recreate a sub-env whose ``step`` raises instead of
            raising: that ``step`` returns its reset observation and marks it in
            ``failed`` (the others go on).

    Raises:
        ValueError: Another ``autoreset_mode``.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        copy: bool = True,
        autoreset_mode: str = "next_step",
        restart_failed: bool = False,
    ):
        self._check_autoreset_mode(autoreset_mode)
        self.env_fns = list(env_fns)
        self.copy = copy
        self.envs = [fn() for fn in self.env_fns]
        self.num_envs = len(self.envs)
        obs_spaces, act_spaces, agents = single_spaces_of(self.envs[0])
        self._set_spaces(obs_spaces, act_spaces, agents)
        self._autoreset = [False] * self.num_envs
        self.restart_failed = restart_failed
        #: Per sub-env: recreated during the last ``step`` (``restart_failed``).
        self.failed = [False] * self.num_envs
        self.num_failures = 0

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict | None = None
    ) -> tuple[list[dict], list[dict]]:
        """Reset every sub-env (``seed`` int: sub-env i gets ``seed + i``)."""
        seeds = self._seeds(seed)
        all_obs, all_infos = [], []
        for env, s in zip(self.envs, seeds):
            obs, infos = env.reset(seed=s, options=options)
            all_obs.append(obs)
            all_infos.append(infos)
        self._autoreset = [False] * self.num_envs
        self.failed = [False] * self.num_envs
        if self.copy:
            all_obs = [_copy_observations(obs) for obs in all_obs]
        return all_obs, all_infos

    def step(self, actions: Sequence[dict]) -> tuple[list, list, list, list, list]:
        """Step each sub-env with its dict (a sub-env that just ended is reset instead)."""
        agents = self.possible_agents
        out_obs, out_rew, out_term, out_trunc, out_info = [], [], [], [], []
        autoreset = self._autoreset
        if self.num_failures:
            self.failed = [False] * self.num_envs
        for i, env in enumerate(self.envs):
            try:
                (obs, rew, term, trunc, info), autoreset[i] = autoreset_step(
                    env, agents, actions[i], autoreset[i]
                )
            except Exception as err:
                if not self.restart_failed:
                    tag_sub_env(err, i)  # lets the runner name the failing sub-env
                    raise
                self.envs[i], (obs, rew, term, trunc, info) = restart_sub_env(
                    self.env_fns[i], env, i, err
                )
                autoreset[i] = False
                self.failed[i] = True
                self.num_failures += 1
            out_obs.append(obs)
            out_rew.append(rew)
            out_term.append(term)
            out_trunc.append(trunc)
            out_info.append(info)
        if self.copy:
            out_obs = [_copy_observations(obs) for obs in out_obs]
        return out_obs, out_rew, out_term, out_trunc, out_info

    def restart_sub_env(self, index: int, error: BaseException) -> tuple:
        """Recreate sub-env ``index`` after ``error`` found in its last step's results.

        As if its ``step`` had raised ``error``: it is recreated, reset and marked in
        ``failed``; its next step is a normal step. Returns the reset as a step result
        (no rewards, no flags) for the caller to put in place of the rejected one.
        """
        self.envs[index], result = restart_sub_env(
            self.env_fns[index], self.envs[index], index, error
        )
        self._autoreset[index] = False
        self.failed[index] = True
        self.num_failures += 1
        return result

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple:
        """Call method ``name`` (or read attribute ``name``) on every sub-env."""
        results = []
        for env in self.envs:
            target = getattr(env, name) if hasattr(env, name) else getattr(env.unwrapped, name)
            results.append(target(*args, **kwargs) if callable(target) else target)
        return tuple(results)

    def get_attr(self, name: str) -> tuple:
        """Attribute ``name`` of every sub-env."""
        return tuple(getattr(env.unwrapped, name) for env in self.envs)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` on every sub-env (one value, or one per sub-env)."""
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        for env, value in zip(self.envs, values):
            setattr(env.unwrapped, name, value)

    def render(self) -> tuple:
        """Render every sub-env."""
        return tuple(env.render() for env in self.envs)

    @property
    def np_random_seed(self) -> tuple:
        """The ``np_random_seed`` of every sub-env."""
        return tuple(getattr(env.unwrapped, "np_random_seed", None) for env in self.envs)

    @property
    def np_random(self) -> tuple:
        """The ``np_random`` generator of every sub-env."""
        return tuple(env.unwrapped.np_random for env in self.envs)

    def close_extras(self, **kwargs: Any) -> None:
        """Close every sub-env."""
        for env in self.envs:
            env.close()


def _copy_observations(obs: Any) -> Any:
    """A copy of one sub-env's observations dict: ``ndarray.copy()`` per agent where the
    observation is a plain array (~10x cheaper than ``deepcopy``), else ``deepcopy``."""
    if type(obs) is not dict:
        return copy_module.deepcopy(obs)
    return {
        aid: o.copy() if type(o) is np.ndarray else copy_module.deepcopy(o)
        for aid, o in obs.items()
    }
