"""``MultiAgentBatch`` and the batch-combining functions (``concat_samples`` & co).

Why: multi-agent sampling yields one ``SampleBatch`` per policy; these combine,
wrap and unwrap them. ``MultiAgentBatch.timeslices`` orders all policies' rows by
``(eps_id, t, agent_index)`` with one ``np.lexsort``, never via per-row dicts.

Import the public names from ``envrunners.policy.sample_batch``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
from envrunners.policy._sample_batch import DEFAULT_COMPRESS_COLUMNS, SampleBatch
from envrunners.utils import tree

__all__ = [
    "MultiAgentBatch",
    "SampleBatchType",
    "concat_samples",
    "concat_samples_into_ma_batch",
    "convert_ma_batch_to_sample_batch",
]


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
