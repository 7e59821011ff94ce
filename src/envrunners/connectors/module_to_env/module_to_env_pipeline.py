"""``ModuleToEnvPipeline``: the pipeline between module outputs and env actions (RLlib's path)."""

from __future__ import annotations

from envrunners.connectors.connector_pipeline_v2 import ConnectorPipelineV2

__all__ = ["ModuleToEnvPipeline"]


class ModuleToEnvPipeline(ConnectorPipelineV2):
    """A ``ConnectorPipelineV2`` from the module's output batch to env actions."""
