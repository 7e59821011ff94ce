"""``OfflinePreLearner`` (``ray.rllib.offline.offline_prelearner``): raw Parquet rows -> steps.

Why: Ray Data hands ``OfflineData``'s mapping step one block of raw rows at a time:
msgpack episode states (``input_read_episodes=True``) or step rows, maybe written by
RLlib. This callable decodes a block into episode chunks, safely (no pickle unless
``allow_pickle``, schema checked), and returns them as one Arrow table of steps in
RLlib's row layout (``eps_id``, ``obs``, ``actions``, ``rewards``, ``new_obs``,
``terminateds``, ``truncateds``, extra outputs), ready for ``iter_batches``.

Difference from RLlib: there is no learner connector pipeline here (learners are
outside envrunners), so the output is steps, not a learner's train batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envrunners.errors import OfflineSchemaError
from envrunners.offline._parquet import (
    EPISODE_COLUMN,
    check_rows_schema,
    columns_from_table,
    episodes_from_columns,
    episodes_from_table,
    episodes_to_rows_table,
    rows_table_from_episode_table,
)

__all__ = ["OfflinePreLearner"]


def _as_table(batch: Any) -> Any:
    """A ``pyarrow.Table`` from a Ray Data batch (already a table, or a dict of numpy)."""
    import pyarrow as pa

    if isinstance(batch, pa.Table):
        return batch
    from envrunners.offline._parquet import tensor_column

    cols = {}
    for name, value in batch.items():
        arr = np.asarray(value)
        if arr.dtype.kind == "O":
            cols[name] = pa.array(list(arr))
        else:
            cols[name] = tensor_column(arr)[0]
    return pa.table(cols)


class OfflinePreLearner:
    """Map one Ray Data batch of raw offline rows to a table of steps (``__call__``).

    Args:
        config: The ``AlgorithmConfig``: ``input_read_episodes`` picks the layout;
            ``input_config["allow_pickle"]`` allows RLlib's pickled columns.
        spaces: Unused (RLlib builds its module from them); kept for the signature.
        module_spec: Unused, as ``spaces``.
        module_state: Unused, as ``spaces``.
        input_read_episodes: Overrides the config's value (None: use the config).
        allow_pickle: Overrides the config's ``input_config["allow_pickle"]``.
    """

    def __init__(
        self,
        config: Any = None,
        spaces: Any = None,
        module_spec: Any = None,
        module_state: Any = None,
        *,
        input_read_episodes: bool | None = None,
        allow_pickle: bool | None = None,
        **kwargs: Any,
    ) -> None:
        self.config = config
        if input_read_episodes is None:
            input_read_episodes = getattr(config, "input_read_episodes", False)
        self.input_read_episodes = bool(input_read_episodes)
        if allow_pickle is None:
            allow_pickle = (getattr(config, "input_config", None) or {}).get("allow_pickle")
        self.allow_pickle = bool(allow_pickle)

    def map_to_episodes(self, batch: Any) -> list[Any]:
        """Decode one batch of raw rows into numpy'd ``SingleAgentEpisode`` chunks.

        Raises:
            OfflineSchemaError: if the rows do not have the configured layout.
            PickleNotAllowedError: for pickled values without ``allow_pickle``.
        """
        table = _as_table(batch)
        if self.input_read_episodes:
            return episodes_from_table(table, "ray.data batch", allow_pickle=self.allow_pickle)
        if EPISODE_COLUMN in table.schema.names:
            raise OfflineSchemaError(
                "holds episodes; set config.offline_data(input_read_episodes=True)",
                path="ray.data batch",
                column=EPISODE_COLUMN,
            )
        check_rows_schema(table.schema, "ray.data batch")
        cols = columns_from_table(table, "ray.data batch", allow_pickle=self.allow_pickle)
        return episodes_from_columns(cols, "ray.data batch")

    def __call__(self, batch: Any) -> Any:
        """Return the steps of ``batch`` as a ``pyarrow.Table`` in RLlib's row layout.

        Episode rows are decoded straight to step columns (no episode objects).
        """
        if self.input_read_episodes:
            table = _as_table(batch)
            return rows_table_from_episode_table(
                table, "ray.data batch", allow_pickle=self.allow_pickle
            )
        return episodes_to_rows_table(self.map_to_episodes(batch))
