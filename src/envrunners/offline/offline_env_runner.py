"""``OfflineSingleAgentEnvRunner`` (``ray.rllib.offline.offline_env_runner``): sample and record.

Why: RLlib's new stack records experience with this runner: every ``sample()`` call
writes the sampled episode chunks (``output_write_episodes=True``) or their steps as
rows to Parquet under ``config.output``, in the layout RLlib's ``OfflineData`` reads.
Here the writing is done by :class:`~envrunners.offline.parquet_writer.ParquetEpisodeWriter`
(pyarrow, no Ray Data, no pickle), hooked into the runner's episode recording, so
sampling itself is unchanged.

Config keys read (``config.offline_data(...)``): ``output``,
``output_write_episodes``, ``output_max_rows_per_file``,
``output_write_remaining_data``, ``output_compress_columns`` (RLlib pickles these
columns; here columns are always stored uncompressed, which RLlib reads too).
"""

from __future__ import annotations

from typing import Any

from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.errors import ConfigError
from envrunners.offline.episode_writer import set_episode_writer
from envrunners.offline.parquet_writer import ParquetEpisodeWriter

__all__ = ["OfflineSingleAgentEnvRunner"]


def _subdir(config: Any) -> str:
    """RLlib's sub-directory: the env id in lower case, or the env class name."""
    env = getattr(config, "env", None)
    if isinstance(env, str):
        return env.lower()
    return getattr(env, "__name__", type(env).__name__).lower()


class OfflineSingleAgentEnvRunner(SingleAgentEnvRunner):
    """A ``SingleAgentEnvRunner`` that writes what it samples to Parquet (``config.output``).

    Args:
        config: An ``AlgorithmConfig`` whose ``output`` is a local directory.
        **kwargs: As for ``SingleAgentEnvRunner`` (``worker_index``, ...).

    Raises:
        ConfigError: if ``config.output`` is not a directory path, or
            ``output_write_method`` is not ``"write_parquet"``.
    """

    def __init__(self, *, config: Any, **kwargs: Any):
        super().__init__(config=config, **kwargs)
        output = getattr(config, "output", None)
        if not isinstance(output, str) or output in ("logdir", "dataset"):
            raise ConfigError(
                f"OfflineSingleAgentEnvRunner needs config.offline_data(output=<directory>), "
                f"got output={output!r}"
            )
        method = getattr(config, "output_write_method", "write_parquet")
        if method != "write_parquet":
            raise ConfigError(
                f"output_write_method={method!r}: OfflineSingleAgentEnvRunner writes Parquet "
                "only (output_write_method='write_parquet')"
            )
        self.output_path = output
        self.subdir_path = _subdir(config)
        self.output_write_episodes = bool(getattr(config, "output_write_episodes", True))
        self.output_max_rows_per_file = getattr(config, "output_max_rows_per_file", None)
        self.write_remaining_data = bool(getattr(config, "output_write_remaining_data", False))
        self.output_compress_columns = list(getattr(config, "output_compress_columns", []) or [])
        self._parquet_writer = ParquetEpisodeWriter(
            output,
            subdir=self.subdir_path,
            worker_index=int(getattr(self, "worker_index", 0) or 0),
            write_episodes=self.output_write_episodes,
            max_rows_per_file=self.output_max_rows_per_file,
            write_remaining_data=self.write_remaining_data,
        )
        set_episode_writer(self, self._parquet_writer)

    @property
    def published_files(self) -> list[str]:
        """The Parquet files written so far by this runner."""
        return self._parquet_writer.published_files
