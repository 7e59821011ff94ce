"""Optional module APIs (``ray.rllib.core.rl_module.apis``)."""

from __future__ import annotations

from envrunners.core.rl_module.apis.value_function_api import ValueFunctionAPI

__all__ = ["ValueFunctionAPI"]
