"""Vectorised multi-agent envs (``ray.rllib.env.vector``): sync, async and ``make_vec``."""

from envrunners.env.vector.async_vector_multi_agent_env import AsyncVectorMultiAgentEnv, SubEnvError
from envrunners.env.vector.registration import make_vec
from envrunners.env.vector.sync_vector_multi_agent_env import SyncVectorMultiAgentEnv
from envrunners.env.vector.vector_multi_agent_env import VectorMultiAgentEnv

__all__ = [
    "AsyncVectorMultiAgentEnv",
    "SubEnvError",
    "SyncVectorMultiAgentEnv",
    "VectorMultiAgentEnv",
    "make_vec",
]
