"""Sub-env seeding and failure recovery shared by every vector env of the package.

``FastSyncVectorEnv`` (single-agent) and the multi-agent vector envs (sync, and
the async worker processes) seed their sub-envs and recreate a failed one the
same way; these functions are that one way. They import nothing of the package
but its errors.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from envrunners.errors import StepFailedRecreateEnvError
from envrunners.utils.failure_log import FAILURE_LOG

__all__ = [
    "MAX_SUB_ENV_RESTART_ATTEMPTS",
    "parent_alive",
    "process_alive",
    "recreate_sub_env",
    "stop_worker_processes",
    "sub_env_seeds",
    "tag_sub_env",
]


#: A sub-env that keeps failing right after being recreated is given up on after
#: this many attempts (RLlib retries forever); the last error is raised.
MAX_SUB_ENV_RESTART_ATTEMPTS = 10


def sub_env_seeds(seed: int | Any | None, num_envs: int) -> list[int | None]:
    """One seed per sub-env: None for all, ``seed + i`` for an int, or the given list.

    Raises:
        ValueError: A list whose length is not ``num_envs``.
    """
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, int | np.integer):
        return [int(seed) + i for i in range(num_envs)]
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(
            f"reset(seed=...) got {len(seeds)} seeds for {num_envs} sub-envs; pass an "
            "int (sub-env i gets seed + i) or one seed per sub-env."
        )
    return seeds


def tag_sub_env(err: BaseException, index: int) -> None:
    """Note on ``err`` which sub-env raised it (``sub_env_index``), so the runner can say so."""
    try:
        err.sub_env_index = index  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - exceptions without a __dict__
        pass


def recreate_sub_env(
    build: Callable[[], Any],
    old_env: Any,
    index: int,
    error: BaseException,
    *,
    phase: str = "step",
    attempts: int = MAX_SUB_ENV_RESTART_ATTEMPTS,
    log: bool = True,
) -> tuple[Any, tuple[Any, Any]]:
    """Replace a sub-env whose ``phase`` (``step``/``reset``) raised ``error``.

    Closes ``old_env``, builds a new one and resets it, retrying with a short
    backoff; reports ``error`` to the process's ``FAILURE_LOG`` unless it is a ``StepFailedRecreateEnvError``
    (or ``log`` is False). Returns the new env and its reset ``(obs, infos)``.

    Raises:
        RuntimeError: The env could not be rebuilt and reset in ``attempts`` tries.
    """
    if log and not isinstance(error, StepFailedRecreateEnvError):
        FAILURE_LOG.report(
            f"sub-env {phase}",
            error,
            "Sub-environment %d raised %r in %s(); recreating it (its partial episode is dropped).",
            index,
            error,
            phase,
        )
    last: BaseException = error
    for attempt in range(attempts):
        try:
            old_env.close()
        except Exception:  # noqa: BLE001 - a broken env may fail to close; it is replaced
            pass
        try:
            old_env = build()
            return old_env, old_env.reset()
        except Exception as err:  # noqa: BLE001 - any env error counts as a failure
            last = err
            time.sleep(min(0.01 * 2**attempt, 1.0))
    raise RuntimeError(
        f"Sub-environment {index} could not be recreated after {attempts} attempts; "
        f"last error: {last!r}"
    ) from last


def stop_worker_processes(processes: list[Any], pipes: list[Any], timeout_s: float) -> None:
    """Join worker ``processes`` (already told to exit) for up to ``timeout_s`` in all,
    terminate (then kill) those still alive, and close their ``pipes``."""
    deadline = time.monotonic() + timeout_s
    for proc in processes:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.terminate()
            proc.join(1.0)
        if proc.is_alive():  # pragma: no cover - ignores SIGTERM
            proc.kill()
            proc.join(1.0)
    for pipe in pipes:
        try:
            pipe.close()
        except OSError:  # pragma: no cover
            pass


def parent_alive(ppid: int) -> bool:
    """Whether the process ``ppid`` that started this worker still runs.

    A forked worker's parent is ``ppid`` until it dies (then the worker is adopted);
    a worker started from a forkserver has the server as its parent, so ``ppid`` is
    asked directly (signal 0: no signal sent).
    """
    return os.getppid() == ppid or process_alive(ppid)


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs (in this pid namespace); signal 0 sends nothing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user (e.g. a reused pid)
        return True
    return True
