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
"""

from __future__ import annotations

import copy
import time
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.env._episode_ids import new_episode_id
from envrunners.env._single_agent_episode_ops import EpisodeOpsMixin
from envrunners.env.utils._structs import batch, leaf_len, map_structure
from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from envrunners.utils.spaces import get_base_struct_from_space

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


class SingleAgentEpisode(EpisodeOpsMixin):
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
        if infos is None:
            infos = [{} for _ in range(self.observations.len_incl_lookback())]
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
        infos = [{} for _ in range(n_act + 1)] if infos is None else list(infos)
        ep.infos = raw(infos, k, None, None, False)
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
        if isinstance(item, slice):
            return self.slice(item)
        raise NotImplementedError(
            f"SingleAgentEpisode only supports slicing (episode[a:b]), got {type(item).__name__}; "
            "use get_observations()/get_actions()/... for single steps."
        )

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

    def _copy_meta_to(self, other: SingleAgentEpisode) -> None:
        """Copy ids and a deep copy of ``custom_data`` onto a derived chunk."""
        other.agent_id = self.agent_id
        other.module_id = self.module_id
        other.multi_agent_episode_id = self.multi_agent_episode_id
        other._custom_data = copy.deepcopy(self._custom_data)
