"""Ids and component names shared by runners, modules and learners (``ray.rllib.core``)."""

from __future__ import annotations

from envrunners.core.columns import Columns

DEFAULT_AGENT_ID = "default_agent"
DEFAULT_MODULE_ID = "default_policy"
DEFAULT_POLICY_ID = DEFAULT_MODULE_ID
ALL_MODULES = "__all_modules__"

COMPONENT_RL_MODULE = "rl_module"
COMPONENT_ENV_TO_MODULE_CONNECTOR = "env_to_module_connector"
COMPONENT_MODULE_TO_ENV_CONNECTOR = "module_to_env_connector"
COMPONENT_LEARNER = "learner"
COMPONENT_ENV_RUNNER = "env_runner"

INPUT_ENV_SPACES = "__env__"
INPUT_ENV_SINGLE_SPACES = "__env_single__"

__all__ = [
    "ALL_MODULES",
    "COMPONENT_ENV_RUNNER",
    "COMPONENT_ENV_TO_MODULE_CONNECTOR",
    "COMPONENT_LEARNER",
    "COMPONENT_MODULE_TO_ENV_CONNECTOR",
    "COMPONENT_RL_MODULE",
    "Columns",
    "DEFAULT_AGENT_ID",
    "DEFAULT_MODULE_ID",
    "DEFAULT_POLICY_ID",
    "INPUT_ENV_SINGLE_SPACES",
    "INPUT_ENV_SPACES",
]
