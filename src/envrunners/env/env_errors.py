"""Errors an environment may raise to steer the runner (``ray.rllib.env.env_errors``)."""

from envrunners.errors import StepFailedRecreateEnvError

__all__ = ["StepFailedRecreateEnvError"]
