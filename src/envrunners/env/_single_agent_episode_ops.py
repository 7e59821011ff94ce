"""Chunk operations of ``SingleAgentEpisode``: validate, to_numpy, cut, slice, concat, state.

Why: kept apart from the data-recording core in ``single_agent_episode.py`` so that
each module stays short; this mixin only works through the episode's public
buffers and attributes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from envrunners.core.columns import Columns
from envrunners.env._single_agent_episode_access import EpisodeAccessMixin
from envrunners.env.utils._structs import map_structure, struct_equal, unbatch
from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from envrunners.errors import SpaceError
from envrunners.utils.spaces import gym_space_from_dict, gym_space_to_dict

if TYPE_CHECKING:
    from envrunners.env.single_agent_episode import SingleAgentEpisode
    from envrunners.policy.sample_batch import SampleBatch

__all__ = ["EpisodeOpsMixin"]

_STATE_BUFFERS = ("observations", "infos", "actions", "rewards")


def _take(buf: InfiniteLookbackBuffer, lo: int, hi: int) -> Any:
    """Return a copy of the raw data at positions ``[lo, hi)`` (lo clipped at 0)."""
    lo = max(lo, 0)
    hi = max(hi, lo)
    if buf.finalized:
        return map_structure(lambda d: d[lo:hi].copy(), buf.data)
    return buf.data[lo:hi]


def _copy_infos(buf: InfiniteLookbackBuffer, lo: int, hi: int) -> Any:
    """Copy infos ``[lo, hi)``, each dict shallow-copied so a derived chunk owns its own."""
    items = _take(buf, lo, hi)
    if not isinstance(items, list):
        return items
    return [dict(i) if isinstance(i, dict) else i for i in items]


class EpisodeOpsMixin(EpisodeAccessMixin):
    """Validation, conversion, splitting and joining of episode chunks."""

    __slots__ = ()

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
        if other.id_ != self.id_:
            raise AssertionError(
                f"Cannot concat episodes with different ids: {self.id_!r} vs {other.id_!r}."
            )
        if self.is_done:
            raise AssertionError("Cannot concat to an episode that is already done.")
        if self.t != other.t_started:
            raise AssertionError(
                f"Cannot concat: self.t ({self.t}) must equal other.t_started ({other.t_started})."
            )
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
        self.infos.extend(other.get_infos())
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


def _space_dict(space: Any) -> dict[str, Any] | None:
    """Encode a space (or None) as plain data."""
    return gym_space_to_dict(space) if space is not None else None


def _space_from(d: dict[str, Any] | None) -> Any:
    """Decode a space written by ``_space_dict``."""
    return gym_space_from_dict(d) if d is not None else None
