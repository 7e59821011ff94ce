"""``OfflineData`` (``ray.rllib.offline.offline_data``): stream offline Parquet through Ray Data.

Why: offline datasets can be far larger than memory and are read by several
consumers at once (one per learner). As in RLlib, ``ray.data.read_parquet`` reads the
files lazily, an :class:`~envrunners.offline.offline_prelearner.OfflinePreLearner`
maps each block of raw rows (episodes or steps) to steps, and ``sample()`` hands out
batches or, with ``num_shards > 1``, one streaming iterator per consumer
(``Dataset.streaming_split``). Nothing is materialized unless
``materialize_mapped_data``-style calls are made by the user; memory stays bounded.

Read plan: the read is cut into about four tasks per cluster CPU (Ray Data would pack
up to 128 MiB into one task), and the default, stateless pre-learner runs inside the
read tasks (fused: same resources, whole blocks), decoding episode rows straight to
Arrow step columns; the driver only slices batches.

Shards are split as RLlib splits them (``streaming_split(n, equal=True)``): each
consumer gets the same number of rows and no row twice; Ray may drop rows at the
end to even the shards out.
``sample(..., equal=False)`` keeps every row but lets Ray hand a consumer that asks
first all of a small dataset. Batches are ``MultiAgentBatch`` es of steps (no learner
connector runs here).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from envrunners.errors import ConfigError
from envrunners.offline._parquet import columns_from_table, is_array_tree
from envrunners.offline.offline_prelearner import OfflinePreLearner
from envrunners.policy.sample_batch import MultiAgentBatch, SampleBatch

__all__ = ["OfflineData"]


def _apply(batch: Any, prelearner: OfflinePreLearner) -> Any:
    """Ray Data task: run the (stateless) pre-learner on one block."""
    return prelearner(batch)


def _read_parquet_in_blocks(reader: Any, path: Any, kwargs: dict[str, Any]) -> Any:
    """``ray.data.read_parquet`` with read tasks small enough for every CPU to get some.

    Ray Data packs files into read tasks of up to 128 MiB uncompressed (the
    ``RAY_DATA_PARQUET_BIN_PACKING_BYTES`` it reads when the read is planned; it
    ignores ``override_num_blocks``): a dataset of a few hundred MB would be one or
    two tasks, decoded by one or two CPUs, and split unevenly between consumers. For
    this read only, the bins and the blocks are capped at the data's size (from the
    Parquet footers) over ``override_num_blocks`` (default: four per cluster CPU),
    unless the user set that variable.
    """
    import pyarrow.parquet as pq
    import ray
    from ray.data import DataContext

    from envrunners.offline.parquet_reader import parquet_files

    num_blocks = kwargs.get("override_num_blocks") or 4 * max(
        1, int(ray.cluster_resources().get("CPU", 1))
    )
    metas = [pq.read_metadata(f) for f in parquet_files(path)]
    nbytes = sum(m.row_group(i).total_byte_size for m in metas for i in range(m.num_row_groups))
    ctx = DataContext.get_current()
    old_block = ctx.target_max_block_size
    cap = max(ctx.target_min_block_size or 1, nbytes // max(1, num_blocks) + 1)
    cap = min(old_block, cap) if old_block else cap
    env = "RAY_DATA_PARQUET_BIN_PACKING_BYTES"
    old_env = os.environ.get(env)
    ctx.target_max_block_size = cap
    if old_env is None:
        os.environ[env] = str(cap)
    try:
        return reader(path, **kwargs)
    finally:
        ctx.target_max_block_size = old_block
        if old_env is None:
            os.environ.pop(env, None)


class OfflineData:
    """Read ``config.input_`` with Ray Data and sample step batches from it.

    Args:
        config: An ``AlgorithmConfig`` with ``input_`` (Parquet files or directories),
            ``input_read_method`` (``"read_parquet"``), ``input_read_method_kwargs``,
            ``input_read_episodes``, ``input_read_batch_size``, ``map_batches_kwargs``,
            ``iter_batches_kwargs`` and ``input_config["allow_pickle"]``.

    Raises:
        ConfigError: if ``input_`` is not a path or list of paths, or the read method
            is not a ``ray.data`` reader.
    """

    def __init__(self, config: Any):
        import ray.data

        self.config = config
        inputs = config.input_
        if isinstance(inputs, list | tuple) and all(isinstance(p, str | Path) for p in inputs):
            self.path: Any = [os.fspath(p) for p in inputs]
        elif isinstance(inputs, str | Path) and inputs != "sampler":
            self.path = os.fspath(inputs)
        else:
            raise ConfigError(
                f"OfflineData needs config.offline_data(input_=<Parquet path or list of "
                f"paths>), got input_={inputs!r}"
            )
        self.data_read_method = getattr(config, "input_read_method", "read_parquet")
        reader = getattr(ray.data, str(self.data_read_method), None)
        if not str(self.data_read_method).startswith("read_") or reader is None:
            raise ConfigError(
                f"input_read_method={self.data_read_method!r} is not a ray.data reader "
                "(use 'read_parquet')"
            )
        self.data_read_method_kwargs = dict(getattr(config, "input_read_method_kwargs", {}) or {})
        self.data_read_batch_size = getattr(config, "input_read_batch_size", None)
        if self.data_read_method == "read_parquet":
            self.data = _read_parquet_in_blocks(reader, self.path, self.data_read_method_kwargs)
        else:
            self.data = reader(self.path, **self.data_read_method_kwargs)
        self.data_is_mapped = False
        self.batch_iterators: Any = None
        self.prelearner_class = OfflinePreLearner
        self.user_map_batches_kwargs = dict(getattr(config, "map_batches_kwargs", {}) or {})
        self.map_batches_kwargs = self.default_map_batches_kwargs | self.user_map_batches_kwargs
        self.iter_batches_kwargs = self.default_iter_batches_kwargs | dict(
            getattr(config, "iter_batches_kwargs", {}) or {}
        )

    @property
    def default_map_batches_kwargs(self) -> dict[str, Any]:
        """RLlib's defaults (two pre-learners at a time, or one per learner; zero-copy blocks).

        Each asks for half a CPU (RLlib: one), so that on a 2-CPU Ray the read tasks
        still get a CPU beside two pre-learner actors instead of waiting forever.
        """
        return {
            "concurrency": max(2, int(getattr(self.config, "num_learners", 0) or 0)),
            "num_cpus": 0.5,
            "zero_copy_batch": True,
        }

    @property
    def default_iter_batches_kwargs(self) -> dict[str, Any]:
        """RLlib's default: prefetch two batches."""
        return {"prefetch_batches": 2}

    def _map(self, num_samples: int) -> None:
        kwargs = dict(self.map_batches_kwargs)
        if self.prelearner_class is OfflinePreLearner:
            # Stateless: map with tasks (no actor start-up), each carrying its small
            # pre-learner (flags only, not the config). Without RLlib's actor defaults
            # (only what the user set) the tasks ask for what the read tasks ask for,
            # so Ray fuses them: each read task decodes its own block, no raw bytes
            # pass through the object store. Whole blocks at a time (unless
            # input_read_batch_size is set): a row count would stop the fusion, and
            # the batches consumers get are cut by iter_batches anyway.
            kwargs = dict(self.user_map_batches_kwargs)
            kwargs.pop("zero_copy_batch", None)
            prelearner = OfflinePreLearner(
                input_read_episodes=bool(getattr(self.config, "input_read_episodes", False)),
                allow_pickle=bool((getattr(self.config, "input_config", None) or {}).get(
                    "allow_pickle", False)),
            )  # fmt: skip
            self.data = self.data.map_batches(
                _apply, fn_kwargs={"prelearner": prelearner},
                batch_size=self.data_read_batch_size, batch_format="pyarrow", **kwargs,
            )  # fmt: skip
        else:  # a user's pre-learner class may hold state: one per actor, as in RLlib
            self.data = self.data.map_batches(
                self.prelearner_class, fn_constructor_kwargs={"config": self.config},
                batch_size=self.data_read_batch_size or num_samples, batch_format="pyarrow",
                **kwargs,
            )  # fmt: skip
        self.data_is_mapped = True

    def sample(
        self,
        num_samples: int,
        return_iterator: bool = False,
        num_shards: int = 1,
        module_state: Any = None,
        *,
        equal: bool = True,
    ) -> Any:
        """Return the next batch of about ``num_samples`` steps, or streaming iterators.

        Args:
            num_samples: Rows per read block (and steps per returned batch).
            return_iterator: Return ``DataIterator`` (s) instead of one batch.
            num_shards: With more than 1, return one iterator per consumer
                (``streaming_split``); the consumers must read concurrently.
            module_state: Unused (RLlib passes its module's weights to the pre-learner).
            equal: Give every shard the same number of rows (RLlib's split; Ray may
                drop rows at the end to even them out).

        Returns:
            A ``MultiAgentBatch`` (``default_policy``), or a list of ``DataIterator``.
        """
        if not self.data_is_mapped:
            self._map(num_samples)
        if num_shards > 1:
            return self.data.streaming_split(num_shards, equal=equal)
        if return_iterator:
            return [self.data.iterator()]
        if self.batch_iterators is None:
            self.batch_iterators = iter(
                self.data.iter_batches(
                    batch_size=num_samples, batch_format="pyarrow", **self.iter_batches_kwargs
                )
            )
        try:
            batch = next(self.batch_iterators)
        except StopIteration:  # start the next pass over the data, as RLlib does
            self.batch_iterators = None
            return self.sample(num_samples, return_iterator, num_shards, module_state)
        steps = _step_batch(batch)
        return MultiAgentBatch({"default_policy": steps}, env_steps=steps.count)


def _step_batch(table: Any) -> SampleBatch:
    """The pre-learner's rows as a ``SampleBatch``: number columns (nested ones, such as
    Dict observations, as nested arrays) and ``eps_id``; other object columns are left out."""
    cols = columns_from_table(table, "ray.data batch")
    return SampleBatch(
        {k: v for k, v in cols.items() if k == "eps_id" or is_array_tree(v, numbers=True)}
    )
