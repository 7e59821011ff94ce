"""``EnvToModulePipeline``: the pipeline between env observations and the module (RLlib's path)."""

from __future__ import annotations

from envrunners.connectors.connector_pipeline_v2 import ConnectorPipelineV2

__all__ = ["EnvToModulePipeline"]


class EnvToModulePipeline(ConnectorPipelineV2):
    """A ``ConnectorPipelineV2`` from env observations to the module's input batch."""
