"""Crash-safe, size-rolled output files: write under a temporary name, publish by rename.

Why: a reader must never see half a record, and a crash must never damage a file
that was already finished. Each output file is written as a hidden temporary
``.<name>.tmp`` next to its final name (``*.json`` globs do not match it) and is
renamed to ``<name>`` when it is rolled (it reached ``max_file_size``) or closed.
Renames never replace an existing file. Every record is flushed to the OS as
it is written, so a killed process leaves complete lines in its temporary file,
plus at most one partial last line: :func:`recover_partial_files` trims that
tail and publishes the file.

Names follow RLlib: ``output-<YYYY-mm-dd_HH-MM-SS>_worker-<index>_<file index>.json``.
"""

from __future__ import annotations

import os
import time
import weakref
from dataclasses import dataclass, field
from typing import BinaryIO

__all__ = ["RollingFileWriter", "recover_partial_files", "temp_name"]

TMP_SUFFIX = ".tmp"


def temp_name(final_path: str) -> str:
    """The hidden temporary name under which ``final_path`` is written."""
    head, tail = os.path.split(final_path)
    return os.path.join(head, "." + tail + TMP_SUFFIX)


def _publish(tmp: str, final: str) -> str:
    """Rename ``tmp`` to ``final`` without replacing an existing file; returns the name used."""
    base, ext = os.path.splitext(final)
    candidate, k = final, 0
    while True:
        try:
            os.link(tmp, candidate)  # atomic and fails if `candidate` exists
        except FileExistsError:
            k += 1
            candidate = f"{base}.{k}{ext}"
            continue
        except OSError:  # no hard links on this filesystem: check, then rename
            if os.path.exists(candidate):
                k += 1
                candidate = f"{base}.{k}{ext}"
                continue
            os.replace(tmp, candidate)
            return candidate
        os.unlink(tmp)
        return candidate


@dataclass
class _OpenFile:
    """The state of the file being written (kept apart from the writer for the finalizer)."""

    handle: BinaryIO | None = None
    tmp: str = ""
    final: str = ""
    fsync: bool = True
    published: list[str] = field(default_factory=list)

    def close(self) -> None:
        handle, self.handle = self.handle, None
        if handle is None:
            return
        try:
            handle.flush()
            if self.fsync:
                os.fsync(handle.fileno())
        finally:
            handle.close()
        self.published.append(_publish(self.tmp, self.final))


class RollingFileWriter:
    """Append lines to size-rolled files in ``directory``; finished files appear atomically.

    Args:
        directory: Output directory (created if missing).
        worker_index: Goes into the file names.
        max_file_size: Start a new file before a write once the current one holds
            at least this many bytes (a file exceeds it by at most one record).
        fsync: ``os.fsync`` each file before publishing it (durable on power loss).

    The open file is also published when the writer is garbage collected or the
    interpreter exits; call :meth:`close` to do it now.
    """

    def __init__(
        self, directory: str, *, worker_index: int = 0, max_file_size: int, fsync: bool = True
    ):
        if max_file_size <= 0:
            raise ValueError(f"max_file_size must be > 0 bytes, got {max_file_size}")
        self.directory = os.path.abspath(os.path.expanduser(directory))
        os.makedirs(self.directory, exist_ok=True)
        self.worker_index = worker_index
        self.max_file_size = int(max_file_size)
        self.file_index = 0
        self.bytes_written = 0
        self._file = _OpenFile(fsync=fsync)
        self._finalizer = weakref.finalize(self, self._file.close)

    @property
    def published_files(self) -> list[str]:
        """Paths of the files finished (rolled or closed) so far, in order."""
        return list(self._file.published)

    @property
    def current_path(self) -> str | None:
        """The final name of the file being written, or None."""
        return self._file.final if self._file.handle is not None else None

    def _open_next(self) -> None:
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
        while True:
            name = f"output-{stamp}_worker-{self.worker_index}_{self.file_index}.json"
            final = os.path.join(self.directory, name)
            self.file_index += 1
            if os.path.exists(final):
                continue
            try:  # O_EXCL: two writers never share a temporary file
                fd = os.open(temp_name(final), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            break
        self._file.handle = os.fdopen(fd, "wb")
        self._file.tmp, self._file.final = temp_name(final), final
        self.bytes_written = 0

    def write_line(self, data: bytes) -> None:
        """Write ``data`` plus a newline as one record, rolling to a new file first if needed."""
        if self._file.handle is None or self.bytes_written >= self.max_file_size:
            self._file.close()
            self._open_next()
        handle = self._file.handle
        start = handle.tell()
        try:
            handle.write(data + b"\n")
            handle.flush()
        except BaseException:  # e.g. disk full: never publish a file ending in half a record
            try:
                handle.seek(start)
                handle.truncate()
            except OSError:
                pass  # the tail is trimmed by recover_partial_files / caught by readers
            raise
        self.bytes_written += len(data) + 1

    def close(self) -> None:
        """Flush and publish the open file (if any). Writing again starts a new file."""
        self._file.close()


def recover_partial_files(directory: str) -> list[str]:
    """Publish the temporary files a killed writer left in ``directory``.

    Why: a crash loses at most the unflushed tail of the file being written; this
    trims that tail (a last line without its newline) and renames the file to its
    final name, so its complete records can be read. Only call it when no writer
    is still writing into ``directory``.

    Returns:
        The published paths (files left empty after trimming are deleted, not listed).
    """
    out = []
    directory = os.path.abspath(os.path.expanduser(directory))
    for name in sorted(os.listdir(directory)):
        if not (name.startswith(".output-") and name.endswith(".json" + TMP_SUFFIX)):
            continue
        tmp = os.path.join(directory, name)
        with open(tmp, "r+b") as f:
            data = f.read()
            keep = data.rfind(b"\n") + 1
            f.truncate(keep)
        if keep == 0:
            os.unlink(tmp)
            continue
        out.append(_publish(tmp, os.path.join(directory, name[1 : -len(TMP_SUFFIX)])))
    return out
