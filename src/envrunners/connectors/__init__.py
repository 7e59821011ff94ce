"""ConnectorV2 pipelines between env and module, run on whole vector-step batches."""

from envrunners.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.connectors.env_to_module.mean_std_filter import MeanStdFilter
from envrunners.connectors.module_to_env.normalize_and_clip_actions import (
    NormalizeAndClipActions,
)
from envrunners.connectors.reward_clipping import clip_rewards_fn

__all__ = [
    "ConnectorPipelineV2",
    "ConnectorV2",
    "MeanStdFilter",
    "NormalizeAndClipActions",
    "clip_rewards_fn",
]
