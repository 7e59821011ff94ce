"""Chunk operations of ``MultiAgentEpisode``: from lists, cut, slice, concat, state, checks.

Why: kept apart from the step-recording core in ``multi_agent_episode.py`` so
that each module stays short. A successor (``cut``) or slice is built agent by
agent with ``SingleAgentEpisode.cut``/``slice`` plus the matching window of the
env-step mapping, so single-agent data (numpy or not, custom data) carries over
exactly; hanging values are carried as described in ``cut``.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from envrunners.env import _multi_agent_episode_index as idx
from envrunners.env._multi_agent_episode_index import (
    _M,
    SKIP_ENV_TS_TAG,
    last_obs_position,
    space_for,
    truncated_without_obs,
)
from envrunners.env.single_agent_episode import SingleAgentEpisode
from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from envrunners.errors import MultiAgentEnvError
from envrunners.utils.spaces import gym_space_from_dict, gym_space_to_dict

if TYPE_CHECKING:
    from collections.abc import Callable

    from envrunners.env.multi_agent_episode import MultiAgentEpisode

__all__ = ["MultiAgentOpsMixin"]

MultiAgentDict = dict[Any, Any]


class MultiAgentOpsMixin:
    """Construction from recorded data, chunking, joining, state, validation and display."""

    def _init_from_data(
        self,
        observations: list[MultiAgentDict],
        infos: list[MultiAgentDict] | None,
        actions: list[MultiAgentDict] | None,
        rewards: list[MultiAgentDict] | None,
        extra_model_outputs: list[MultiAgentDict] | None,
        term_flags: dict,
        trunc_flags: dict,
        len_lookback_buffer: int | str,
    ) -> None:
        """Fill the episode from per-env-step lists (see ``__init__``)."""
        num_steps = len(rewards) if rewards is not None else len(observations) - 1
        actions = list(actions) if actions is not None else [{} for _ in range(num_steps)]
        rewards = list(rewards) if rewards is not None else [{} for _ in range(num_steps)]
        infos = list(infos) if infos is not None else [{} for _ in observations]
        extras = (
            list(extra_model_outputs)
            if extra_model_outputs is not None
            else [{} for _ in range(num_steps)]
        )
        sizes = {
            "observations": (len(observations), num_steps + 1),
            "infos": (len(infos), num_steps + 1),
            "actions": (len(actions), num_steps),
            "extra_model_outputs": (len(extras), num_steps),
        }
        bad = [
            f"len({k})={got} (expected {want})" for k, (got, want) in sizes.items() if got != want
        ]
        if bad:
            raise MultiAgentEnvError(
                f"Inconsistent MultiAgentEpisode data for {num_steps} env steps "
                f"(len(rewards)): " + ", ".join(bad) + "."
            )
        if len_lookback_buffer == "auto":
            lookback = num_steps
        elif isinstance(len_lookback_buffer, int) and len_lookback_buffer >= 0:
            lookback = min(len_lookback_buffer, num_steps)
        else:
            raise ValueError(
                f"len_lookback_buffer must be 'auto' or an int >= 0, got {len_lookback_buffer!r}."
            )
        self._len_lookback_buffers = lookback
        self.env_t = self.env_t_started + num_steps - lookback
        all_done = self.is_terminated or self.is_truncated
        columns = idx.split_by_agent(observations, infos, actions, rewards, extras, lookback)
        for aid, c in columns.items():
            # An agent's own flags win; an agent not done by them ends with the episode.
            term = bool(term_flags.get(aid, False))
            trunc = bool(trunc_flags.get(aid, False))
            if not (term or trunc):
                term, trunc = self.is_terminated, self.is_truncated
            if not c.observations:
                if c.has_begin_reward and not (term or trunc or all_done):
                    self._hanging_rewards_begin[aid] = c.begin_reward
                continue
            if c.has_pending_action and (term or trunc):
                if not term:
                    raise MultiAgentEnvError(truncated_without_obs(aid, self.env_t))
                # Terminated while waiting: close the step on a copy of the last obs.
                c.actions.append(c.pending_action)
                c.rewards.append(c.pending_reward)
                for k, v in c.pending_extras.items():
                    c.extras.setdefault(k, []).append(v)
                c.observations.append(c.observations[-1])
                c.infos.append(c.infos[-1])
                c.obs_positions.append(num_steps)
                c.has_pending_reward = False
                c.pending_action = _M
            for k, v in c.extras.items():
                if len(v) != len(c.actions):
                    raise MultiAgentEnvError(
                        f"Agent {aid!r}: extra model output {k!r} is given for {len(v)} of "
                        f"its {len(c.actions)} steps; give it for every step or none."
                    )
            n_lb = max(sum(1 for p in c.obs_positions if p <= lookback) - 1, 0)
            t_started = int(self.agent_t_started[aid])
            sa = SingleAgentEpisode(
                self._agent_episode_ids.get(aid),
                observations=c.observations,
                observation_space=space_for(self.observation_space, aid),
                infos=c.infos,
                actions=c.actions,
                action_space=space_for(self.action_space, aid),
                rewards=c.rewards,
                terminated=term,
                truncated=trunc,
                extra_model_outputs=c.extras,
                t_started=t_started,
                len_lookback_buffer=n_lb,
                agent_id=aid,
                module_id=self.module_for(aid),
                multi_agent_episode_id=self.id_,
            )
            self.agent_episodes[aid] = sa
            mapping: list[Any] = [SKIP_ENV_TS_TAG] * (num_steps + 1)
            for k, p in enumerate(c.obs_positions):
                mapping[p] = t_started - n_lb + k
            self._env_t_to_agent_t[aid] = InfiniteLookbackBuffer(data=mapping, lookback=lookback)
            if c.has_begin_reward:
                self._hanging_rewards_begin[aid] = c.begin_reward
            if sa.is_done:
                self._done_agent_ids.add(aid)
                continue
            if c.has_pending_action:
                self._hanging_actions_end[aid] = c.pending_action
                self._hanging_extra_model_outputs_end[aid] = c.pending_extras
            if c.has_pending_reward:
                self._hanging_rewards_end[aid] = c.pending_reward
        self._update_all_done()

    # ------------------------------------------------------------- chunking
    def to_numpy(self) -> MultiAgentEpisode:
        """Turn every agent's step data into numpy arrays (``SingleAgentEpisode.to_numpy``)."""
        for sa in self.agent_episodes.values():
            sa.to_numpy()
        return self

    def cut(self, len_lookback_buffer: int = 0) -> MultiAgentEpisode:
        """Return the empty successor chunk that continues this ongoing episode.

        The lookback grows beyond ``len_lookback_buffer`` where needed so that
        every ongoing agent's last observation is in it (an agent with a hanging
        action continues from there). The successor has the same id,
        ``env_t_started == self.env_t``, each agent continues at its own ``t``,
        hanging actions carry over, and this chunk's ``_hanging_rewards_end``
        becomes the successor's ``_hanging_rewards_begin`` (added to the agent's
        next completed step).

        Raises:
            RuntimeError: The episode is already done.
            ValueError: ``len_lookback_buffer < 0``.
        """
        if self.is_done:
            raise RuntimeError(
                "Can't call `MultiAgentEpisode.cut()` when the episode is already done!"
            )
        if len_lookback_buffer < 0:
            raise ValueError(f"len_lookback_buffer must be >= 0, got {len_lookback_buffer}.")
        n = len(self)
        return self._sub_episode(n, n, int(len_lookback_buffer), cut=True)

    def slice(self, slice_: slice, *, len_lookback_buffer: int | None = None) -> MultiAgentEpisode:
        """Return env steps ``slice_`` of this chunk as a new chunk (data is copied).

        An agent that acted before the slice ends but observes only after it gets
        that action as hanging; its reward belongs to the later slice. The done
        flags are kept only if the slice reaches the end. Like ``cut``, the
        lookback grows so that agents ongoing at the slice start keep their last
        observation.

        Raises:
            ValueError: A slice step other than 1 or a negative lookback.
        """
        if slice_.step not in (None, 1):
            raise ValueError(f"MultiAgentEpisode.slice() needs step 1, got {slice_.step}.")
        start, stop, _ = slice_.indices(len(self))
        lb = self._len_lookback_buffers if len_lookback_buffer is None else int(len_lookback_buffer)
        if lb < 0:
            raise ValueError(f"len_lookback_buffer must be >= 0, got {lb}.")
        return self._sub_episode(start, max(stop, start), lb, cut=False)

    def __getitem__(self, item: slice) -> MultiAgentEpisode:
        """Return ``self.slice(item)``; only slices are supported.

        Raises:
            NotImplementedError: For anything but a slice.
        """
        if isinstance(item, slice):
            return self.slice(item)
        raise NotImplementedError(
            f"MultiAgentEpisode only supports slicing (episode[a:b]), got {type(item).__name__}; "
            "use get_observations()/get_actions()/... for single steps."
        )

    def _sub_episode(self, start: int, stop: int, lookback: int, *, cut: bool) -> MultiAgentEpisode:
        """Build the chunk of env steps ``[start, stop)`` (``cut``: the successor)."""
        n = len(self)
        p0 = self._len_lookback_buffers + start
        p1 = self._len_lookback_buffers + stop
        lookback = min(lookback, p0)
        for aid, sa in self.agent_episodes.items():  # grow: ongoing agents keep their last obs
            data = self._mapping_data(aid)
            q = last_obs_position(data, p0)
            if q is not None and not (sa.is_done and last_obs_position(data) == q):
                lookback = max(lookback, p0 - q)
        w0 = p0 - lookback
        new = type(self)(
            self.id_,
            observation_space=self.observation_space,
            action_space=self.action_space,
            env_t_started=self.env_t_started + start,
            agent_episode_ids=self._agent_episode_ids,
            agent_module_ids=self._agent_to_module_mapping,
            agent_to_module_mapping_fn=self.agent_to_module_mapping_fn,
        )
        new._len_lookback_buffers = lookback
        new.env_t = new.env_t_started + stop - start
        for aid, sa in self.agent_episodes.items():
            data = self._mapping_data(aid)
            window = data[w0 : p1 + 1]
            steps = [(p, v) for p, v in enumerate(window, w0) if v != SKIP_ENV_TS_TAG]
            if not steps:
                continue
            before = [s for s in steps if s[0] <= p0]
            q0, v0 = before[-1] if before else steps[0]
            v1 = steps[-1][1]
            k = sum(1 for p, _ in steps if p < q0)
            s, e = v0 - sa.t_started, v1 - sa.t_started
            if cut and not sa.is_done:
                new_sa = sa.cut(len_lookback_buffer=k)
            else:
                new_sa = sa.slice(slice(s, e), len_lookback_buffer=k)
            new.agent_episodes[aid] = new_sa
            new.agent_t_started[aid] = new_sa.t_started
            new._agent_episode_ids[aid] = sa.id_
            new._env_t_to_agent_t[aid] = InfiniteLookbackBuffer(data=window, lookback=lookback)
            if not cut and aid in self._hanging_rewards_begin:
                # A carried reward waits for the step pending at the end; rewards before
                # the first observation go with the slice that holds that observation.
                if aid in self._carried_begin:
                    if stop == n:
                        new._hanging_rewards_begin[aid] = self._hanging_rewards_begin[aid]
                        new._carried_begin.add(aid)
                else:
                    first = next(p for p, v in enumerate(data) if v != SKIP_ENV_TS_TAG)
                    if p0 < first <= p1 or (start == 0 and first <= p1):
                        new._hanging_rewards_begin[aid] = self._hanging_rewards_begin[aid]
            if new_sa.is_done:
                new._done_agent_ids.add(aid)
                continue
            self._carry_hanging(aid, sa, new, e, stop == n, cut)
        if cut:
            for aid, r in self._hanging_rewards_begin.items():
                if aid not in self.agent_episodes:  # still waiting for a first observation
                    new._hanging_rewards_begin[aid] = r
            new._custom_data = copy.deepcopy(self._custom_data)
            new._start_time = self._last_step_time or self._start_time
        else:
            if stop == n:
                for aid, r in self._hanging_rewards_begin.items():
                    if aid not in self.agent_episodes:
                        new._hanging_rewards_begin[aid] = r
                new.is_terminated, new.is_truncated = self.is_terminated, self.is_truncated
            new._custom_data = copy.deepcopy(self._custom_data)
            new._start_time, new._last_step_time = self._start_time, self._last_step_time
        return new

    def _carry_hanging(
        self,
        aid: Any,
        sa: SingleAgentEpisode,
        new: MultiAgentEpisode,
        e: int,
        at_end: bool,
        cut: bool,
    ) -> None:
        """Set ``aid``'s hanging values in a sub-episode ``new`` of this one."""
        if cut:
            if aid in self._hanging_actions_end:
                new._hanging_actions_end[aid] = self._hanging_actions_end[aid]
                new._hanging_extra_model_outputs_end[aid] = dict(
                    self._hanging_extra_model_outputs_end.get(aid) or {}
                )
            pending = self._hanging_rewards_end.get(aid, _M)
            if aid in self._carried_begin:
                carried = self._hanging_rewards_begin[aid]
                pending = carried if pending is _M else carried + pending
            if pending is not _M:
                new._hanging_rewards_begin[aid] = pending
                new._carried_begin.add(aid)
            return
        if e < len(sa):  # acted in the slice, observes only after it
            new._hanging_actions_end[aid] = sa.actions.get(e)
            new._hanging_extra_model_outputs_end[aid] = {
                k: b.get(e) for k, b in sa.extra_model_outputs.items()
            }
        elif at_end:
            if aid in self._hanging_actions_end:
                new._hanging_actions_end[aid] = self._hanging_actions_end[aid]
                new._hanging_extra_model_outputs_end[aid] = dict(
                    self._hanging_extra_model_outputs_end.get(aid) or {}
                )
            if aid in self._hanging_rewards_end:
                new._hanging_rewards_end[aid] = self._hanging_rewards_end[aid]

    def concat_episode(self, other: MultiAgentEpisode) -> None:
        """Append the successor chunk ``other`` (e.g. from ``cut()``) to this one, in place.

        Agents only in ``other`` are adopted; agents done here are skipped; the
        others are concatenated per agent. ``other``'s hanging values replace ours.

        Raises:
            AssertionError: Different ids, this chunk is done, or ``self.env_t !=
                other.env_t_started``.
        """
        if other.id_ != self.id_:
            raise AssertionError(
                f"Cannot concat episodes with different ids: {self.id_!r} vs {other.id_!r}."
            )
        if self.is_done:
            raise AssertionError("Cannot concat to a MultiAgentEpisode that is already done.")
        if self.env_t != other.env_t_started:
            raise AssertionError(
                f"Cannot concat: self.env_t ({self.env_t}) must equal other.env_t_started "
                f"({other.env_t_started})."
            )
        lb_self, lb_other = self._len_lookback_buffers, other._len_lookback_buffers
        for aid, osa in other.agent_episodes.items():
            odata = other._mapping_data(aid)
            sa = self.agent_episodes.get(aid)
            if sa is not None and sa.is_done:
                continue
            adopted = sa is None
            if sa is not None:
                sa.concat_episode(osa)
                self._mapping_data(aid).extend(odata[lb_other + 1 :])
            else:
                self.agent_episodes[aid] = osa
                self.agent_t_started[aid] = osa.t_started
                head = [SKIP_ENV_TS_TAG] * (lb_self + len(self))
                self._env_t_to_agent_t[aid] = InfiniteLookbackBuffer(
                    data=head + list(odata[lb_other:]), lookback=lb_self
                )
                if aid in other._agent_to_module_mapping:
                    self._agent_to_module_mapping.setdefault(
                        aid, other._agent_to_module_mapping[aid]
                    )
            # Other's hanging state replaces ours for this agent.
            self._hanging_actions_end.pop(aid, None)
            self._hanging_extra_model_outputs_end.pop(aid, None)
            self._hanging_rewards_end.pop(aid, None)
            if aid in self._carried_begin:
                self._carried_begin.discard(aid)
                self._hanging_rewards_begin.pop(aid, None)
            if aid in other._hanging_actions_end:
                self._hanging_actions_end[aid] = other._hanging_actions_end[aid]
                self._hanging_extra_model_outputs_end[aid] = dict(
                    other._hanging_extra_model_outputs_end.get(aid) or {}
                )
            pending = other._hanging_rewards_end.get(aid, _M)
            if aid in other._carried_begin:
                carried = other._hanging_rewards_begin[aid]
                pending = carried if pending is _M else carried + pending
            if pending is not _M:
                self._hanging_rewards_end[aid] = pending
            begin = other._hanging_rewards_begin.get(aid, _M)
            if aid in other._carried_begin or begin is _M:
                if adopted:
                    self._hanging_rewards_begin.pop(aid, None)
            elif adopted:  # `other` already holds what we had before its first obs
                self._hanging_rewards_begin[aid] = begin
            else:
                self._hanging_rewards_begin[aid] = self._hanging_rewards_begin.get(aid, 0.0) + begin
        # Agents still without an observation: `other` (a successor) has the full tally,
        # or has dropped them (they ended before observing).
        for aid in [a for a in self._hanging_rewards_begin if a not in self.agent_episodes]:
            if aid not in other._hanging_rewards_begin:
                del self._hanging_rewards_begin[aid]
        for aid, r in other._hanging_rewards_begin.items():
            if aid not in other.agent_episodes:
                self._hanging_rewards_begin[aid] = r
        self.env_t = other.env_t
        self.is_terminated = other.is_terminated
        self.is_truncated = other.is_truncated
        self._custom_data.update(other._custom_data)
        if other._last_step_time is not None:
            self._last_step_time = other._last_step_time
        self._done_agent_ids = {aid for aid, sa in self.agent_episodes.items() if sa.is_done}
        self._stepped_cache = None
        self._update_all_done()
        self.validate()

    # ----------------------------------------------------------------- state
    def get_state(self) -> dict[str, Any]:
        """Return the episode as plain data (no pickle); ``from_state`` restores it.

        The mapping function is not part of the state (the per-agent module ids
        are); pass it to ``from_state`` if new agents may still appear.
        """
        return {
            "id_": self.id_,
            "agent_to_module_mapping": dict(self._agent_to_module_mapping),
            "observation_space": _spaces_to_state(self.observation_space),
            "action_space": _spaces_to_state(self.action_space),
            "env_t_started": self.env_t_started,
            "env_t": self.env_t,
            "agent_t_started": dict(self.agent_t_started),
            "env_t_to_agent_t": {aid: b.get_state() for aid, b in self.env_t_to_agent_t.items()},
            "agent_episode_ids": dict(self._agent_episode_ids),
            "hanging_actions_end": dict(self._hanging_actions_end),
            "hanging_extra_model_outputs_end": {
                aid: dict(v) for aid, v in self._hanging_extra_model_outputs_end.items()
            },
            "hanging_rewards_end": dict(self._hanging_rewards_end),
            "hanging_rewards_begin": dict(self._hanging_rewards_begin),
            "carried_begin": list(self._carried_begin),
            "is_terminated": self.is_terminated,
            "is_truncated": self.is_truncated,
            "agent_episodes": {aid: sa.get_state() for aid, sa in self.agent_episodes.items()},
            "start_time": self._start_time,
            "last_step_time": self._last_step_time,
            "len_lookback_buffers": self._len_lookback_buffers,
            "custom_data": dict(self._custom_data),
        }

    @classmethod
    def from_state(
        cls, state: dict[str, Any], *, agent_to_module_mapping_fn: Callable[..., Any] | None = None
    ) -> MultiAgentEpisode:
        """Rebuild an episode from ``get_state()`` output (and validate it)."""
        ep = cls(
            state["id_"],
            observation_space=_spaces_from_state(state.get("observation_space")),
            action_space=_spaces_from_state(state.get("action_space")),
            env_t_started=state["env_t_started"],
            agent_t_started=state.get("agent_t_started"),
            agent_episode_ids=state.get("agent_episode_ids"),
            agent_module_ids=state.get("agent_to_module_mapping"),
            agent_to_module_mapping_fn=agent_to_module_mapping_fn,
        )
        ep.env_t = int(state["env_t"])
        ep._len_lookback_buffers = int(state.get("len_lookback_buffers", 0))
        ep._env_t_to_agent_t = {
            aid: InfiniteLookbackBuffer.from_state(s)
            for aid, s in state["env_t_to_agent_t"].items()
        }
        ep.agent_episodes = {
            aid: SingleAgentEpisode.from_state(s) for aid, s in state["agent_episodes"].items()
        }
        ep._hanging_actions_end = dict(state.get("hanging_actions_end") or {})
        ep._hanging_extra_model_outputs_end = {
            aid: dict(v) for aid, v in (state.get("hanging_extra_model_outputs_end") or {}).items()
        }
        ep._hanging_rewards_end = dict(state.get("hanging_rewards_end") or {})
        ep._hanging_rewards_begin = dict(state.get("hanging_rewards_begin") or {})
        ep._carried_begin = set(state.get("carried_begin") or ())
        ep.is_terminated = bool(state["is_terminated"])
        ep.is_truncated = bool(state["is_truncated"])
        ep._start_time = state.get("start_time")
        ep._last_step_time = state.get("last_step_time")
        ep._custom_data = dict(state.get("custom_data") or {})
        ep._done_agent_ids = {aid for aid, sa in ep.agent_episodes.items() if sa.is_done}
        ep.validate()
        return ep

    # ---------------------------------------------------------------- checks
    def validate(self) -> None:
        """Check every agent episode and the env-step mapping.

        Raises:
            AssertionError: An inconsistency (the message says which).
        """
        missing = set(self.agent_episodes) - set(self._env_t_to_agent_t)
        if missing:  # (a mapping without episode is fine: the runner prunes empty ones)
            raise AssertionError(f"Agents {sorted(map(str, missing))} have no env-step mapping.")
        lookback = self._len_lookback_buffers
        target = lookback + len(self) + 1
        for aid, sa in self.agent_episodes.items():
            sa.validate()
            data = self._mapping_data(aid)
            if len(data) != target or self._env_t_to_agent_t[aid].lookback != lookback:
                raise AssertionError(
                    f"Agent {aid!r}: mapping has {len(data)} entries (lookback "
                    f"{self._env_t_to_agent_t[aid].lookback}); expected {target} ({lookback})."
                )
            steps = [v for v in data if v != SKIP_ENV_TS_TAG]
            if steps and (
                steps != list(range(steps[0], steps[0] + len(steps))) or steps[-1] != sa.t
            ):
                raise AssertionError(
                    f"Agent {aid!r}: mapped agent steps {steps} are not consecutive up to t={sa.t}."
                )
        for aid in self._hanging_actions_end:
            sa = self.agent_episodes.get(aid)
            if sa is not None and sa.is_done:
                raise AssertionError(f"Agent {aid!r} is done but has a hanging action.")

    # --------------------------------------------------------------- display
    def _timing_grid(self) -> str:
        """Return the agent timing grid that ``print()`` shows."""
        lookback = self._len_lookback_buffers
        first = self.env_t_started - lookback
        header = [str(first + p) for p in range(lookback + len(self) + 1)]
        rows = {
            str(aid): ["." if v == SKIP_ENV_TS_TAG else str(v) for v in self._mapping_data(aid)]
            for aid in self.agent_episodes
        }
        width = max([len(c) for c in header] + [len(c) for r in rows.values() for c in r])
        name_w = max([len("env_t")] + [len(a) for a in rows])

        def line(name: str, cells: list[str]) -> str:
            parts = [c.rjust(width) for c in cells]
            if lookback:
                parts.insert(lookback, "|")
            return name.ljust(name_w) + "  " + " ".join(parts)

        return "\n".join([line("env_t", header)] + [line(a, r) for a, r in rows.items()])

    def print(self) -> None:
        """Print the agent timing grid: per env step, each agent's own step ("." = none).

        Example (the reset ``{a, b}``, then ``b`` skips one step)::

            env_t  0 1 2
            a      0 1 2
            b      0 . 1

        Lookback columns are separated from the chunk by ``|``.
        """
        print(self._timing_grid())

    def __repr__(self) -> str:
        """Summarise the chunk: length, done flag, per-agent returns and id."""
        returns = {aid: sa.get_return() for aid, sa in self.agent_episodes.items()}
        return f"MAEps(len={len(self)} done={self.is_done} Rs={returns} id_={self.id_})"


def _spaces_to_state(spaces: Any) -> dict[str, Any] | None:
    """Encode per-agent spaces (a dict or ``gym.spaces.Dict``) as plain data."""
    if not spaces:
        return None
    kind = "gym_dict" if isinstance(spaces, gym.spaces.Dict) else "dict"
    return {"kind": kind, "spaces": {aid: gym_space_to_dict(s) for aid, s in spaces.items()}}


def _spaces_from_state(state: dict[str, Any] | None) -> Any:
    """Decode per-agent spaces written by ``_spaces_to_state``."""
    if not state:
        return {}
    spaces = {aid: gym_space_from_dict(s) for aid, s in state["spaces"].items()}
    return gym.spaces.Dict(spaces) if state["kind"] == "gym_dict" else spaces
