"""``InfiniteLookbackBuffer``: one column of episode data plus its lookback history.

Why: an episode chunk needs the steps it owns *and* some steps from before its
start (for frame stacking, bootstrapping, recurrent state). The buffer keeps both
in one sequence and translates episode-relative indices (0 = the chunk's first
step, negative = from the end or into the lookback) into positions in that
sequence, padding out-of-range positions with a fill value on request.

Data is either a Python list of per-step items (cheap to append to) or, once
``finalize()``-d, one batch-first numpy array (a dict/tuple tree of them for
nested spaces). Index arithmetic below happens in *data coordinates*: position
``p`` in ``[0, len_incl_lookback())``; episode index ``i >= 0`` is ``lookback + i``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.env.utils._structs import batch, leaf_len, struct_equal, unbatch
from envrunners.utils.spaces import (
    get_base_struct_from_space,
    gym_space_from_dict,
    gym_space_to_dict,
    one_hot_encode,
    one_hot_size,
)
from envrunners.utils.tree import is_container, map_structure

__all__ = ["InfiniteLookbackBuffer"]

Indices = int | list[int] | slice | None


#: Item types that ``finalize`` batches with ``np.asarray`` directly (no struct checks).
_PLAIN_SCALARS = frozenset((float, int, np.float32, np.float64, np.int64, np.int32))


class InfiniteLookbackBuffer:
    """A sequence of per-step items whose first ``lookback`` items are history.

    Why: see the module docstring; every per-step column of an episode
    (observations, actions, rewards, infos, extra model outputs) is one of these.

    Attributes:
        data: A list of items, or (when ``finalized``) a tree of batch-first arrays.
        lookback: How many leading items are history, not part of this chunk.
        finalized: Whether ``data`` is numpy (appends then concatenate).
        space: The gymnasium space of one item (optional; used for fill/one-hot).
        space_struct: ``space`` broken into its nested dict/tuple of leaf spaces.
    """

    __slots__ = ("data", "lookback", "finalized", "_space", "space_struct")

    def __init__(self, data: Any = None, lookback: int = 0, space: gym.Space | None = None):
        """Wrap ``data`` (a list, or numpy data that counts as finalized).

        Args:
            data: The items; defaults to an empty list.
            lookback: How many leading items are history; capped at ``len(data)``.
            space: The space of one item.
        """
        self.data = [] if data is None else data
        self.finalized = not isinstance(self.data, list)
        self.lookback = min(int(lookback), self.len_incl_lookback())
        self._space: gym.Space | None = None
        self.space_struct: Any = None
        self.space = space

    @classmethod
    def _raw(cls, data: Any, lookback: int, space: Any, space_struct: Any, finalized: bool):
        """Build a buffer without any checks (internal fast path)."""
        buf = object.__new__(cls)
        buf.data = data
        buf.lookback = lookback
        buf.finalized = finalized
        buf._space = space
        buf.space_struct = space_struct
        return buf

    @property
    def space(self) -> gym.Space | None:
        """The space of one item; setting it also sets ``space_struct``."""
        return self._space

    @space.setter
    def space(self, value: gym.Space | None) -> None:
        self._space = value
        self.space_struct = get_base_struct_from_space(value) if value is not None else None

    # ----------------------------------------------------------------- lengths
    def __len__(self) -> int:
        """Return the number of items after the lookback."""
        return max(self.len_incl_lookback() - self.lookback, 0)

    def len_incl_lookback(self) -> int:
        """Return the number of items including the lookback."""
        if self.finalized:
            return leaf_len(self.data)
        return len(self.data)

    # ---------------------------------------------------------------- mutation
    def append(self, item: Any) -> None:
        """Append one item (``np.concatenate`` when finalized)."""
        if self.finalized:
            self.data = map_structure(
                lambda d, i: np.concatenate([d, np.asarray(i)[None]], axis=0), self.data, item
            )
        else:
            self.data.append(item)

    def extend(self, items: Any) -> None:
        """Append many items: a list of items, or batch-first (numpy) data."""
        if self.finalized:
            if isinstance(items, list) and not items:
                return  # nothing to add; avoid promoting dtypes with an empty batch
            new = self._batch(items) if isinstance(items, list) else items
            if leaf_len(new) == 0:
                return
            if self.len_incl_lookback() == 0:
                self.data = map_structure(np.asarray, new)
            else:
                self.data = map_structure(
                    lambda d, i: np.concatenate([d, np.asarray(i)], axis=0), self.data, new
                )
        elif isinstance(items, list):
            self.data.extend(items)
        elif is_container(items) or isinstance(items, np.ndarray):
            self.data.extend(unbatch(items))
        else:
            self.data.extend(list(items))

    def pop(self, index: int = -1) -> None:
        """Remove the item at data position ``index`` (does not return it)."""
        if self.finalized:
            n = self.len_incl_lookback()
            pos = index + n if index < 0 else index
            if not 0 <= pos < n:
                raise IndexError(f"pop index {index} out of range for {n} items.")
            self.data = map_structure(lambda d: np.delete(d, pos, axis=0), self.data)
        else:
            self.data.pop(index)

    def concat(self, other: InfiniteLookbackBuffer) -> None:
        """Extend with ``other``'s items, excluding its lookback."""
        self.extend(other.get())

    def finalize(self) -> None:
        """Turn the list of items into batch-first numpy data (no-op if already done)."""
        if self.finalized:
            return
        data = self.data
        first = data[0] if data else None
        if type(first) in _PLAIN_SCALARS:
            # = batch(data) for plain leaves (rewards, int actions, 1-D extra outputs),
            # minus its dispatch: episodes finalize several short columns each.
            self.data = np.asarray(data)
        else:
            self.data = self._batch(data)
        self.finalized = True

    def _batch(self, items: list[Any]) -> Any:
        """Batch ``items``; an empty list becomes empty arrays shaped like the space."""
        if len(items) == 0 and self.space_struct is not None:
            return map_structure(
                lambda s: np.zeros((0, *(s.shape or ())), dtype=s.dtype), self.space_struct
            )
        return batch(items)

    def __add__(self, other: Any) -> InfiniteLookbackBuffer:
        """Return a new (list) buffer: numbers add element-wise, buffers/lists append.

        Raises:
            RuntimeError: If this buffer is finalized.
        """
        if self.finalized:
            raise RuntimeError("Cannot use `+` on a finalized InfiniteLookbackBuffer.")
        if isinstance(other, (int, float, np.number)) and not isinstance(other, bool):
            data = [d + other for d in self.data]
        elif isinstance(other, InfiniteLookbackBuffer):
            tail = other.get()
            data = self.data + (unbatch(tail) if other.finalized else list(tail))
        else:
            data = self.data + list(other)
        return InfiniteLookbackBuffer(data=data, lookback=self.lookback, space=self.space)

    # ---------------------------------------------------------------- indexing
    def _pos(self, i: int, neg_index_as_lookback: bool, n: int) -> int:
        """Translate an episode index into a data position (may be out of range)."""
        if i >= 0 or neg_index_as_lookback:
            return self.lookback + i
        return n + i

    def _slice_positions(self, s: slice, neg_index_as_lookback: bool, n: int) -> range:
        """Translate an episode slice into a range of data positions (unclipped)."""
        step = 1 if s.step is None else int(s.step)
        if step == 0:
            raise ValueError("slice step cannot be zero")
        if step > 0:
            start = self.lookback if s.start is None else None
            stop = n if s.stop is None else None
        else:
            start = n - 1 if s.start is None else None
            stop = self.lookback - 1 if s.stop is None else None
        if start is None:
            start = self._pos(int(s.start), neg_index_as_lookback, n)
        if stop is None:
            stop = self._pos(int(s.stop), neg_index_as_lookback, n)
        return range(start, stop, step)

    def _leaf_fill(self, leaf_space: Any, fill: Any, one_hot: bool, like: Any = None) -> Any:
        """Return one fill item for a leaf: shaped like its space (or like ``like``)."""
        if one_hot and one_hot_size(leaf_space) is not None:
            return np.zeros((one_hot_size(leaf_space),), dtype=np.float32)
        if leaf_space is not None and getattr(leaf_space, "shape", None) is not None:
            return np.full(leaf_space.shape, fill, dtype=leaf_space.dtype)[()]
        if like is not None:
            base = np.asarray(like).dtype
            try:
                dtype = np.result_type(base, fill)
            except TypeError:
                dtype = np.dtype(object)
            return np.full(np.shape(like), fill, dtype=dtype)[()]
        return fill

    def _fill_item(self, fill: Any, one_hot: bool) -> Any:
        """Return one fill item for the whole (possibly nested) item."""
        if self.space_struct is None:
            if self.len_incl_lookback() == 0:
                return fill
            if self.finalized:
                first = map_structure(lambda d: d[0], self.data)
            else:
                first = self.data[0]
                numeric = isinstance(fill, (int, float, np.number)) and not isinstance(fill, bool)
                if is_container(first) or not numeric or not _is_numeric_leaf(first):
                    return fill  # e.g. infos dicts: pad with the fill value itself
            return map_structure(lambda x: self._leaf_fill(None, fill, False, like=x), first)
        return map_structure(lambda s: self._leaf_fill(s, fill, one_hot), self.space_struct)

    def _one_hot(self, value: Any, batched: bool) -> Any:
        """One-hot encode the Discrete/MultiDiscrete leaves of ``value``."""
        if self.space_struct is None:
            return value
        return map_structure(lambda s, v: one_hot_encode(s, v, batched), self.space_struct, value)

    def _effective(self, _ignore_last_ts: bool, _add_last_ts_value: Any) -> Any:
        """Return data with the last item dropped and/or an extra item appended."""
        data = self.data
        if _ignore_last_ts:
            data = map_structure(lambda d: d[:-1], data) if self.finalized else data[:-1]
        if _add_last_ts_value is not None:
            if self.finalized:
                data = map_structure(
                    lambda d, v: np.concatenate([d, np.asarray(v)[None]], axis=0),
                    data,
                    _add_last_ts_value,
                )
            else:
                data = [*data, _add_last_ts_value]
        return data

    def get(
        self,
        indices: Indices = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        _ignore_last_ts: bool = False,
        _add_last_ts_value: Any = None,
    ) -> Any:
        """Return items by episode index: an int gives one item, a slice/list a batch.

        Why: episode getters need "the last k steps", "the step before the chunk
        started" and padded windows without caring where the chunk boundary is.

        Args:
            indices: ``None`` (all items after the lookback), an int, a list of ints
                or a slice. Non-negative indices count from the chunk start;
                negative ones from the end of the data.
            neg_index_as_lookback: Read negative indices as positions before the
                chunk start (-1 = the last lookback item).
            fill: Pad out-of-range positions with this value (shaped like the space)
                instead of raising (int, list) or clipping (slice). A slice wholly
                outside the data gives ``|start - stop|`` fill items in either
                direction, as in RLlib.
            one_hot_discrete: One-hot encode Discrete/MultiDiscrete components
                (float32); fill positions then become all-zero vectors.
            _ignore_last_ts: Act as if the last item were not there (multi-agent use).
            _add_last_ts_value: Act as if this item were appended (multi-agent use).

        Returns:
            One item, or a batch: a list (not finalized) or numpy data (finalized).

        Raises:
            IndexError: An int index, or an index in a list, out of range without ``fill``
                (as RLlib; slices are clipped instead).
        """
        data = self.data
        if _ignore_last_ts or _add_last_ts_value is not None:
            data = self._effective(_ignore_last_ts, _add_last_ts_value)
        n = leaf_len(data) if self.finalized else len(data)
        if indices is None:
            positions: range | list[int] = range(self.lookback, n)
        elif isinstance(indices, slice):
            positions = self._slice_positions(indices, neg_index_as_lookback, n)
            a, b = positions.start, positions.stop
            if fill is not None and abs(positions.step) == 1 and (max(a, b) < 0 or min(a, b) >= n):
                # As RLlib: a slice wholly outside the data gives ``|a - b|`` fill items,
                # whichever its direction (``buf[100:98]`` -> two fills).
                empty = self._take_range(data, 0, 0, one_hot_discrete)
                return self._pad(empty, abs(a - b), 0, fill, one_hot_discrete)
        elif isinstance(indices, (int, np.integer)):
            return self._get_one(
                data, int(indices), n, neg_index_as_lookback, fill, one_hot_discrete
            )
        else:
            positions = [self._pos(int(i), neg_index_as_lookback, n) for i in indices]
            if fill is None:
                for i, p in zip(indices, positions, strict=True):
                    if not 0 <= p < n:
                        raise self._out_of_range(i, n)
        return self._gather(data, positions, n, fill, one_hot_discrete)

    __getitem__ = get

    def _get_one(self, data: Any, i: int, n: int, neg_lb: bool, fill: Any, one_hot: bool) -> Any:
        """Return the single item at episode index ``i``."""
        p = self._pos(i, neg_lb, n)
        if not 0 <= p < n and fill is None:
            raise self._out_of_range(i, n)
        return self._item_at(data, p, n, fill, one_hot)

    def _out_of_range(self, i: Any, n: int) -> IndexError:
        return IndexError(
            f"Index {i} is out of range: the buffer has {n - self.lookback} items "
            f"after a lookback of {self.lookback} (pass fill= to pad)."
        )

    def _item_at(self, data: Any, p: int, n: int, fill: Any, one_hot: bool) -> Any:
        """Return the item at data position ``p``, or the fill item when out of range."""
        if not 0 <= p < n:
            return self._fill_item(fill, one_hot)
        item = map_structure(lambda d: d[p], data) if self.finalized else data[p]
        return self._one_hot(item, batched=False) if one_hot else item

    def _gather(self, data: Any, positions: range | list[int], n: int, fill: Any, one_hot: bool):
        """Return the batch of items at ``positions``, padded (fill) or clipped at the ends."""
        if isinstance(positions, range) and positions.step == 1:
            a, b = positions.start, positions.stop
            lo = min(max(a, 0), n)
            hi = max(min(b, n), lo)
            core = self._take_range(data, lo, hi, one_hot)
            if fill is None or b <= a:
                return core
            left = max(0, min(b, 0) - a)
            right = max(0, b - max(a, n))
            return self._pad(core, left, right, fill, one_hot)
        plist = list(positions)
        if fill is None:
            return self._take_list(data, [p for p in plist if 0 <= p < n], one_hot)
        if not self.finalized:
            return [self._item_at(data, p, n, fill, one_hot) for p in plist]
        if not plist:
            return self._take_list(data, [], one_hot)
        return batch([self._item_at(data, p, n, fill, one_hot) for p in plist])

    def _take_range(self, data: Any, lo: int, hi: int, one_hot: bool) -> Any:
        """Return items ``[lo, hi)`` of the data as a batch."""
        if self.finalized:
            out = map_structure(lambda d: d[lo:hi], data)
            return self._one_hot(out, batched=True) if one_hot else out
        out = data[lo:hi]
        return [self._one_hot(x, batched=False) for x in out] if one_hot else out

    def _take_list(self, data: Any, positions: list[int], one_hot: bool) -> Any:
        """Return the items at the given in-range positions as a batch."""
        if self.finalized:
            idx = np.asarray(positions, dtype=np.int64)
            out = map_structure(lambda d: d[idx], data)
            return self._one_hot(out, batched=True) if one_hot else out
        out = [data[p] for p in positions]
        return [self._one_hot(x, batched=False) for x in out] if one_hot else out

    def _pad(self, core: Any, left: int, right: int, fill: Any, one_hot: bool) -> Any:
        """Pad a batch with ``left``/``right`` fill items."""
        if left == 0 and right == 0:
            return core
        filler = self._fill_item(fill, one_hot)
        if not self.finalized:
            return [filler] * left + list(core) + [filler] * right

        def pad_leaf(c: np.ndarray, f: Any) -> np.ndarray:
            f = np.asarray(f)
            if c.shape[0] == 0 and c.shape[1:] != f.shape:
                c = np.zeros((0, *f.shape), dtype=np.result_type(c.dtype, f.dtype))
            block = np.broadcast_to(f, f.shape)
            parts = [np.repeat(block[None], left, axis=0), c, np.repeat(block[None], right, axis=0)]
            return np.concatenate(parts, axis=0)

        if is_container(core):
            return map_structure(pad_leaf, core, filler)
        return pad_leaf(core, filler)

    # ------------------------------------------------------------------ setters
    def set(
        self,
        new_data: Any,
        *,
        at_indices: Indices = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Overwrite existing items (the mirror of ``get``; never grows the buffer).

        Args:
            new_data: One item (int index) or a batch (list, or batch-first numpy).
            at_indices: ``None`` (all items after the lookback), int, list or slice.
            neg_index_as_lookback: Read negative indices as lookback positions.

        Raises:
            IndexError: A position out of range, or ``new_data`` of the wrong size.
        """
        n = self.len_incl_lookback()
        if isinstance(at_indices, (int, np.integer)):
            p = self._pos(int(at_indices), neg_index_as_lookback, n)
            if not 0 <= p < n:
                raise IndexError(f"Cannot set index {at_indices}: out of range for this buffer.")
            if self.finalized:
                map_structure(lambda d, v: d.__setitem__(p, v), self.data, new_data)
            else:
                self.data[p] = new_data
            return
        if at_indices is None:
            positions: list[int] | range = range(self.lookback, n)
        elif isinstance(at_indices, slice):
            positions = self._slice_positions(at_indices, neg_index_as_lookback, n)
        else:
            positions = [self._pos(int(i), neg_index_as_lookback, n) for i in at_indices]
        bad = [p for p in positions if not 0 <= p < n]
        if bad:
            raise IndexError(f"Cannot set indices {at_indices}: positions out of range.")
        size = len(new_data) if isinstance(new_data, list) else leaf_len(new_data)
        if size != len(positions):
            raise IndexError(
                f"Cannot set {size} items at {len(positions)} positions ({at_indices})."
            )
        if self.finalized:
            idx = (
                slice(positions.start, positions.stop, positions.step)
                if isinstance(positions, range) and positions.step > 0
                else np.asarray(list(positions), dtype=np.int64)
            )
            new = self._batch(new_data) if isinstance(new_data, list) else new_data
            map_structure(lambda d, v: d.__setitem__(idx, v), self.data, new)
        else:
            items = new_data if isinstance(new_data, list) else unbatch(new_data)
            for p, v in zip(positions, items):
                self.data[p] = v

    def __setitem__(self, key: Indices, value: Any) -> None:
        """Set items: ``buffer[key] = value`` is ``set(value, at_indices=key)``."""
        self.set(value, at_indices=key)

    # -------------------------------------------------------------------- state
    def get_state(self) -> dict[str, Any]:
        """Return the buffer as a dict (data, lookback, finalized, encoded space)."""
        return {
            "data": self.data if self.finalized else list(self.data),
            "lookback": self.lookback,
            "finalized": self.finalized,
            "space": gym_space_to_dict(self.space) if self.space is not None else None,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> InfiniteLookbackBuffer:
        """Rebuild a buffer from ``get_state()`` output."""
        space = state.get("space")
        data = state["data"]
        buf = cls(
            data=list(data) if isinstance(data, list) else data,
            lookback=state["lookback"],
            space=gym_space_from_dict(space) if space is not None else None,
        )
        buf.finalized = bool(state["finalized"])
        return buf

    def __eq__(self, other: object) -> bool:
        """Return whether two buffers hold equal data, lookback, finalized flag and space."""
        if not isinstance(other, InfiniteLookbackBuffer):
            return NotImplemented
        return (
            self.lookback == other.lookback
            and self.finalized == other.finalized
            and self.space == other.space
            and self.len_incl_lookback() == other.len_incl_lookback()
            and struct_equal(self.data, other.data)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        """Summarise the buffer (lengths and finalized flag)."""
        return (
            f"InfiniteLookbackBuffer(len={len(self)}, lookback={self.lookback}, "
            f"finalized={self.finalized})"
        )


def _is_numeric_leaf(x: Any) -> bool:
    """Return whether ``x`` is a number or a numeric numpy array (a fill can mimic it)."""
    if isinstance(x, (np.ndarray, np.generic)):
        return x.dtype.kind in "biuf"
    return isinstance(x, (int, float)) and not isinstance(x, bool)
