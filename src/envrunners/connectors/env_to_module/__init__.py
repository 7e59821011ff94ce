"""Env-to-module connector pieces (RLlib's ``connectors.env_to_module``), whole-batch."""

from envrunners.connectors.env_to_module.env_to_module_pipeline import EnvToModulePipeline
from envrunners.connectors.env_to_module.flatten_observations import FlattenObservations
from envrunners.connectors.env_to_module.frame_stacking import FrameStackingEnvToModule
from envrunners.connectors.env_to_module.mean_std_filter import MeanStdFilter
from envrunners.connectors.env_to_module.observation_preprocessor import (
    ObservationPreprocessor,
    SingleAgentObservationPreprocessor,
)
from envrunners.connectors.env_to_module.prev_actions_prev_rewards import PrevActionsPrevRewards

__all__ = [
    "EnvToModulePipeline",
    "FlattenObservations",
    "FrameStackingEnvToModule",
    "MeanStdFilter",
    "ObservationPreprocessor",
    "PrevActionsPrevRewards",
    "SingleAgentObservationPreprocessor",
]
