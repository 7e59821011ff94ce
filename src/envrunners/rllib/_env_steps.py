"""One env step of an RLlib runner with RLlib's failure handling, timed in bulk.

Both plug-in runners step RLlib's env inside envrunners' loop; what a failing step
does is RLlib's rule (count it, then raise or recreate the env), so it lives here
once. The runner's ``_env_step_s`` / ``_env_step_calls`` sum the step time for the
per-call timer log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ray.rllib.env.env_errors import StepFailedRecreateEnvError
from ray.rllib.env.env_runner import ENV_STEP_FAILURE as RLLIB_ENV_STEP_FAILURE
from ray.rllib.env.env_runner import NUM_ENV_STEP_FAILURES_LIFETIME

from envrunners.env.env_runner import ENV_STEP_FAILURE

__all__ = ["step_with_rllib_failure_handling"]

logger = logging.getLogger("envrunners")


def step_with_rllib_failure_handling(
    runner: Any, actions: Any, after_recreate: Callable[[], None]
) -> Any:
    """``runner.env.step(actions)``, or ``ENV_STEP_FAILURE`` after recreating the env.

    A failing step is counted in ``NUM_ENV_STEP_FAILURES_LIFETIME``; without
    ``restart_failed_sub_environments`` it is re-raised (as RLlib's runner does),
    with it the env is rebuilt by ``runner.make_env()`` and ``after_recreate()``
    lets the runner rewire its loop to the new env.
    """
    start = time.perf_counter()
    try:
        results = runner.env.step(actions)
    except Exception as err:
        runner.metrics.log_value(NUM_ENV_STEP_FAILURES_LIFETIME, 1, reduce="lifetime_sum")
        name = type(runner).__name__
        if not runner.config.restart_failed_sub_environments:
            logger.exception(
                "envrunners.rllib %s: environment step failed and "
                "'config.restart_failed_sub_environments' is False; set "
                "fault_tolerance(restart_failed_sub_environments=True) to recreate it.",
                name,
            )
            raise RuntimeError from err
        if not isinstance(err, StepFailedRecreateEnvError):  # that one asks for it quietly
            logger.exception(
                "envrunners.rllib %s: environment step failed; recreating the env: %s",
                name,
                err,
            )
        runner.make_env()
        after_recreate()
        return ENV_STEP_FAILURE
    runner._env_step_s += time.perf_counter() - start
    runner._env_step_calls += 1
    if results is RLLIB_ENV_STEP_FAILURE:  # pragma: no cover - a wrapper's sentinel
        return ENV_STEP_FAILURE
    return results
