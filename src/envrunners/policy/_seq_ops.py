"""Sequence (``seq_lens``) arithmetic over a batch's columns: slicing, gathering, padding.

Why a separate module: recurrent data cuts rows into sequences, and every row
operation then has to map rows to sequences (``state_in_*`` has one row per
sequence) and, once zero-padded, to padded offsets. That index arithmetic is done
here with numpy (cumulative sums, ``searchsorted``, ``repeat``), never per row.

The batch-level functions take a ``SampleBatch`` and return the new columns as a
plain dict; the caller wraps them in a batch.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from envrunners.core.columns import Columns
from envrunners.policy import _batch_ops as ops
from envrunners.utils import tree

__all__ = [
    "chop_seq_lens",
    "gather_rows",
    "padded_row_index",
    "right_zero_pad_columns",
    "seq_starts",
    "slice_seq_lens",
    "slice_trimmed",
    "slice_whole_sequences",
]

SEQ_LENS = Columns.SEQ_LENS
INFOS = Columns.INFOS


def seq_starts(seq_lens: np.ndarray) -> np.ndarray:
    """Return the start row of each sequence in unpadded data (exclusive cumulative sum)."""
    starts = np.zeros(len(seq_lens), dtype=np.int64)
    if len(seq_lens) > 1:
        np.cumsum(seq_lens[:-1], out=starts[1:])
    return starts


def chop_seq_lens(rows: int, max_seq_len: int) -> np.ndarray:
    """``seq_lens`` of one trajectory of ``rows`` rows cut into ``max_seq_len`` sequences.

    Full sequences first, the remainder last: 12 rows at 5 give ``[5, 5, 2]``
    (RLlib's old-stack collector cuts each trajectory so).
    """
    full, rest = divmod(int(rows), int(max_seq_len))
    lens = np.full(full + (1 if rest else 0), max_seq_len, dtype=np.int32)
    if rest:
        lens[-1] = rest
    return lens


def padded_row_index(seq_lens: np.ndarray, max_seq_len: int) -> np.ndarray:
    """Map each unpadded row to its row in right-zero-padded data (sequence i at i*max_seq_len)."""
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    total = int(seq_lens.sum())
    seq_of_row = np.repeat(np.arange(len(seq_lens)), seq_lens)
    offset_in_seq = np.arange(total) - np.repeat(seq_starts(seq_lens), seq_lens)
    return seq_of_row * max_seq_len + offset_in_seq


def slice_seq_lens(seq_lens: np.ndarray, start: int, end: int) -> tuple[int, int, np.ndarray, int]:
    """Work out which sequences the unpadded rows ``[start, end)`` touch.

    Why: ``SampleBatch.slice`` with ``seq_lens`` must re-cut the first and last
    sequence and pick the matching ``state_in_*`` rows.

    Args:
        seq_lens: Sequence lengths of the batch.
        start: First row; a negative value means ``-start`` zero rows are
            prepended, which lengthen the first sequence.
        end: One past the last row (already capped at the batch length).

    Returns:
        ``(first_seq, last_seq_exclusive, new_seq_lens, data_start)`` where
        ``sum(new_seq_lens) == end - start`` and ``data_start = max(start, 0)``.
    """
    seq_lens = np.asarray(seq_lens, dtype=np.int64)
    data_start = max(start, 0)
    if end <= data_start:  # no data rows: at most the left padding, as part of sequence 0
        pad = data_start - start
        if pad and len(seq_lens):
            return 0, 1, np.array([pad], dtype=np.int32), data_start
        return 0, 0, np.zeros(0, dtype=np.int32), data_start
    ends = np.cumsum(seq_lens)
    first = int(np.searchsorted(ends, data_start, side="right"))
    last = int(np.searchsorted(ends, end - 1, side="right"))
    new = seq_lens[first : last + 1].copy()
    new[-1] = end - (ends[last] - seq_lens[last])  # trim the last sequence at `end`
    new[0] -= data_start - (ends[first] - seq_lens[first])  # trim the first at `start`
    new[0] += data_start - start  # negative start: left zero-padding
    return first, last + 1, new.astype(np.int32), data_start


def _lens(batch: Any) -> np.ndarray:
    return ops.to_numpy(dict.__getitem__(batch, SEQ_LENS)).astype(np.int64)


def _slice_column(key: str, value: Any, start: int, stop: int) -> Any:
    return tree.map_structure(partial(ops.slice_leaf, start=start, stop=stop), value)


def slice_whole_sequences(batch: Any, s: slice) -> dict[str, Any]:
    """Columns of ``batch[s]`` for a batch with seq_lens: whole sequences only.

    The result covers the sequences from the one holding row ``s.start`` up to,
    but excluding, the one holding row ``s.stop`` (all, if stop reaches the end).
    Zero-padded data is cut at padded offsets. In "slicing by batch id" mode,
    ``s`` selects sequences (rows of B×T data) and ``infos`` follows the
    cumulative seq_lens.
    """
    lens = _lens(batch)
    data: dict[str, Any] = {}
    if batch._slice_seq_lens_in_B:
        a, b, _ = s.indices(len(lens))
        b = max(a, b)
        bounds = np.concatenate([[0], np.cumsum(lens)])
        for k, v in dict.items(batch):
            if k == INFOS:
                data[k] = v[int(bounds[a]) : int(bounds[b])]
            else:
                data[k] = _slice_column(k, v, a, b)
        return data
    count = batch.count
    start, stop, _ = s.indices(count)
    stop = max(start, stop)
    ends = np.cumsum(lens)
    a = int(np.searchsorted(ends, start, side="right"))
    b = len(lens) if stop >= count else int(np.searchsorted(ends, stop, side="right"))
    if batch.zero_padded:
        row_a, row_b = a * batch.max_seq_len, b * batch.max_seq_len
    else:
        starts = np.append(ends - lens, count)
        row_a, row_b = int(starts[a]), int(starts[b])
    for k, v in dict.items(batch):
        per_sequence = k == SEQ_LENS or ops.is_state_in(k)
        data[k] = _slice_column(k, v, *((a, b) if per_sequence else (row_a, row_b)))
    return data


def slice_trimmed(
    batch: Any, start: int, end: int, state_start: int | None, state_end: int | None
) -> tuple[dict[str, Any], int | None]:
    """Columns of ``batch.slice(start, end)`` for unpadded data with seq_lens.

    The first and last touched sequence are trimmed so that the new seq_lens sum
    to ``end - start``; a negative ``start`` prepends zero rows to the first one.
    ``state_start``/``state_end`` pick the sequences explicitly (the last one is
    then trimmed to fit). Returns the columns and the new ``max_seq_len``.
    """
    lens = _lens(batch)
    end = min(end, batch.count)
    data_start = max(start, 0)
    if state_start is not None or state_end is not None:
        if state_start is None or state_end is None:
            raise ops.BatchArgumentError("SampleBatch.slice: give both state_start and state_end")
        first, last = state_start, state_end
        new_lens = lens[first:last].astype(np.int32)
        if len(new_lens):
            new_lens[-1] = (end - start) - new_lens[:-1].sum()
    else:
        first, last, new_lens, data_start = slice_seq_lens(lens, start, end)
    pad = data_start - start
    data: dict[str, Any] = {}
    for k, v in dict.items(batch):
        if k == SEQ_LENS:
            continue
        if ops.is_state_in(k):
            data[k] = _slice_column(k, v, first, last)
        else:
            cut = partial(ops.left_padded, start=data_start, stop=end, pad=pad)
            data[k] = tree.map_structure(cut, v)
    data[SEQ_LENS] = new_lens
    max_seq_len = batch.max_seq_len
    if len(new_lens) and (max_seq_len is None or new_lens.max() > max_seq_len):
        max_seq_len = int(new_lens.max())
    return data, max_seq_len


def gather_rows(batch: Any, index: np.ndarray) -> dict[str, Any]:
    """Columns holding rows ``index`` (unpadded row numbers) of ``batch``, seq_lens left out.

    With seq_lens, ``state_in_*`` rows are those of each selected row's sequence,
    and zero-padded data is read at the padded offsets.
    """
    seq_index = None
    if SEQ_LENS in batch:
        lens = _lens(batch)
        seq_index = np.repeat(np.arange(len(lens)), lens)[index]
        if batch.zero_padded:
            index = padded_row_index(lens, batch.max_seq_len)[index]
    data: dict[str, Any] = {}
    for k, v in dict.items(batch):
        if k == SEQ_LENS:
            continue
        rows = seq_index if seq_index is not None and ops.is_state_in(k) else index
        data[k] = tree.map_structure(partial(ops.take_leaf, index=rows, column=k), v)
    return data


def right_zero_pad_columns(batch: Any, max_seq_len: int, exclude_states: bool) -> None:
    """Pad ``batch``'s row columns in place so that sequence i starts at ``i * max_seq_len``."""
    lens = _lens(batch)
    if len(lens) and lens.max() > max_seq_len:
        raise ops.BatchArgumentError(
            f"right_zero_pad: a sequence has {lens.max()} rows, more than max_seq_len={max_seq_len}"
        )
    length = len(lens) * max_seq_len
    index = padded_row_index(lens, max_seq_len)

    def pad(leaf: Any) -> Any:
        return leaf if ops.leaf_len(leaf) is None else ops.pad_leaf(leaf, length, index)

    for k, v in list(dict.items(batch)):
        if k == SEQ_LENS or (exclude_states and ops.is_state_in(k)):
            continue
        ops.check_rows(k, v, batch.count, "right_zero_pad")
        dict.__setitem__(batch, k, tree.map_structure(pad, v))
