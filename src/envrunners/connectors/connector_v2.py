"""Connector base class and pipeline: small steps that transform whole batches.

A connector takes the batch of all sub-envs at once (``{"obs": (N, ...)}`` on
the env-to-module side, ``{"actions": (N, ...)}`` on the module-to-env side) and
returns it transformed, so a pipeline costs a few numpy ops per vector step.
Stateful steps (an observation filter) expose ``get_state``/``set_state`` and a
``merge_states`` that an ``EnvRunnerGroup`` uses to merge runners' statistics
and broadcast the result.

Unlike RLlib's ``ConnectorV2``, steps never walk the episode objects: the
sampler builds episodes only at the end of ``sample()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import gymnasium as gym

__all__ = ["ConnectorPipelineV2", "ConnectorV2"]


class ConnectorV2:
    """One batch transform with optional state.

    Args:
        input_observation_space: The observation space of the batches it receives.
        input_action_space: The action space of the batches it receives.
    """

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        **kwargs: Any,
    ):
        self.input_observation_space = input_observation_space
        self.input_action_space = input_action_space

    @property
    def name(self) -> str:
        """The key of this step's state inside a pipeline state."""
        return type(self).__name__

    @property
    def observation_space(self) -> gym.Space | None:
        """The observation space of the batches it returns (default: unchanged)."""
        return self.recompute_output_observation_space(
            self.input_observation_space, self.input_action_space
        )

    @property
    def action_space(self) -> gym.Space | None:
        """The action space of the batches it returns (default: unchanged)."""
        return self.recompute_output_action_space(
            self.input_observation_space, self.input_action_space
        )

    def recompute_output_observation_space(
        self, input_observation_space: gym.Space | None, input_action_space: gym.Space | None
    ) -> gym.Space | None:
        """Override when the step changes the observation space."""
        return input_observation_space

    def recompute_output_action_space(
        self, input_observation_space: gym.Space | None, input_action_space: gym.Space | None
    ) -> gym.Space | None:
        """Override when the step changes the action space."""
        return input_action_space

    def __call__(self, *, batch: dict[str, Any], explore: bool | None = None, **kwargs: Any):
        """Return the transformed ``batch`` (may modify it in place)."""
        return batch

    def get_state(self) -> dict[str, Any]:
        """Plain-data state (numpy arrays and numbers); empty for stateless steps."""
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a state from ``get_state``."""

    def reset_state(self) -> None:
        """Forget accumulated state (e.g. filter statistics)."""

    @staticmethod
    def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Merge the states of several copies of this step (default: the first)."""
        return dict(states[0]) if states else {}


class ConnectorPipelineV2(ConnectorV2):
    """Runs its connectors in order; its state is ``{step name: step state}``."""

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        connectors: Iterable[ConnectorV2] | None = None,
        **kwargs: Any,
    ):
        super().__init__(input_observation_space, input_action_space)
        self.connectors: list[ConnectorV2] = list(connectors or [])
        self._rewire()

    def _rewire(self) -> None:
        obs, act = self.input_observation_space, self.input_action_space
        for conn in self.connectors:
            conn.input_observation_space, conn.input_action_space = obs, act
            obs, act = conn.observation_space, conn.action_space
        self._out = (obs, act)

    @property
    def observation_space(self) -> gym.Space | None:
        """The observation space after the last step."""
        return self._out[0]

    @property
    def action_space(self) -> gym.Space | None:
        """The action space after the last step."""
        return self._out[1]

    def __len__(self) -> int:
        return len(self.connectors)

    def __call__(self, *, batch: dict[str, Any], explore: bool | None = None, **kwargs: Any):
        """Run every step on ``batch`` in order."""
        for conn in self.connectors:
            batch = conn(batch=batch, explore=explore, **kwargs)
        return batch

    def append(self, connector: ConnectorV2) -> None:
        """Add a step at the end."""
        self.connectors.append(connector)
        self._rewire()

    def prepend(self, connector: ConnectorV2) -> None:
        """Add a step at the front."""
        self.connectors.insert(0, connector)
        self._rewire()

    def remove(self, name_or_class: str | type) -> None:
        """Remove every step with this name or class."""
        self.connectors = [
            c for c in self.connectors if not (c.name == name_or_class or type(c) is name_or_class)
        ]
        self._rewire()

    def __getitem__(self, key: str | int | type) -> ConnectorV2:
        if isinstance(key, int):
            return self.connectors[key]
        for conn in self.connectors:
            if conn.name == key or type(conn) is key:
                return conn
        raise KeyError(f"no connector {key!r} in pipeline {[c.name for c in self.connectors]}")

    def get_state(self) -> dict[str, Any]:
        """``{step name: step state}`` for every stateful step."""
        return {c.name: s for c in self.connectors if (s := c.get_state())}

    def set_state(self, state: dict[str, Any]) -> None:
        """Give each step its part of ``state`` (unknown names are ignored)."""
        for conn in self.connectors:
            if conn.name in state:
                conn.set_state(state[conn.name])

    def reset_state(self) -> None:
        """Reset every step."""
        for conn in self.connectors:
            conn.reset_state()

    def merge_states(self, states: Sequence[dict[str, Any]]) -> dict[str, Any]:  # type: ignore[override]
        """Merge pipeline states step by step with each step's own ``merge_states``."""
        merged: dict[str, Any] = {}
        for conn in self.connectors:
            parts = [s[conn.name] for s in states if conn.name in s]
            if parts:
                merged[conn.name] = conn.merge_states(parts)
        return merged

    def __repr__(self) -> str:
        return f"ConnectorPipelineV2({[c.name for c in self.connectors]})"
