"""What ``episodes`` is when a runner calls its env-to-module pipeline during sampling.

RLlib hands connectors the list of full ``SingleAgentEpisode`` objects of all
sub-envs. Our sampler builds episodes only at the end of ``sample()``, so during
sampling the single-agent runner passes a ``VectorEpisodes``: a sequence with one
``SubEnvEpisodeView`` per batch row plus whole-batch arrays (``starts``,
``lengths``, ``dones``, ``actions``, ``rewards``) that the stock pieces read
without a per-sub-env loop. A view answers the common reads of the newest step
only: ``len()``, ``get_observations(-1)``, ``get_actions(-1)``,
``get_rewards(-1)``, ``is_done``, ``env_index``. Pieces that need more history
(frame stacking, previous actions) keep it themselves from these arrays.

Stepping ready-first, a batch holds only the sub-envs that were ready, in the
order they came: ``env_indices`` says which sub-env each row is (None: row ``i``
is sub-env ``i``, all of them), and a piece that keeps per-sub-env history
indexes it by those (see ``ConnectorV2.supports_ready_first``).

``VectorEpisodeTracker`` keeps those arrays up to date from the runner's acting,
env-step (or ``recv``) and observation hooks (a few numpy ops per batch, and only
for a pipeline with a piece that reads ``episodes``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from envrunners.core._nested import map_structure

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
    """Sub-env ``env_index``'s episode in progress, as far as this batch knows it."""

    __slots__ = ("_row", "_vec", "env_index")

    def __init__(self, vec: VectorEpisodes, row: int):
        self._vec = vec
        self._row = row
        ids = vec.env_indices
        self.env_index = row if ids is None else int(ids[row])

    def __len__(self) -> int:
        """Env steps taken in this episode so far (0 for the first observation)."""
        return int(self._vec.lengths[self._row])

    @property
    def is_done(self) -> bool:
        """Whether the observation of this step ended the episode."""
        return bool(self._vec.dones[self._row])

    @property
    def is_reset(self) -> bool:
        """Whether the observation of this step is the episode's first."""
        return bool(self._vec.starts[self._row])

    def get_observations(self, indices: Any = -1) -> Any:
        """The newest (not yet transformed) observation of this sub-env."""
        _newest_only(indices, "observations")
        return row_of(self._vec.observations, self._row)

    def get_actions(self, indices: Any = -1) -> Any:
        """The action taken before the newest observation (IndexError at episode start)."""
        _newest_only(indices, "actions")
        if not len(self) or self._vec.actions is None:
            raise IndexError("the episode has no actions yet (first observation)")
        return row_of(self._vec.actions, self._row)

    def get_rewards(self, indices: Any = -1) -> Any:
        """The reward received with the newest observation (IndexError at episode start)."""
        _newest_only(indices, "rewards")
        if not len(self) or self._vec.rewards is None:
            raise IndexError("the episode has no rewards yet (first observation)")
        return float(self._vec.rewards[self._row])

    def __repr__(self) -> str:
        return f"SubEnvEpisodeView(env_index={self.env_index}, len={len(self)})"


class VectorEpisodes(Sequence):
    """The episodes of a batch's sub-envs at one step: views plus whole-batch arrays.

    Attributes:
        observations: The observation batch the pipeline received (before any piece).
        starts: ``(B,)`` bool: the observation is an episode's first (reset).
        lengths: ``(B,)`` int: env steps taken in the episode so far.
        dones: ``(B,)`` bool: the observation ended the episode (terminal or truncated).
        actions: The module actions taken before these observations, one row per
            batch row (None when there are none: after a reset).
        rewards: ``(B,)`` rewards received with these observations (None after a reset).
        env_indices: ``(B,)`` the sub-env of each row, for a ready-first batch of some
            sub-envs; None when row ``i`` is sub-env ``i`` (every sub-env, in order).
        num_envs: How many sub-envs the runner has (``B`` when ``env_indices`` is None).
    """

    def __init__(
        self,
        observations: Any,
        starts: np.ndarray,
        lengths: np.ndarray,
        dones: np.ndarray,
        actions: Any,
        rewards: Any,
        env_indices: np.ndarray | None = None,
        num_envs: int | None = None,
    ):
        self.observations = observations
        self.starts = starts
        self.lengths = lengths
        self.dones = dones
        self.actions = actions
        self.rewards = rewards
        self.env_indices = env_indices
        self.num_envs = len(starts) if num_envs is None else int(num_envs)

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

    Stepping all sub-envs together, the runner calls ``after_actions`` with the
    module's actions, ``after_step`` with what its env step returned, and
    ``observe`` with each new observation batch (which returns the
    ``VectorEpisodes`` for the pipeline call); an observation batch with no env step
    before it is a reset: every sub-env starts. Stepping ready-first, ``after_recv``
    takes the place of ``after_step`` (the batch's sub-envs, rewards and flags) and
    the actions are kept per sub-env until its next observation comes. A sub-env
    starts an episode with its first observation since the env was (re)built or
    ``forget()``, after one that ended an episode, and when the env reports it failed.

    Args:
        num_envs: Number of sub-envs.
        failure_marker: What the step function returns after it recreated the env.
        env_fn: Returns the current vector env (read for per-sub-env restarts; a new
            env object means every sub-env starts over).
    """

    def __init__(self, num_envs: int, failure_marker: Any, env_fn: Callable[[], Any]):
        self.num_envs = num_envs
        self._marker = failure_marker
        self._env_fn = env_fn
        self._env = env_fn()
        #: ``(env_ids or None, rewards, dones, failed or None)`` of the step or ``recv``
        #: the next observation batch comes from; None: that batch is a reset.
        self._step: tuple | None = None
        self._seen = np.zeros(num_envs, np.bool_)  # has an episode going
        self._all_seen = False
        self._dones = np.zeros(num_envs, np.bool_)
        self._lengths = np.zeros(num_envs, np.int64)
        self._ids: np.ndarray | None = None  # the sub-envs of the batch being acted on
        self._actions: Any = None  # that batch's actions (stepping all together)
        self._actions_by_env: Any = None  # each sub-env's last actions (ready-first)

    def forget(self) -> None:
        """Every sub-env starts a new episode with its next observation (a reset)."""
        self._seen[:] = False
        self._all_seen = False
        self._step = None

    def after_actions(self, actions: Any) -> None:
        """Note the module's actions for the batch just observed."""
        ids = self._ids
        if ids is None:
            self._actions = actions
            return
        if self._actions_by_env is None:  # every row a valid action until one is written
            n = self.num_envs
            self._actions_by_env = map_structure(
                lambda a: np.repeat(np.asarray(a)[:1], n, 0), actions
            )
        map_structure(lambda store, a: store.__setitem__(ids, a), self._actions_by_env, actions)

    def after_step(self, results: Any) -> None:
        """Note the rewards and episode ends of a step of every sub-env (or the env's
        recreation)."""
        if results is self._marker:
            self._step = None
            return
        self._note(None, results[1], results[2], results[3])

    def after_recv(self, results: Any) -> None:
        """Note a ready-first batch: ``(env_ids, obs, rewards, terminated, truncated,
        infos)`` as ``recv()`` returns it (or the env's recreation)."""
        if results is self._marker:
            self._step = None
            return
        self._note(np.asarray(results[0], np.intp), results[2], results[3], results[4])

    def _note(self, ids: np.ndarray | None, rewards: Any, terms: Any, truncs: Any) -> None:
        env = self._env_fn()
        failed = None
        if getattr(env, "last_errors", None):
            failed = np.asarray(env.failed, np.bool_)
            failed = failed if ids is None else failed[ids]
        self._step = (ids, np.asarray(rewards), np.logical_or(terms, truncs), failed)

    def observe(self, observations: Any) -> VectorEpisodes:
        """The ``VectorEpisodes`` for this observation batch."""
        n = self.num_envs
        env = self._env_fn()
        if env is not self._env:  # a recreated env: every sub-env starts over
            self._env = env
            self._seen[:] = self._all_seen = False
        step, self._step = self._step, None
        if step is None:  # a reset of every sub-env
            self._ids = None
            self._seen[:] = self._all_seen = True
            self._lengths = np.zeros(n, np.int64)
            self._dones = np.zeros(n, np.bool_)
            starts = np.ones(n, np.bool_)
            return VectorEpisodes(
                observations, starts, self._lengths.copy(), self._dones, None, None
            )
        ids, rewards, step_dones, failed = step
        self._ids = ids
        if ids is None:  # every sub-env stepped
            starts = self._dones if failed is None else self._dones | failed
            if not self._all_seen:
                starts = starts | ~self._seen
                self._seen[:] = self._all_seen = True
            self._lengths += 1
            self._lengths[starts] = 0
            self._dones = step_dones & ~starts
            return VectorEpisodes(
                observations, starts, self._lengths.copy(), self._dones, self._actions, rewards
            )
        starts = self._dones[ids] | ~self._seen[ids]
        if failed is not None:
            starts |= failed
        self._seen[ids] = True
        lengths = self._lengths[ids] + 1
        lengths[starts] = 0
        self._lengths[ids] = lengths
        dones = step_dones & ~starts
        self._dones[ids] = dones
        store = self._actions_by_env
        actions = None if store is None else map_structure(lambda a: a[ids], store)
        return VectorEpisodes(observations, starts, lengths, dones, actions, rewards, ids, n)
