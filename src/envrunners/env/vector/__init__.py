"""Every vector env of the package: multi-agent sync/async (``ray.rllib.env.vector``),
multi-agent shared memory, ``make_vec``, and the single-agent ``FastSyncVectorEnv``,
``EnvPoolVectorEnv`` and ``SharedMemoryVectorEnv``."""

from envrunners.env.vector.async_vector_multi_agent_env import AsyncVectorMultiAgentEnv
from envrunners.env.vector.envpool_vector_env import EnvPoolVectorEnv
from envrunners.env.vector.fast_sync_vector_env import FastSyncVectorEnv
from envrunners.env.vector.registration import make_vec
from envrunners.env.vector.shared_memory_vector_env import SharedMemoryVectorEnv
from envrunners.env.vector.shared_memory_vector_multi_agent_env import (
    SharedMemoryVectorMultiAgentEnv,
)
from envrunners.env.vector.sync_vector_multi_agent_env import SyncVectorMultiAgentEnv
from envrunners.env.vector.vector_multi_agent_env import VectorMultiAgentEnv

__all__ = [
    "AsyncVectorMultiAgentEnv",
    "EnvPoolVectorEnv",
    "FastSyncVectorEnv",
    "SharedMemoryVectorEnv",
    "SharedMemoryVectorMultiAgentEnv",
    "SyncVectorMultiAgentEnv",
    "VectorMultiAgentEnv",
    "make_vec",
]
