"""Getters and setters of ``SingleAgentEpisode`` (thin delegates to its buffers).

Why: the episode's public read/write API is large but mechanical; it lives here
so the episode module can focus on recording and chunking. Index semantics are
those of ``InfiniteLookbackBuffer.get``/``set``: ints, lists or slices relative
to the chunk start, negative from the end (or into the lookback with
``neg_index_as_lookback=True``), ``fill`` pads out-of-range positions.
"""

from __future__ import annotations

from typing import Any

from envrunners.env.utils.infinite_lookback_buffer import Indices, InfiniteLookbackBuffer

__all__ = ["EpisodeAccessMixin"]


class EpisodeAccessMixin:
    """Index-based read and write access to an episode's per-step data."""

    __slots__ = ()

    observations: InfiniteLookbackBuffer
    infos: InfiniteLookbackBuffer
    actions: InfiniteLookbackBuffer
    rewards: InfiniteLookbackBuffer
    extra_model_outputs: dict[str, InfiniteLookbackBuffer]

    # ----------------------------------------------------------------- getters
    def get_observations(
        self,
        indices: Indices = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any:
        """Return observations by index (all after the lookback if ``indices`` is None).

        Example: with observations ``[0, 1, 2, 3]`` (Discrete(4), no lookback),
        ``get_observations(-1) == 3``, ``get_observations(slice(-6, -2), fill=-9)
        == [-9, -9, 0, 1]`` and ``get_observations(2, one_hot_discrete=True) ==
        [0, 0, 1, 0]``.
        """
        return self.observations.get(
            indices,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            one_hot_discrete=one_hot_discrete,
        )

    def get_infos(
        self, indices: Indices = None, *, neg_index_as_lookback: bool = False, fill: Any = None
    ) -> Any:
        """Return infos by index (aligned with observations)."""
        return self.infos.get(indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill)

    def get_actions(
        self,
        indices: Indices = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
    ) -> Any:
        """Return actions by index (``actions[i]`` was taken after ``observations[i]``)."""
        return self.actions.get(
            indices,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            one_hot_discrete=one_hot_discrete,
        )

    def get_rewards(
        self, indices: Indices = None, *, neg_index_as_lookback: bool = False, fill: Any = None
    ) -> Any:
        """Return rewards by index (``rewards[i]`` followed ``actions[i]``)."""
        return self.rewards.get(indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill)

    def get_extra_model_outputs(
        self,
        key: str,
        indices: Indices = None,
        *,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
    ) -> Any:
        """Return the extra model output ``key`` by index (aligned with actions).

        Raises:
            KeyError: If the episode has no such extra output.
        """
        return self._extra_buffer(key).get(
            indices, neg_index_as_lookback=neg_index_as_lookback, fill=fill
        )

    def _extra_buffer(self, key: str) -> InfiniteLookbackBuffer:
        """Return the buffer of extra output ``key`` or raise a KeyError naming the known keys."""
        try:
            return self.extra_model_outputs[key]
        except KeyError:
            known = sorted(map(str, self.extra_model_outputs))
            raise KeyError(
                f"This episode has no extra model output {key!r}; it has {known}."
            ) from None

    # ----------------------------------------------------------------- setters
    def set_observations(
        self, *, new_data: Any, at_indices: Indices = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Overwrite observations at ``at_indices`` (all after the lookback if None).

        Raises:
            IndexError: Out-of-range positions or ``new_data`` of the wrong size.
        """
        self.observations.set(
            new_data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
        )

    def set_infos(
        self, *, new_data: Any, at_indices: Indices = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Overwrite infos at ``at_indices``; see ``set_observations``."""
        self.infos.set(new_data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback)

    def set_actions(
        self, *, new_data: Any, at_indices: Indices = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Overwrite actions at ``at_indices``; see ``set_observations``."""
        self.actions.set(
            new_data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
        )

    def set_rewards(
        self, *, new_data: Any, at_indices: Indices = None, neg_index_as_lookback: bool = False
    ) -> None:
        """Overwrite rewards at ``at_indices``; see ``set_observations``."""
        self.rewards.set(
            new_data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
        )

    def set_extra_model_outputs(
        self,
        *,
        key: str,
        new_data: Any,
        at_indices: Indices = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Overwrite extra model output ``key`` at ``at_indices``; see ``set_observations``.

        Raises:
            KeyError: If the episode has no such extra output.
        """
        self._extra_buffer(key).set(
            new_data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
        )
