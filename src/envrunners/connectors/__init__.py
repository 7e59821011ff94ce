"""Batch-wise connector pipelines between env and module (env-to-module, module-to-env)."""

from envrunners.connectors.connector_v2 import ConnectorPipelineV2, ConnectorV2
from envrunners.connectors.steps import (
    MeanStdFilter,
    NormalizeAndClipActions,
    clip_rewards_fn,
)

__all__ = [
    "ConnectorPipelineV2",
    "ConnectorV2",
    "MeanStdFilter",
    "NormalizeAndClipActions",
    "clip_rewards_fn",
]
