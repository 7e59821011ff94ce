"""Errors an environment may raise to steer the runner (``ray.rllib.env.env_errors``)."""

from __future__ import annotations

__all__ = ["StepFailedRecreateEnvError"]


class StepFailedRecreateEnvError(Exception):
    """Raised by an env's ``step``/``reset`` to ask for a silent recreate and reset.

    With ``restart_failed_sub_environments=True`` the runner recreates the failing
    (sub-)environment, drops its partial episode and goes on, without logging a
    traceback (any other exception is logged once).
    """
