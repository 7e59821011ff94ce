"""Flatten and rebuild nested dict/tuple/list structures (actions, observations, states).

Structured spaces (``Dict``, ``Tuple``) give nested actions and observations, and
recurrent modules nested states; these helpers walk them in one fixed order (dict
insertion order, sequence order) so a flat list of leaves maps back to its place.
Lists are nodes here (a state or action may be one); ``envrunners.utils.tree``, for
batch columns and episode buffers, takes a list as a leaf (a column of values).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

__all__ = ["as_arrays", "flatten", "map_structure", "paths", "unflatten_as"]


def flatten(structure: Any) -> list[Any]:
    """The leaves of ``structure`` (anything but dict, tuple or list is a leaf), in order."""
    if isinstance(structure, Mapping):
        return [leaf for value in structure.values() for leaf in flatten(value)]
    if isinstance(structure, (tuple, list)):
        return [leaf for value in structure for leaf in flatten(value)]
    return [structure]


def paths(structure: Any, prefix: tuple = ()) -> list[tuple]:
    """The path (tuple of keys / indices) of every leaf, in :func:`flatten`'s order."""
    if isinstance(structure, Mapping):
        return [p for k, v in structure.items() for p in paths(v, (*prefix, k))]
    if isinstance(structure, (tuple, list)):
        return [p for i, v in enumerate(structure) for p in paths(v, (*prefix, i))]
    return [prefix]


def unflatten_as(structure: Any, leaves: list[Any]) -> Any:
    """``structure`` with its leaves replaced, in order, by ``leaves``."""
    it = iter(leaves)

    def build(node: Any) -> Any:
        if isinstance(node, Mapping):
            return {k: build(v) for k, v in node.items()}
        if isinstance(node, (tuple, list)):
            built = [build(v) for v in node]
            return built if isinstance(node, list) else tuple(built)
        return next(it)

    return build(structure)


def map_structure(fn: Callable[..., Any], structure: Any, *others: Any) -> Any:
    """``fn`` applied leaf-wise to ``structure`` (and same-shaped ``others``).

    Exact ``dict`` / ``tuple`` / ``list`` nodes and array leaves are told apart by type
    first (the sampler maps states and outputs per step); other mappings and
    sequences take the ``isinstance`` checks.
    """
    kind = type(structure)
    if kind is dict or (kind is not np.ndarray and isinstance(structure, Mapping)):
        if not others:
            return {k: map_structure(fn, v) for k, v in structure.items()}
        return {k: map_structure(fn, v, *[o[k] for o in others]) for k, v in structure.items()}
    if (
        kind is tuple
        or kind is list
        or (kind is not np.ndarray and isinstance(structure, tuple | list))
    ):
        built = [map_structure(fn, v, *[o[i] for o in others]) for i, v in enumerate(structure)]
        return built if isinstance(structure, list) else tuple(built)
    return fn(structure, *others)


def as_arrays(column: Any) -> Any:
    """An episode column as (nested) numpy arrays with a leading time axis.

    A not-yet-numpy episode returns a list of per-step items (nested for Dict / Tuple
    spaces or LSTM states), stacked here leaf by leaf; a numpy one already returns
    (nested) arrays, each leaf taken as an array.
    """
    if isinstance(column, list):
        return map_structure(lambda *items: np.stack(items), *column)
    return map_structure(np.asarray, column)
