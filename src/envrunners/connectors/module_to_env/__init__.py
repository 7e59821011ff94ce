"""Module-to-env connector pieces (RLlib's ``connectors.module_to_env``), whole-batch."""

from envrunners.connectors.module_to_env.get_actions import GetActions
from envrunners.connectors.module_to_env.module_to_env_pipeline import ModuleToEnvPipeline
from envrunners.connectors.module_to_env.normalize_and_clip_actions import (
    NormalizeAndClipActions,
)

__all__ = ["GetActions", "ModuleToEnvPipeline", "NormalizeAndClipActions"]
