"""``SharedMemoryVectorMultiAgentEnv``: multi-agent sub-envs stepped ready-first by worker processes.

``num_workers`` processes each own a contiguous share of the sub-envs, as in
``SharedMemoryVectorEnv``, whose worker pool this env drives (commands, "done"
semaphore, oldest-first readiness, dead-worker detection and respawn, ``close``).
What differs is the data: multi-agent observations are per-agent dicts whose
agents come and go, so they have no fixed row in shared memory. Each worker
answers a step with one pipe message holding its share's per-agent results, and
gets its share's action dicts in one pipe message with the step command: one
message each way per worker per step, whatever the number of sub-envs or agents.

With ``batch_size < num_envs`` it is asynchronous (EnvPool's API):
``async_reset()``, then ``recv()`` the first ``batch_size`` ready sub-envs and
``send()`` their actions while the others still step. ``reset``/``step`` step
every sub-env together (``batch_size == num_envs``). Episode rules are the other
multi-agent vector envs': ``NEXT_STEP`` autoreset (the step after a sub-env's
episode ended resets it, ignores its actions and returns its reset observations
with zero rewards). Failures follow ``SharedMemoryVectorEnv``: a sub-env that
raises is a ``SubEnvError`` naming it (``restart_failed``: recreated, marked in
``failed``), a dead worker is a ``VectorEnvWorkerDiedError`` naming it and its
sub-envs (``restart_failed``: respawned, its sub-envs marked failed), and a worker
that does not answer within ``timeout_s`` (a sub-env stuck in its step) is killed and
then treated as dead: ``VectorEnvWorkerHungError``, or respawned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.env.vector.shared_memory_vector_env import (
    SharedMemoryVectorEnv,
    _describe,
    _Worker,
)
from envrunners.env.vector.vector_multi_agent_env import (
    ALL,
    VectorMultiAgentEnv,
    autoreset_step,
    single_spaces_of,
)

__all__ = ["SharedMemoryVectorMultiAgentEnv"]

#: The pool's spaces: no per-sub-env row (the per-agent data travels in pipe messages).
_NO_ROWS = gym.spaces.Tuple(())
#: The ``call`` name a worker answers with ``single_spaces_of`` of each of its sub-envs.
_SPACES = "__envrunners_single_spaces__"


def _reset_as_step(obs: dict, infos: dict) -> tuple:
    """A reset's ``(obs, infos)`` as a step result: no rewards, no flags."""
    return obs, {}, {ALL: False}, {ALL: False}, infos


class _MultiAgentWorker(_Worker):
    """One worker's share of multi-agent sub-envs; answers with ``msg["result"]``: one
    step result ``(obs, rewards, terminateds, truncateds, infos)`` per sub-env (None for
    one that raised without ``restart_failed``)."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.agents = [single_spaces_of(env)[2] for env in self.envs]

    def step_with(self, actions: list, msg: dict) -> None:
        """Step each sub-env of the share with its action dict (NEXT_STEP autoreset)."""
        results = msg["result"] = []
        autoreset = self.autoreset
        for j, env in enumerate(self.envs):
            try:
                result, autoreset[j] = autoreset_step(env, self.agents[j], actions[j], autoreset[j])
            except Exception as err:  # noqa: BLE001 - reported to the parent
                phase = "reset" if autoreset[j] else "step"
                if self.restart_failed:
                    result = _reset_as_step(*_Worker.restart(self, j, err, phase, msg))
                else:  # the parent raises; the sub-env resets on its next step
                    msg.setdefault("errors", []).append((j, phase, *_describe(err)))
                    autoreset[j] = True
                    result = None
            results.append(result)

    def reset(self, seeds: list, options: dict | None, msg: dict) -> None:
        """Reset each sub-env of the share; its results as step results."""
        results = msg["result"] = []
        for j, env in enumerate(self.envs):
            try:
                result = _reset_as_step(*env.reset(seed=seeds[j], options=options))
            except Exception as err:  # noqa: BLE001 - reported to the parent
                if not self.restart_failed:
                    msg.setdefault("errors", []).append((j, "reset", *_describe(err)))
                    result = None
                else:
                    result = _reset_as_step(*_Worker.restart(self, j, err, "reset", msg))
            results.append(result)
        self.autoreset = [False] * len(self.envs)

    def restart(self, j: int, err: BaseException, phase: str, msg: dict) -> tuple[Any, dict]:
        """The parent's ``restart_sub_env``: recreate sub-env ``j``; its reset comes back
        as its step result (the other entries of ``result`` are None)."""
        obs, info = super().restart(j, err, phase, msg)
        msg["result"] = [None] * len(self.envs)
        msg["result"][j] = _reset_as_step(obs, info)
        return obs, info

    def write_obs(self, i: int, obs: Any) -> None:
        """Nothing: observations travel in ``msg["result"]``."""

    def call(self, name: str, args: tuple, kwargs: dict) -> list:
        """``name(*args, **kwargs)`` (or the attribute) of each sub-env, as the other
        multi-agent vector envs read it (the env, else its ``unwrapped``)."""
        if name == _SPACES:
            return [single_spaces_of(env) for env in self.envs]
        results = []
        for env in self.envs:
            target = getattr(env, name) if hasattr(env, name) else getattr(env.unwrapped, name)
            results.append(target(*args, **kwargs) if callable(target) else target)
        return results


class SharedMemoryVectorMultiAgentEnv(VectorMultiAgentEnv):
    """``len(env_fns)`` ``MultiAgentEnv`` sub-envs stepped by ``num_workers`` processes.

    Args:
        env_fns: Zero-arg functions, each building one ``MultiAgentEnv`` (pickled
            with cloudpickle when ``context`` is not ``"fork"``).
        num_workers: Worker processes (default: ``default_num_workers``: one per
            core, shares that divide ``batch_size``).
        batch_size: Sub-envs per ``recv()`` (None = ``num_envs``: synchronous); a
            multiple of the per-worker share.
        context: The ``multiprocessing`` start method (None: the platform's default).
        restart_failed: Recreate a sub-env whose ``reset``/``step`` raises (and respawn
            a dead worker) instead of raising; ``failed`` marks them.
        autoreset_mode: Only ``"next_step"`` is supported.
        timeout_s: Seconds a worker may take to build its sub-envs or to answer a
            command (None: no limit; the runner passes ``sample_timeout_s``). A worker
            past it is killed: ``VectorEnvWorkerHungError``, or (``restart_failed``)
            replaced, its sub-envs reset and marked failed.

    Raises:
        ConfigError: A bad ``num_workers``/``batch_size``/``timeout_s`` (naming what is
            expected).
        SubEnvError: A sub-env could not be built in its worker.
        ValueError: Another ``autoreset_mode``.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        *,
        num_workers: int | None = None,
        batch_size: int | None = None,
        context: str | None = None,
        restart_failed: bool = False,
        autoreset_mode: str = "next_step",
        timeout_s: float | None = None,
    ):
        self._check_autoreset_mode(autoreset_mode)
        self._pool = SharedMemoryVectorEnv(
            env_fns,
            num_workers=num_workers,
            batch_size=batch_size,
            context=context,
            restart_failed=restart_failed,
            copy=False,
            observation_space=_NO_ROWS,
            action_space=_NO_ROWS,
            worker_cls=_MultiAgentWorker,
            timeout_s=timeout_s,
        )
        pool = self._pool
        self.num_envs = pool.num_envs
        self.batch_size = pool.batch_size
        self.num_workers = pool.num_workers
        self.restart_failed = restart_failed
        self.timeout_s = pool.timeout_s
        #: ``shares[w]``: the sub-envs of worker ``w``; ``worker_of[i]``: sub-env ``i``'s worker.
        self.shares, self.worker_of = pool.shares, pool.worker_of
        try:
            spaces = pool.call(_SPACES)[0]
        except BaseException:
            pool.close(terminate=True)
            raise
        self._set_spaces(*spaces)

    @property
    def is_async(self) -> bool:
        """Whether ``recv()`` returns fewer than ``num_envs`` sub-envs (``batch_size < num_envs``)."""
        return self._pool.is_async

    @property
    def processes(self) -> list[Any]:
        """The worker processes."""
        return self._pool.processes

    @property
    def failed(self) -> np.ndarray:
        """Per sub-env: recreated (after an error) during the last reset/step/recv."""
        return self._pool.failed

    @property
    def num_failures(self) -> int:
        """Sub-env failures recovered so far."""
        return self._pool.num_failures

    @property
    def last_errors(self) -> list[tuple[int, BaseException]]:
        """``(index, exception)`` of every failure recovered in the last call."""
        return self._pool.last_errors

    # -- the synchronous API -------------------------------------------------------
    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict | None = None
    ) -> tuple[list[dict], list[dict]]:
        """Reset every sub-env in parallel (``seed`` int: sub-env i gets ``seed + i``).

        Raises:
            ConfigError: Asynchronous envs start with ``async_reset()``.
        """
        results = self._pool.reset(seed=seed, options=options)[1]
        return [r[0] for r in results], [r[4] for r in results]

    def step(self, actions: Sequence[dict]) -> tuple[list, list, list, list, list]:
        """Step every sub-env with its action dict (a sub-env that just ended is reset instead).

        Raises:
            ValueError: Not one action dict per sub-env.
        """
        if len(actions) != self.num_envs:
            raise ValueError(f"step() got {len(actions)} action dicts for {self.num_envs} sub-envs")
        results = self._pool.step((), payloads=actions)[4]
        obs, rew, term, trunc, info = zip(*results)
        return list(obs), list(rew), list(term), list(trunc), list(info)

    # -- the asynchronous API (EnvPool's send/recv) ----------------------------------
    def async_reset(self, *, seed: Any = None, options: dict | None = None) -> None:
        """Reset every sub-env without waiting; ``recv()`` returns their reset observations
        (zero rewards, no flags) as they are ready. ``seed`` as in ``reset``."""
        self._pool.async_reset(seed=seed, options=options)

    def recv(self) -> tuple[np.ndarray, list, list, list, list, list]:
        """The next ``batch_size`` ready sub-envs: ``(env_ids, obs, rewards, terminateds,
        truncateds, infos)``, entry ``j`` (a per-agent dict) belonging to ``env_ids[j]``.

        ``failed[env_ids]`` marks the returned sub-envs recreated after an error (their
        entries hold their reset observations).

        Raises:
            RuntimeError: Fewer than ``batch_size`` sub-envs are stepping (``send`` first).
            SubEnvError: One of them raised (without ``restart_failed``).
            VectorEnvWorkerDiedError: A worker this call waits for died.
        """
        env_ids, _, _, _, _, results = self._pool.recv()
        obs, rew, term, trunc, info = zip(*results)
        return env_ids, list(obs), list(rew), list(term), list(trunc), list(info)

    def send(self, actions: Sequence[dict], env_ids: Any) -> None:
        """Hand action dict ``actions[j]`` to sub-env ``env_ids[j]`` and let it step.

        Raises:
            ValueError: ``env_ids`` are not whole worker shares ``recv()`` returned.
        """
        self._pool.send((), env_ids, payloads=actions)

    # -- recovery and the rest -------------------------------------------------------
    def restart_sub_env(self, index: int, error: BaseException) -> tuple:
        """Recreate sub-env ``index`` after ``error`` found in its last results (as if its
        step had raised it; ``restart_failed`` must be set). Returns its reset as a step result."""
        return self._pool.restart_sub_env(index, error)[1]

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple:
        """Call method ``name`` (or read attribute ``name``) on every sub-env."""
        return self._pool.call(name, *args, **kwargs)

    def get_attr(self, name: str) -> tuple:
        """Attribute ``name`` of every sub-env."""
        return self._pool.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` on every sub-env (one value, or one per sub-env)."""
        self._pool.set_attr(name, values)

    def render(self) -> tuple:
        """Render every sub-env."""
        return self._pool.call("render")

    def close_extras(self, *, terminate: bool = False, timeout: float = 5.0, **kwargs: Any) -> None:
        """Stop every worker (terminating those still alive after ``timeout``)."""
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close(terminate=terminate, timeout=timeout)
