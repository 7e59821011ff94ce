"""Read Parquet offline data (RLlib 2.60's layouts or ours) as episodes or batches, streaming.

Why: the files ``OfflineSingleAgentEnvRunner`` (ours or RLlib's) writes must be
readable without Ray Data too: to convert them, to inspect them, to feed an
old-stack learner. Files are read one row group at a time, so memory stays bounded
by the largest row group, not the dataset. Every file's schema is checked first; a
bad file raises an ``OfflineDataError`` that names it (and the column).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from typing import Any

from envrunners.errors import OfflineDataError, OfflineInputNotFoundError
from envrunners.offline._parquet import (
    EPISODE_COLUMN,
    batch_from_columns,
    check_episode_schema,
    check_rows_schema,
    columns_from_table,
    episode_batch,
    episodes_from_columns,
    episodes_from_table,
)
from envrunners.policy.sample_batch import SampleBatch

__all__ = ["is_episode_file", "parquet_files", "read_parquet_batches", "read_parquet_episodes"]


def parquet_files(inputs: str | list[str]) -> list[str]:
    """The ``.parquet`` files under ``inputs`` (files, directories searched recursively, globs).

    Hidden files (the writers' temporaries) are skipped.

    Raises:
        OfflineInputNotFoundError: if nothing matches.
    """
    out: list[str] = []
    for item in [inputs] if isinstance(inputs, str | os.PathLike) else list(inputs):
        path = os.path.expanduser(str(item))
        if os.path.isdir(path):
            found = glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True)
        elif any(c in path for c in "*?["):
            found = glob.glob(path, recursive=True)
        else:
            found = [path] if os.path.isfile(path) else []
        out.extend(sorted(f for f in found if not os.path.basename(f).startswith(".")))
    if not out:
        raise OfflineInputNotFoundError(
            f"no Parquet file found in {inputs!r} (give .parquet files, directories or globs)"
        )
    return out


def _open(path: str) -> Any:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise OfflineDataError(
            f"not a readable Parquet file (truncated or corrupt?): {e}", path=path
        ) from None


def is_episode_file(path: str) -> bool:
    """Whether ``path`` holds one episode per row (RLlib's ``item`` column)."""
    return EPISODE_COLUMN in _open(path).schema_arrow.names


def _tables(path: str, rows_per_batch: int) -> Iterator[Any]:
    import pyarrow as pa

    pf = _open(path)
    schema = pf.schema_arrow
    try:
        for rb in pf.iter_batches(batch_size=rows_per_batch):
            yield pa.Table.from_batches([rb], schema=schema)
    except (pa.ArrowException, OSError) as e:
        raise OfflineDataError(
            f"cannot read the data (truncated or corrupt?): {e}", path=path
        ) from None


def read_parquet_episodes(
    inputs: str | list[str], *, allow_pickle: bool = False, rows_per_batch: int = 1024
) -> Iterator[Any]:
    """Yield the episode chunks stored in ``inputs`` (numpy'd ``SingleAgentEpisode`` objects).

    Episode files give one chunk per row; step files give one chunk per run of equal
    ``eps_id``.

    Raises:
        OfflineDataError: (or its ``OfflineSchemaError``/``PickleNotAllowedError``) for a
            file that is corrupt, has the wrong columns or pickled values.
    """
    for path in parquet_files(inputs):
        episodes = is_episode_file(path)
        if not episodes:
            check_rows_schema(_open(path).schema_arrow, path)
        for table in _tables(path, rows_per_batch):
            if episodes:
                yield from episodes_from_table(table, path, allow_pickle=allow_pickle)
            else:
                cols = columns_from_table(table, path, allow_pickle=allow_pickle)
                yield from episodes_from_columns(cols, path)


def read_parquet_batches(
    inputs: str | list[str], *, allow_pickle: bool = False, rows_per_batch: int = 65536
) -> Iterator[SampleBatch]:
    """Yield ``SampleBatch`` es of at most ``rows_per_batch`` steps read from ``inputs``.

    Step files are read column-wise; episode files are decoded and each batch is
    the concatenation of a row group's episodes.
    """
    from envrunners.policy.sample_batch import concat_samples

    for path in parquet_files(inputs):
        if is_episode_file(path):
            check_episode_schema(_open(path).schema_arrow, path)
            for table in _tables(path, max(1, rows_per_batch // 200)):
                eps = episodes_from_table(table, path, allow_pickle=allow_pickle)
                batches = [episode_batch(ep) for ep in eps if len(ep)]
                if batches:
                    yield concat_samples(batches)
            continue
        check_rows_schema(_open(path).schema_arrow, path)
        for table in _tables(path, rows_per_batch):
            yield batch_from_columns(columns_from_table(table, path, allow_pickle=allow_pickle))
