"""A module's state kept in one buffer, and ``FlatState``: a state that travels as one array.

Why: a weight sync pays per array. Ray serializes, maps and deserializes every
array of a state dict as a buffer of its own, and a runner installs each with its
own copy. When a module's parameters and buffers lie one after another in one
numpy buffer, its state is that buffer: it crosses Ray as one array and a runner
installs it with one ``np.copyto`` (or adopts the object store's pages once).

- ``flatten(module, entries, names)`` moves the module's entries (its cached
  ``state_dict``, see ``_state_entries``) into one fresh buffer, in the order
  ``names`` gives, and keeps a ``FlatStorage`` record on the module. Each entry
  becomes ``torch.from_numpy`` of its own slice: a tensor whose storage is just
  that slice, so a pickled or deep-copied parameter still carries only its own
  bytes. Parameters stay the same objects (``param.data`` changes), so optimizers
  and hooks that hold them keep working.
- ``flat_storage(module, entries)`` returns that record while it is valid: the
  same entries, every entry still at its place in the buffer (``data_ptr``); a
  ``.to()``, ``param.data = ...`` or a new registration ends it.
- ``FlatState`` is a ``dict`` of ``{name: array}`` like any module state, whose
  arrays are views of one 1-D array (``flat``); it pickles as that array and its
  layout. Changing the dict (not the arrays' contents) detaches it: it then
  pickles as the plain dict it has become.

Only CPU entries of one dtype that each own their whole storage are moved (tied or
shared weights stay as they are: flattening would untie them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from envrunners.core.rl_module._state_entries import CacheRecord
from envrunners.utils.cow_arrays import MIN_BYTES, adoptable_state

__all__ = [
    "UNSET",
    "FlatState",
    "FlatStorage",
    "adopt_flat",
    "adoptable_flat_state",
    "flat_storage",
    "flatten",
    "matches",
    "refused",
]

_RECORD_ATTR = "_flat_storage_record"
_REFUSED_ATTR = "_flat_storage_refused"
_DATA_PTR = torch.Tensor.data_ptr
#: ``FlatStorage.inference_names`` not worked out yet.
UNSET: Any = object()

#: ``(dtype name, entry names, entry shapes)``: what a flat array holds, in order.
Layout = tuple[str, tuple[str, ...], tuple[tuple[int, ...], ...]]


def _views(flat: np.ndarray, layout: Layout) -> dict[str, np.ndarray]:
    views, offset = {}, 0
    for name, shape in zip(layout[1], layout[2]):
        size = math.prod(shape)
        views[name] = flat[offset : offset + size].reshape(shape)
        offset += size
    return views


def layout_size(layout: Layout) -> int:
    """How many elements a flat array of ``layout`` holds."""
    return sum(math.prod(shape) for shape in layout[2])


def _rebuild(flat: np.ndarray, layout: Layout) -> FlatState:
    return FlatState(flat, layout)


def _detaching(method: Any) -> Any:
    def changed(self: FlatState, *args: Any, **kwargs: Any) -> Any:
        self.flat = None  # the dict no longer mirrors the flat array: pickle it as a dict
        return method(self, *args, **kwargs)

    changed.__name__ = method.__name__
    changed.__doc__ = method.__doc__
    return changed


class FlatState(dict):
    """A module state ``{name: array}`` whose arrays are consecutive views of ``flat``.

    Args:
        flat: A 1-D C-contiguous array holding every entry, in ``layout`` order.
        layout: ``(dtype name, names, shapes)``.
        adoptable: ``flat`` is private to this process and used by nobody else: a
            module may keep it as its storage instead of copying (see
            ``envrunners.utils.cow_arrays``).
    """

    __slots__ = ("adoptable", "flat", "layout")

    def __init__(self, flat: np.ndarray, layout: Layout, adoptable: bool = False):
        super().__init__(_views(flat, layout))
        self.flat: np.ndarray | None = flat
        self.layout = layout
        self.adoptable = adoptable

    def __reduce__(self) -> tuple:
        if self.flat is None:
            return (dict, (dict(self),))
        return (_rebuild, (self.flat, self.layout))

    __setitem__ = _detaching(dict.__setitem__)
    __delitem__ = _detaching(dict.__delitem__)
    __ior__ = _detaching(dict.__ior__)
    clear = _detaching(dict.clear)
    pop = _detaching(dict.pop)
    popitem = _detaching(dict.popitem)
    setdefault = _detaching(dict.setdefault)
    update = _detaching(dict.update)


class FlatStorage:
    """The record of a flattened module: its entries as slices of one buffer.

    A module copied or pickled goes without it (it describes the original's memory).
    """

    __slots__ = ("array", "entries", "inference_names", "layout", "pointers", "prefixes", "tensors")

    def __init__(self, entries: dict, tensors: list, array: np.ndarray, layout: Layout):
        self.entries = entries  # the state_entries dict this was made for
        self.tensors = tensors  # in layout order
        self.array = array  # the 1-D buffer
        self.layout = layout
        self.pointers = list(map(_DATA_PTR, tensors))
        #: ``{names: [size, layout, FlatState of views]}`` of prefixes ``state_of`` gave.
        self.prefixes: dict[tuple[str, ...], list | None] = {}
        #: The names of the module's inference-only state (None: unknown; set by its owner).
        self.inference_names: Any = UNSET

    def __reduce__(self) -> tuple:
        return (type(None), ())

    def valid_for(self, entries: dict) -> bool:
        return entries is self.entries and list(map(_DATA_PTR, self.tensors)) == self.pointers

    def state_of(self, names: Sequence[str], copy: bool) -> FlatState | None:
        """The entries ``names`` as a ``FlatState``, if they are a prefix of the buffer.

        Without ``copy`` the state is views of the module's memory; the same object
        is handed out again while nobody changed the dict (its views would be equal).
        """
        key = tuple(names)
        found = self.prefixes.get(key, False)
        if found is False:
            found = None
            if key == self.layout[1][: len(key)]:
                layout = (self.layout[0], key, self.layout[2][: len(key)])
                found = [layout_size(layout), layout, None]
            self.prefixes[key] = found
        if found is None:
            return None
        size, layout, views = found
        if copy:
            return FlatState(self.array[:size].copy(), layout)
        if views is None or views.flat is None:
            views = found[2] = FlatState(self.array[:size], layout)
        return views


def refused(module: torch.nn.Module, entries: dict) -> bool:
    """Whether ``flatten`` found ``entries`` (``state_entries``) impossible to move."""
    marker = module.__dict__.get(_REFUSED_ATTR)  # (``(entries,)``, kept by identity)
    return marker is not None and marker[0] is entries


def flat_storage(module: torch.nn.Module, entries: dict) -> FlatStorage | None:
    """The module's ``FlatStorage`` if it still describes ``entries`` (``state_entries``)."""
    record = module.__dict__.get(_RECORD_ATTR)
    if record is not None and record.valid_for(entries):
        return record
    return None


def can_flatten(entries: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``entries`` are CPU tensors of one dtype, each owning its whole storage."""
    tensors = list(entries.values())
    if not tensors:
        return False
    dtype = tensors[0].dtype
    seen, spans = set(), []
    for t in tensors:
        if (
            t.device.type != "cpu"
            or t.layout != torch.strided
            or t.dtype != dtype
            or t.is_conj()
            or t.is_neg()
            or not t.is_contiguous()
            or t.storage_offset() != 0
            or t.untyped_storage().nbytes() != t.numel() * t.element_size()
            or id(t) in seen
        ):
            return False
        seen.add(id(t))
        if t.numel():
            spans.append((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()))
    spans.sort()
    if any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
        return False  # two entries share memory (tied weights): keep them as they are
    try:
        torch.empty(0, dtype=dtype).numpy()
    except (TypeError, RuntimeError):  # e.g. bfloat16
        return False
    return True


def flatten(
    module: torch.nn.Module,
    entries: dict[str, torch.Tensor],
    names: Sequence[str],
    source: np.ndarray | None = None,
) -> FlatStorage | None:
    """Move ``entries`` into one new buffer, in the order ``names`` (all of them) gives.

    The values are the entries' own, or ``source`` (a flat array of that layout). Returns
    the record (also kept on the module), or None if the entries cannot be moved.
    """
    if sorted(names) != sorted(entries):
        return None
    if not can_flatten(entries):  # (remembered: not tried again for these entries)
        object.__setattr__(module, _REFUSED_ATTR, CacheRecord((entries,)))
        return None
    tensors = [entries[n] for n in names]
    dtype = tensors[0].detach().numpy().dtype
    layout: Layout = (dtype.name, tuple(names), tuple(tuple(t.shape) for t in tensors))
    array = np.empty(layout_size(layout), dtype)
    if source is not None:
        np.copyto(array, source)
    views = _views(array, layout)
    for name, tensor in zip(names, tensors):  # (``.data`` swaps record no autograd op)
        if source is None:
            np.copyto(views[name], tensor.detach().numpy())
        tensor.data = torch.from_numpy(views[name])
    record = FlatStorage(entries, tensors, array, layout)
    object.__setattr__(module, _RECORD_ATTR, record)
    return record


def adoptable_flat_state(state: FlatState) -> FlatState | None:
    """``state`` (fresh from ``ray.get``) as a copy-on-write private ``FlatState`` the
    module may adopt (see ``envrunners.utils.cow_arrays``), or None: copy it."""
    if state.flat.nbytes < MIN_BYTES:  # (no walk of the state: copying is cheaper)
        return None
    views = adoptable_state({"flat": state.flat})
    return None if views is None else FlatState(views["flat"], state.layout, adoptable=True)


def adopt_flat(module: torch.nn.Module, entries: dict, state: FlatState) -> FlatStorage:
    """Make ``state``'s (adoptable, private) arrays the storage of ``entries``: no copy."""
    tensors = [entries[n] for n in state.layout[1]]
    for tensor, view in zip(tensors, dict.values(state)):
        tensor.data = torch.from_numpy(view)
    record = FlatStorage(entries, tensors, state.flat, state.layout)
    object.__setattr__(module, _RECORD_ATTR, record)
    return record


def matches(entries: Mapping[str, torch.Tensor], layout: Layout) -> bool:
    """Whether ``entries`` are exactly ``layout``'s names, with its shapes and dtype."""
    names, shapes = layout[1], layout[2]
    if len(names) != len(entries):
        return False
    for name, shape in zip(names, shapes):
        tensor = entries.get(name)
        if tensor is None or tuple(tensor.shape) != shape:
            return False
    first = entries[names[0]] if names else None
    return first is not None and str(first.dtype).rpartition(".")[2] == layout[0]
