"""envrunners: fast, fault-tolerant RL experience collection with RLlib's public API.

Every public RLlib path maps by replacing ``ray.rllib`` with ``envrunners``; the
most used names are also importable flat from here. Imports are lazy, so
``import envrunners`` stays cheap (no Ray or torch until a name needs them).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # errors
    "EnvRunnersError": "envrunners.errors",
    "ConfigError": "envrunners.errors",
    "EnvCreatorError": "envrunners.errors",
    "UnknownPolicyError": "envrunners.errors",
    "OfflineDataError": "envrunners.errors",
    "EnvRunnerError": "envrunners.errors",
    "SpaceError": "envrunners.errors",
    "MultiAgentEnvError": "envrunners.errors",
    # constants
    "Columns": "envrunners.core.columns",
    # config
    "AlgorithmConfig": "envrunners.algorithms.algorithm_config",
    "PPOConfig": "envrunners.algorithms.ppo",
    "PolicySpec": "envrunners.policy.policy_spec",
    "EnvContext": "envrunners.env.env_context",
    # batches
    "SampleBatch": "envrunners.policy.sample_batch",
    "MultiAgentBatch": "envrunners.policy.sample_batch",
    "concat_samples": "envrunners.policy.sample_batch",
    "concat_samples_into_ma_batch": "envrunners.policy.sample_batch",
    "convert_ma_batch_to_sample_batch": "envrunners.policy.sample_batch",
    # episodes
    "InfiniteLookbackBuffer": "envrunners.env.utils.infinite_lookback_buffer",
    "SingleAgentEpisode": "envrunners.env.single_agent_episode",
    "MultiAgentEpisode": "envrunners.env.multi_agent_episode",
    # modules
    "RLModule": "envrunners.core.rl_module.rl_module",
    "RLModuleSpec": "envrunners.core.rl_module.rl_module",
    "MultiRLModule": "envrunners.core.rl_module.multi_rl_module",
    "MultiRLModuleSpec": "envrunners.core.rl_module.multi_rl_module",
    "DefaultTorchRLModule": "envrunners.core.rl_module.default_torch_rl_module",
    "DefaultModelConfig": "envrunners.core.rl_module.default_model_config",
    "TorchRLModule": "envrunners.core.rl_module.torch.torch_rl_module",
    # runners
    "EnvRunner": "envrunners.env.env_runner",
    "SingleAgentEnvRunner": "envrunners.env.single_agent_env_runner",
    "StepFailedRecreateEnvError": "envrunners.env.env_errors",
    "register_env": "envrunners.env.registry",
    # groups and fault tolerance
    "EnvRunnerGroup": "envrunners.env.env_runner_group",
    "WorkerSet": "envrunners.evaluation.worker_set",
    "FaultTolerantActorManager": "envrunners.utils.actor_manager",
    "FaultAwareApply": "envrunners.utils.actor_manager",
    "CallResult": "envrunners.utils.actor_manager",
    "RemoteCallResults": "envrunners.utils.actor_manager",
    "ResultOrError": "envrunners.utils.actor_manager",
    "synchronous_parallel_sample": "envrunners.execution.rollout_ops",
    # multi-agent
    "MultiAgentEnv": "envrunners.env.multi_agent_env",
    "make_multi_agent": "envrunners.env.multi_agent_env",
    "MultiAgentEnvRunner": "envrunners.env.multi_agent_env_runner",
    "PettingZooEnv": "envrunners.env.wrappers.pettingzoo_env",
    "ParallelPettingZooEnv": "envrunners.env.wrappers.pettingzoo_env",
    "VectorMultiAgentEnv": "envrunners.env.vector",
    "SyncVectorMultiAgentEnv": "envrunners.env.vector",
    "AsyncVectorMultiAgentEnv": "envrunners.env.vector",
    # old stack
    "Policy": "envrunners.policy.policy",
    "TorchPolicy": "envrunners.policy.torch_policy",
    "PolicyMap": "envrunners.policy.policy_map",
    "RolloutWorker": "envrunners.evaluation.rollout_worker",
    "SyncSampler": "envrunners.evaluation.sampler",
    "SamplerInput": "envrunners.evaluation.sampler",
    "RolloutMetrics": "envrunners.evaluation.metrics",
    "compute_advantages": "envrunners.evaluation.postprocessing",
    "PGTorchPolicy": "envrunners.algorithms.pg",
    "PPOTorchPolicy": "envrunners.algorithms.ppo",
    # offline data
    "InputReader": "envrunners.offline.input_reader",
    "IOContext": "envrunners.offline.io_context",
    "OutputWriter": "envrunners.offline.output_writer",
    "NoopOutput": "envrunners.offline.output_writer",
    "JsonReader": "envrunners.offline.json_reader",
    "JsonWriter": "envrunners.offline.json_writer",
    "MixedInput": "envrunners.offline.mixed_input",
    "ShuffledInput": "envrunners.offline.shuffled_input",
    "D4RLReader": "envrunners.offline.d4rl_reader",
    # filters and connectors
    "Filter": "envrunners.utils.filter",
    "NoFilter": "envrunners.utils.filter",
    "MeanStdFilter": "envrunners.utils.filter",
    "ConcurrentMeanStdFilter": "envrunners.utils.filter",
    "RunningStat": "envrunners.utils.filter",
    "get_filter": "envrunners.utils.filter",
    "FilterManager": "envrunners.utils.filter_manager",
    "ConnectorV2": "envrunners.connectors",
    "ConnectorPipelineV2": "envrunners.connectors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'envrunners' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
