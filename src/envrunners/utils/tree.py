"""Small nested-structure helpers (dicts and tuples of array leaves), without ``dm_tree``.

Batch columns may hold nested dicts or tuples of arrays (dict and tuple observation
spaces). These helpers walk such structures so that batch code can treat every
leaf alike. Containers are ``dict`` (any ``Mapping``) and ``tuple`` (namedtuples
included); **lists are leaves**, because in batch data a list is a column of
values (``infos``, or data not yet converted to an array), not a structure.
Dict entries are visited in insertion order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

__all__ = [
    "flatten",
    "flatten_with_path",
    "is_container",
    "map_structure",
    "map_structure_with_path",
    "unflatten_as",
]

Path = tuple[Any, ...]


# Exact types answered without an ABC isinstance check (the hot path in batch code).
_CONTAINER_TYPES = frozenset([dict, tuple])
_LEAF_TYPES = frozenset([np.ndarray, list, str, bytes, int, float, bool, type(None)])


def is_container(x: Any) -> bool:
    """Return True if ``x`` is a structure node (a mapping or a tuple), not a leaf."""
    t = type(x)
    if t in _CONTAINER_TYPES:
        return True
    if t in _LEAF_TYPES:
        return False
    return isinstance(x, (Mapping, tuple))


def _rebuild(template: Any, children: list[Any]) -> Any:
    """Build a container of ``template``'s kind holding ``children`` (in visiting order)."""
    if isinstance(template, Mapping):
        pairs = zip(template.keys(), children)
        if type(template) is dict:
            return dict(pairs)
        try:
            return type(template)(pairs)
        except TypeError:
            return dict(pairs)
    if hasattr(template, "_fields"):  # namedtuple
        return type(template)(*children)
    if type(template) is tuple:
        return tuple(children)
    return type(template)(children)


def _children(x: Any) -> list[tuple[Any, Any]]:
    if isinstance(x, Mapping):
        return list(x.items())
    return list(enumerate(x))


def map_structure(fn: Callable[..., Any], *structures: Any) -> Any:
    """Apply ``fn`` to the matching leaves of one or more same-shaped structures.

    Why: lets batch code slice, concatenate or convert nested columns in one call.
    The first structure decides the shape; the others must have the same keys
    (a missing key raises ``KeyError``) and tuple lengths (else ``ValueError``).
    """
    first = structures[0]
    if not is_container(first):
        return fn(*structures)
    if isinstance(first, Mapping):
        children = [map_structure(fn, *(s[k] for s in structures)) for k in first]
    else:
        for s in structures[1:]:
            if not isinstance(s, tuple) or len(s) != len(first):
                raise ValueError(
                    f"map_structure: structures differ: tuple of length {len(first)} vs {s!r:.80}"
                )
        children = [map_structure(fn, *items) for items in zip(*structures)]
    return _rebuild(first, children)


def map_structure_with_path(fn: Callable[..., Any], structure: Any, _path: Path = ()) -> Any:
    """Apply ``fn(path, leaf)`` to every leaf; ``path`` is the tuple of keys/indices to it."""
    if not is_container(structure):
        return fn(_path, structure)
    children = [
        map_structure_with_path(fn, child, (*_path, key)) for key, child in _children(structure)
    ]
    return _rebuild(structure, children)


def flatten_with_path(structure: Any, _path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Yield ``(path, leaf)`` pairs in visiting order."""
    if not is_container(structure):
        yield _path, structure
        return
    for key, child in _children(structure):
        yield from flatten_with_path(child, (*_path, key))


def flatten(structure: Any) -> list[Any]:
    """Return the leaves of ``structure`` as a flat list, in visiting order."""
    if not is_container(structure):
        return [structure]
    return [leaf for _, leaf in flatten_with_path(structure)]


def unflatten_as(structure: Any, flat: list[Any]) -> Any:
    """Inverse of :func:`flatten`: pour ``flat`` leaves back into ``structure``'s shape."""
    it = iter(flat)
    try:
        out = map_structure(lambda _: next(it), structure)
    except StopIteration:
        raise ValueError("unflatten_as: fewer leaves than the structure has") from None
    rest = sum(1 for _ in it)
    if rest:
        raise ValueError(f"unflatten_as: {rest} leaves more than the structure has")
    return out
