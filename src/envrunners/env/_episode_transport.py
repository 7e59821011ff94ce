"""Episode pickling: every numeric array of an episode in one contiguous byte block.

Why: a ``sample()`` result is hundreds of short episodes (CartPole: ~120 per
2,000 steps), each with ~7 small arrays, and the driver unpickles all of them.
Pickled field by field, every array costs a numpy reconstruct call (Python code)
and every buffer and info dict a few objects; that was the largest part of the
driver's CPU in continuous sampling. Here an episode pickles as a header of
plain values (ids, flags, spaces, each column's layout) and ONE block holding
all its packable arrays (contiguous copies at 16-byte aligned offsets).

A whole ``sample()`` result goes through ``pack_episodes``: its episodes share
ONE block (one buffer for pickle and Ray, one join of all arrays on the runner).
Episodes of one layout (one runner's: same columns, dtypes and spaces) pack by
column: each column's arrays lie back to back, the header holds one template per
column and, per episode, its plain slot values and row counts; rebuilt, each
episode's arrays are slices of one view per column. Other lists keep one header
per episode.

With pickle protocol 5 the block travels as a ``PickleBuffer``: Ray sends it
out-of-band without copies (the arrays then are read-only, like every array Ray
deserializes), plain ``pickle`` stores it in-band and loads it as a writable
``bytearray``. The rebuilt columns are numpy VIEWS into the block, so a rebuilt
episode is an ordinary finalized episode: appends and ``concat_episode``
concatenate into new arrays, setters write into its own part of the block (an
episode of a packed list keeps the list's block alive, as any numpy view does).

Everything else round-trips as plain pickle would: list (not finalized)
buffers, object arrays, namedtuple or other non-dict/tuple containers, custom
data, infos (a column of distinct empty dicts, made or not, travels as its length), the
``_last_added_*`` references (identity with the buffers' items kept, as pickle's
memo keeps it) and the extra attributes of subclasses.
"""

from __future__ import annotations

import functools
import math
import operator
import pickle
import sys
from typing import Any

import numpy as np

from envrunners.env._empty_infos import EmptyInfosBuffer
from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

__all__ = [
    "episode_reduce",
    "own_slots",
    "pack_episodes",
    "rebuild_columnar",
    "rebuild_episode",
    "rebuild_episodes",
]

#: Offsets of the packed arrays in the block are multiples of this (any dtype's alignment).
_ALIGN = 16
#: The slots of ``SingleAgentEpisode`` that hold buffers; every other slot travels as is.
_COLUMN_SLOTS = frozenset(("observations", "infos", "actions", "rewards", "extra_model_outputs"))
#: How a column's data travels: one packed array, a dict/tuple tree with packed
#: leaves, ``n`` distinct empty info dicts, the data as is, the whole buffer as is, or
#: an ``EmptyInfosBuffer`` (``n`` empty dicts not made yet: rebuilt as one).
_ARRAY, _TREE, _EMPTY_INFOS, _RAW, _BUFFER, _UNMADE_INFOS = range(6)


class _DtypeCache(dict):
    """``dtype.str`` -> ``np.dtype``, made on the first lookup (``[]`` is the fast path)."""

    def __missing__(self, name: str) -> np.dtype:
        dtype = self[name] = np.dtype(name)
        return dtype


_dtypes = _DtypeCache()
#: dtype -> its interned ``dtype.str`` (``dtype.str`` builds a new string on every call).
_dtype_strs: dict[np.dtype, str] = {}
#: Zero bytes that pad an array's bytes to the next multiple of ``_ALIGN``.
_PADS = tuple(bytes(n) for n in range(_ALIGN))


class _Slot(int):
    """A packed array's place in a column tree: its index in the block layout."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Slot, (int(self),))


def _dtype_name(dtype: np.dtype) -> str:
    """``dtype.str``, interned once per dtype (headers repeat it: pickle memoizes it)."""
    name = _dtype_strs.get(dtype)
    if name is None:
        name = _dtype_strs[dtype] = sys.intern(dtype.str)
    return name


def _packable(x: Any) -> bool:
    """Whether ``x`` is a plain numpy array whose bytes are all of its data."""
    return type(x) is np.ndarray and not x.dtype.hasobject and x.dtype.fields is None


class _Packer:
    """Collects packable arrays and their layout in the block.

    One packer serves one episode, or all episodes of a packed list: then each
    episode takes its own ``layout`` (``new_layout``) while the arrays go on
    into the one shared block.
    """

    __slots__ = ("arrays", "layout", "size")

    def __init__(self) -> None:
        #: The block's parts in order: each array's bytes, then its padding.
        self.arrays: list[Any] = []
        #: Per packed array of the current episode: dtype string, shape, byte offset.
        self.layout: list[Any] = []
        self.size = 0

    def new_layout(self) -> list[Any]:
        """The finished episode's layout; the next episode's arrays start a new one."""
        layout, self.layout = self.layout, []
        return layout

    def add(self, array: np.ndarray) -> int:
        name = _dtype_name(array.dtype)
        offset = self.size
        nbytes = array.nbytes
        self.layout += (name, array.shape, offset)
        pad = -nbytes % _ALIGN
        self.size = offset + nbytes + pad
        if nbytes:
            self.arrays.append(array)
            if pad:
                self.arrays.append(_PADS[pad])
        return len(self.layout) // 3 - 1

    def add_run(self, arrays: list[np.ndarray]) -> None:
        """Add ``arrays`` back to back, padded once at the end (no layout entries: the
        reader slices them by their row counts; see ``_columnar_header``)."""
        size = sum([a.nbytes for a in arrays])
        self.arrays += arrays
        pad = -size % _ALIGN
        if pad:
            self.arrays.append(_PADS[pad])
        self.size += size + pad

    def tree(self, data: Any) -> Any:
        """``data`` with its packable leaves replaced by ``_Slot`` markers (exact dicts/tuples)."""
        if _packable(data):
            return _Slot(self.add(data))
        if type(data) is dict:
            return {k: self.tree(v) for k, v in data.items()}
        if type(data) is tuple:
            return tuple(self.tree(v) for v in data)
        return data

    def column(self, buf: Any) -> tuple[Any, ...]:
        """Encode one buffer as ``(kind, payload, lookback, finalized, space, space_struct)``."""
        if type(buf) is not InfiniteLookbackBuffer:
            return (_BUFFER, buf, None, None, None, None)
        data = buf.data
        if _packable(data):
            kind, payload = _ARRAY, self.add(data)
        elif type(data) is dict or type(data) is tuple:
            n = len(self.layout)
            payload = self.tree(data)
            kind = _TREE if len(self.layout) > n else _RAW
        else:
            kind, payload = _RAW, data
        return (kind, payload, buf.lookback, buf.finalized, buf._space, buf.space_struct)

    def infos(self, buf: Any, last_added_infos: Any) -> tuple[Any, ...]:
        """Encode the infos buffer; a list of distinct empty dicts travels as its length."""
        if type(buf) is EmptyInfosBuffer:  # dicts never made: none to look at
            return (_UNMADE_INFOS, buf.len_incl_lookback(), buf.lookback, False, None, None)
        data = buf.data if type(buf) is InfiniteLookbackBuffer else None
        if (
            type(data) is list
            and last_added_infos is None
            and set(map(type, data)) <= {dict}
            and not any(data)
            and len(set(map(id, data))) == len(data)
        ):
            return (_EMPTY_INFOS, len(data), buf.lookback, buf.finalized, buf._space, None)
        return self.column(buf)

    def block(self) -> bytearray:
        """All packed arrays, joined into one writable block at their (aligned) offsets."""
        try:
            return bytearray().join(self.arrays)
        except TypeError:  # a non-contiguous array: its contiguous copy has the same bytes
            self.arrays = [
                np.ascontiguousarray(a) if type(a) is np.ndarray else a for a in self.arrays
            ]
            return bytearray().join(self.arrays)

    def header(self, episode: Any, base: type) -> tuple[Any, ...]:
        """The episode's header; its arrays go into this packer's block."""
        columns = [
            self.column(episode.observations),
            self.infos(episode.infos, episode._last_added_infos),
            self.column(episode.actions),
            self.column(episode.rewards),
        ]
        extra_keys = tuple(episode.extra_model_outputs)
        columns += [self.column(b) for b in episode.extra_model_outputs.values()]
        names, values = _plain_slots(base)
        return (
            names,
            values(episode),
            tuple(self.new_layout()),
            tuple(columns),
            extra_keys,
            None if type(episode) is base else _subclass_state(episode, base),
        )


def episode_reduce(episode: Any, protocol: int, base: type) -> tuple[Any, ...]:
    """``__reduce_ex__`` of ``SingleAgentEpisode``: ``(rebuild_episode, (cls, header, block))``.

    The block is a ``PickleBuffer`` with protocol >= 5 (out-of-band with Ray),
    else a ``bytearray`` (one copy; ``copy.deepcopy`` takes this path). ``base``
    is ``SingleAgentEpisode``: what a subclass adds travels as its state.
    """
    packer = _Packer()
    header = packer.header(episode, base)
    return (rebuild_episode, (type(episode), header, _block_arg(packer.block(), protocol)))


def _block_arg(block: bytearray, protocol: int) -> Any:
    return pickle.PickleBuffer(block) if protocol >= 5 else block


class _PackedEpisodes:
    """A list of episodes that pickles as one block plus one header per episode.

    Unpickles as a plain ``list`` (``rebuild_episodes``); never used otherwise.
    """

    __slots__ = ("base", "episodes")

    def __init__(self, episodes: list[Any], base: type):
        self.episodes = episodes
        self.base = base

    def __reduce_ex__(self, protocol: int) -> tuple[Any, ...]:
        packer, base = _Packer(), self.base
        columns = _columnar_header(self.episodes, base, packer)
        if columns is not None:
            return (rebuild_columnar, (base, columns, _block_arg(packer.block(), protocol)))
        headers = [(type(e), packer.header(e, base)) for e in self.episodes]
        return (rebuild_episodes, (headers, _block_arg(packer.block(), protocol)))


def _column_template(buf: Any) -> tuple[Any, ...] | None:
    """``(dtype, row shape, finalized, space, space_struct)`` of a buffer whose data is
    one packable array with rows; else None."""
    if type(buf) is not InfiniteLookbackBuffer:
        return None
    data = buf.data
    if not _packable(data) or not data.ndim:
        return None
    return (data.dtype, data.shape[1:], buf.finalized, buf._space, buf.space_struct)


def _column_arrays(buffers: list[Any], template: tuple[Any, ...]) -> list[np.ndarray] | None:
    """The data arrays of ``buffers`` if every buffer matches ``template``; else None."""
    dtype, row_shape, finalized, space, space_struct = template
    arrays = []
    keep = arrays.append
    ndarray, buffer_cls = np.ndarray, InfiniteLookbackBuffer
    for buf in buffers:
        if type(buf) is not buffer_cls:
            return None
        data = buf.data
        if (
            type(data) is not ndarray
            or data.dtype != dtype
            or data.shape[1:] != row_shape
            or not data.ndim
            or buf.finalized is not finalized
            or buf._space is not space
            or buf.space_struct is not space_struct
        ):
            return None
        keep(data)
    return arrays


def _columnar_header(episodes: list[Any], base: type, packer: _Packer) -> tuple[Any, ...] | None:
    """A columnar header of ``episodes`` (their arrays go into ``packer``), or None.

    Applies when every episode is a plain ``base`` episode of one layout (as one
    runner's ``sample()`` makes them): infos not made yet, and each other column
    one array of the same dtype, row shape, finalized flag and spaces. Then each
    column's arrays lie back to back in the block and the header holds, per
    column, that template and each episode's row count and lookback; per episode
    only its plain slot values and infos length. Why: a header of tuples per
    episode and column was most of the runner's packing and of the driver's
    unpickling.
    """
    first = episodes[0]
    keys = tuple(first.extra_model_outputs)
    for episode in episodes:
        if type(episode) is not base or type(episode.infos) is not EmptyInfosBuffer:
            return None
        if tuple(episode.extra_model_outputs) != keys:
            return None
    columns = [
        [e.observations for e in episodes],
        [e.actions for e in episodes],
        [e.rewards for e in episodes],
    ]
    columns += [[e.extra_model_outputs[k] for e in episodes] for k in keys]
    templates, rows, lookbacks = [], [], []
    for buffers in columns:
        template = _column_template(buffers[0])
        arrays = None if template is None else _column_arrays(buffers, template)
        if arrays is None:
            return None
        templates.append((_dtype_name(template[0]), *template[1:]))
        rows.append(_shared([len(a) for a in arrays], rows))
        lookbacks.append(_shared([b.lookback for b in buffers], lookbacks))
        packer.add_run(arrays)
    infos = [e.infos for e in episodes]
    names, values = _plain_slots(base)
    return (
        names,
        [values(e) for e in episodes],
        [b.len_incl_lookback() for b in infos],
        [b.lookback for b in infos],
        keys,
        tuple(templates),
        rows,
        lookbacks,
    )


def _shared(values: list[int], earlier: list[list[int]]) -> list[int]:
    """``values``, or an equal list of ``earlier`` (pickled once: most columns have the
    same row counts and lookbacks)."""
    for other in earlier:
        if other == values:
            return other
    return values


def rebuild_columnar(cls: type, header: tuple[Any, ...], block: Any) -> list[Any]:
    """Rebuild a list packed by ``_columnar_header``.

    Each column is one array view into ``block``; an episode's arrays are slices of
    those (a slice costs half of a new view into the block).
    """
    names, values, infos_len, infos_lookback, keys, templates, rows, lookbacks = header
    new, buffer_cls = object.__new__, InfiniteLookbackBuffer
    columns = []
    start = 0
    for (name, row_shape, finalized, space, space_struct), counts, column_lookbacks in zip(
        templates, rows, lookbacks
    ):
        dtype = _dtypes[name]
        row_bytes = dtype.itemsize * math.prod(row_shape)
        total = sum(counts)
        if total and row_bytes:
            whole = np.ndarray((total, *row_shape), dtype, block, start)
        else:
            whole = np.empty((total, *row_shape), dtype)
        column = []
        keep = column.append
        first = 0
        for n, lookback in zip(counts, column_lookbacks):
            buf = new(buffer_cls)
            buf.data = whole[first : first + n]
            first += n
            buf.lookback = lookback
            buf.finalized = finalized
            buf._space = space
            buf.space_struct = space_struct
            keep(buf)
        columns.append(column)
        end = start + total * row_bytes
        start = end + (-end % _ALIGN)
    of_length = EmptyInfosBuffer.of_length
    set_slots = _slot_setter(names)
    episodes = []
    keep = episodes.append
    for plain, n, lookback, (obs, actions, rewards, *extras) in zip(
        values, infos_len, infos_lookback, zip(*columns)
    ):
        ep = new(cls)
        set_slots(ep, plain)
        ep.observations = obs
        ep.infos = of_length(n, lookback)
        ep.actions = actions
        ep.rewards = rewards
        ep.extra_model_outputs = dict(zip(keys, extras))
        keep(ep)
    return episodes


def pack_episodes(samples: Any, base: type) -> Any:
    """``samples`` ready to pickle: a list of ``base`` episodes shares one block.

    Anything else (a batch, other episode types, a subclass with its own
    ``__reduce_ex__``) comes back as it is. Unpickled, a packed list is a
    plain list of rebuilt episodes, exactly as the episodes pickled one by one.
    """
    if type(samples) is not list or not samples:
        return samples
    reduce = base.__reduce_ex__
    for episode in samples:
        if not isinstance(episode, base) or type(episode).__reduce_ex__ is not reduce:
            return samples
    return _PackedEpisodes(samples, base)


@functools.cache
def _plain_slots(base: type) -> tuple[tuple[str, ...], Any]:
    """The slots of ``base`` other than the buffers, and a getter of their values."""
    names = tuple(s for s in base.__slots__ if s not in _COLUMN_SLOTS)
    return names, operator.attrgetter(*names)


def _subclass_state(episode: Any, base: type) -> tuple[Any, dict[str, Any]]:
    """A subclass's own ``__dict__`` and the values of the slots it adds to ``base``."""
    slots: dict[str, Any] = {}
    for klass in type(episode).__mro__:
        if klass is base:
            break
        for name in own_slots(klass):
            if hasattr(episode, name):
                slots[name] = getattr(episode, name)
    return getattr(episode, "__dict__", None), slots


def own_slots(klass: type) -> tuple[str, ...]:
    """The data slots ``klass`` itself declares (not inherited, no ``__dict__``/``__weakref__``)."""
    slots = klass.__dict__.get("__slots__", ())
    if isinstance(slots, str):
        slots = (slots,)
    return tuple(s for s in slots if s not in ("__dict__", "__weakref__"))


def rebuild_episodes(headers: list[tuple[type, tuple[Any, ...]]], block: Any) -> list[Any]:
    """Rebuild a ``pack_episodes`` list; every episode's arrays are views into ``block``."""
    return [rebuild_episode(cls, header, block) for cls, header in headers]


def rebuild_episode(cls: type, header: tuple[Any, ...], block: Any) -> Any:
    """Rebuild an episode from ``episode_reduce`` output; its arrays are views into ``block``."""
    names, plain, layout, columns, extra_keys, subclass_state = header
    views: list[np.ndarray] = []
    view = views.append
    ndarray, dtypes = np.ndarray, _dtypes
    parts = iter(layout)
    for name, shape, offset in zip(parts, parts, parts):  # (dtype string, shape, offset)
        dtype = dtypes[name]
        view(np.empty(shape, dtype) if 0 in shape else ndarray(shape, dtype, block, offset))
    # Buffers are made inline (not with ``InfiniteLookbackBuffer._raw``): a call per
    # column was a fifth of the driver's unpacking.
    new, buffer_cls = object.__new__, InfiniteLookbackBuffer
    buffers: list[Any] = []
    keep = buffers.append
    for kind, payload, lookback, finalized, space, space_struct in columns:
        if kind == _ARRAY:
            data = views[payload]
        elif kind == _UNMADE_INFOS:
            keep(EmptyInfosBuffer.of_length(payload, lookback))
            continue
        elif kind == _EMPTY_INFOS:
            data = [{} for _ in range(payload)]
        elif kind == _BUFFER:
            keep(payload)
            continue
        elif kind == _TREE:
            data = _fill_tree(payload, views)
        else:
            data = payload
        buf = new(buffer_cls)
        buf.data = data
        buf.lookback = lookback
        buf.finalized = finalized
        buf._space = space
        buf.space_struct = space_struct
        keep(buf)
    ep = new(cls)
    _slot_setter(names)(ep, plain)
    ep.observations, ep.infos, ep.actions, ep.rewards = buffers[:4]
    ep.extra_model_outputs = dict(zip(extra_keys, buffers[4:]))
    if subclass_state is not None:
        instance_dict, slots = subclass_state
        if instance_dict:
            ep.__dict__.update(instance_dict)
        for name, value in slots.items():
            setattr(ep, name, value)
    return ep


@functools.lru_cache(maxsize=64)
def _slot_setter(names: tuple[str, ...]) -> Any:
    """``set_slots(episode, values)``: one unpacking assignment of the named slots.

    Why: a ``setattr`` call per slot (15 per episode) was another fifth of the
    unpacking. The names are ``__slots__`` entries (identifiers), as
    ``dataclasses`` generates its ``__init__``.
    """
    if not all(name.isidentifier() for name in names):  # only ever ``__slots__`` entries
        raise pickle.UnpicklingError(f"episode slot names must be identifiers, got {names!r}")
    targets = "".join(f"episode.{name}, " for name in names)
    namespace: dict[str, Any] = {}
    exec(f"def set_slots(episode, values):\n    {targets or '()'} = values\n", namespace)
    return namespace["set_slots"]


def _fill_tree(tree: Any, views: list[np.ndarray]) -> Any:
    if type(tree) is _Slot:
        return views[tree]
    if type(tree) is dict:
        return {k: _fill_tree(v, views) for k, v in tree.items()}
    if type(tree) is tuple:
        return tuple(_fill_tree(v, views) for v in tree)
    return tree
