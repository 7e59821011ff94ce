"""``SingleAgentEpisode``: one agent's trajectory chunk (``ray.rllib.env.single_agent_episode``).

Why: the new API stack hands learners episodes, not flat batches. A chunk holds
observations ``o_0..o_T`` (one more than actions), actions/rewards/extra model
outputs ``1..T``, infos, the done flags, and a lookback of earlier steps so that
continuation chunks (``cut()``) can still see history. Chunks of one episode share
``id_``; ``t_started``/``t`` place them on the episode's time axis.

Two ways to build one:
- step by step: ``add_env_reset`` then ``add_env_step`` (lists; cheap appends);
- from whole columns: ``SingleAgentEpisode.from_columns(...)`` stores numpy arrays
  as finalized buffers in O(1) Python work per column (the samplers' fast path).

The getters and setters (``get_observations``, ``set_rewards``, ...) are thin
delegates to the buffers; their index semantics are those of
``InfiniteLookbackBuffer.get``/``set``: ints, lists or slices relative to the chunk
start, negative from the end (or into the lookback with
``neg_index_as_lookback=True``), ``fill`` pads out-of-range positions.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from envrunners.core.columns import Columns
from envrunners.env._empty_infos import EmptyInfosBuffer
from envrunners.env._episode_ids import new_episode_id
from envrunners.env._episode_transport import episode_reduce, own_slots
from envrunners.env.utils._structs import batch, leaf_len, struct_equal, unbatch
from envrunners.env.utils.infinite_lookback_buffer import Indices, InfiniteLookbackBuffer
from envrunners.errors import SpaceError
from envrunners.utils.spaces import (
    get_base_struct_from_space,
    gym_space_from_dict,
    gym_space_to_dict,
)
from envrunners.utils.tree import map_structure

if TYPE_CHECKING:
    from envrunners.policy.sample_batch import SampleBatch

__all__ = ["SingleAgentEpisode"]

REWARD_SPACE = gym.spaces.Box(-np.inf, np.inf, (), np.float32)
_REWARD_STRUCT = get_base_struct_from_space(REWARD_SPACE)


def _length(data: Any) -> int:
    """Return the number of items (incl. lookback) of a list, array tree or buffer."""
    if data is None:
        return 0
    if isinstance(data, InfiniteLookbackBuffer):
        return data.len_incl_lookback()
    if isinstance(data, list):
        return len(data)
    return leaf_len(data)


def _buffer(data: Any, lookback: int, space: gym.Space | None) -> InfiniteLookbackBuffer:
    """Wrap constructor input as a buffer: lists are copied, numpy data is finalized."""
    if isinstance(data, InfiniteLookbackBuffer):
        if space is not None:
            data.space = space
        return data
    if data is None:
        data = []
    elif isinstance(data, (list, tuple)) and not hasattr(data, "_fields"):
        data = list(data)
    return InfiniteLookbackBuffer(data=data, lookback=lookback, space=space)


def _col_len(column: Any) -> int:
    """Rows of a column: ``len`` for a plain array, the first leaf's for a struct."""
    return len(column) if type(column) is np.ndarray else leaf_len(column)


_STATE_BUFFERS = ("observations", "infos", "actions", "rewards")


def _take(buf: InfiniteLookbackBuffer, lo: int, hi: int) -> Any:
    """Return a copy of the raw data at positions ``[lo, hi)`` (lo clipped at 0)."""
    lo = max(lo, 0)
    hi = max(hi, lo)
    if buf.finalized:
        return map_structure(lambda d: d[lo:hi].copy(), buf.data)
    return buf.data[lo:hi]


def _copy_infos(buf: InfiniteLookbackBuffer, lo: int, hi: int) -> Any:
    """Copy infos ``[lo, hi)``, each dict shallow-copied so a derived chunk owns its own.

    None for infos whose empty dicts were never made: the derived chunk's are not either.
    """
    if type(buf) is EmptyInfosBuffer:
        return None
    items = _take(buf, lo, hi)
    if not isinstance(items, list):
        return items
    return [dict(i) if isinstance(i, dict) else i for i in items]


def slice_only(episode: Any, item: Any) -> Any:
    """Return ``episode.slice(item)``: ``episode[item]`` of both episode classes.

    Raises:
        NotImplementedError: For anything but a slice.
    """
    if isinstance(item, slice):
        return episode.slice(item)
    raise NotImplementedError(
        f"{type(episode).__name__} only supports slicing (episode[a:b]), got "
        f"{type(item).__name__}; use get_observations()/get_actions()/... for single steps."
    )


def check_successor(episode: Any, other: Any, t_name: str, t: int, other_t_started: int) -> None:
    """Check that ``other`` continues ``episode`` (``concat_episode`` of both episode classes).

    Same id, ``episode`` not done, and ``other`` starts where ``episode`` ends:
    ``t == other_t_started``, where ``t_name`` names the time attribute (``t`` or
    ``env_t``) for the message.

    Raises:
        AssertionError: Naming the condition that does not hold.
    """
    if other.id_ != episode.id_:
        raise AssertionError(
            f"Cannot concat episodes with different ids: {episode.id_!r} vs {other.id_!r}."
        )
    if episode.is_done:
        raise AssertionError(f"Cannot concat to a {type(episode).__name__} that is already done.")
    if t != other_t_started:
        raise AssertionError(
            f"Cannot concat: self.{t_name} ({t}) must equal other.{t_name}_started "
            f"({other_t_started})."
        )


class SingleAgentEpisode:
    """A chunk of one agent's episode, with lookback history.

    Why: the unit the new-stack ``SingleAgentEnvRunner.sample()`` returns; see the
    module docstring for the data layout.

    Attributes:
        id_: The episode id, shared by all chunks of one episode (32 random hex digits).
        agent_id: The agent this belongs to (multi-agent), else None.
        module_id: The RLModule that acts for it (multi-agent), else None.
        multi_agent_episode_id: The id of the owning ``MultiAgentEpisode``, if any.
        observations: Buffer of ``o_0..o_T`` (plus lookback).
        infos: Buffer of infos, aligned with observations; never finalized.
        actions: Buffer of ``a_1..a_T`` (plus lookback).
        rewards: Buffer of ``r_1..r_T`` (plus lookback); space is a float32 Box.
        extra_model_outputs: Per key, a buffer aligned with actions.
        is_terminated: Whether the episode ended in a terminal state.
        is_truncated: Whether the episode was cut off (time limit etc.).
        t_started: The episode timestep of this chunk's first observation.
        t: The episode timestep of this chunk's last observation.
    """

    __slots__ = (
        "id_",
        "agent_id",
        "module_id",
        "multi_agent_episode_id",
        "observations",
        "infos",
        "actions",
        "rewards",
        "extra_model_outputs",
        "is_terminated",
        "is_truncated",
        "t_started",
        "t",
        "_observation_space",
        "_action_space",
        "_last_added_observation",
        "_last_added_infos",
        "_start_time",
        "_last_step_time",
        "_custom_data",
    )

    def __init__(
        self,
        id_: str | None = None,
        *,
        observations: Any = None,
        observation_space: gym.Space | None = None,
        infos: Any = None,
        actions: Any = None,
        action_space: gym.Space | None = None,
        rewards: Any = None,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: dict[str, Any] | None = None,
        t_started: int | None = None,
        len_lookback_buffer: int | str = "auto",
        agent_id: Any = None,
        module_id: Any = None,
        multi_agent_episode_id: str | None = None,
    ):
        """Create an episode chunk, optionally pre-filled with data.

        Args:
            id_: The episode id; 32 random hex digits (like uuid4().hex) if None.
            observations: ``o_0..o_T`` incl. the lookback: a list, numpy data (stored
                finalized) or an ``InfiniteLookbackBuffer`` (used as is).
            observation_space: The space of one observation.
            infos: Infos aligned with observations; ``{}`` each by default.
            actions: ``a_1..a_T`` incl. the lookback.
            action_space: The space of one action.
            rewards: ``r_1..r_T`` incl. the lookback.
            terminated: Whether the episode is terminated.
            truncated: Whether the episode is truncated.
            extra_model_outputs: Per key, data aligned with actions.
            t_started: The timestep of the first non-lookback observation (0 if None).
            len_lookback_buffer: How many leading steps are lookback. ``"auto"`` (or
                a number above ``len(rewards)``) makes all given data lookback.
            agent_id: The agent id (multi-agent).
            module_id: The module id (multi-agent).
            multi_agent_episode_id: The owning multi-agent episode's id.

        Raises:
            ValueError: ``len_lookback_buffer`` is not ``"auto"`` or an int >= 0.
            AssertionError: The given data has inconsistent lengths (see ``validate``).
        """
        self.id_ = id_ or new_episode_id()
        self.agent_id = agent_id
        self.module_id = module_id
        self.multi_agent_episode_id = multi_agent_episode_id

        n_rewards = _length(rewards)
        if len_lookback_buffer == "auto":
            lookback = n_rewards
        elif isinstance(len_lookback_buffer, (int, np.integer)) and len_lookback_buffer >= 0:
            lookback = min(int(len_lookback_buffer), n_rewards)
        else:
            raise ValueError(
                f"len_lookback_buffer must be 'auto' or an int >= 0, got {len_lookback_buffer!r}."
            )

        self.observations = _buffer(observations, lookback, observation_space)
        if infos is None:  # distinct empty dicts, made when first used
            self.infos = EmptyInfosBuffer.of_length(self.observations.len_incl_lookback(), lookback)
        else:
            self.infos = _buffer(infos, lookback, None)
        self.actions = _buffer(actions, lookback, action_space)
        self.rewards = _buffer(rewards, lookback, REWARD_SPACE)
        self.extra_model_outputs = {
            k: _buffer(v, lookback, None) for k, v in (extra_model_outputs or {}).items()
        }
        self._observation_space = observation_space
        self._action_space = action_space
        self.is_terminated = bool(terminated)
        self.is_truncated = bool(truncated)
        self.t_started = int(t_started or 0)
        self.t = len(self.rewards) + self.t_started
        self._last_added_observation = None
        self._last_added_infos = None
        self._start_time: float | None = None
        self._last_step_time: float | None = None
        self._custom_data: dict[str, Any] = {}
        self.validate()

    @classmethod
    def from_columns(
        cls,
        *,
        observations: Any,
        actions: Any,
        rewards: np.ndarray,
        infos: list[dict] | None = None,
        extra_model_outputs: dict[str, Any] | None = None,
        terminated: bool = False,
        truncated: bool = False,
        t_started: int = 0,
        len_lookback_buffer: int = 0,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        id_: str | None = None,
        agent_id: Any = None,
        module_id: Any = None,
        multi_agent_episode_id: str | None = None,
        copy: bool = True,
        start_time: float | None = None,
        last_step_time: float | None = None,
    ) -> SingleAgentEpisode:
        """Build a numpy'd episode chunk from whole column arrays in O(1) Python work.

        Why: samplers write steps into preallocated ``(T, num_envs, ...)`` buffers
        and build episodes once per ``sample()`` from slices of them; stepping an
        episode per step would cost Python work per step.

        Every column includes the ``len_lookback_buffer`` (``k``) lookback steps:
        with ``n`` steps in the chunk, ``observations`` (and ``infos``) have
        ``k + n + 1`` rows, ``actions``, ``rewards`` and every extra output
        ``k + n`` rows. Columns may be nested (dict/tuple trees of arrays).
        The result has ``len == n``, ``t == t_started + n`` and ``is_numpy``.

        Args:
            observations: Batch-first array (tree) of ``k + n + 1`` observations.
            actions: Batch-first array (tree) of ``k + n`` actions.
            rewards: Array of ``k + n`` rewards (float32 recommended).
            infos: List of ``k + n + 1`` info dicts; empty dicts if None.
            extra_model_outputs: Per key, an array (tree) of ``k + n`` rows.
            terminated: Whether the chunk ends in a terminal state.
            truncated: Whether the chunk ends by truncation.
            t_started: Episode timestep of the first non-lookback observation.
            len_lookback_buffer: ``k``, the number of leading lookback steps.
            observation_space: Space of one observation.
            action_space: Space of one action.
            id_: Episode id (continuation chunks pass their predecessor's); new if None.
            agent_id: Agent id (multi-agent).
            module_id: Module id (multi-agent).
            multi_agent_episode_id: Owning multi-agent episode's id.
            copy: Copy the arrays (default). Pass False only for arrays nobody will
                overwrite later: views into a sampler's reused buffers would change
                under the episode.
            start_time: ``time.perf_counter()`` at the chunk's first observation.
            last_step_time: ``time.perf_counter()`` at the chunk's last step.

        Raises:
            ValueError: Column lengths that do not fit the layout above.
        """
        n_act = _col_len(actions)
        k = int(len_lookback_buffer)
        problems = []
        if not 0 <= k <= n_act:
            problems.append(f"len_lookback_buffer={k} must be in [0, len(actions)={n_act}]")
        if _col_len(rewards) != n_act:
            problems.append(f"len(rewards)={leaf_len(rewards)} != len(actions)={n_act}")
        if _col_len(observations) != n_act + 1:
            problems.append(
                f"len(observations)={leaf_len(observations)} != len(actions)+1={n_act + 1}"
            )
        if infos is not None and len(infos) != n_act + 1:
            problems.append(f"len(infos)={len(infos)} != len(actions)+1={n_act + 1}")
        for key, value in (extra_model_outputs or {}).items():
            if _col_len(value) != n_act:
                problems.append(
                    f"len(extra_model_outputs[{key!r}])={leaf_len(value)} != len(actions)={n_act}"
                )
        if problems:
            raise ValueError(
                "Bad columns for SingleAgentEpisode.from_columns: " + "; ".join(problems)
            )

        conv = np.array if copy else np.asarray
        raw = InfiniteLookbackBuffer._raw

        def column(data: Any, space: Any, struct: Any) -> InfiniteLookbackBuffer:
            if type(data) is np.ndarray:  # the common case, without the struct walk
                return raw(data.copy() if copy else data, k, space, struct, True)
            if isinstance(data, list):  # tolerated: a list of per-step items
                data = batch(data)
            return raw(map_structure(conv, data), k, space, struct, True)

        ep = object.__new__(cls)
        ep.id_ = id_ or new_episode_id()
        ep.agent_id = agent_id
        ep.module_id = module_id
        ep.multi_agent_episode_id = multi_agent_episode_id
        ep._observation_space = observation_space
        ep._action_space = action_space
        ep.observations = column(
            observations, observation_space, get_base_struct_from_space(observation_space)
        )
        ep.actions = column(actions, action_space, get_base_struct_from_space(action_space))
        ep.rewards = column(rewards, REWARD_SPACE, _REWARD_STRUCT)
        if infos is None:  # distinct empty dicts, made when first used
            ep.infos = EmptyInfosBuffer.of_length(n_act + 1, k)
        else:
            ep.infos = raw(list(infos), k, None, None, False)
        ep.extra_model_outputs = {
            key: column(value, None, None) for key, value in (extra_model_outputs or {}).items()
        }
        ep.is_terminated = bool(terminated)
        ep.is_truncated = bool(truncated)
        ep.t_started = int(t_started)
        ep.t = ep.t_started + n_act - k
        ep._last_added_observation = None
        ep._last_added_infos = None
        ep._start_time = start_time
        ep._last_step_time = last_step_time
        ep._custom_data = {}
        return ep

    # ------------------------------------------------------------- properties
    @property
    def observation_space(self) -> gym.Space | None:
        """The space of one observation; setting it also sets the buffer's space."""
        return self._observation_space

    @observation_space.setter
    def observation_space(self, value: gym.Space | None) -> None:
        self._observation_space = self.observations.space = value

    @property
    def action_space(self) -> gym.Space | None:
        """The space of one action; setting it also sets the buffer's space."""
        return self._action_space

    @action_space.setter
    def action_space(self, value: gym.Space | None) -> None:
        self._action_space = self.actions.space = value

    @property
    def is_reset(self) -> bool:
        """Whether the episode has its initial observation (``add_env_reset`` happened)."""
        return len(self.observations) > 0

    @property
    def is_numpy(self) -> bool:
        """Whether the step data is numpy (``to_numpy()`` or ``from_columns``)."""
        return self.rewards.finalized

    @property
    def is_done(self) -> bool:
        """Whether the episode is terminated or truncated."""
        return self.is_terminated or self.is_truncated

    @property
    def custom_data(self) -> dict[str, Any]:
        """A free-form dict for user data (carried by ``cut``, merged by ``concat``)."""
        return self._custom_data

    # ------------------------------------------------------------- adding data
    def add_env_reset(self, observation: Any, infos: dict | None = None) -> None:
        """Record the initial observation (and infos) and start the episode's timer.

        Raises:
            AssertionError: If already reset or done, or the chunk does not start empty.
        """
        if self.is_reset or self.observations.len_incl_lookback() > 0:
            raise AssertionError("add_env_reset() was already called: the episode has data.")
        if self.is_done:
            raise AssertionError("Cannot reset an episode that is already done.")
        if self.t != self.t_started:
            raise AssertionError(f"Cannot reset: t ({self.t}) != t_started ({self.t_started}).")
        infos = infos if infos is not None else {}
        self.observations.append(observation)
        self.infos.append(infos)
        self._last_added_observation = observation
        self._last_added_infos = infos
        self._start_time = time.perf_counter()

    def add_env_step(
        self,
        observation: Any,
        action: Any,
        reward: float,
        infos: dict | None = None,
        *,
        terminated: bool = False,
        truncated: bool = False,
        extra_model_outputs: dict[str, Any] | None = None,
    ) -> None:
        """Record one env step: the action taken, then the obs/reward/infos that followed.

        Works on numpy'd episodes too (by concatenation, O(len) per call). Space
        membership is not checked here; use ``validate(check_spaces=True)``.

        Raises:
            AssertionError: If the episode is done or was never reset.
        """
        if self.is_done:
            raise AssertionError("The agent is already done: no data can be added to its episode.")
        if not self.is_reset:
            raise AssertionError(
                "Call add_env_reset() before add_env_step(): the episode has no observation."
            )
        infos = infos if infos is not None else {}
        self.observations.append(observation)
        self.actions.append(action)
        self.rewards.append(reward)
        self.infos.append(infos)
        self.t += 1
        if extra_model_outputs:
            numpy = self.rewards.finalized
            for key, value in extra_model_outputs.items():
                buf = self.extra_model_outputs.get(key)
                if buf is None:
                    data = map_structure(lambda v: np.asarray(v)[None], value) if numpy else [value]
                    self.extra_model_outputs[key] = InfiniteLookbackBuffer(data)
                else:
                    buf.append(value)
        self.is_terminated = bool(terminated)
        self.is_truncated = bool(truncated)
        self._last_added_observation = observation
        self._last_added_infos = infos
        self._last_step_time = time.perf_counter()

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

    # ------------------------------------------------------------- validation
    def validate(self, *, check_spaces: bool = False) -> None:
        """Check that the buffers have consistent lengths (lookback excluded).

        Why: every chunk must satisfy ``len(obs) == len(infos) == len(actions) + 1
        == len(rewards) + 1`` (or be empty), with each extra output as long as the
        actions; a broken chunk would silently misalign training data.

        Args:
            check_spaces: Also check that every observation and action (lookback
                excluded) lies in its space. Off by default: it costs Python work
                per step.

        Raises:
            AssertionError: Inconsistent lengths (the message has the numbers).
            SpaceError: With ``check_spaces``, an item outside its space.
        """
        n_obs, n_inf = len(self.observations), len(self.infos)
        n_act, n_rew = len(self.actions), len(self.rewards)
        if n_obs != n_inf:
            raise AssertionError(f"len(observations)={n_obs} != len(infos)={n_inf}.")
        if n_obs == 0:
            sizes = {"actions": n_act, "rewards": n_rew}
            sizes.update({f"extra_model_outputs[{k!r}]": len(b) for k, b in self._extras()})
            bad = {k: v for k, v in sizes.items() if v}
            if bad:
                raise AssertionError(f"An episode without observations has data: {bad}.")
        else:
            if n_act + 1 != n_obs or n_rew + 1 != n_obs:
                raise AssertionError(
                    f"len(observations)={n_obs} must be len(actions)+1={n_act + 1} and "
                    f"len(rewards)+1={n_rew + 1} (lengths exclude the lookback)."
                )
            for key, buf in self._extras():
                if len(buf) != n_obs - 1:
                    raise AssertionError(
                        f"len(extra_model_outputs[{key!r}])={len(buf)} != len(actions)={n_act}."
                    )
        if self.t - self.t_started != n_rew:
            raise AssertionError(
                f"t - t_started = {self.t} - {self.t_started} != len(rewards)={n_rew}."
            )
        if check_spaces:
            self._check_space("observation", self.observations, self.observation_space)
            self._check_space("action", self.actions, self.action_space)

    def _extras(self) -> list[tuple[str, InfiniteLookbackBuffer]]:
        """Return the extra-output buffers as ``(key, buffer)`` pairs."""
        return list(self.extra_model_outputs.items())

    @staticmethod
    def _check_space(what: str, buf: InfiniteLookbackBuffer, space: Any) -> None:
        """Raise SpaceError for the first item of ``buf`` (lookback excluded) not in ``space``."""
        if space is None:
            return
        items = buf.get()
        if buf.finalized:
            items = unbatch(items)
        for i, item in enumerate(items):
            if not space.contains(item):
                raise SpaceError(f"The {what} at index {i} is not in {space}: {item!r}.")

    # ------------------------------------------------------------- conversion
    def to_numpy(self) -> SingleAgentEpisode:
        """Turn the step data into batch-first numpy arrays; infos stay lists.

        Why: learners want arrays; recording steps wants lists. ``add_env_step``
        keeps working afterwards (by concatenation).

        Returns:
            ``self``.
        """
        self.validate()
        self.observations.finalize()
        if self.rewards.len_incl_lookback() > 0:
            self.actions.finalize()
            self.rewards.finalize()
            for buf in self.extra_model_outputs.values():
                buf.finalize()
        return self

    def get_data_dict(self) -> dict[str, Any]:
        """Return the chunk as columns of length ``len(self)`` (lookback excluded).

        Keys: ``obs`` (without the last observation), ``infos`` (likewise),
        ``actions``, ``rewards``, ``terminateds``/``truncateds`` (False except at the
        last step, which carries the flag), ``t`` (``t_started..t-1``), ``eps_id``
        and every extra model output key. Values are numpy when ``is_numpy``.
        """
        n = len(self)
        numpy = self.is_numpy
        terminateds = [False] * n
        truncateds = [False] * n
        if n:
            terminateds[-1] = self.is_terminated
            truncateds[-1] = self.is_truncated
        infos = self.infos.get(slice(0, n))
        data: dict[str, Any] = {
            Columns.OBS: self.observations.get(slice(0, n)),
            Columns.INFOS: infos,
            Columns.ACTIONS: self.actions.get(),
            Columns.REWARDS: self.rewards.get(),
            Columns.TERMINATEDS: terminateds,
            Columns.TRUNCATEDS: truncateds,
            Columns.T: list(range(self.t_started, self.t)),
            Columns.EPS_ID: [self.id_] * n,
        }
        for key, buf in self.extra_model_outputs.items():
            data[key] = buf.get()
        if numpy:
            obj_infos = np.empty(n, dtype=object)
            obj_infos[:] = infos
            data[Columns.INFOS] = obj_infos
            data[Columns.TERMINATEDS] = np.asarray(terminateds, dtype=bool)
            data[Columns.TRUNCATEDS] = np.asarray(truncateds, dtype=bool)
            data[Columns.T] = np.arange(self.t_started, self.t, dtype=np.int64)
            data[Columns.EPS_ID] = np.full(n, self.id_)
        return data

    def get_sample_batch(self) -> SampleBatch:
        """Return ``SampleBatch(self.get_data_dict())`` (old-stack batch of this chunk)."""
        from envrunners.policy.sample_batch import SampleBatch

        return SampleBatch(self.get_data_dict())

    # ------------------------------------------------------------- chunking
    def cut(self, len_lookback_buffer: int = 0) -> SingleAgentEpisode:
        """Return the empty successor chunk that continues this (ongoing) episode.

        Why: a sampler returns a chunk per ``sample()`` and keeps stepping the
        successor; same ``id_``, ``t_started == self.t``, and the last
        ``len_lookback_buffer`` steps as lookback (fewer if there are fewer).

        Args:
            len_lookback_buffer: How many past steps the successor can look back on.

        Returns:
            A new episode with ``len == 0``: observations/infos ``[-L-1:]`` and
            actions/rewards/extras ``[-L:]`` as lookback; numpy iff ``self`` is.

        Raises:
            AssertionError: If this episode is done (there is nothing to continue).
            ValueError: If ``len_lookback_buffer < 0``.
        """
        if self.is_done:
            raise AssertionError(
                "Cannot cut() an episode that is already done: it has no successor."
            )
        if len_lookback_buffer < 0:
            raise ValueError(f"len_lookback_buffer must be >= 0, got {len_lookback_buffer}.")
        n_obs = self.observations.len_incl_lookback()
        n_act = self.actions.len_incl_lookback()
        lb = min(int(len_lookback_buffer), n_act, max(n_obs - 1, 0))
        succ = type(self)(
            self.id_,
            observations=_take(self.observations, n_obs - lb - 1, n_obs) if n_obs else [],
            observation_space=self.observation_space,
            infos=_copy_infos(self.infos, n_obs - lb - 1, n_obs) if n_obs else [],
            actions=_take(self.actions, n_act - lb, n_act),
            action_space=self.action_space,
            rewards=_take(self.rewards, n_act - lb, n_act),
            extra_model_outputs={
                k: _take(b, b.len_incl_lookback() - lb, b.len_incl_lookback())
                for k, b in self.extra_model_outputs.items()
            },
            t_started=self.t,
            len_lookback_buffer=lb,
        )
        self._copy_meta_to(succ)
        succ._last_added_observation = self._last_added_observation
        succ._last_added_infos = self._last_added_infos
        succ._start_time = (
            self._last_step_time if self._last_step_time is not None else self._start_time
        )
        return succ

    def slice(self, slice_: slice, *, len_lookback_buffer: int | None = None) -> SingleAgentEpisode:
        """Return a new chunk holding steps ``slice_`` of this one (data is copied).

        Why: learners split long chunks; the result keeps the id, starts at
        ``t_started + start`` and keeps as much lookback as exists before ``start``.

        Args:
            slice_: A slice with step 1 (or None); None/negative bounds as in Python.
            len_lookback_buffer: Lookback of the result; defaults to this chunk's.

        Returns:
            The slice; it keeps the done flags only if it reaches the end.

        Raises:
            ValueError: A step other than 1 or a negative ``len_lookback_buffer``.
        """
        if slice_.step not in (None, 1):
            raise ValueError(f"SingleAgentEpisode.slice() needs step 1, got {slice_.step}.")
        n = len(self)
        start, stop, _ = slice_.indices(n)
        stop = max(stop, start)
        lb_obs, lb_act = self.observations.lookback, self.actions.lookback
        lb = lb_obs if len_lookback_buffer is None else int(len_lookback_buffer)
        if lb < 0:
            raise ValueError(f"len_lookback_buffer must be >= 0, got {lb}.")
        lb = min(lb, lb_obs + start, lb_act + start)
        keep_done = stop == n
        o_lo, o_hi = lb_obs + start - lb, lb_obs + stop + 1
        a_lo, a_hi = lb_act + start - lb, lb_act + stop
        sliced = type(self)(
            self.id_,
            observations=_take(self.observations, o_lo, o_hi),
            observation_space=self.observation_space,
            infos=_copy_infos(self.infos, o_lo, o_hi),
            actions=_take(self.actions, a_lo, a_hi),
            action_space=self.action_space,
            rewards=_take(self.rewards, a_lo, a_hi),
            extra_model_outputs={
                k: _take(b, b.lookback + start - lb, b.lookback + stop)
                for k, b in self.extra_model_outputs.items()
            },
            terminated=self.is_terminated and keep_done,
            truncated=self.is_truncated and keep_done,
            t_started=self.t_started + start,
            len_lookback_buffer=lb,
        )
        self._copy_meta_to(sliced)
        sliced._start_time = self._start_time
        sliced._last_step_time = self._last_step_time
        return sliced

    def concat_episode(self, other: SingleAgentEpisode) -> None:
        """Append the successor chunk ``other`` (e.g. from ``cut()``) to this one, in place.

        Raises:
            AssertionError: Different ids, this chunk done, ``self.t !=
                other.t_started``, mismatching boundary observation or extra-output
                keys, or either chunk invalid. ``self`` is unchanged then.
        """
        check_successor(self, other, "t", self.t, other.t_started)
        self.validate()
        other.validate()
        if not self.is_reset or not other.is_reset:
            raise AssertionError("Cannot concat: both chunks need observations.")
        if not struct_equal(self.observations.get(-1), other.observations.get(0)):
            raise AssertionError(
                "Cannot concat: other's first observation differs from self's last observation."
            )
        mine, theirs = set(self.extra_model_outputs), set(other.extra_model_outputs)
        if len(other) > 0 and theirs != mine and (mine or self.actions.len_incl_lookback()):
            raise AssertionError(
                f"Cannot concat: extra_model_outputs keys differ ({sorted(map(str, mine))} vs "
                f"{sorted(map(str, theirs))})."
            )
        self.observations.pop()
        self.infos.pop()
        self.observations.extend(other.get_observations())
        self.infos.extend(other.get_infos())  # other's dicts, shared (made if need be)
        self.actions.extend(other.get_actions())
        self.rewards.extend(other.get_rewards())
        for key, buf in other.extra_model_outputs.items():
            if key in self.extra_model_outputs:
                self.extra_model_outputs[key].extend(buf.get())
            else:
                data = buf.get()
                self.extra_model_outputs[key] = InfiniteLookbackBuffer(
                    list(data) if isinstance(data, list) else data
                )
        self.t = other.t
        self.is_terminated = other.is_terminated
        self.is_truncated = other.is_truncated
        self._last_added_observation = other._last_added_observation
        self._last_added_infos = other._last_added_infos
        if other._last_step_time is not None:
            self._last_step_time = other._last_step_time
        self._custom_data.update(other.custom_data)
        self.validate()

    # ----------------------------------------------------------------- state
    def get_state(self) -> dict[str, Any]:
        """Return the episode as a dict of plain data and numpy arrays (no pickle needed).

        Spaces are encoded with ``gym_space_to_dict``; ``from_state`` restores it.
        """
        state: dict[str, Any] = {
            "id_": self.id_,
            "agent_id": self.agent_id,
            "module_id": self.module_id,
            "multi_agent_episode_id": self.multi_agent_episode_id,
            "extra_model_outputs": (
                {k: b.get_state() for k, b in self.extra_model_outputs.items()}
                if self.extra_model_outputs
                else None
            ),
            "is_terminated": self.is_terminated,
            "is_truncated": self.is_truncated,
            "t_started": self.t_started,
            "t": self.t,
            "observation_space": _space_dict(self.observation_space),
            "action_space": _space_dict(self.action_space),
            "_start_time": self._start_time,
            "_last_step_time": self._last_step_time,
            "custom_data": dict(self._custom_data),
        }
        for name in _STATE_BUFFERS:
            state[name] = getattr(self, name).get_state()
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SingleAgentEpisode:
        """Rebuild an episode from ``get_state()`` output (and validate it)."""
        ep = object.__new__(cls)
        ep.id_ = state["id_"]
        ep.agent_id = state["agent_id"]
        ep.module_id = state["module_id"]
        ep.multi_agent_episode_id = state["multi_agent_episode_id"]
        for name in _STATE_BUFFERS:
            setattr(ep, name, InfiniteLookbackBuffer.from_state(state[name]))
        extras = state.get("extra_model_outputs") or {}
        ep.extra_model_outputs = {
            k: InfiniteLookbackBuffer.from_state(s) for k, s in extras.items()
        }
        ep.is_terminated = bool(state["is_terminated"])
        ep.is_truncated = bool(state["is_truncated"])
        ep.t_started = int(state["t_started"])
        ep.t = int(state["t"])
        ep._observation_space = _space_from(state.get("observation_space"))
        ep._action_space = _space_from(state.get("action_space"))
        ep.observations.space = ep._observation_space
        ep.actions.space = ep._action_space
        ep._start_time = state.get("_start_time")
        ep._last_step_time = state.get("_last_step_time")
        ep._custom_data = dict(state.get("custom_data") or {})
        has_obs = ep.observations.len_incl_lookback() > 0
        ep._last_added_observation = ep.observations.get(-1) if has_obs else None
        ep._last_added_infos = ep.infos.get(-1) if has_obs else None
        ep.validate()
        return ep

    # ------------------------------------------------------------------ misc
    def get_return(self) -> float:
        """Return the sum of this chunk's rewards (lookback and other chunks excluded)."""
        rewards = self.rewards.get()
        return float(np.sum(rewards)) if len(rewards) else 0.0

    def get_duration_s(self) -> float:
        """Return wall-clock seconds from the chunk's start to its last step (0.0 if none)."""
        if self._last_step_time is None or self._start_time is None:
            return 0.0
        return self._last_step_time - self._start_time

    def env_steps(self) -> int:
        """Return the number of env steps in this chunk (``len(self)``)."""
        return self.t - self.t_started

    def agent_steps(self) -> int:
        """Return the number of agent steps in this chunk (``len(self)``)."""
        return self.t - self.t_started

    def __len__(self) -> int:
        """Return the number of steps in this chunk (``t - t_started``)."""
        return self.t - self.t_started

    def __repr__(self) -> str:
        """Summarise the chunk: length, done flag, return and id."""
        return f"SAEps(len={len(self)} done={self.is_done} R={self.get_return()} id_={self.id_})"

    def __getitem__(self, item: slice) -> SingleAgentEpisode:
        """Return ``self.slice(item)``; only slices are supported.

        Raises:
            NotImplementedError: For anything but a slice.
        """
        return slice_only(self, item)

    def add_temporary_timestep_data(self, key: str, data: Any) -> None:
        """Removed API (RLlib deprecated it); always raises.

        Raises:
            ValueError: Always; use ``custom_data`` instead.
        """
        raise ValueError(
            "SingleAgentEpisode.add_temporary_timestep_data() is deprecated and removed; "
            "store per-episode data in `episode.custom_data` instead."
        )

    def get_temporary_timestep_data(self, key: str) -> Any:
        """Removed API (RLlib deprecated it); always raises.

        Raises:
            ValueError: Always; use ``custom_data`` instead.
        """
        raise ValueError(
            "SingleAgentEpisode.get_temporary_timestep_data() is deprecated and removed; "
            "read per-episode data from `episode.custom_data` instead."
        )

    def __reduce_ex__(self, protocol: int) -> tuple[Any, ...]:
        """Pickle as one header plus one block of all arrays (see ``_episode_transport``).

        Why: the driver unpickles every episode a remote runner samples; rebuilt
        columns are views into the block, not one numpy reconstruct per array.
        """
        return episode_reduce(self, protocol, SingleAgentEpisode)

    def __copy__(self) -> SingleAgentEpisode:
        """Return a shallow copy sharing the buffers (``copy.copy``).

        Why: without it ``copy.copy`` would go through ``__reduce_ex__`` and copy
        every array into a new block.
        """
        new = object.__new__(type(self))
        for klass in type(self).__mro__:
            for name in own_slots(klass):
                if hasattr(self, name):
                    object.__setattr__(new, name, getattr(self, name))
        if hasattr(self, "__dict__"):
            new.__dict__.update(self.__dict__)
        return new

    def _copy_meta_to(self, other: SingleAgentEpisode) -> None:
        """Copy ids and a deep copy of ``custom_data`` onto a derived chunk."""
        other.agent_id = self.agent_id
        other.module_id = self.module_id
        other.multi_agent_episode_id = self.multi_agent_episode_id
        other._custom_data = copy.deepcopy(self._custom_data)


def _space_dict(space: Any) -> dict[str, Any] | None:
    """Encode a space (or None) as plain data."""
    return gym_space_to_dict(space) if space is not None else None


def _space_from(d: dict[str, Any] | None) -> Any:
    """Decode a space written by ``_space_dict``."""
    return gym_space_from_dict(d) if d is not None else None
