"""Test helper: exact equality of nested states (dicts, lists, tuples, arrays)."""

from __future__ import annotations

from typing import Any

import numpy as np


def same_tree(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` have the same structure, types, dtypes, shapes and values.

    Float arrays compare NaN equal to NaN; everything else with ``==``.
    """
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(same_tree(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_tree, a, b))
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
        )
    return type(a) is type(b) and a == b
