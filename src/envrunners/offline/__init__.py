"""Offline experience IO (``ray.rllib.offline``): readers, writers and their context.

Why: RolloutWorkers read training data from files, mixtures and their own env,
and record what they sample; new-stack runners record their episodes. Files are
JSON lines, one batch (or episode chunk) per line, with arrays in a pickle-free
codec (``json_codec``); writers publish files atomically (``json_writer``).

Public names (imported lazily, so ``import envrunners.offline`` is cheap):

- ``InputReader``, ``IOContext``, ``OutputWriter``, ``NoopOutput``
- ``JsonReader``, ``JsonWriter``, ``MixedInput``, ``ShuffledInput``, ``D4RLReader``
- ``EpisodeWriter``, ``read_episodes``, ``record_episodes``, ``close_episode_writer``
- ``input_reader_from_config``, ``output_writer_from_config``
- ``register_input``, ``registry_contains_input``, ``registry_get_input``
- ``recover_partial_files``
- new stack, Parquet (RLlib 2.60's layouts): ``OfflineSingleAgentEnvRunner``,
  ``OfflineData``, ``OfflinePreLearner``, ``ParquetEpisodeWriter``,
  ``read_parquet_episodes``, ``read_parquet_batches``
- Minari: ``read_minari_episodes``, ``read_minari_batches``, ``write_minari``
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "InputReader": "envrunners.offline.input_reader",
    "IOContext": "envrunners.offline.io_context",
    "OutputWriter": "envrunners.offline.output_writer",
    "NoopOutput": "envrunners.offline.output_writer",
    "JsonReader": "envrunners.offline.json_reader",
    "JsonWriter": "envrunners.offline.json_writer",
    "recover_partial_files": "envrunners.offline.json_writer",
    "MixedInput": "envrunners.offline.mixed_input",
    "ShuffledInput": "envrunners.offline.shuffled_input",
    "D4RLReader": "envrunners.offline.d4rl_reader",
    "EpisodeWriter": "envrunners.offline.episode_writer",
    "read_episodes": "envrunners.offline.episode_writer",
    "record_episodes": "envrunners.offline.episode_writer",
    "close_episode_writer": "envrunners.offline.episode_writer",
    "input_reader_from_config": "envrunners.offline.io_selection",
    "output_writer_from_config": "envrunners.offline.io_selection",
    "register_input": "envrunners.offline.input_registry",
    "registry_contains_input": "envrunners.offline.input_registry",
    "registry_get_input": "envrunners.offline.input_registry",
    "OfflineSingleAgentEnvRunner": "envrunners.offline.offline_env_runner",
    "OfflineData": "envrunners.offline.offline_data",
    "OfflinePreLearner": "envrunners.offline.offline_prelearner",
    "ParquetEpisodeWriter": "envrunners.offline.parquet_writer",
    "read_parquet_episodes": "envrunners.offline.parquet_reader",
    "read_parquet_batches": "envrunners.offline.parquet_reader",
    "read_minari_episodes": "envrunners.offline.minari_io",
    "read_minari_batches": "envrunners.offline.minari_io",
    "write_minari": "envrunners.offline.minari_io",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'envrunners.offline' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
