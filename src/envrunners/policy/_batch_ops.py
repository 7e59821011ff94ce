"""Leaf-level array operations behind ``SampleBatch`` (slice, take, concat, pad, convert).

Why a separate module: these are pure functions of one leaf at a time, used by the
batch classes, the sequence arithmetic in ``_seq_ops`` and the JSON codec, and they
import nothing back from the batch classes. Every function works on one leaf (or one column's leaves) with numpy
index arrays, and never loops per row over numpy or torch data (only Python lists,
such as ``infos``, are gathered element by element).

A *leaf* is a numpy array, a torch tensor, or a Python list (``infos``).
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from envrunners.errors import BatchArgumentError
from envrunners.utils import tree
from envrunners.utils.compression import is_compressed, pack, unpack

__all__ = [
    "check_rows",
    "concat_leaves",
    "is_packed_rows",
    "is_state",
    "is_state_in",
    "left_padded",
    "pack_leaf",
    "slice_leaf",
    "take_leaf",
    "unpack_leaf",
    "is_torch_tensor",
    "leaf_len",
    "pad_leaf",
    "take",
    "to_numpy",
    "to_torch",
]


def is_torch_tensor(x: Any) -> bool:
    """Return True for a ``torch.Tensor`` without importing torch (no torch, no tensors)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def to_numpy(x: Any) -> np.ndarray:
    """Return ``x`` as a numpy array (tensors are moved to the CPU first)."""
    if is_torch_tensor(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def leaf_len(x: Any) -> int | None:
    """Return the leading-axis length of a leaf, or None if it has none (scalar, 0-d)."""
    if isinstance(x, np.ndarray) or is_torch_tensor(x):
        return int(x.shape[0]) if x.ndim else None
    try:
        return len(x)
    except TypeError:
        return None


def take(x: Any, index: np.ndarray, *, column: str = "?") -> Any:
    """Gather rows ``index`` (an int array) of a leaf along axis 0.

    Raises:
        TypeError: for a leaf that has no rows to gather (e.g. a scalar).
    """
    if isinstance(x, np.ndarray):
        return x[index]
    if is_torch_tensor(x):
        import torch

        return x[torch.as_tensor(index, dtype=torch.long, device=x.device)]
    if isinstance(x, (list, tuple)):
        idx = index.tolist()
        if len(idx) < 2:
            return [x[i] for i in idx]
        return list(operator.itemgetter(*idx)(x))
    raise TypeError(
        f"column {column!r}: cannot select rows of a {type(x).__name__}; "
        "batch columns must be numpy arrays, torch tensors or lists"
    )


def concat_leaves(values: Sequence[Any], axis: int = 0) -> Any:
    """Concatenate same-kind leaves: numpy, torch or lists.

    Why: ``concat_samples`` must keep each column's type (torch stays torch,
    ``infos`` stays a list).

    Raises:
        ValueError: for leaves that are neither arrays, tensors nor lists.
    """
    first = values[0]
    if all(isinstance(v, np.ndarray) for v in values):
        if first.ndim == 0:
            raise ValueError(
                "Unsupported type for concatenation: 0-d arrays (scalars) have no rows to concat"
            )
        return np.concatenate(values, axis=axis if first.ndim > axis else 0)
    if is_torch_tensor(first):
        import torch

        tensors = [v if is_torch_tensor(v) else torch.as_tensor(v) for v in values]
        return torch.cat(tensors, dim=axis if first.ndim > axis else 0)
    if isinstance(first, list):
        out: list[Any] = []
        for v in values:
            out.extend(v)
        return out
    if isinstance(first, np.ndarray) and all(isinstance(v, (np.ndarray, list)) for v in values):
        return np.concatenate([np.asarray(v, dtype=first.dtype) for v in values], axis=0)
    raise ValueError(
        f"Unsupported type for concatenation: {type(first).__name__} "
        "(columns must be numpy arrays, torch tensors or lists)"
    )


def pad_leaf(x: Any, length: int, index: np.ndarray) -> Any:
    """Return a zero leaf of ``length`` rows with ``x``'s rows written at ``index``.

    Object and str arrays (and lists) are padded with None instead of zeros.
    """
    if isinstance(x, list):
        out: list[Any] = [None] * length
        for i, v in zip(index.tolist(), x):
            out[i] = v
        return out
    if is_torch_tensor(x):
        import torch

        padded = torch.zeros((length, *x.shape[1:]), dtype=x.dtype, device=x.device)
        padded[torch.as_tensor(index, dtype=torch.long, device=x.device)] = x
        return padded
    x = np.asarray(x)
    if x.dtype.kind in "OUS":
        padded_np = np.full((length, *x.shape[1:]), None, dtype=object)
    else:
        padded_np = np.zeros((length, *x.shape[1:]), dtype=x.dtype)
    padded_np[index] = x
    return padded_np


def to_torch(x: Any, device: Any, *, pin_memory: bool = False) -> Any:
    """Convert one leaf to a torch tensor on ``device`` (float64 becomes float32).

    Object, str, bytes, structured and datetime arrays and lists (``infos``) are
    returned unchanged.
    """
    import torch

    if isinstance(x, np.ndarray):
        if x.dtype.kind in "OUSVmM":  # no torch dtype for these
            return x
        if x.dtype == np.float64:
            x = x.astype(np.float32)
        elif not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        if not x.flags.writeable:  # e.g. a zero-copy read from Ray's object store
            x = x.copy()
        tensor = torch.from_numpy(x)
    elif is_torch_tensor(x):
        tensor = x.float() if x.dtype == torch.float64 else x
    else:
        return x
    non_blocking = False
    target = torch.device(device)
    if pin_memory and target.type == "cuda" and tensor.device.type == "cpu":
        tensor = tensor.pin_memory()
        non_blocking = True
    return tensor.to(target, non_blocking=non_blocking)


def is_state_in(key: Any) -> bool:
    """Return True for ``state_in_*`` columns (one row per sequence when seq_lens exist)."""
    return isinstance(key, str) and key.startswith("state_in_")


def is_state(key: Any) -> bool:
    """Return True for ``state_in_*`` and ``state_out_*`` columns."""
    return isinstance(key, str) and key.startswith(("state_in_", "state_out_"))


def slice_leaf(leaf: Any, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of a leaf as a view; row-less leaves (scalars) stay as they are."""
    if type(leaf) is np.ndarray:  # fast path
        return leaf[start:stop] if leaf.ndim else leaf
    return leaf if leaf_len(leaf) is None else leaf[start:stop]


def take_leaf(leaf: Any, index: np.ndarray, column: str) -> Any:
    """Rows ``index`` of a leaf; row-less leaves (scalars) stay as they are."""
    return leaf if leaf_len(leaf) is None else take(leaf, index, column=column)


def left_padded(leaf: Any, start: int, stop: int, pad: int) -> Any:
    """Rows ``[start, stop)`` of a leaf with ``pad`` zero (or None) rows in front."""
    part = slice_leaf(leaf, start, max(start, stop))
    n = leaf_len(part)
    if pad <= 0 or n is None:
        return part
    return pad_leaf(part, n + pad, np.arange(pad, pad + n))


def check_rows(key: str, value: Any, expected: int, what: str) -> None:
    """Raise BatchArgumentError if a leaf of column ``key`` does not have ``expected`` rows."""
    for leaf in tree.flatten(value):
        n = leaf_len(leaf)
        if n is not None and n != expected:
            raise BatchArgumentError(
                f"{what}: column {key!r} has {n} rows, expected {expected}; all data "
                "columns must have one row per timestep"
            )


def is_packed_rows(leaf: Any) -> bool:
    """Return True for a 1-d array whose items are packed rows (see ``compress``)."""
    return (
        isinstance(leaf, np.ndarray)
        and leaf.ndim == 1
        and leaf.dtype.kind in "OUS"
        and len(leaf) > 0
        and is_compressed(leaf[0])
    )


def pack_leaf(bulk: bool, leaf: Any) -> Any:
    """Pack a leaf whole (``bulk``) or row by row into an object array; packed leaves pass."""
    if is_compressed(leaf) or is_packed_rows(leaf):
        return leaf
    n = leaf_len(leaf)
    if bulk or not n:  # an empty leaf is packed whole so that dtype and shape survive
        return pack(to_numpy(leaf))
    rows = np.empty(n, dtype=object)
    rows[:] = [pack(row) for row in to_numpy(leaf)]
    return rows


def unpack_leaf(leaf: Any) -> Any:
    """Unpack a packed leaf (whole or row by row); any other leaf is returned unchanged."""
    if is_compressed(leaf):
        return unpack(leaf)
    if is_packed_rows(leaf):
        return np.stack([unpack(row) for row in leaf])
    return leaf
