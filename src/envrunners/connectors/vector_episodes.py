"""What ``episodes`` is when a runner calls its env-to-module pipeline during sampling.

RLlib hands connectors the list of full ``SingleAgentEpisode`` objects of all
sub-envs. Our sampler builds episodes only at the end of ``sample()``, so during
sampling the single-agent runner passes a ``VectorEpisodes``: a sequence with one
``SubEnvEpisodeView`` per sub-env plus whole-batch arrays (``starts``,
``lengths``, ``dones``, ``actions``, ``rewards``) that the stock pieces read
without a per-sub-env loop. A view answers the common reads of the newest step
only: ``len()``, ``get_observations(-1)``, ``get_actions(-1)``,
``get_rewards(-1)``, ``is_done``, ``env_index``. Pieces that need more history
(frame stacking, previous actions) keep it themselves from these arrays.

``VectorEpisodeTracker`` keeps those arrays up to date from the runner's acting,
env-step and observation hooks (a few numpy ops per vector step, and only for a
pipeline with a piece that reads ``episodes``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

__all__ = ["SubEnvEpisodeView", "VectorEpisodeTracker", "VectorEpisodes", "row_of"]


def row_of(value: Any, i: int) -> Any:
    """Row ``i`` of a batch (each leaf's row for a dict / tuple batch)."""
    if isinstance(value, dict):
        return {k: row_of(v, i) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(row_of(v, i) for v in value)
    return value[i]


def _newest_only(indices: Any, what: str) -> None:
    if indices not in (-1, None):
        raise IndexError(
            f"get_{what}({indices!r}): during sampling a connector sees only the newest "
            f"{what[:-1]} of each sub-env (index -1); keep longer histories in the connector "
            "(as FrameStackingEnvToModule and PrevActionsPrevRewards do)."
        )


class SubEnvEpisodeView:
    """Sub-env ``env_index``'s episode in progress, as far as this vector step knows it."""

    __slots__ = ("_vec", "env_index")

    def __init__(self, vec: VectorEpisodes, env_index: int):
        self._vec = vec
        self.env_index = env_index

    def __len__(self) -> int:
        """Env steps taken in this episode so far (0 for the first observation)."""
        return int(self._vec.lengths[self.env_index])

    @property
    def is_done(self) -> bool:
        """Whether the observation of this step ended the episode."""
        return bool(self._vec.dones[self.env_index])

    @property
    def is_reset(self) -> bool:
        """Whether the observation of this step is the episode's first."""
        return bool(self._vec.starts[self.env_index])

    def get_observations(self, indices: Any = -1) -> Any:
        """The newest (not yet transformed) observation of this sub-env."""
        _newest_only(indices, "observations")
        return row_of(self._vec.observations, self.env_index)

    def get_actions(self, indices: Any = -1) -> Any:
        """The action taken before the newest observation (IndexError at episode start)."""
        _newest_only(indices, "actions")
        if not len(self) or self._vec.actions is None:
            raise IndexError("the episode has no actions yet (first observation)")
        return row_of(self._vec.actions, self.env_index)

    def get_rewards(self, indices: Any = -1) -> Any:
        """The reward received with the newest observation (IndexError at episode start)."""
        _newest_only(indices, "rewards")
        if not len(self) or self._vec.rewards is None:
            raise IndexError("the episode has no rewards yet (first observation)")
        return float(self._vec.rewards[self.env_index])

    def __repr__(self) -> str:
        return f"SubEnvEpisodeView(env_index={self.env_index}, len={len(self)})"


class VectorEpisodes(Sequence):
    """All sub-envs' episodes at one vector step: views plus whole-batch arrays.

    Attributes:
        observations: The observation batch the pipeline received (before any piece).
        starts: ``(N,)`` bool: the observation is an episode's first (reset).
        lengths: ``(N,)`` int: env steps taken in the episode so far.
        dones: ``(N,)`` bool: the observation ended the episode (terminal or truncated).
        actions: The module actions of the previous vector step (None after a reset).
        rewards: ``(N,)`` rewards received with these observations (None after a reset).
    """

    def __init__(self, observations, starts, lengths, dones, actions, rewards):
        self.observations = observations
        self.starts = starts
        self.lengths = lengths
        self.dones = dones
        self.actions = actions
        self.rewards = rewards

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> SubEnvEpisodeView:  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(len(self))[i]]  # type: ignore[return-value]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return SubEnvEpisodeView(self, i % n)

    def __iter__(self) -> Iterator[SubEnvEpisodeView]:
        return (SubEnvEpisodeView(self, i) for i in range(len(self)))


class VectorEpisodeTracker:
    """Keeps episode starts, lengths, last actions and rewards per sub-env.

    The runner calls ``after_actions`` with the module's actions, ``after_step``
    with what its env step returned, and ``observe`` with each new observation
    batch (which returns the ``VectorEpisodes`` for the pipeline call). An
    observation batch with no env step before it is a reset: every sub-env starts.

    Args:
        num_envs: Number of sub-envs.
        failure_marker: What the step function returns after it recreated the env.
        env_fn: Returns the current vector env (read for per-sub-env restarts).
    """

    def __init__(self, num_envs: int, failure_marker: Any, env_fn: Callable[[], Any]):
        self.num_envs = num_envs
        self._marker = failure_marker
        self._env_fn = env_fn
        self._stepped = False
        self._actions: Any = None
        self._rewards: Any = None
        self._step_dones = np.zeros(num_envs, np.bool_)
        self._failed: np.ndarray | None = None
        self._dones = np.zeros(num_envs, np.bool_)
        self._lengths = np.zeros(num_envs, np.int64)

    def after_actions(self, actions: Any) -> None:
        """Note the module's actions of this vector step."""
        self._actions = actions

    def after_step(self, results: Any) -> None:
        """Note the rewards and episode ends of an env step (or the env's recreation)."""
        if results is self._marker:
            self._stepped = False
            return
        self._stepped = True
        self._rewards = np.asarray(results[1])
        self._step_dones = np.logical_or(results[2], results[3])
        env = self._env_fn()
        self._failed = (
            np.asarray(env.failed, np.bool_) if getattr(env, "last_errors", None) else None
        )

    def observe(self, observations: Any) -> VectorEpisodes:
        """The ``VectorEpisodes`` for this observation batch."""
        if not self._stepped:  # a reset
            starts = np.ones(self.num_envs, np.bool_)
            self._lengths = np.zeros(self.num_envs, np.int64)
            self._dones = np.zeros(self.num_envs, np.bool_)
            actions = rewards = None
        else:
            starts = self._dones if self._failed is None else self._dones | self._failed
            self._lengths += 1
            self._lengths[starts] = 0
            self._dones = self._step_dones & ~starts
            actions, rewards = self._actions, self._rewards
        self._stepped = False
        return VectorEpisodes(
            observations, starts, self._lengths.copy(), self._dones, actions, rewards
        )
