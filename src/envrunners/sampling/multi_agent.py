"""The multi-agent sampling loop: per-module batched inference over all sub-envs.

One iteration: for every module, the observations of all agents mapped to it,
across all sub-envs, are stacked once (``np.stack``) and go through ONE forward
pass; the actions are scattered back into per-sub-env action dicts; the vector
env steps once; each sub-env's results are recorded in its ``MultiAgentEpisode``
(which holds actions until the agent's next observation and sums the rewards in
between), and the observations of agents that act next are grouped by module
for the next iteration. Work per step is O(agents), never quadratic. Plain
simultaneous-move steps take ``MultiAgentEpisode.try_add_plain_env_step`` (direct
appends, extra model outputs as ``(keys, values)`` pairs); any other step falls
back to ``add_env_step``.

Stateful modules (``use_states``) keep one recurrent-state row per (sub-env,
agent) in a ``ModuleStates``: the rows of the agents that act are gathered for
the module's one forward and its state out scattered back, so an agent that
does not act in a step (turn-based envs) keeps its state. The state out is
recorded per agent step under ``Columns.STATE_OUT`` with the other extra model
outputs, as RLlib does. A row starts at the module's initial state and is
released when its agent's episode, its sub-env's episode or the sub-env ends.

Semantics follow RLlib's ``MultiAgentEnvRunner``: ``NEXT_STEP`` autoreset (the
reset step is recorded with ``add_env_reset`` and not counted), finished
episodes first, in-progress chunks ``cut()`` so the next call continues them,
no replacement episode after the last one in episode mode (spec §20.1).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from itertools import repeat
from typing import Any

import numpy as np

from envrunners.core.columns import Columns
from envrunners.env.env_runner import ENV_STEP_FAILURE
from envrunners.env.multi_agent_episode import MultiAgentEpisode
from envrunners.errors import MultiAgentEnvError, NonFiniteEnvDataError
from envrunners.sampling._agent_batching import action_rows, rows, stack
from envrunners.sampling._agent_states import ModuleStates
from envrunners.sampling._multi_agent_extras import SEQ_KEY, ExtrasTape, flush_agent_rows
from envrunners.sampling.finite_checks import AgentObsRewardCheck, episode_step_error
from envrunners.sampling.sample_result import MultiAgentEpisodeStats, SampleResult
from envrunners.utils.gc_pause import paused_gc

__all__ = ["ActFn", "MultiAgentSampleResult", "MultiAgentSampler"]

_ALL = "__all__"
_NO_FLAGS: dict = {}

#: ``act_fn(module_id, obs_batch, explore, t) -> {"actions": ..., extra outputs...}``;
#: for a stateful module (see ``MultiAgentSampler.use_states``) it is called as
#: ``act_fn(module_id, obs_batch, explore, t, state, extra_inputs)`` (``extra_inputs``:
#: ``prev_actions`` / ``prev_rewards`` or None) and its result also holds the next
#: state under ``Columns.STATE_OUT`` (``"state_out"``).
ActFn = Callable[..., dict[str, Any]]

#: What ``run()`` returns.
MultiAgentSampleResult = SampleResult[MultiAgentEpisode, MultiAgentEpisodeStats]


class MultiAgentSampler:
    """Runs the multi-agent loop over one vector env; keeps episode state between calls.

    Args:
        num_envs: Sub-envs in the vector env.
        new_episode: ``new_episode(env_index) -> MultiAgentEpisode`` (fires the callback).
        reset_fn: ``reset_fn() -> (obs list, infos list)`` of the vector env.
        step_fn: ``step_fn(actions list)`` -> the 5 lists, or ``ENV_STEP_FAILURE`` after
            it recreated the whole vector env.
        observation_spaces: Per-agent observation spaces (unknown agents are an error).
        action_spaces: Per-agent action spaces (for random actions).
        obs_fns: Per module, an env-to-module transform of the stacked observations.
        action_fns: Per module, a module-to-env transform of the action batch.
        lookback: ``episode_lookback_horizon`` for the continuation chunks.
        fire: ``fire(event, episode, env_index, **extra)``; only called for ``events``.
        events: The episode callback events somebody listens to.
        failed_fn: ``failed_fn()`` -> per sub-env, whether the vector env recreated
            it in the last step (its partial episode is then dropped), or None.
        recv_fn: For an asynchronous vector env (``start_async``): ``recv_fn()`` ->
            ``(env_ids, obs, rewards, terminateds, truncateds, infos)`` of the ready
            sub-envs (per-agent dicts), or ``ENV_STEP_FAILURE`` after it recreated the env.
        send_fn: ``send_fn(action dicts, env_ids)`` -> None, or ``ENV_STEP_FAILURE``.
        async_reset_fn: ``async_reset_fn()`` resets an asynchronous vector env without
            waiting (its reset observations come with the next ``recv_fn`` calls).
    """

    def __init__(
        self,
        *,
        num_envs: int,
        new_episode: Callable[[int], MultiAgentEpisode],
        reset_fn: Callable[[], tuple[list, list]],
        step_fn: Callable[[list], Any],
        observation_spaces: dict,
        action_spaces: dict,
        obs_fns: dict[str, Callable[[Any], Any]] | None = None,
        action_fns: dict[str, Callable[[Any], Any]] | None = None,
        lookback: int = 1,
        fire: Callable[..., None] | None = None,
        events: frozenset[str] = frozenset(),
        failed_fn: Callable[[], Any] | None = None,
        recv_fn: Callable[[], Any] | None = None,
        send_fn: Callable[[list, Any], Any] | None = None,
        async_reset_fn: Callable[[], None] | None = None,
        pause_gc: bool = True,
    ):
        self.num_envs = num_envs
        self.new_episode = new_episode
        self.reset_fn = reset_fn
        self.step_fn = step_fn
        self.observation_spaces = observation_spaces
        self.action_spaces = action_spaces
        self.obs_fns = obs_fns or {}
        self.action_fns = action_fns or {}
        self.lookback = max(0, int(lookback))
        self.fire = fire
        self.events = events if fire is not None else frozenset()
        self.failed_fn = failed_fn
        self.recv_fn = recv_fn
        self.send_fn = send_fn
        self.async_reset_fn = async_reset_fn
        #: Whether ``run()`` pauses the cyclic collector (the runners'
        #: ``pause_gc_during_sample``; see ``envrunners.utils.gc_pause``).
        self.pause_gc = pause_gc
        #: Whether ``start_async()`` began the episodes: ``run()`` steps ready-first.
        self.ready_first = False
        #: Ready-first: per sub-env, the (module-side) actions and extra outputs in flight.
        self._inflight_actions: list[dict] = [{} for _ in range(num_envs)]
        self._inflight_extras: list[dict] = [{} for _ in range(num_envs)]
        self.weights_seq_no = 0
        self.episodes: list[MultiAgentEpisode] = []
        self._pending: list[bool] = []
        self._modmaps: list[dict] = []
        self._start_times: list[float] = []
        self._to_module: dict[str, tuple[Any, list[tuple[int, Any]]]] = {}
        self._totals: dict[str, _EpisodeTotals] = {}
        self._prev_chunks: dict[str, list[MultiAgentEpisode]] = defaultdict(list)
        #: While a run defers extra outputs: per module, its tape (else None) ...
        self._tapes: dict[Any, ExtrasTape] | None = None
        #: ... and per sub-env, ``{agent_id: [tape row per step not yet recorded]}``.
        self._tape_rows: list[dict] = []
        #: Per stateful module id, its state rows; per sub-env, ``{agent_id: (rows, slot)}``.
        self._states: dict[Any, ModuleStates] = {}
        self._slots: list[dict] = [{} for _ in range(num_envs)]
        #: Per stateful module id acting next step, the slots of its batch's rows.
        self._state_slots: dict[Any, np.ndarray] = {}
        self.started = False
        #: Check every step's raw observations (final ones too) and rewards for NaN/inf.
        self.check_finite = False
        #: ``on_non_finite(errors, results)``: raises, or returns the step's results
        #: with each bad sub-env's reset in its place, or None after recreating the
        #: whole vector env (the loop then starts fresh episodes). None: raise.
        self.on_non_finite: Callable[[list[NonFiniteEnvDataError], tuple], Any] | None = None
        self._finite: AgentObsRewardCheck | None = None

    def use_states(self, modules: dict[Any, Any]) -> None:
        """Carry recurrent state for these stateful modules (``{module_id: module}``).

        Rows of a module id whose module object changed (or that is no longer
        stateful) are dropped: its agents start again from the initial state.
        """
        states = self._states
        if states.keys() == modules.keys() and all(
            states[mid].fits(m) for mid, m in modules.items()
        ):
            return
        self._states = {
            mid: states[mid] if mid in states and states[mid].fits(m) else ModuleStates(m)
            for mid, m in modules.items()
        }
        self._assign_slots()

    # -- episodes -----------------------------------------------------------------
    def acting_agents(self, module_id: Any) -> list[tuple[int, Any]]:
        """``(sub-env index, agent id)`` of each row the next ``act_fn`` call for
        ``module_id`` receives, in row order (empty when no agent of it acts)."""
        group = self._to_module.get(module_id)
        return [] if group is None else list(group[1])

    def start(self) -> int:
        """Reset every sub-env and begin fresh episodes; returns how many in-progress ones ended."""
        dropped = self._begin_episodes(ready_first=False)
        obs, infos = self.reset_fn()
        if self.obs_fns:
            obs = self._transform_obs(obs)
        self._ingest(obs, None, None, None, infos, None, None, SampleResult(), None)
        self.started = True
        return dropped

    def start_async(self) -> int:
        """Begin fresh episodes on an asynchronous vector env just ``async_reset``.

        No observation is in hand: each sub-env's reset observations come with its
        first ``recv_fn()``, and ``run()`` steps ready-first from then on. Returns how
        many in-progress episodes ended.
        """
        dropped = self._begin_episodes(ready_first=True)
        self._to_module = {}
        self._state_slots = {}
        self.started = True
        return dropped

    def _begin_episodes(self, ready_first: bool) -> int:
        dropped = sum(1 for p, e in zip(self._pending, self.episodes) if not p and e.env_t > 0)
        self.started = False
        self.ready_first = ready_first
        self._totals.clear()
        self._prev_chunks.clear()
        n = self.num_envs
        self._modmaps = [{} for _ in range(n)]
        self._tape_rows = [{} for _ in range(n)]
        self._slots = [{} for _ in range(n)]
        for store in self._states.values():
            store.clear()
        self._start_times = [time.time()] * n
        self.episodes = [self.new_episode(i) for i in range(n)]
        self._pending = [True] * n
        self._inflight_actions = [{} for _ in range(n)]
        self._inflight_extras = [{} for _ in range(n)]
        return dropped

    def _start_over(self) -> int:
        """After the whole vector env was recreated: reset it and begin fresh episodes."""
        if self.ready_first:
            self.async_reset_fn()
            return self.start_async()
        return self.start()

    def _module_of(self, i: int, episode: MultiAgentEpisode, aid: Any) -> Any:
        if aid not in self.observation_spaces:
            raise MultiAgentEnvError(
                f"sub-environment {i} returned an observation for agent {aid!r}, which has no "
                f"entry in the env's observation_spaces (known agents: "
                f"{list(self.observation_spaces)}). Add it to the env's `possible_agents`, "
                "`observation_spaces` and `action_spaces`."
            )
        mid = episode.module_for(aid)
        self._modmaps[i][aid] = mid
        return mid

    def _transform_obs(self, obs_l: list[dict]) -> list[dict]:
        """Apply the per-module env-to-module transforms; the episodes store the result."""
        groups: dict[Any, tuple[list, list]] = {}
        for i, obs_i in enumerate(obs_l):
            mm, ep = self._modmaps[i], self.episodes[i]
            for aid, o in obs_i.items():
                mid = mm.get(aid)
                if mid is None:
                    mid = self._module_of(i, ep, aid)
                g = groups.get(mid)
                if g is None:
                    g = groups[mid] = ([], [])
                g[0].append(o)
                g[1].append((i, aid))
        new: dict[tuple[int, Any], Any] = {}
        for mid, (items, idx) in groups.items():
            fn = self.obs_fns.get(mid)
            batch = stack(items)
            new.update(zip(idx, rows(fn(batch) if fn is not None else batch)))
        return [{aid: new[(i, aid)] for aid in obs_i} for i, obs_i in enumerate(obs_l)]

    # -- the loop -----------------------------------------------------------------
    def run(
        self,
        *,
        act_fn: ActFn | None,
        explore: bool,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        count_agent_steps: bool = False,
        t_offset: int = 0,
        defer_extras: bool = False,
    ) -> MultiAgentSampleResult:
        """Sample ``num_timesteps`` (env or agent) steps or ``num_episodes`` whole episodes.

        ``act_fn`` None means random actions from the agents' action spaces.
        ``defer_extras``: the caller numpy's the returned episodes (``to_numpy``), so
        extra model outputs may go through per-module tapes (see
        ``envrunners.sampling._multi_agent_extras``) when no episode callbacks listen.
        """
        if not self.started:
            raise RuntimeError("MultiAgentSampler.run() called before start()")
        res: MultiAgentSampleResult = SampleResult()
        n = self.num_envs
        episode_mode = num_episodes is not None
        target = int(num_episodes if episode_mode else num_timesteps or 0)
        self._tapes = {} if defer_extras and act_fn is not None and not self.events else None
        self._tape_rows = [{} for _ in range(n)]
        loop = self._loop_ready_first if self.ready_first else self._loop
        with paused_gc(self.pause_gc) as gc_backstop:  # see envrunners.utils.gc_pause
            env_ts, agent_ts = loop(
                res, act_fn, explore, target, episode_mode, count_agent_steps, t_offset, gc_backstop
            )
            res.env_steps, res.agent_steps = env_ts, agent_ts
            if self._tapes is not None:  # (ready-first: the actions in flight keep their outputs)
                self._stop_deferring(self._inflight_extras if self.ready_first else None)
            if not episode_mode:
                self._cut_ongoing(res)
        return res

    def _loop(
        self,
        res: MultiAgentSampleResult,
        act_fn: ActFn | None,
        explore: bool,
        target: int,
        episode_mode: bool,
        count_agent_steps: bool,
        t_offset: int,
        gc_backstop: Callable[[], None],
    ) -> tuple[int, int]:
        """The vector-step loop of ``run``; returns the env and agent steps taken."""
        n = self.num_envs
        env_ts = agent_ts = 0
        finite = self._finite_check() if self.check_finite else None
        while (
            (len(res.done) < target)
            if episode_mode
            else ((agent_ts if count_agent_steps else env_ts) < target)
        ):
            gc_backstop()
            actions: list[dict] = [{} for _ in range(n)]
            extras: list[dict] = [{} for _ in range(n)]
            env_actions = self._act_all(act_fn, explore, t_offset + env_ts, actions, extras, None)
            results = self.step_fn(env_actions)
            if results is ENV_STEP_FAILURE:
                res.num_env_failures += 1
                res.num_dropped_episodes += self._start_over()
                env_ts = agent_ts = 0
                continue
            vetted = self._vet(results, res, finite)
            if vetted is None:  # the whole vector env was recreated: start afresh
                env_ts = agent_ts = 0
                continue
            lists, lost_env, lost_agent = vetted
            # Dropped steps do not count toward the target (the batch keeps its size).
            env_ts -= lost_env
            agent_ts -= lost_agent
            goal = target if episode_mode else None
            d_env, d_agent = self._ingest(*lists, actions, extras, res, goal)
            env_ts += d_env
            agent_ts += d_agent
        return env_ts, agent_ts

    def _loop_ready_first(
        self,
        res: MultiAgentSampleResult,
        act_fn: ActFn | None,
        explore: bool,
        target: int,
        episode_mode: bool,
        count_agent_steps: bool,
        t_offset: int,
        gc_backstop: Callable[[], None],
    ) -> tuple[int, int]:
        """``_loop`` on an asynchronous vector env: act on whichever sub-envs are ready first.

        Per iteration: one ``recv_fn()`` of the ready sub-envs, their results recorded in
        their episodes with the actions they were sent (``_ingest`` over just those),
        one forward per module for just their agents (a stateful module gathers and
        scatters those agents' state rows) and one ``send_fn``. The rules are the
        synchronous loop's per sub-env, so each sub-env's episodes are what that loop
        gives it. At the end every sub-env has its actions in flight; they and their
        extra outputs are recorded when its results come, in the next call.
        """
        n = self.num_envs
        env_ts = agent_ts = 0
        finite = self._finite_check() if self.check_finite else None
        # Actions (and extra outputs) in flight before this call: recorded per step.
        carried = set(range(n))
        recv_fn, send_fn = self.recv_fn, self.send_fn
        while (
            (len(res.done) < target)
            if episode_mode
            else ((agent_ts if count_agent_steps else env_ts) < target)
        ):
            gc_backstop()
            results = recv_fn()
            if results is ENV_STEP_FAILURE:
                res.num_env_failures += 1
                res.num_dropped_episodes += self._start_over()
                env_ts = agent_ts = 0
                continue
            ids = [int(i) for i in results[0]]
            # Per sub-env lists (empty dicts for the sub-envs still stepping).
            vetted = self._vet(tuple(_scatter(col, ids, n) for col in results[1:]), res, finite)
            if vetted is None:  # the whole vector env was recreated: start afresh
                env_ts = agent_ts = 0
                continue
            lists, lost_env, lost_agent = vetted
            env_ts -= lost_env
            agent_ts -= lost_agent
            actions, extras = self._inflight_actions, self._inflight_extras
            goal = target if episode_mode else None
            d_env, d_agent = self._ingest(*lists, actions, extras, res, goal, ids, carried)
            env_ts += d_env
            agent_ts += d_agent
            if episode_mode and len(res.done) >= target:
                break  # §20.1: the next call resets every sub-env; nothing more to send
            carried.difference_update(ids)
            for i in ids:
                actions[i] = {}
                extras[i] = {}
            env_actions = self._act_all(act_fn, explore, t_offset + env_ts, actions, extras, ids)
            if send_fn([env_actions[i] for i in ids], results[0]) is ENV_STEP_FAILURE:
                res.num_env_failures += 1
                res.num_dropped_episodes += self._start_over()
                env_ts = agent_ts = 0
        return env_ts, agent_ts

    def _act_all(
        self,
        act_fn: ActFn | None,
        explore: bool,
        t: int,
        actions: list[dict],
        extras: list[dict],
        env_ids: list[int] | None,
    ) -> list[dict]:
        """One forward per module for the agents in ``_to_module``; their actions and extra
        outputs go into ``actions[i]`` / ``extras[i]`` (per sub-env dicts, filled in place).

        Returns the actions for the env: ``actions`` itself, or per sub-env dicts with the
        module-to-env transforms applied (filled for ``env_ids``; None: every sub-env).
        """
        env_actions = actions
        if act_fn is None:
            spaces = self.action_spaces
            for _, idx in self._to_module.values():
                for i, aid in idx:
                    actions[i][aid] = spaces[aid].sample()
            return env_actions
        n = self.num_envs
        seq = self.weights_seq_no
        action_fns = self.action_fns
        tapes = self._tapes
        state_slots = self._state_slots
        for mid, (batch, idx) in self._to_module.items():
            slots = state_slots.get(mid) if state_slots else None
            if slots is None:
                out = act_fn(mid, batch, explore, t)
            else:  # one forward for the agents that act; the others keep their rows
                store = self._states[mid]
                state, inputs = store.gather(slots)
                out = act_fn(mid, batch, explore, t, state, inputs)
                store.after_act(slots, out[Columns.STATE_OUT], out["actions"])
            acts = out.pop("actions")
            a_rows = action_rows(acts)
            fn = action_fns.get(mid)
            if fn is not None:
                if env_actions is actions:
                    env_actions = [{} for _ in range(n)]
                e_rows = rows(fn(acts))
                for k, (i, aid) in enumerate(idx):
                    env_actions[i][aid] = e_rows[k]
            n_rows = len(idx)
            if tapes is not None:
                tape = tapes.get(mid)
                if tape is None:
                    tape = ExtrasTape.create(out, n_rows)
                    if tape is not None:
                        tapes[mid] = tape
                g = None if tape is None else tape.try_write(out, n_rows)
                if g is not None:
                    for (i, aid), a in zip(idx, a_rows):
                        actions[i][aid] = a
                        extras[i][aid] = g
                        g += 1
                    continue
                self._stop_deferring(extras)
                tapes = None
            keys = (*out, SEQ_KEY)
            cols = [rows(v) for v in out.values()]
            cols.append([seq] * n_rows)
            # (keys, values) pairs, not dicts: see MultiAgentEpisode.try_add_plain_env_step
            for (i, aid), a, ex in zip(idx, a_rows, zip(repeat(keys), zip(*cols))):
                actions[i][aid] = a
                extras[i][aid] = ex
        if env_actions is not actions:  # modules without a transform act as is
            for i in range(n) if env_ids is None else env_ids:
                for aid, a in actions[i].items():
                    env_actions[i].setdefault(aid, a)
        return env_actions

    def _vet(
        self, results: tuple, res: MultiAgentSampleResult, finite: AgentObsRewardCheck | None
    ) -> tuple | None:
        """A step's five per-sub-env lists, ready to record: episodes of recreated sub-envs
        dropped, non-finite data handled, observations transformed for the modules.

        Returns ``(the five lists, env steps, agent steps)``, the steps being those of
        this call dropped with those episodes, or None after the whole vector env was
        recreated (and reset).
        """
        obs_l, rew_l, term_l, trunc_l, info_l = results
        lost_env = lost_agent = 0
        if self.failed_fn is not None:
            failed = self.failed_fn()
            if failed is not None and any(failed):
                lost_env, lost_agent = self._restart_episodes(failed, res)
        if finite is not None and not finite.ok(obs_l, rew_l):
            checked = self._non_finite(finite, results, res)
            if checked is None:
                return None
            obs_l, rew_l, term_l, trunc_l, info_l = checked[:5]
            lost_env += checked[5]
            lost_agent += checked[6]
        if self.obs_fns:
            obs_l = self._transform_obs(obs_l)
        return (obs_l, rew_l, term_l, trunc_l, info_l), lost_env, lost_agent

    # -- non-finite data ----------------------------------------------------------
    def _finite_check(self) -> AgentObsRewardCheck:
        """The check for the current observation spaces (rebuilt when they change)."""
        check = self._finite
        if check is None or check.observation_spaces is not self.observation_spaces:
            check = self._finite = AgentObsRewardCheck(self.observation_spaces)
        return check

    def _non_finite(
        self, check: AgentObsRewardCheck, results: tuple, res: MultiAgentSampleResult
    ) -> tuple | None:
        """A step with non-finite observations or rewards: name them, then handle.

        Each bad sub-env gets a ``NonFiniteEnvDataError`` naming its index, the env step
        of its episode and the column (``obs[agent]``, ``rewards[agent]``). Before
        anything is recorded, ``on_non_finite(errors, results)`` raises, recreates the
        whole vector env (returns None: so does this) or recreates the bad sub-envs,
        whose reset observations it puts in their place; their episodes are dropped
        as for a sub-env whose step raised. Returns the results plus the env and agent
        steps of this call dropped with those episodes.
        """
        found = check.find(results[0], results[1])
        if not found:  # the fast test overflowed on large finite values
            return (*results, 0, 0)
        errors = []
        for i, column, value in found:
            if self._pending[i]:  # the reset observation of its next episode
                step, episode_id = 0, None
            else:
                episode = self.episodes[i]
                step, episode_id = episode.env_t + 1, episode.id_
            errors.append(episode_step_error(i, column, value, step, episode_id))
        if self.on_non_finite is None:
            raise errors[0]
        patched = self.on_non_finite(errors, results)
        if patched is None:
            res.num_env_failures += 1
            res.num_dropped_episodes += self._start_over()
            return None
        failed = [False] * self.num_envs
        for err in errors:
            failed[err.sub_env_index] = True
        return (*patched, *self._restart_episodes(failed, res))

    def _flush_tape_rows(self, i: int) -> None:
        """Record sub-env ``i``'s deferred extra outputs in its episode (see ``run``)."""
        pending = self._tape_rows[i]
        if pending:
            flush_agent_rows(
                self.episodes[i], pending, self._modmaps[i], self._tapes, self.weights_seq_no
            )

    def _stop_deferring(self, extras: list[dict] | None) -> None:
        """Flush every deferred row; turn this step's tape rows into extra-output dicts."""
        tapes = self._tapes
        if tapes is None:
            return
        for i in range(self.num_envs):
            self._flush_tape_rows(i)
        if extras is not None:
            seq = self.weights_seq_no
            for i, ext_i in enumerate(extras):
                mm = self._modmaps[i]
                for aid, g in ext_i.items():
                    if type(g) is int:
                        ext_i[aid] = _pairs(tapes[mm[aid]].row(g, seq))
        self._tapes = None

    def _ingest(
        self,
        obs_l: list[dict],
        rew_l: list[dict] | None,
        term_l: list[dict] | None,
        trunc_l: list[dict] | None,
        info_l: list[dict],
        actions: list[dict] | None,
        extras: list[dict] | None,
        res: MultiAgentSampleResult,
        episode_target: int | None,
        env_ids: Any = None,
        carried: set[int] | None = None,
    ) -> tuple[int, int]:
        """Record one vector step (or reset) and group the next observations by module.

        ``env_ids``: the sub-envs whose entries to record (None: all; ready-first: the
        ready ones). ``carried``: sub-envs whose extra outputs are dicts from an earlier
        ``run()`` (recorded per step even while this run defers to tapes).
        """
        groups: dict[Any, tuple[list, list]] = {}
        counts = res.agent_counts
        events = self.events
        env_steps = agent_steps = 0
        now = time.perf_counter()
        deferring = self._tapes is not None
        for i in range(self.num_envs) if env_ids is None else env_ids:
            obs_i = obs_l[i]
            ep = self.episodes[i]
            mm = self._modmaps[i]
            slots_i = self._slots[i]
            stepped = not self._pending[i]
            try:
                if stepped:
                    term_i, trunc_i = term_l[i], trunc_l[i]  # type: ignore[index]
                    if _ALL not in term_i:
                        raise MultiAgentEnvError(
                            f"the env's terminateds dict has no '__all__' key (got keys "
                            f"{list(term_i)}); a MultiAgentEnv must always report "
                            "terminateds['__all__'] (True once the whole episode ended)."
                        )
                    act_i, rew_i, ext_i = actions[i], rew_l[i], extras[i]  # type: ignore[index]
                    info_i = info_l[i] or {}
                    if deferring and (carried is None or i not in carried):
                        recorded = ep.try_add_plain_env_step(
                            obs_i, act_i, rew_i, info_i, term_i, trunc_i, _NO_FLAGS, now
                        )
                        if recorded:
                            pending = self._tape_rows[i]
                            for aid, g in ext_i.items():
                                rows_a = pending.get(aid)
                                if rows_a is None:
                                    pending[aid] = [g]
                                else:
                                    rows_a.append(g)
                        else:  # an irregular step: record the deferred rows first
                            self._flush_tape_rows(i)
                            tapes, seq = self._tapes, self.weights_seq_no
                            ext_i = {aid: tapes[mm[aid]].row(g, seq) for aid, g in ext_i.items()}
                    else:
                        recorded = ep.try_add_plain_env_step(
                            obs_i, act_i, rew_i, info_i, term_i, trunc_i, ext_i, now
                        )
                        if not recorded:
                            ext_i = {aid: dict(zip(*kv)) for aid, kv in ext_i.items()}
                    if not recorded:
                        ep.add_env_step(
                            obs_i,
                            act_i,
                            rew_i,
                            info_l[i],
                            terminateds=term_i,
                            truncateds=trunc_i,
                            extra_model_outputs=ext_i,
                        )
                    env_steps += 1
                    agent_steps += len(obs_i)
                    done = ep.is_done
                    if done and not (term_i[_ALL] or trunc_i.get(_ALL)):
                        raise MultiAgentEnvError(
                            "every agent that appeared in this episode is done, so the episode "
                            "is over, but the env did not set terminateds['__all__'] (or "
                            "truncateds['__all__']); set it in the step where the last agent "
                            "ends (agents cannot join after all others have finished)."
                        )
                else:
                    term_i = trunc_i = _NO_FLAGS
                    ep.add_env_reset(observations=obs_i, infos=info_l[i])
                    self._pending[i] = False
                    self._start_times[i] = time.time()
                    done = False
            except MultiAgentEnvError as err:
                raise MultiAgentEnvError(f"sub-environment {i}: {err}") from err
            for aid, o in obs_i.items():
                mid = mm.get(aid)
                if mid is None:
                    mid = self._module_of(i, ep, aid)
                if stepped:
                    key = (aid, mid)
                    counts[key] = counts.get(key, 0) + 1
                    if done or term_i.get(aid) or trunc_i.get(aid):
                        if slots_i:  # the agent's episode ended: so did its recurrent state
                            entry = slots_i.pop(aid, None)
                            if entry is not None:
                                entry[0].release(entry[1])
                        continue
                g = groups.get(mid)
                if g is None:
                    g = groups[mid] = ([], [])
                g[0].append(o)
                g[1].append((i, aid))
            if events:
                event = "on_episode_step" if stepped else "on_episode_start"
                if event in events:
                    self.fire(event, ep, i)
            if done:
                if slots_i:
                    self._release_states(i)
                self._finish(i, ep, res)
                if episode_target is not None and len(res.done) >= episode_target:
                    break  # §20.1: no replacement episode after the last one
                self.episodes[i] = self.new_episode(i)
                self._pending[i] = True
                self._modmaps[i] = {}
        spaces = self.observation_spaces
        self._to_module = {
            mid: (stack(items, spaces.get(idx[0][1])), idx) for mid, (items, idx) in groups.items()
        }
        if self._states:
            self._assign_slots()
        return env_steps, agent_steps

    def _assign_slots(self) -> None:
        """The state slots of the agents that act next (new agents get initial-state rows)."""
        slot_map = {}
        all_slots = self._slots
        for mid, store in self._states.items():
            group = self._to_module.get(mid)
            if group is None:
                continue
            slots = []
            for i, aid in group[1]:
                slots_i = all_slots[i]
                entry = slots_i.get(aid)
                if entry is None or entry[0] is not store:
                    entry = slots_i[aid] = (store, store.acquire())
                elif store.prev_rewards:  # the reward for the agent's last action
                    rewards = self.episodes[i].agent_episodes[aid].rewards.data
                    if len(rewards):
                        store.set_prev_reward(entry[1], rewards[-1])
                slots.append(entry[1])
            slot_map[mid] = np.array(slots, dtype=np.intp)
        self._state_slots = slot_map

    def _release_states(self, i: int) -> None:
        """Release the state rows of sub-env ``i``'s agents (its episode ended or was dropped)."""
        slots_i = self._slots[i]
        for store, slot in slots_i.values():
            store.release(slot)
        slots_i.clear()

    def _restart_episodes(self, failed: Any, res: MultiAgentSampleResult) -> tuple[int, int]:
        """Drop the episodes of recreated sub-envs (their reset obs start new ones).

        Returns the env and agent steps of this call that were dropped with them.
        """
        lost_env = lost_agent = 0
        for i, was_recreated in enumerate(failed):
            if not was_recreated:
                continue
            res.num_sub_env_failures += 1
            if self._pending[i]:
                continue  # a fresh episode already waits for this reset observation
            episode = self.episodes[i]
            if episode.env_t > 0:
                res.num_dropped_episodes += 1
            lost_env += len(episode)
            lost_agent += episode.agent_steps()
            self._totals.pop(episode.id_, None)
            self._prev_chunks.pop(episode.id_, None)
            self._tape_rows[i] = {}
            self._release_states(i)
            self.episodes[i] = self.new_episode(i)
            self._pending[i] = True
            self._modmaps[i] = {}
        return lost_env, lost_agent

    def _finish(self, i: int, episode: MultiAgentEpisode, res: MultiAgentSampleResult) -> None:
        self._flush_tape_rows(i)
        totals = self._totals.pop(episode.id_, None) or _EpisodeTotals()
        totals.add(episode)
        res.episode_stats.append(totals.stats(time.time() - self._start_times[i]))
        prev = self._prev_chunks.pop(episode.id_, [])
        if "on_episode_end" in self.events:
            self.fire("on_episode_end", episode, i, prev_episode_chunks=prev)
        _prune_zero_len_agents(episode)
        res.done.append(episode)
        res.done_env_index.append(i)

    def _cut_ongoing(self, res: MultiAgentSampleResult) -> None:
        keep_prev = "on_episode_end" in self.events
        for i, episode in enumerate(self.episodes):
            if self._pending[i] or len(episode) == 0:
                continue
            successor = episode.cut(len_lookback_buffer=self.lookback)
            totals = self._totals.get(episode.id_)
            if totals is None:
                totals = self._totals[episode.id_] = _EpisodeTotals()
            totals.add(episode)
            if keep_prev:
                self._prev_chunks[episode.id_].append(episode)
            _prune_zero_len_agents(episode)
            res.ongoing.append(episode)
            res.ongoing_env_index.append(i)
            self.episodes[i] = successor


class _EpisodeTotals:
    """Running totals of the chunks of one episode already returned."""

    __slots__ = ("length", "steps", "returns", "modules")

    def __init__(self) -> None:
        self.length = 0
        self.steps: dict[Any, int] = {}
        self.returns: dict[Any, float] = {}
        self.modules: dict[Any, Any] = {}

    def add(self, episode: MultiAgentEpisode) -> None:
        """Add one returned chunk's steps and rewards (per agent)."""
        self.length += len(episode)
        for aid, sa in episode.agent_episodes.items():
            n = len(sa)
            if n:
                self.steps[aid] = self.steps.get(aid, 0) + n
                self.returns[aid] = self.returns.get(aid, 0.0) + _chunk_return(sa)
                self.modules[aid] = sa.module_id

    def stats(self, duration_s: float) -> MultiAgentEpisodeStats:
        """The whole episode's numbers (its chunks summed), returns per module too."""
        module_returns: dict[str, float] = {}
        for aid, ret in self.returns.items():
            mid = str(self.modules[aid])
            module_returns[mid] = module_returns.get(mid, 0.0) + ret
        return MultiAgentEpisodeStats(
            length=self.length,
            ret=float(sum(self.returns.values())),
            duration_s=duration_s,
            agent_steps={str(a): n for a, n in self.steps.items()},
            agent_returns={str(a): r for a, r in self.returns.items()},
            module_returns=module_returns,
        )


def _chunk_return(sa: Any) -> float:
    """Sum of one agent's rewards in this chunk (lookback excluded)."""
    buf = sa.rewards
    if type(buf.data) is list:  # = buf.get() on a list buffer, without the slice machinery
        return float(sum(buf.data[buf.lookback :]))
    rewards = buf.get()
    if isinstance(rewards, np.ndarray):
        return float(rewards.sum())
    return float(sum(rewards))


def _prune_zero_len_agents(episode: MultiAgentEpisode) -> None:
    """Drop agents without any step from a returned chunk (RLlib does the same)."""
    empty = [aid for aid, sa in episode.agent_episodes.items() if len(sa) == 0]
    for aid in empty:
        del episode.agent_episodes[aid]
        mapping = getattr(episode, "_env_t_to_agent_t", None)
        if mapping is not None:
            mapping.pop(aid, None)


def _scatter(column: list, ids: list[int], n: int) -> list:
    """A ready-first batch's per-sub-env entries at their sub-env's index (others ``{}``)."""
    out: list = [_NO_FLAGS] * n
    for i, value in zip(ids, column):
        out[i] = value
    return out


def _pairs(ext: dict) -> tuple[tuple, tuple]:
    """An extra-outputs dict as the ``(keys, values)`` pair the per-step path passes."""
    return tuple(ext), tuple(ext.values())
