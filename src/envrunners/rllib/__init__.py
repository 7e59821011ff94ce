"""envrunners' runners inside RLlib's own algorithms (``config.env_runners(env_runner_cls=...)``).

The only part of envrunners that imports ``ray.rllib``; names load on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MultiAgentEnvRunner"]


def __getattr__(name: str) -> Any:
    if name == "MultiAgentEnvRunner":
        from envrunners.rllib.multi_agent_env_runner import MultiAgentEnvRunner

        return MultiAgentEnvRunner
    raise AttributeError(f"module 'envrunners.rllib' has no attribute {name!r}")
