"""Finding offline input files and reading their lines (plain, zipped or remote).

Why: ``JsonReader``, the episode reader and the CLI resolve inputs the same way:
a directory means its ``*.json`` and ``*.zip`` files, a str is a glob, a list
names files (or globs, or directories). A missing or empty input is an error
when the reader is built, not on its first ``next()``. Lines are parsed by
:func:`parse_line`, which names the file and line of any corrupt record.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import zipfile
from collections.abc import Iterator
from typing import Any

from envrunners.errors import OfflineDataError, OfflineInputNotFoundError, PickleNotAllowedError
from envrunners.offline._rolling_file import TMP_SUFFIX
from envrunners.offline.json_codec import loads, record_to_object

__all__ = ["iter_lines", "parse_line", "resolve_inputs"]

logger = logging.getLogger("envrunners")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
_PREVIEW = 60


def _scheme(path: str) -> str | None:
    m = _SCHEME.match(path)
    return m.group(1).lower() if m else None


def _unfinished_hint(directory: str) -> str:
    try:
        tmp = [n for n in os.listdir(directory) if n.endswith(".json" + TMP_SUFFIX)]
    except OSError:
        return ""
    if not tmp:
        return ""
    return (
        f"; it holds {len(tmp)} unfinished file(s) of a writer that is still running or was "
        "killed: envrunners.offline.json_writer.recover_partial_files(dir) publishes them"
    )


def _expand_local(item: str, who: str, original: Any) -> list[str]:
    path = os.path.abspath(os.path.expanduser(item))
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.json")))
        files += sorted(glob.glob(os.path.join(path, "*.zip")))
        if not files:
            raise OfflineInputNotFoundError(
                f"{who}: No files found matching {original!r}: directory {path} has no *.json "
                f"or *.zip files{_unfinished_hint(path)}"
            )
        return files
    if glob.has_magic(path):
        files = sorted(f for f in glob.glob(path) if os.path.isfile(f))
        if not files:
            raise OfflineInputNotFoundError(f"{who}: No files found matching {original!r}")
        return files
    if not os.path.isfile(path):
        raise OfflineInputNotFoundError(f"{who}: Offline file {path} not found!")
    return [path]


def resolve_inputs(inputs: Any, who: str = "JsonReader") -> list[str]:
    """Turn a path, glob, directory or list of them into the list of files to read.

    Raises:
        OfflineInputNotFoundError: (a ``ValueError`` and ``FileNotFoundError``) if an
            input is empty or matches no file.
        ValueError: for another type, or a remote URI glob (lists may name remote
            files, read with ``smart_open``).
    """
    if isinstance(inputs, str):
        if not inputs.strip():
            raise OfflineInputNotFoundError(f"{who}: the input path is an empty string")
        scheme = _scheme(inputs)
        if scheme == "file":
            inputs = inputs[len("file://") :]
        elif scheme is not None:
            raise ValueError(
                f"{who}: Don't know how to glob over {inputs!r}; pass a list of file URIs "
                "(read with smart_open) or a local path"
            )
        return _expand_local(inputs, who, inputs)
    if isinstance(inputs, (list, tuple)):
        if not inputs:
            raise OfflineInputNotFoundError(f"{who}: the list of inputs is empty")
        files: list[str] = []
        for item in inputs:
            if not isinstance(item, str) or not item.strip():
                raise ValueError(f"{who}: every input must be a non-empty str, got {item!r}")
            scheme = _scheme(item)
            if scheme not in (None, "file"):
                _require_smart_open(who, item)
                files.append(item)
            else:
                local = item[len("file://") :] if scheme == "file" else item
                files.extend(_expand_local(local, who, item))
        return files
    raise ValueError(f"{who}: type of inputs must be list or str, not {type(inputs)}")


def _require_smart_open(who: str, uri: str) -> None:
    try:
        import smart_open  # noqa: F401
    except ImportError:
        raise ValueError(
            f"{who}: reading {uri!r} needs the smart_open package (`pip install smart_open`)"
        ) from None


def iter_lines(path: str) -> Iterator[tuple[str, int, bytes]]:
    """Yield ``(where, line_number, line)`` for every line of a file (1-based numbers).

    ``*.zip`` archives yield the lines of their ``*.json`` members (``where`` is
    ``archive.zip!member.json``); nothing is extracted to disk. Remote URIs go
    through ``smart_open``.
    """
    if _scheme(path) not in (None, "file"):
        import smart_open

        with smart_open.open(path, "rb") as f:
            for i, line in enumerate(f, 1):
                yield path, i, line
        return
    if path.endswith(".zip"):
        with zipfile.ZipFile(path) as zf:
            for member in sorted(n for n in zf.namelist() if n.endswith(".json")):
                with zf.open(member) as f:
                    for i, line in enumerate(f, 1):
                        yield f"{path}!{member}", i, line
        return
    with open(path, "rb") as f:
        for i, line in enumerate(f, 1):
            yield path, i, line


def parse_line(
    line: bytes, where: str, lineno: int, *, allow_pickle: bool = False, episodes: bool = False
) -> Any:
    """Parse one line into a batch (or episode); None for a blank line.

    Raises:
        PickleNotAllowedError: for RLlib cloudpickle columns without ``allow_pickle``.
        OfflineDataError: for anything else that is wrong with the line; names
            ``where`` and ``lineno`` and says if the line looks cut off.
    """
    stripped = line.strip()
    if not stripped:
        return None
    try:
        return record_to_object(loads(stripped), allow_pickle=allow_pickle, episodes=episodes)
    except PickleNotAllowedError as e:
        raise PickleNotAllowedError(str(e), path=where, line=lineno) from None
    except Exception as e:  # any failure of a corrupt line is reported with its place
        preview = stripped[:_PREVIEW] + (b"..." if len(stripped) > _PREVIEW else b"")
        cut = "" if line.endswith(b"\n") else (
            " The line does not end with a newline: the file was probably cut off while "
            "being written."
        )  # fmt: skip
        raise OfflineDataError(
            f"corrupt record ({type(e).__name__}: {e}); the line starts with {preview!r}.{cut} "
            "Pass skip_corrupt=True to skip (and count) corrupt lines instead.",
            path=where,
            line=lineno,
        ) from None
