"""``ConnectorV2``: RLlib 2.60's connector contract, applied to whole vector-step batches.

A connector is called with keywords only::

    connector(rl_module=..., batch=..., episodes=..., explore=..., shared_data=...,
              metrics=...)

and returns the batch (changed in place or a new dict). Here ``batch`` holds all
sub-envs at once (``{"obs": (N, ...)}`` on the env-to-module side,
``{"actions": (N, ...)}`` on the module-to-env side; stepping ready-first, the
sub-envs that were ready), so a piece costs a few numpy ops per vector step.
``episodes`` is what the runner can give cheaply during sampling (see
``envrunners.connectors.vector_episodes``), not RLlib's list of full episode
objects.

Output spaces follow RLlib: setting ``input_observation_space`` /
``input_action_space`` recomputes ``observation_space`` / ``action_space`` via
``recompute_output_observation_space`` / ``recompute_output_action_space``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import gymnasium as gym

__all__ = ["ConnectorV2"]


class ConnectorV2:
    """One transform of a batch, with optional state (RLlib's ``ConnectorV2``).

    Subclasses override ``__call__`` (declaring the keywords they use, plus
    ``**kwargs`` or not: a pipeline passes a piece only the keywords it declares
    when it has no ``**kwargs``), and ``recompute_output_observation_space`` /
    ``recompute_output_action_space`` when they change a space. Stateful pieces
    (a filter) override ``get_state``/``set_state``/``merge_states``.

    Args:
        input_observation_space: The observation space of the batches it receives.
        input_action_space: The action space of the batches it receives.
        **kwargs: Ignored (forward compatibility, as in RLlib).
    """

    #: Whether ``__call__`` reads ``episodes`` during sampling. The single-agent runner
    #: keeps its per-sub-env episode views up to date only when a piece of the
    #: env-to-module pipeline says True (user pieces do by default; stock pieces that
    #: only touch ``batch`` say False, so they add no per-step bookkeeping).
    reads_episodes: bool = True

    #: Whether a piece that reads ``episodes`` works on ready-first batches: only the
    #: sub-envs that were ready, in the order they came (``episodes.env_indices``, each
    #: view's ``env_index``), so any history it keeps per sub-env is indexed by those,
    #: not by batch row. A runner stepping ready-first refuses pieces that read
    #: episodes and do not say True (an envrunners key: RLlib never steps that way).
    supports_ready_first: bool = False

    def __init__(
        self,
        input_observation_space: gym.Space | None = None,
        input_action_space: gym.Space | None = None,
        **kwargs: Any,
    ):
        self._observation_space: gym.Space | None = None
        self._action_space: gym.Space | None = None
        self._input_observation_space: gym.Space | None = None
        self._input_action_space: gym.Space | None = None
        self.input_action_space = input_action_space
        self.input_observation_space = input_observation_space

    # -- spaces ----------------------------------------------------------------------
    def recompute_output_observation_space(
        self, input_observation_space: gym.Space | None, input_action_space: gym.Space | None
    ) -> gym.Space | None:
        """The observation space of the batches this piece returns (default: unchanged)."""
        return input_observation_space

    def recompute_output_action_space(
        self, input_observation_space: gym.Space | None, input_action_space: gym.Space | None
    ) -> gym.Space | None:
        """The action space of the batches this piece returns (default: unchanged)."""
        return input_action_space

    @property
    def observation_space(self) -> gym.Space | None:
        """The output observation space (None until an input space is known)."""
        return self._observation_space

    @property
    def action_space(self) -> gym.Space | None:
        """The output action space (None until an input space is known)."""
        return self._action_space

    @property
    def input_observation_space(self) -> gym.Space | None:
        """The input observation space; setting it recomputes ``observation_space``."""
        return self._input_observation_space

    @input_observation_space.setter
    def input_observation_space(self, value: gym.Space | None) -> None:
        self._input_observation_space = value
        if value is not None:
            self._observation_space = self.recompute_output_observation_space(
                value, self._input_action_space
            )

    @property
    def input_action_space(self) -> gym.Space | None:
        """The input action space; setting it recomputes ``action_space``."""
        return self._input_action_space

    @input_action_space.setter
    def input_action_space(self, value: gym.Space | None) -> None:
        self._input_action_space = value
        if value is not None:
            self._action_space = self.recompute_output_action_space(
                self._input_observation_space, value
            )

    @property
    def name(self) -> str:
        """The key of this piece's state inside a pipeline state (its class name)."""
        return type(self).__name__

    # -- the call --------------------------------------------------------------------
    def __call__(
        self,
        *,
        rl_module: Any = None,
        batch: dict[str, Any],
        episodes: Any = None,
        explore: bool | None = None,
        shared_data: dict | None = None,
        metrics: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Return the transformed ``batch`` (may change it in place). Default: unchanged."""
        return batch

    # -- state -----------------------------------------------------------------------
    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Plain-data state (numpy arrays and numbers); empty for stateless pieces."""
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore a state from ``get_state`` (or ``merge_states``)."""

    def reset_state(self) -> None:
        """Forget accumulated state (e.g. filter statistics)."""

    def merge_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """Merge the states of several copies of this piece (default: the first)."""
        return dict(states[0]) if states else {}

    def __str__(self, indentation: int = 0) -> str:
        return " " * indentation + type(self).__name__
