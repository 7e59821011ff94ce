"""``JsonWriter``: record batches as JSON lines, one batch per line, crash-safe and pickle-free.

Why: ``config.offline_data(output=path)`` makes every ``RolloutWorker`` record what
it samples, for offline RL, debugging and replays. Lines follow RLlib's layout
(see ``envrunners.offline.json_codec`` for the exact format); files follow
RLlib's naming, ``output-<time>_worker-<i>_<k>.json``, rolled by size. A file is
written under a hidden temporary name and renamed when rolled or closed
(``envrunners.offline._rolling_file``): readers never see half a record, and a
crash never damages a finished file.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from envrunners.offline._rolling_file import RollingFileWriter, recover_partial_files
from envrunners.offline.io_context import IOContext
from envrunners.offline.json_codec import batch_to_record, dumps
from envrunners.offline.output_writer import OutputWriter

__all__ = ["JsonWriter", "recover_partial_files"]

logger = logging.getLogger("envrunners")


def _check_local(path: str, who: str) -> str:
    if not isinstance(path, str) or not path:
        raise ValueError(f"{who}: path must be a non-empty str (a directory), got {path!r}")
    scheme = path.split("://", 1)[0] if "://" in path else ""
    if scheme and scheme != "file":
        raise ValueError(
            f"{who}: cannot write to {path!r}: only local directories are supported (files "
            "are published by an atomic rename, which object stores do not offer); write "
            "locally and upload the finished *.json files."
        )
    return path[len("file://") :] if scheme == "file" else path


class JsonWriter(OutputWriter):
    """Write ``SampleBatch``/``MultiAgentBatch`` objects to JSON-lines files in a directory.

    Args:
        path: Output directory (created if missing; local paths only).
        ioctx: The worker's ``IOContext`` (its ``worker_index`` names the files).
        max_file_size: Roll to a new file once the current one holds this many
            bytes (checked before each write, so a file may exceed it by one record).
        compress_columns: Accepted for RLlib compatibility; envrunners packs every
            array column with its plain-data codec, so this changes nothing.
        drop_non_json_infos: Drop info values that are not plain data (counted in
            ``num_dropped_info_values``) instead of raising at write time.
        fsync: ``os.fsync`` each file before publishing it.

    Raises:
        ValueError: for a remote URI or a non-positive ``max_file_size``.
    """

    def __init__(
        self,
        path: str,
        ioctx: IOContext | None = None,
        max_file_size: int = 64 * 1024 * 1024,
        compress_columns: Iterable[str] = frozenset(["obs", "new_obs"]),
        *,
        drop_non_json_infos: bool = False,
        fsync: bool = True,
    ) -> None:
        self.ioctx = ioctx or IOContext()
        self.path = _check_local(path, "JsonWriter")
        self.max_file_size = int(max_file_size)
        self.compress_columns = frozenset(compress_columns or ())
        self.drop_non_json_infos = drop_non_json_infos
        self.num_dropped_info_values = 0
        self._files = RollingFileWriter(
            self.path,
            worker_index=self.ioctx.worker_index,
            max_file_size=self.max_file_size,
            fsync=fsync,
        )
        self.path = self._files.directory

    @property
    def bytes_written(self) -> int:
        """Bytes written to the current file (RLlib's attribute)."""
        return self._files.bytes_written

    @property
    def file_index(self) -> int:
        """Number of files opened so far (RLlib's attribute)."""
        return self._files.file_index

    @property
    def published_files(self) -> list[str]:
        """The finished (rolled or closed) files, in order."""
        return self._files.published_files

    def write(self, sample_batch: Any) -> None:
        """Append one batch as one line (rolling the file first if it is full).

        Raises:
            UnencodableValueError: (a ``TypeError``) if a column or info value is not
                plain data; nothing is written for that batch.
            TypeError: if ``sample_batch`` is not a SampleBatch or MultiAgentBatch.
        """
        dropped: list[str] | None = [] if self.drop_non_json_infos else None
        record = batch_to_record(
            sample_batch, drop_non_json_infos=self.drop_non_json_infos, dropped=dropped
        )
        if dropped:
            self.num_dropped_info_values += len(dropped)
            logger.debug("JsonWriter dropped non-plain info values: %s", dropped[:5])
        self._files.write_line(dumps(record))

    def close(self) -> None:
        """Publish the open file now (it is also published on garbage collection/exit)."""
        self._files.close()

    def __enter__(self) -> JsonWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JsonWriter(path={self.path!r}, worker_index={self.ioctx.worker_index})"
