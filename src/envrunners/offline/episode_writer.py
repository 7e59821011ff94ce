"""Record new-stack episodes (one line per episode chunk) and read them back.

Why: ``SingleAgentEnvRunner``/``MultiAgentEnvRunner`` return episode chunks, not
batches; with ``config.offline_data(output=path)`` they record every chunk they
sample, under the same rules as ``JsonWriter``: plain data only (never pickle),
files written under a temporary name and published by rename, rolled by size.

A line is ``{"type": "SingleAgentEpisode" | "MultiAgentEpisode", "state": ...}``
holding ``episode.get_state()`` (see ``envrunners.offline.json_codec``), so
:func:`read_episodes` restores the exact chunk (``from_state``) and ``JsonReader``
reads the same files as batches (``episode.get_sample_batch()``).

A runner records with one call after sampling::

    episodes = ...  # the sampled chunks
    record_episodes(self, episodes)   # no-op unless config.output is set

The writer is created on first use, kept per runner, and its open file is
published when :func:`close_episode_writer` is called (e.g. in ``stop()``), when the
runner is garbage collected, or at interpreter exit.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from envrunners.errors import OfflineDataError
from envrunners.offline._input_files import iter_lines, parse_line, resolve_inputs
from envrunners.offline._rolling_file import RollingFileWriter
from envrunners.offline.io_context import IOContext, _get
from envrunners.offline.json_codec import EPISODE_TYPES, dumps, episode_to_record
from envrunners.offline.json_writer import _check_local

__all__ = [
    "EpisodeWriter",
    "close_episode_writer",
    "read_episodes",
    "record_episodes",
    "set_episode_writer",
]

logger = logging.getLogger("envrunners")


class EpisodeWriter:
    """Write episode chunks as JSON lines (one chunk per line), crash-safe and pickle-free.

    Args:
        path: Output directory (created if missing; local paths only).
        worker_index: Goes into the file names (``output-<time>_worker-<i>_<k>.json``).
        max_file_size: Roll to a new file once the current one holds this many bytes.
        drop_non_json_values: Drop values that are not plain data (counted in
            ``num_dropped_values``) instead of raising.
        fsync: ``os.fsync`` each file before publishing it.
    """

    def __init__(
        self,
        path: str,
        *,
        worker_index: int = 0,
        max_file_size: int = 64 * 1024 * 1024,
        drop_non_json_values: bool = False,
        fsync: bool = True,
    ) -> None:
        self._files = RollingFileWriter(
            _check_local(path, "EpisodeWriter"),
            worker_index=worker_index,
            max_file_size=max_file_size,
            fsync=fsync,
        )
        self.path = self._files.directory
        self.drop_non_json_values = drop_non_json_values
        self.num_dropped_values = 0
        self.num_episodes_written = 0

    @property
    def published_files(self) -> list[str]:
        """The finished (rolled or closed) files, in order."""
        return self._files.published_files

    def write(self, episodes: Any) -> int:
        """Write one episode chunk, or each chunk of an iterable, as one line each.

        Returns:
            The number of lines written.

        Raises:
            UnencodableValueError: (a ``TypeError``) if a chunk holds a value that is
                not plain data (nothing of that chunk is written).
        """
        if type(episodes).__name__ in EPISODE_TYPES:
            episodes = [episodes]
        n = 0
        for episode in episodes:
            dropped: list[str] | None = [] if self.drop_non_json_values else None
            record = episode_to_record(
                episode, drop_non_json_values=self.drop_non_json_values, dropped=dropped
            )
            if dropped:
                self.num_dropped_values += len(dropped)
            self._files.write_line(dumps(record))
            n += 1
        self.num_episodes_written += n
        return n

    def close(self) -> None:
        """Publish the open file now."""
        self._files.close()

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_episodes(inputs: str | list[str], *, skip_corrupt: bool = False) -> Iterator[Any]:
    """Yield the episode chunks recorded in ``inputs`` (files, globs, directories), in order.

    Raises:
        OfflineDataError: for a corrupt line (unless ``skip_corrupt``) or a line
            that holds a batch, not an episode; names the file and line.
    """
    for path in resolve_inputs(inputs, "read_episodes"):
        for where, lineno, line in iter_lines(path):
            try:
                obj = parse_line(line, where, lineno, episodes=True)
            except OfflineDataError:
                if skip_corrupt:
                    continue
                raise
            if obj is None:
                continue
            if type(obj).__name__ not in EPISODE_TYPES:
                raise OfflineDataError(
                    f"this line holds a {type(obj).__name__}, not an episode; read batch "
                    "files with JsonReader",
                    path=where,
                    line=lineno,
                )
            yield obj


# --------------------------------------------------------------- runner hook

_WRITERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _writer_for(runner: Any, output: Any) -> Any:
    config = runner.config
    worker_index = int(getattr(runner, "worker_index", 0) or 0)
    if callable(output) and not isinstance(output, str):
        ioctx = IOContext(config=config, worker_index=worker_index)
        return output(ioctx)
    if output == "dataset":
        raise OfflineDataError(
            "output='dataset' writes through ray.data, which envrunners does not include; "
            "give a directory instead"
        )
    path = (getattr(runner, "log_dir", None) or os.getcwd()) if output == "logdir" else output
    options = _get(config, "output_config", None) or {}
    return EpisodeWriter(
        path,
        worker_index=worker_index,
        max_file_size=int(_get(config, "output_max_file_size", 64 * 1024 * 1024)),
        drop_non_json_values=bool(
            options.get("drop_non_json_values", options.get("drop_non_json_infos", False))
        ),
        fsync=bool(options.get("fsync", True)),
    )


def record_episodes(runner: Any, episodes: Iterable[Any]) -> None:
    """Record ``episodes`` if ``runner.config.output`` is set (one line per chunk).

    Why: the one call an env runner makes after ``sample()`` to honour
    ``config.offline_data(output=...)``. Cheap when no output is configured.
    A callable ``output`` is called once with an ``IOContext`` and must return an
    object whose ``write(episodes)`` accepts the list of chunks.
    """
    output = _get(runner.config, "output", None)
    if output is None:
        return
    writer = _WRITERS.get(runner)
    if writer is None:
        writer = _writer_for(runner, output)
        set_episode_writer(runner, writer)
    writer.write(list(episodes))


def set_episode_writer(runner: Any, writer: Any) -> None:
    """Make ``writer`` (``write(episodes)``, optional ``close()``) record ``runner``'s chunks.

    Why: ``OfflineSingleAgentEnvRunner`` records to Parquet instead of JSON lines
    through the same :func:`record_episodes` hook; the writer is closed like the default one.
    """
    _WRITERS[runner] = writer
    close = getattr(writer, "close", None)
    if close is not None:
        weakref.finalize(runner, close)


def close_episode_writer(runner: Any) -> None:
    """Publish and forget the episode writer of ``runner`` (call it from ``stop()``)."""
    writer = _WRITERS.pop(runner, None)
    close = getattr(writer, "close", None)
    if close is not None:
        close()
