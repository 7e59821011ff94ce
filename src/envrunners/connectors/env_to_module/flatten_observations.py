"""``FlattenObservations`` (env-to-module): Dict/Tuple/Discrete/MultiDiscrete -> one float vector.

Flattens like RLlib: leaves in the space's order (``Dict`` keys sorted, as gymnasium
stores them; ``Tuple`` in order), ``Box``/``MultiBinary`` flattened to float32,
``Discrete`` one-hot, ``MultiDiscrete`` one one-hot per component, concatenated.
The output space is ``Box(-inf, inf, (width,), float32)``. Works on the whole
``(N, ...)`` batch at once.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.connectors.connector_v2 import ConnectorV2
from envrunners.errors import ConfigError

__all__ = ["FlattenObservations"]


def _leaves(space: gym.Space, value: Any = None) -> list[tuple[gym.Space, Any]]:
    """``(leaf space, leaf batch)`` pairs in flattening order (``value`` may be None)."""
    if isinstance(space, gym.spaces.Dict):
        return [
            leaf
            for k, s in space.spaces.items()
            for leaf in _leaves(s, None if value is None else value[k])
        ]
    if isinstance(space, gym.spaces.Tuple):
        return [
            leaf
            for i, s in enumerate(space.spaces)
            for leaf in _leaves(s, None if value is None else value[i])
        ]
    return [(space, value)]


def _width(space: gym.Space) -> int:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    if isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary)):
        return int(np.prod(space.shape)) if space.shape else 1
    raise ConfigError(
        f"FlattenObservations cannot flatten the space {space!r}: supported leaves are Box, "
        "MultiBinary, Discrete and MultiDiscrete (inside Dict/Tuple spaces)."
    )


def _flatten_leaf(space: gym.Space, x: Any, rows: int) -> np.ndarray:
    x = np.asarray(x)
    if isinstance(space, gym.spaces.Discrete):
        out = np.zeros((rows, int(space.n)), np.float32)
        out[np.arange(rows), x.reshape(rows).astype(np.int64) - int(space.start)] = 1.0
        return out
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = space.nvec.reshape(-1)
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]]) - space.start.reshape(-1)
        index = x.reshape(rows, -1).astype(np.int64) + offsets
        out = np.zeros((rows, int(nvec.sum())), np.float32)
        np.put_along_axis(out, index, 1.0, axis=1)
        return out
    return x.reshape(rows, -1).astype(np.float32, copy=False)


def flatten_batch(space: gym.Space, batch: Any) -> np.ndarray:
    """A batch of observations of ``space`` (leading axis N) as ``(N, width)`` float32."""
    leaves = _leaves(space, batch)
    rows = len(np.asarray(leaves[0][1]))
    parts = [_flatten_leaf(s, x, rows) for s, x in leaves]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


class FlattenObservations(ConnectorV2):
    """Flattens ``batch["obs"]`` into one float32 vector per row.

    Args:
        input_observation_space: The observation space (may be set later by the
            pipeline). With ``multi_agent=True``, a ``Dict`` from agent ids to each
            agent's space, and ``batch["obs"]`` a dict from agent id to that agent's batch.
        input_action_space: The action space (unused).
        multi_agent: The observations are keyed by agent id at the top level.
        agent_ids: With ``multi_agent``, flatten only these agents' observations.
        keys_to_remove: Top-level ``Dict`` keys (per agent with ``multi_agent``) to drop
            before flattening.
    """

    reads_episodes = False

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        *,
        multi_agent: bool = False,
        agent_ids: Collection[Any] | None = None,
        keys_to_remove: list[str] | None = None,
        as_learner_connector: bool = False,
        **kwargs: Any,
    ):
        self._multi_agent = multi_agent
        self._agent_ids = None if agent_ids is None else set(agent_ids)
        self._keys_to_remove = list(keys_to_remove or [])
        self._kept: dict[Any, gym.Space] = {}  # per agent (None single-agent): space to flatten
        super().__init__(input_observation_space, input_action_space, **kwargs)

    def _without_removed(self, space: gym.Space) -> gym.Space:
        if not self._keys_to_remove:
            return space
        if not isinstance(space, gym.spaces.Dict):
            raise ConfigError(
                f"FlattenObservations(keys_to_remove=...) needs a Dict observation space, "
                f"got {space!r}."
            )
        return gym.spaces.Dict(
            {k: s for k, s in space.spaces.items() if k not in self._keys_to_remove}
        )

    def _flat_space(self, space: gym.Space) -> gym.spaces.Box:
        width = sum(_width(s) for s, _ in _leaves(space))
        return gym.spaces.Box(float("-inf"), float("inf"), (width,), np.float32)

    def recompute_output_observation_space(self, input_observation_space, input_action_space):
        """``Box(-inf, inf, (width,), float32)`` (per flattened agent with ``multi_agent``)."""
        if input_observation_space is None:
            return None
        if not self._multi_agent:
            kept = self._without_removed(input_observation_space)
            self._kept = {None: kept}
            return self._flat_space(kept)
        if not isinstance(input_observation_space, gym.spaces.Dict):
            raise ConfigError(
                "FlattenObservations(multi_agent=True) needs a Dict observation space from "
                f"agent id to each agent's space, got {input_observation_space!r}."
            )
        spaces, self._kept = {}, {}
        for agent_id, space in input_observation_space.spaces.items():
            if self._agent_ids is not None and agent_id not in self._agent_ids:
                spaces[agent_id] = space
                continue
            self._kept[agent_id] = self._without_removed(space)
            spaces[agent_id] = self._flat_space(self._kept[agent_id])
        return gym.spaces.Dict(spaces)

    def _flatten(self, space: gym.Space, obs: Any) -> np.ndarray:
        if self._keys_to_remove:
            obs = {k: v for k, v in obs.items() if k not in self._keys_to_remove}
        return flatten_batch(space, obs)

    def __call__(self, *, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Replace ``batch["obs"]`` by its flattened form (whole batch, one pass)."""
        if not self._kept:
            raise ConfigError(
                "FlattenObservations has no input_observation_space: construct it with the "
                "space or add it to a pipeline that knows its input space."
            )
        obs = batch["obs"]
        if not self._multi_agent:
            batch["obs"] = self._flatten(self._kept[None], obs)
            return batch
        batch["obs"] = {
            aid: self._flatten(self._kept[aid], o) if aid in self._kept else o
            for aid, o in obs.items()
        }
        return batch
