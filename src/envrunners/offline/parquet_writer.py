"""``ParquetEpisodeWriter``: write episode chunks as Parquet in RLlib 2.60's layouts.

Why: RLlib's new stack records and reads offline data as Parquet through Ray Data.
This writer produces the same files without Ray Data (pyarrow only): either one
episode per row (``write_episodes=True``: RLlib's msgpack episode state in column
``item``) or one timestep per row (RLlib's columns ``eps_id``, ``obs``, ``actions``,
``rewards``, ``new_obs``, ``terminateds``, ``truncateds``, extra model outputs).
Nothing is pickled: a value that is not plain data raises ``UnencodableValueError``.

Files are written under a hidden temporary name and published by rename, so a
reader never sees half a file. Each write event goes to its own directory, named as
RLlib names them: ``<path>/<subdir>/run-<worker:06d>-<event:05d>/part-<k>.parquet``.
With ``max_rows_per_file`` rows (episodes, or steps) are buffered and written in
files of exactly that many rows; the rest is written by :meth:`close` if
``write_remaining_data``.
"""

from __future__ import annotations

import os
from typing import Any

from envrunners.offline._parquet import episodes_to_rows_table, episodes_to_table
from envrunners.offline._rolling_file import _publish, temp_name

__all__ = ["ParquetEpisodeWriter"]


class ParquetEpisodeWriter:
    """Write episode chunks to Parquet files that RLlib's ``OfflineData`` reads.

    Args:
        path: Output base directory (local; created if missing).
        subdir: Directory under ``path`` (RLlib: the env id, lower case).
        worker_index: Goes into the run directory names.
        write_episodes: One episode per row (True) or one step per row (False).
        max_rows_per_file: Buffer until this many rows, then write files of exactly
            this many rows (None: write every ``write()`` call as one file).
        write_remaining_data: Write the buffered rest on :meth:`close`.
        compression: Parquet compression codec.
    """

    def __init__(
        self,
        path: str,
        *,
        subdir: str = "",
        worker_index: int = 0,
        write_episodes: bool = True,
        max_rows_per_file: int | None = None,
        write_remaining_data: bool = True,
        compression: str = "snappy",
    ) -> None:
        if max_rows_per_file is not None and int(max_rows_per_file) <= 0:
            raise ValueError(f"max_rows_per_file must be > 0 or None, got {max_rows_per_file}")
        self.directory = os.path.join(os.path.abspath(os.path.expanduser(path)), subdir)
        self.worker_index = int(worker_index)
        self.write_episodes = bool(write_episodes)
        self.max_rows_per_file = int(max_rows_per_file) if max_rows_per_file else None
        self.write_remaining_data = bool(write_remaining_data)
        self.compression = compression
        self.num_rows_written = 0
        self._published: list[str] = []
        self._buffer: list[Any] = []  # Arrow tables not yet written
        self._buffered_rows = 0
        self._event = 0

    @property
    def published_files(self) -> list[str]:
        """The files written so far, in order."""
        return list(self._published)

    def write(self, episodes: Any) -> int:
        """Add episode chunks (one chunk or an iterable); writes files as the buffer allows.

        Returns:
            The number of rows (episodes or steps) added.
        """
        if not isinstance(episodes, list | tuple):
            episodes = [episodes] if hasattr(episodes, "get_state") else list(episodes)
        episodes = [ep for ep in episodes if len(ep) > 0 or self.write_episodes]
        if not episodes:
            return 0
        table = episodes_to_table(episodes) if self.write_episodes else (
            episodes_to_rows_table(episodes)
        )  # fmt: skip
        self._buffer.append(table)
        self._buffered_rows += table.num_rows
        if self.max_rows_per_file is None:
            self._flush(None)
        elif self._buffered_rows >= self.max_rows_per_file:
            self._flush(self.max_rows_per_file)
        return table.num_rows

    def _flush(self, rows_per_file: int | None) -> None:
        import pyarrow as pa

        table = pa.concat_tables(self._buffer) if len(self._buffer) > 1 else self._buffer[0]
        step = rows_per_file or table.num_rows
        n_full = table.num_rows // step
        if n_full == 0:
            return
        self._event += 1
        run = os.path.join(
            self.directory, f"run-{self.worker_index:06d}" + f"-{self._event}".zfill(6)
        )
        for k in range(n_full):
            self._write_file(table.slice(k * step, step), os.path.join(run, f"part-{k}.parquet"))
        rest = table.slice(n_full * step)
        self._buffer = [rest] if rest.num_rows else []
        self._buffered_rows = rest.num_rows

    def _write_file(self, table: Any, final: str) -> None:
        import pyarrow.parquet as pq

        os.makedirs(os.path.dirname(final), exist_ok=True)
        tmp = temp_name(final)
        try:
            pq.write_table(table, tmp, compression=self.compression)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        self._published.append(_publish(tmp, final))
        self.num_rows_written += table.num_rows

    def close(self) -> None:
        """Write the buffered rest (if ``write_remaining_data``), then forget it."""
        if self._buffer and self.write_remaining_data:
            self._flush(None)
        self._buffer, self._buffered_rows = [], 0

    def __enter__(self) -> ParquetEpisodeWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
