"""Experience batches of the old API stack (``ray.rllib.policy.sample_batch``).

``SampleBatch`` is a dict of equally long columns: ``RolloutWorker.sample()``, the
offline readers and the old-stack policies exchange experience in it. Row ``t``
holds one step: ``obs[t]`` was seen, ``actions[t]`` taken, ``rewards[t]`` received,
and ``terminateds[t]``/``truncateds[t]`` describe ``new_obs[t]``. ``MultiAgentBatch``
holds one ``SampleBatch`` per policy; ``concat_samples`` and its siblings combine,
wrap and unwrap them.

Columns are numpy arrays (or torch tensors after :meth:`SampleBatch.to_device`),
possibly nested in dicts/tuples; ``infos`` is a list. Every operation is
vectorised over rows: slicing returns views, shuffling applies one permutation,
episode splits come from change points, ``MultiAgentBatch.timeslices`` orders all
policies' rows with one ``np.lexsort``. Leaf work lives in ``_batch_ops``, sequence
(``seq_lens``) arithmetic in ``_seq_ops``; neither imports this module.

Deliberate differences from RLlib (spec section 20): ``shuffle()`` also permutes
``infos``; ``timeslices(size=k)`` ends with a shorter slice instead of hanging;
``is_training`` is always the raw bool; compression never pickles.
"""

from __future__ import annotations

import contextlib
import numbers
import operator
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from typing import Any, Union

import numpy as np

from envrunners.core import DEFAULT_POLICY_ID
from envrunners.errors import (
    BatchArgumentError,
    BatchTypeError,
    ColumnKeyError,
    DeprecatedAPIError,
    UnknownPolicyError,
    suggest,
)
from envrunners.policy import _batch_ops as ops
from envrunners.policy import _seq_ops as seq_ops
from envrunners.utils import tree

__all__ = [
    "DEFAULT_POLICY_ID",
    "MultiAgentBatch",
    "SampleBatch",
    "SampleBatchType",
    "attempt_count_timesteps",
    "concat_samples",
    "concat_samples_into_ma_batch",
    "convert_ma_batch_to_sample_batch",
]

_DONES_CONSTRUCT_MSG = (
    "SampleBatch cannot be constructed anymore with a `DONES` key! Give the episode ends "
    "as 'terminateds' (the episode reached a terminal state) and 'truncateds' (it was cut "
    "off, e.g. by a time limit) instead."
)
_DONES_SET_MSG = (
    "Cannot set `DONES` in a SampleBatch anymore! Set 'terminateds' and 'truncateds' instead."
)
DEFAULT_COMPRESS_COLUMNS = frozenset(["obs", "new_obs"])


def _as_array(key: str, leaf: Any) -> Any:
    """Turn a list or Python number leaf into a numpy array; leave everything else alone."""
    if isinstance(leaf, (list, numbers.Number)):
        try:
            return np.asarray(leaf)
        except ValueError as e:
            raise BatchArgumentError(
                f"SampleBatch column {key!r}: cannot turn this list into a numpy array ({e}); "
                "give rows of equal shape, or a numpy array"
            ) from None
    return leaf


def _rebuild_sample_batch(cls: type, data: dict, state: dict) -> SampleBatch:
    """Unpickle helper: restore data and settings without re-running the constructor."""
    batch = cls.__new__(cls)
    dict.update(batch, data)
    batch.__dict__.update(state)
    return batch


class SampleBatch(dict):
    """A dict of equally long data columns: one row per (agent) timestep.

    Why: the unit of experience the old API stack samples, stores, and trains on.
    Lists and Python numbers given as values become numpy arrays (``infos`` stays a
    list). ``seq_lens`` (if given) cuts the rows into RNN sequences; ``state_in_*``
    columns then hold one row per sequence. ``count`` (= ``len(batch)``) is the
    number of timesteps, computed once at construction.

    Special keyword arguments: ``_time_major``, ``_max_seq_len``, ``_zero_padded``,
    ``_is_training``, ``_num_grad_updates``.

    Raises:
        KeyError: if a ``"dones"`` column is given (use ``terminateds``/``truncateds``).
    """

    # Column names (the same strings as envrunners.core.columns.Columns).
    OBS = "obs"
    CUR_OBS = "obs"
    NEXT_OBS = "new_obs"
    ACTIONS = "actions"
    REWARDS = "rewards"
    PREV_ACTIONS = "prev_actions"
    PREV_REWARDS = "prev_rewards"
    TERMINATEDS = "terminateds"
    TRUNCATEDS = "truncateds"
    DONES = "dones"  # virtual: reading it returns `terminateds`; it cannot be stored.
    INFOS = "infos"
    SEQ_LENS = "seq_lens"
    T = "t"
    EPS_ID = "eps_id"
    ENV_ID = "env_id"
    AGENT_INDEX = "agent_index"
    UNROLL_ID = "unroll_id"
    ACTION_DIST_INPUTS = "action_dist_inputs"
    ACTION_PROB = "action_prob"
    ACTION_LOGP = "action_logp"
    ACTION_DIST = "action_dist"
    VF_PREDS = "vf_preds"
    VALUES_BOOTSTRAPPED = "values_bootstrapped"
    OBS_EMBEDS = "obs_embeds"
    RETURNS_TO_GO = "returns_to_go"
    ATTENTION_MASKS = "attention_masks"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        time_major = kwargs.pop("_time_major", None)
        max_seq_len = kwargs.pop("_max_seq_len", None)
        zero_padded = kwargs.pop("_zero_padded", False)
        is_training = kwargs.pop("_is_training", None)
        num_grad_updates = kwargs.pop("_num_grad_updates", None)
        dict.__init__(self, *args, **kwargs)
        if self.DONES in self:
            raise ColumnKeyError(_DONES_CONSTRUCT_MSG)
        if is_training is None:
            is_training = dict.pop(self, "is_training", False)
        self._init_settings(time_major, max_seq_len, zero_padded, is_training, num_grad_updates)

        seq_lens = dict.get(self, self.SEQ_LENS)
        if seq_lens is None or (isinstance(seq_lens, (list, tuple)) and len(seq_lens) == 0):
            dict.pop(self, self.SEQ_LENS, None)
        elif isinstance(seq_lens, (list, tuple)):
            dict.__setitem__(self, self.SEQ_LENS, np.asarray(seq_lens, dtype=np.int32))
        for key, value in list(dict.items(self)):
            if key in (self.INFOS, self.SEQ_LENS):
                continue
            if tree.is_container(value):
                converted = tree.map_structure(partial(_as_array, key), value)
            else:
                converted = _as_array(key, value)
            if converted is not value:
                dict.__setitem__(self, key, converted)
        seq_lens = dict.get(self, self.SEQ_LENS)
        if self.max_seq_len is None and seq_lens is not None and len(seq_lens) > 0:
            self.max_seq_len = int(ops.to_numpy(seq_lens).max())
        self.count = attempt_count_timesteps(self)

    def _init_settings(
        self,
        time_major: bool | None,
        max_seq_len: int | None,
        zero_padded: bool,
        is_training: bool,
        num_grad_updates: float | None,
    ) -> None:
        self.time_major = time_major
        self.max_seq_len = max_seq_len
        self.zero_padded = zero_padded
        self._is_training = is_training
        self.num_grad_updates = num_grad_updates
        self.accessed_keys: set[str] = set()
        self.added_keys: set[str] = set()
        self.deleted_keys: set[str] = set()
        self.intercepted_values: dict[str, Any] = {}
        self.get_interceptor: Callable[[Any], Any] | None = None
        self._slice_seq_lens_in_B = False
        self._slice_map: list[tuple[int, int]] = []  # RLlib attribute; unused here

    def _derive(self, data: dict, count: int | None = None, **settings: Any) -> SampleBatch:
        """Return a new batch over ``data`` (already converted) with this batch's settings."""
        out = SampleBatch.__new__(SampleBatch)
        dict.update(out, data)
        out._init_settings(
            settings.get("time_major", self.time_major),
            settings.get("max_seq_len", self.max_seq_len),
            settings.get("zero_padded", self.zero_padded),
            settings.get("is_training", self._is_training),
            settings.get("num_grad_updates", self.num_grad_updates),
        )
        out.count = attempt_count_timesteps(out) if count is None else int(count)
        return out

    def __reduce__(self) -> tuple:
        state = dict(self.__dict__)
        state["intercepted_values"] = {}  # a cache; recomputed on the next read
        return (_rebuild_sample_batch, (type(self), dict(self), state))

    # ----------------------------------------------------------------- counting

    def __len__(self) -> int:
        """Return the number of timesteps (``count``), not the number of columns."""
        return self.count

    def env_steps(self) -> int:
        """Return the number of env steps in this batch (same as ``len(self)``)."""
        return self.count

    def agent_steps(self) -> int:
        """Return the number of agent steps in this batch (same as ``len(self)``)."""
        return self.count

    # ------------------------------------------------------------- item access

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return self._slice(key)
        if key == self.DONES:
            return self[self.TERMINATEDS]
        if key == "is_training":
            warnings.warn(
                "batch['is_training'] is deprecated; use batch.is_training",
                DeprecationWarning,
                stacklevel=2,
            )
            return self.is_training
        value = dict.__getitem__(self, key)
        self.accessed_keys.add(key)
        interceptor = self.get_interceptor
        if interceptor is not None:
            if key not in self.intercepted_values:
                self.intercepted_values[key] = interceptor(value)
            value = self.intercepted_values[key]
        return value

    def __setitem__(self, key: Any, item: Any) -> None:
        if key == self.DONES:
            raise ColumnKeyError(_DONES_SET_MSG)
        added = self.__dict__.get("added_keys")
        if added is None:  # not initialised yet (e.g. unpickling a foreign pickle)
            dict.__setitem__(self, key, item)
            return
        if key == "is_training":
            self.set_training(bool(item))
            return
        if key not in self:
            added.add(key)
        dict.__setitem__(self, key, item)
        # Values written while an interceptor is active are taken as already converted.
        if key in self.intercepted_values:
            self.intercepted_values[key] = item

    def __delitem__(self, key: Any) -> None:
        self.deleted_keys.add(key)
        dict.__delitem__(self, key)
        self.intercepted_values.pop(key, None)

    def get(self, key: Any, default: Any = None) -> Any:
        """Return one column (through the interceptor, if any), or ``default`` if missing."""
        try:
            return self[key]
        except KeyError:
            return default

    def columns(self, keys: Iterable[str]) -> list[Any]:
        """Return the data of the given columns, in order (``[self[k] for k in keys]``)."""
        return [self[k] for k in keys]

    def set_get_interceptor(self, fn: Callable[[Any], Any] | None) -> None:
        """Set a function applied to each column on read (e.g. numpy → tensor), cached per key.

        Why: lets a policy's loss read tensors while the batch keeps numpy data.
        A different function clears the cache of intercepted values.
        """
        if fn is not self.get_interceptor:
            self.intercepted_values = {}
        self.get_interceptor = fn

    @property
    def is_training(self) -> bool:
        """Whether this batch is used for training (always the raw bool, never intercepted)."""
        return self._is_training

    def set_training(self, training: bool = True) -> None:
        """Set the ``is_training`` flag for this batch."""
        self._is_training = training
        self.intercepted_values.pop("is_training", None)

    # --------------------------------------------------------------- predicates

    def is_terminated_or_truncated(self) -> bool:
        """Return True if the last row is terminated or (if that column exists) truncated."""
        terminateds = self[self.TERMINATEDS]
        if len(terminateds) == 0:
            return False
        if bool(terminateds[-1]):
            return True
        return self.TRUNCATEDS in self and bool(self[self.TRUNCATEDS][-1])

    def is_single_trajectory(self) -> bool:
        """Return True if no row but the last one ends an episode (terminated or truncated)."""
        for key in (self.TERMINATEDS, self.TRUNCATEDS):
            if key in self and ops.to_numpy(dict.__getitem__(self, key))[:-1].any():
                return False
        return True

    # -------------------------------------------------------- copying, combining

    def copy(self, shallow: bool = False) -> SampleBatch:
        """Return a deep copy (arrays copied) or, with ``shallow=True``, one sharing the arrays.

        Settings and the interceptor are kept; the key-tracking sets are shared.
        """

        def dup(leaf: Any) -> Any:
            if shallow:
                return leaf
            if isinstance(leaf, np.ndarray):
                return leaf.copy()
            if ops.is_torch_tensor(leaf):
                return leaf.clone()
            if isinstance(leaf, list):
                return list(leaf)
            return leaf

        data = {k: tree.map_structure(dup, v) for k, v in dict.items(self)}
        out = self._derive(data, count=self.count)
        out._slice_seq_lens_in_B = self._slice_seq_lens_in_B
        out.set_get_interceptor(self.get_interceptor)
        out.added_keys = self.added_keys
        out.deleted_keys = self.deleted_keys
        out.accessed_keys = self.accessed_keys
        return out

    def concat(self, other: SampleBatch) -> SampleBatch:
        """Return a new batch with ``other``'s rows after this batch's rows."""
        return concat_samples([self, other])

    @staticmethod
    def concat_samples(samples: Any) -> Any:
        """Removed: use the module function ``concat_samples``."""
        raise DeprecatedAPIError(
            "SampleBatch.concat_samples",
            "envrunners.policy.sample_batch.concat_samples",
        )

    def as_multi_agent(self, module_id: str | None = None) -> MultiAgentBatch:
        """Wrap this batch as a ``MultiAgentBatch`` under ``module_id`` (default policy id)."""
        return MultiAgentBatch({module_id or DEFAULT_POLICY_ID: self}, self.count)

    # ---------------------------------------------------------------- iteration

    def rows(self) -> Iterator[dict[str, Any]]:
        """Yield one dict per timestep; ``seq_lens`` is 1 in every row.

        Why: per-row access for builders and debugging (slow by nature; prefer columns).
        With ``seq_lens``, ``state_in_*`` values are those of the row's sequence.
        """
        seq_lens = dict.get(self, self.SEQ_LENS)
        seq_of_row = None
        if seq_lens is not None and not self.zero_padded:
            lens = ops.to_numpy(seq_lens).astype(np.int64)
            seq_of_row = np.repeat(np.arange(len(lens)), lens)
        items = list(dict.items(self))
        for i in range(self.count):
            row: dict[str, Any] = {}
            for key, value in items:
                if key == self.SEQ_LENS:
                    row[key] = 1
                    continue
                j = int(seq_of_row[i]) if seq_of_row is not None and ops.is_state_in(key) else i
                row[key] = tree.map_structure(operator.itemgetter(j), value)
            yield row

    # -------------------------------------------------------- slicing, splitting

    def _slice_rows(self, start: int, stop: int) -> SampleBatch:
        """Rows ``[start, stop)`` as views (no seq_lens handling)."""
        cut = partial(ops.slice_leaf, start=start, stop=stop)
        data = {k: tree.map_structure(cut, v) for k, v in dict.items(self)}
        return self._derive(data, count=max(stop - start, 0))

    def _slice(self, s: slice) -> SampleBatch:
        """``batch[a:b]``: rows as views; with ``seq_lens``, whole sequences only."""
        if s.step not in (None, 1):
            raise BatchArgumentError(f"SampleBatch slicing needs step 1, got step {s.step}")
        if self.SEQ_LENS not in self:
            start, stop, _ = s.indices(self.count)
            return self._slice_rows(start, max(start, stop))
        return self._derive(seq_ops.slice_whole_sequences(self, s))

    def slice(
        self,
        start: int,
        end: int,
        state_start: int | None = None,
        state_end: int | None = None,
    ) -> SampleBatch:
        """Return rows ``[start, end)`` without copying the data.

        Why: cut fragments and minibatches cheaply. With ``seq_lens``, the first
        and last sequence are trimmed so that ``sum(seq_lens) == end - start`` and
        the ``state_in_*`` rows of the touched sequences are kept; a negative
        ``start`` prepends ``-start`` zero rows to the first sequence. Give
        ``state_start``/``state_end`` to pick the sequences yourself.

        Raises:
            ValueError: for a zero-padded batch with seq_lens (use ``batch[a:b]``).
        """
        if self.SEQ_LENS not in self:
            return self[start:end]
        if self.zero_padded:
            raise BatchArgumentError(
                "SampleBatch.slice() works on unpadded rows, but this batch is zero-padded; "
                "use batch[a:b] to select whole sequences"
            )
        data, max_seq_len = seq_ops.slice_trimmed(self, start, end, state_start, state_end)
        count = max(min(end, self.count) - start, 0)
        return self._derive(data, count=count, max_seq_len=max_seq_len)

    def split_by_episode(self, key: str | None = None) -> list[SampleBatch]:
        """Split into one batch per episode, cutting where ``eps_id`` changes or after a done.

        Why: postprocessing (e.g. advantages) runs per episode.

        Args:
            key: ``"eps_id"``, ``"dones"`` (terminateds or truncateds), or None for
                ``eps_id`` if present, else dones. An id that recurs later starts a
                new slice (ids are not grouped).

        Raises:
            ValueError: for any other ``key`` (also an AssertionError, as in RLlib).
            KeyError: if the needed column is missing.
        """
        if key not in (None, self.EPS_ID, self.DONES):
            raise BatchArgumentError(
                f"split_by_episode: key must be None, 'eps_id' or 'dones', got {key!r}"
            )
        if self.count == 0 and (self.EPS_ID in self or self.TERMINATEDS in self):
            return []
        if key == self.EPS_ID or (key is None and self.EPS_ID in self):
            if self.EPS_ID not in self:
                raise ColumnKeyError(
                    "split_by_episode(key='eps_id'): this batch has no 'eps_id' column"
                )
            ids = ops.to_numpy(dict.__getitem__(self, self.EPS_ID))
            ids = ids.reshape(len(ids), -1)
            cuts = np.flatnonzero((ids[1:] != ids[:-1]).any(axis=1)) + 1
        else:
            if self.TERMINATEDS not in self:
                raise ColumnKeyError(
                    "split_by_episode: the batch has neither an 'eps_id' nor a 'terminateds' "
                    "column to find episode ends"
                    if key is None
                    else "split_by_episode(key='dones'): this batch has no 'terminateds' column"
                )
            done = ops.to_numpy(dict.__getitem__(self, self.TERMINATEDS)).astype(bool)
            if self.TRUNCATEDS in self:
                done = done | ops.to_numpy(dict.__getitem__(self, self.TRUNCATEDS)).astype(bool)
            cuts = np.flatnonzero(done[:-1]) + 1
        bounds = [0, *cuts.tolist(), self.count]
        slices = [self.slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        assert sum(s.count for s in slices) == self.count
        return slices

    def timeslices(
        self, size: int | None = None, num_slices: int | None = None, k: int | None = None
    ) -> list[SampleBatch]:
        """Cut the rows into consecutive slices of ``size`` rows, or into ``num_slices`` slices.

        With ``size``, the last slice is shorter if ``len % size != 0`` (RLlib hangs
        there). With ``num_slices``, slice i gets ``rows_left // slices_left`` rows,
        so 4 rows in 3 slices give lengths 1, 1, 2. ``k`` is the old name of ``size``.
        """
        if k is not None:
            warnings.warn(
                "timeslices(k=...) is deprecated; use timeslices(size=...)",
                DeprecationWarning,
                stacklevel=2,
            )
            if size is None:
                size = k
        if (size is None) == (num_slices is None):
            raise BatchArgumentError("timeslices: give exactly one of `size` or `num_slices`")
        if size is not None:
            if size <= 0:
                raise BatchArgumentError(f"timeslices: size must be >= 1, got {size}")
            return [self.slice(a, min(a + size, self.count)) for a in range(0, self.count, size)]
        if num_slices <= 0:
            raise BatchArgumentError(f"timeslices: num_slices must be >= 1, got {num_slices}")
        out, start, left = [], 0, self.count
        for i in range(num_slices):
            n = left // (num_slices - i)
            out.append(self.slice(start, start + n))
            start, left = start + n, left - n
        return out

    def enable_slicing_by_batch_id(self) -> None:
        """Make ``batch[a:b]`` select sequences ``a..b`` of B×T (one row per sequence) data."""
        self._slice_seq_lens_in_B = True

    def disable_slicing_by_batch_id(self) -> None:
        """Make ``batch[a:b]`` select timesteps again (the default)."""
        self._slice_seq_lens_in_B = False

    def shuffle(self) -> SampleBatch:
        """Shuffle the rows in place (all columns, ``infos`` included, by one permutation).

        Why: decorrelate SGD minibatches. Zero-padded sequence data is shuffled by
        whole sequences. Uses numpy's global RNG (seed it with ``np.random.seed``).

        Raises:
            ValueError: if the batch has ``seq_lens`` and is not zero-padded yet.
        """
        seq_lens = dict.get(self, self.SEQ_LENS)
        if seq_lens is not None and not self.zero_padded:
            raise BatchArgumentError(
                "SampleBatch.shuffle not possible when your data has `seq_lens` defined AND "
                "is not zero-padded yet!"
            )
        if seq_lens is None:
            for k, v in dict.items(self):
                ops.check_rows(k, v, self.count, "shuffle")
            perm = row_perm = np.random.permutation(self.count)
        else:
            width = self.max_seq_len
            perm = np.random.permutation(len(seq_lens))
            row_perm = (perm[:, None] * width + np.arange(width)).ravel()
        for k, v in list(dict.items(self)):
            index = perm if k == self.SEQ_LENS or ops.is_state_in(k) else row_perm
            shuffled = tree.map_structure(partial(ops.take_leaf, index=index, column=k), v)
            dict.__setitem__(self, k, shuffled)
        self.intercepted_values = {}
        return self

    # ------------------------------------------------- padding, devices, bytes

    def right_zero_pad(self, max_seq_len: int, exclude_states: bool = True) -> SampleBatch:
        """Pad every sequence with zeros to ``max_seq_len`` rows, in place.

        Why: recurrent models train on a dense [num_seqs, max_seq_len] layout.
        Sequence i starts at row ``i * max_seq_len``; object/str columns and lists
        are padded with None. ``count`` keeps the unpadded number of timesteps.

        Raises:
            ValueError: without ``seq_lens``, if already zero-padded, or if a
                sequence is longer than ``max_seq_len``.
        """
        if self.SEQ_LENS not in self:
            raise BatchArgumentError(
                "Cannot right-zero-pad SampleBatch if no `seq_lens` field present! "
                f"SampleBatch={self!r}"
            )
        if self.zero_padded:
            raise BatchArgumentError(
                "right_zero_pad: this batch is already zero-padded "
                f"(max_seq_len={self.max_seq_len})"
            )
        seq_ops.right_zero_pad_columns(self, max_seq_len, exclude_states)
        self.zero_padded = True
        self.max_seq_len = max_seq_len
        self.intercepted_values = {}
        return self

    def zero_pad(self, *args: Any, **kwargs: Any) -> None:
        """Removed: use ``right_zero_pad``."""
        raise DeprecatedAPIError("SampleBatch.zero_pad", "SampleBatch.right_zero_pad")

    def to_device(
        self,
        device: Any,
        framework: str = "torch",
        pin_memory: bool = False,
        use_stream: bool = False,
        stream: Any = None,
    ) -> SampleBatch:
        """Convert the numpy columns to torch tensors on ``device``, in place.

        Why: hand a sampled batch to a torch learner. float64 becomes float32;
        nested dicts/tuples are converted leaf by leaf; ``infos`` and object/str
        arrays stay as they are.

        Raises:
            NotImplementedError: for any framework other than ``"torch"``.
        """
        if framework != "torch":
            raise NotImplementedError(
                f"SampleBatch.to_device: framework={framework!r} is not supported; "
                "envrunners only supports 'torch'"
            )
        import torch

        target = torch.device(device)
        on_stream = use_stream and target.type == "cuda"
        ctx: Any = contextlib.nullcontext()
        if on_stream:
            stream = stream or torch.cuda.Stream(target)
            ctx = torch.cuda.stream(stream)
        convert = partial(ops.to_torch, device=target, pin_memory=pin_memory)
        with ctx:
            for k, v in list(dict.items(self)):
                if k != self.INFOS:
                    dict.__setitem__(self, k, tree.map_structure(convert, v))
        if on_stream:
            torch.cuda.current_stream(target).wait_stream(stream)
        self.intercepted_values = {}
        return self

    def size_bytes(self) -> int:
        """Return the data size: ``nbytes`` of arrays/tensors, ``sys.getsizeof`` of others."""
        total = 0
        for value in dict.values(self):
            for leaf in tree.flatten(value):
                if isinstance(leaf, np.ndarray):
                    total += leaf.nbytes
                elif ops.is_torch_tensor(leaf):
                    total += leaf.nelement() * leaf.element_size()
                else:
                    total += sys.getsizeof(leaf)
        return total

    # -------------------------------------------------------------- compression

    def compress(
        self, bulk: bool = False, columns: Iterable[str] = DEFAULT_COMPRESS_COLUMNS
    ) -> SampleBatch:
        """Pack the given columns in place (no pickle; see ``envrunners.utils.compression``).

        Why: shrink observation columns for transfer and replay. With ``bulk``
        each leaf becomes one packed string; otherwise each row is packed on its
        own (an object array of strings), so rows can still be selected.
        """
        for key in columns:
            if key in self:
                value = dict.__getitem__(self, key)
                dict.__setitem__(self, key, tree.map_structure(partial(ops.pack_leaf, bulk), value))
        self.intercepted_values = {}
        return self

    def decompress_if_needed(
        self, columns: Iterable[str] = DEFAULT_COMPRESS_COLUMNS
    ) -> SampleBatch:
        """Unpack packed leaves of the given columns in place; other leaves stay as they are."""
        for key in columns:
            if key in self:
                value = dict.__getitem__(self, key)
                dict.__setitem__(self, key, tree.map_structure(ops.unpack_leaf, value))
        self.intercepted_values = {}
        return self

    # -------------------------------------------------------------------- other

    def get_single_step_input_dict(
        self, view_requirements: Mapping[str, Any], index: str | int = "last"
    ) -> SampleBatch:
        """Build a 1-row input for the next forward pass (experimental).

        With ``index="last"``: ``obs`` comes from the last ``new_obs``,
        ``prev_actions``/``prev_rewards`` from the last ``actions``/``rewards`` and
        ``state_in_i`` from the last ``state_out_i``. With an int, that row's
        ``data_col`` values are used. Columns absent from the batch are skipped.
        """
        if index == "last":
            start, stop = -1, None
        else:
            start = int(index)
            stop = start + 1 if start != -1 else None
        cut = partial(ops.slice_leaf, start=start, stop=stop)
        data: dict[str, Any] = {}
        for view_col, req in view_requirements.items():
            source = getattr(req, "data_col", None) or view_col
            if index == "last":
                if source == self.OBS:
                    source = self.NEXT_OBS
                elif view_col == self.PREV_ACTIONS:
                    source = self.ACTIONS
                elif view_col == self.PREV_REWARDS:
                    source = self.REWARDS
                elif ops.is_state_in(view_col):
                    source = "state_out_" + view_col[len("state_in_") :]
            if source in self:
                data[view_col] = tree.map_structure(cut, dict.__getitem__(self, source))
        return SampleBatch(data, seq_lens=[1])

    def __repr__(self) -> str:
        seq_lens = dict.get(self, self.SEQ_LENS)
        if seq_lens is None:
            return f"SampleBatch({self.count}: {list(self.keys())})"
        keys = [k for k in self.keys() if k != self.SEQ_LENS]
        return f"SampleBatch({self.count} (seqs={len(seq_lens)}): {keys})"

    __str__ = __repr__


def attempt_count_timesteps(tensor_dict: Mapping[str, Any]) -> int:
    """Return the number of timesteps in a dict of columns.

    Why: a batch's ``count`` must be known without trusting any one column.
    Uses ``sum(seq_lens)`` if present; otherwise the length of the first leaf of
    the first column (other than ``infos`` and ``state_in_*``/``state_out_*``)
    that has a non-zero length; else 0.
    """
    is_dict = isinstance(tensor_dict, dict)  # read around SampleBatch's key tracking
    getter = dict.get if is_dict else type(tensor_dict).get
    seq_lens = getter(tensor_dict, SampleBatch.SEQ_LENS)
    if seq_lens is not None and ops.leaf_len(seq_lens):
        return int(ops.to_numpy(seq_lens).sum())
    items = dict.items(tensor_dict) if is_dict else tensor_dict.items()
    for key, value in items:
        if key in (SampleBatch.SEQ_LENS, SampleBatch.INFOS) or ops.is_state(key) or value is None:
            continue
        leaves = tree.flatten(value)
        n = ops.leaf_len(leaves[0]) if leaves else None
        if n:
            return n
    return 0


class MultiAgentBatch:
    """One ``SampleBatch`` per policy, plus the number of env steps they cover.

    Why: in multi-agent sampling several agents (and policies) act per env step,
    so env steps and agent steps differ: ``env_steps()`` is ``count``,
    ``agent_steps()`` the sum of the policy batches' lengths.

    Raises:
        TypeError: if a value of ``policy_batches`` is not a SampleBatch (also an
            AssertionError, as in RLlib).
    """

    def __init__(self, policy_batches: Mapping[str, SampleBatch], env_steps: int):
        for pid, batch in policy_batches.items():
            if not isinstance(batch, SampleBatch):
                raise BatchTypeError(
                    f"MultiAgentBatch: policy {pid!r} maps to a {type(batch).__name__}; "
                    "every value must be a SampleBatch"
                )
        self.policy_batches: dict[str, SampleBatch] = (
            policy_batches if isinstance(policy_batches, dict) else dict(policy_batches)
        )
        self.count = int(env_steps)

    def env_steps(self) -> int:
        """The number of env steps (there are >= 1 agent steps per env step)."""
        return self.count

    def __len__(self) -> int:
        return self.count

    def agent_steps(self) -> int:
        """The number of agent steps: the sum of all policy batches' lengths."""
        return sum(b.count for b in self.policy_batches.values())

    def __getitem__(self, policy_id: str) -> SampleBatch:
        try:
            return self.policy_batches[policy_id]
        except KeyError:
            held = sorted(map(str, self.policy_batches))
            hint = suggest(policy_id, self.policy_batches)
            raise UnknownPolicyError(
                f"MultiAgentBatch has no policy {policy_id!r}; it holds {held}.{hint}"
            ) from None

    def as_multi_agent(self) -> MultiAgentBatch:
        """Return self (already multi-agent)."""
        return self

    def copy(self) -> MultiAgentBatch:
        """Return a deep copy (every policy batch copied)."""
        return MultiAgentBatch({p: b.copy() for p, b in self.policy_batches.items()}, self.count)

    def to_device(self, device: Any, framework: str = "torch", **kwargs: Any) -> MultiAgentBatch:
        """Move every policy batch's columns to ``device`` (see ``SampleBatch.to_device``)."""
        for batch in self.policy_batches.values():
            batch.to_device(device, framework=framework, **kwargs)
        return self

    def size_bytes(self) -> int:
        """Return the summed ``size_bytes()`` of all policy batches."""
        return sum(b.size_bytes() for b in self.policy_batches.values())

    def compress(
        self, bulk: bool = False, columns: Iterable[str] = DEFAULT_COMPRESS_COLUMNS
    ) -> None:
        """Compress every policy batch in place (see ``SampleBatch.compress``)."""
        for batch in self.policy_batches.values():
            batch.compress(bulk=bulk, columns=columns)

    def decompress_if_needed(
        self, columns: Iterable[str] = DEFAULT_COMPRESS_COLUMNS
    ) -> MultiAgentBatch:
        """Decompress every policy batch in place (see ``SampleBatch.decompress_if_needed``)."""
        for batch in self.policy_batches.values():
            batch.decompress_if_needed(columns)
        return self

    def timeslices(self, k: int) -> list[MultiAgentBatch]:
        """Cut into batches of ``k`` env steps each (the last may be shorter).

        Why: sequence-based replay needs multi-agent data in env-step order.
        Rows of all policies are ordered by ``(eps_id, t, agent_index)``; rows with
        the same ``(eps_id, t)`` form one env step. Every output row is its own
        sequence (``seq_lens`` of ones) if the input had ``seq_lens``.

        Raises:
            KeyError: if a policy batch lacks ``eps_id``, ``t`` or ``agent_index``.
            ValueError: if ``k < 1`` or the batch has no rows.
        """
        if k < 1:
            raise BatchArgumentError(f"MultiAgentBatch.timeslices: k must be >= 1, got {k}")
        need = (SampleBatch.EPS_ID, SampleBatch.T, SampleBatch.AGENT_INDEX)
        pids = list(self.policy_batches)
        cols: list[list[np.ndarray]] = [[], [], [], [], []]
        for p, pid in enumerate(pids):
            batch = self.policy_batches[pid]
            missing = [c for c in need if c not in batch]
            if missing:
                raise ColumnKeyError(
                    f"MultiAgentBatch.timeslices needs the columns {list(need)} in every "
                    f"policy batch; policy {pid!r} lacks {missing}"
                )
            for i, c in enumerate(need):
                cols[i].append(ops.to_numpy(dict.__getitem__(batch, c))[: batch.count])
            cols[3].append(np.full(batch.count, p, dtype=np.int64))
            cols[4].append(np.arange(batch.count, dtype=np.int64))
        if not self.agent_steps():
            raise BatchArgumentError("MultiAgentBatch.timeslices: the batch has no rows")
        eps, t, agent, pidx, rows = (np.concatenate(c) for c in cols)
        order = np.lexsort((rows, pidx, agent, t, eps))  # the last key sorts first
        eps_s, t_s = eps[order], t[order]
        new_step = np.ones(len(order), dtype=bool)
        new_step[1:] = (eps_s[1:] != eps_s[:-1]) | (t_s[1:] != t_s[:-1])
        step_id = np.cumsum(new_step) - 1
        slice_id = step_id // k
        bounds = np.searchsorted(slice_id, np.arange(slice_id[-1] + 2))
        out = []
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            seg = order[a:b]
            batches = {}
            for p, pid in enumerate(pids):
                sel = rows[seg[pidx[seg] == p]]
                if len(sel):
                    batches[pid] = _rows_as_new_batch(self.policy_batches[pid], sel)
            out.append(MultiAgentBatch(batches, int(step_id[b - 1] - step_id[a] + 1)))
        return out

    @staticmethod
    def wrap_as_needed(
        policy_batches: Mapping[str, SampleBatch], env_steps: int
    ) -> SampleBatch | MultiAgentBatch:
        """Return the lone default-policy batch as a SampleBatch, else a MultiAgentBatch."""
        if len(policy_batches) == 1 and DEFAULT_POLICY_ID in policy_batches:
            return policy_batches[DEFAULT_POLICY_ID]
        return MultiAgentBatch(policy_batches, env_steps)

    @staticmethod
    def concat_samples(samples: Any) -> Any:
        """Removed: use the module function ``concat_samples``."""
        raise DeprecatedAPIError(
            "MultiAgentBatch.concat_samples",
            "envrunners.policy.sample_batch.concat_samples",
        )

    def __repr__(self) -> str:
        return f"MultiAgentBatch({self.policy_batches}, env_steps={self.count})"

    __str__ = __repr__


def _rows_as_new_batch(batch: SampleBatch, index: np.ndarray) -> SampleBatch:
    """Rows ``index`` of ``batch`` as a fresh batch; each row its own sequence if seq_lens exist."""
    data = seq_ops.gather_rows(batch, index)
    if SampleBatch.SEQ_LENS in batch:
        data[SampleBatch.SEQ_LENS] = np.ones(len(index), dtype=np.int32)
    return SampleBatch(data, _is_training=batch.is_training)


SampleBatchType = Union[SampleBatch, MultiAgentBatch]  # noqa: UP007 (a runtime alias)


def concat_samples(samples: Iterable[SampleBatchType]) -> SampleBatchType:
    """Concatenate batches row-wise (into a MultiAgentBatch if any input is one).

    Why: merge fragments from several runners or calls into one train batch.
    Empty batches are skipped. The result has the **first** batch's columns; a
    column missing from a later batch raises KeyError (extra ones are dropped).
    ``num_grad_updates`` becomes the count-weighted mean of the inputs that have it.

    Raises:
        ValueError: for inconsistent ``zero_padded``/``time_major``/``max_seq_len``
            settings or columns of a type that cannot be concatenated.
        TypeError: for inputs that are not SampleBatch or MultiAgentBatch.
    """
    samples = list(samples)
    if any(isinstance(s, MultiAgentBatch) for s in samples):
        return concat_samples_into_ma_batch(samples)
    batches = []
    for i, s in enumerate(samples):
        if not isinstance(s, SampleBatch):
            raise BatchTypeError(
                f"concat_samples: item {i} is a {type(s).__name__}; "
                "only SampleBatch and MultiAgentBatch can be concatenated"
            )
        if s.count > 0:
            batches.append(s)
    if not batches:
        return SampleBatch()
    first = batches[0]
    if any(b.zero_padded != first.zero_padded or b.time_major != first.time_major for b in batches):
        raise BatchArgumentError(
            "All SampleBatches' `zero_padded` and `time_major` settings must be consistent!"
        )
    lens = [b.max_seq_len for b in batches]
    max_seq_len = None
    if any(x is None for x in lens) and any(x is not None for x in lens):
        raise BatchArgumentError("Samples must consistently either provide or omit `max_seq_len`!")
    if lens[0] is not None:
        if first.zero_padded and len(set(lens)) > 1:
            raise BatchArgumentError(
                "concat_samples: zero-padded batches must share one `max_seq_len`, got "
                f"{sorted(set(lens))}"
            )
        max_seq_len = max(lens)
    axis = 1 if first.time_major else 0
    out: dict[str, Any] = {}
    for key in first.keys():
        values = []
        for i, b in enumerate(batches):
            if key not in b:
                raise ColumnKeyError(
                    f"concat_samples: column {key!r} is in the first batch but missing from "
                    f"batch {i}; every batch needs the first batch's columns"
                )
            values.append(dict.__getitem__(b, key))
        col_axis = 0 if key in (SampleBatch.SEQ_LENS, SampleBatch.INFOS) else axis
        try:
            out[key] = tree.map_structure(
                lambda *leaves, ax=col_axis: ops.concat_leaves(leaves, ax), *values
            )
        except ValueError as e:
            raise BatchArgumentError(f"concat_samples: column {key!r}: {e}") from None
    graded = [(b.count, b.num_grad_updates) for b in batches if b.num_grad_updates is not None]
    weight = sum(c for c, _ in graded)
    num_grad_updates = sum(c * g for c, g in graded) / weight if weight else 0.0
    return SampleBatch(
        out,
        _time_major=first.time_major,
        _zero_padded=first.zero_padded,
        _max_seq_len=max_seq_len,
        _is_training=first.is_training,
        _num_grad_updates=num_grad_updates,
    )


def concat_samples_into_ma_batch(samples: Iterable[SampleBatchType]) -> MultiAgentBatch:
    """Concatenate SampleBatches and MultiAgentBatches policy by policy into a MultiAgentBatch.

    A SampleBatch counts as the default policy's data; empty ones are skipped.
    ``env_steps`` of the result is the sum of the inputs' ``env_steps()``.

    Raises:
        ValueError: for an input that is neither a SampleBatch nor a MultiAgentBatch.
    """
    per_policy: dict[str, list[SampleBatch]] = {}
    env_steps = 0
    for s in samples:
        if isinstance(s, SampleBatch):
            if s.count <= 0:
                continue
            s = s.as_multi_agent()
        elif not isinstance(s, MultiAgentBatch):
            raise BatchArgumentError(
                "`concat_samples_into_ma_batch` can only concat SampleBatch|MultiAgentBatch "
                f"objects, not {type(s).__name__}!"
            )
        for pid, batch in s.policy_batches.items():
            per_policy.setdefault(pid, []).append(batch)
        env_steps += s.env_steps()
    return MultiAgentBatch(
        {pid: concat_samples(batches) for pid, batches in per_policy.items()}, env_steps
    )


def convert_ma_batch_to_sample_batch(batch: SampleBatchType) -> SampleBatch:
    """Return the SampleBatch inside a default-policy-only MultiAgentBatch (or the batch itself).

    Raises:
        ValueError: if the MultiAgentBatch holds any policy other than the default one.
    """
    if isinstance(batch, MultiAgentBatch):
        if set(batch.policy_batches) == {DEFAULT_POLICY_ID}:
            return batch.policy_batches[DEFAULT_POLICY_ID]
        raise BatchArgumentError(
            "RLlib tried to convert a multi agent-batch with data from more than one policy "
            f"to a single-agent batch; this batch holds policies {sorted(batch.policy_batches)}, "
            f"only a batch with just {DEFAULT_POLICY_ID!r} can be converted"
        )
    return batch
