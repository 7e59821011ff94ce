"""The single-agent sampling loop: vector steps into column buffers, episodes at the end.

One iteration = one batched policy call for all sub-envs, one ``env.step`` of the
vector env and one row written per column. No per-step, per-sub-env Python
objects are made: episodes (``SingleAgentEpisode``) are built once per
``run()`` from slices of the buffers. Gymnasium's ``NEXT_STEP`` autoreset is
followed: the step after a sub-env's episode ended returns its reset observation,
ignores its action and is not counted as a timestep.

A stateful module (``recurrent`` set) gets its state as a per-sub-env column in
the same single forward; the state it returns is recorded per step under
``Columns.STATE_OUT`` in the episodes' extra model outputs (nested like
``get_initial_state()``, one ``(1, cell)``-like row per step, as RLlib records
it) and reset to the initial state for each sub-env whose episode starts.

With an asynchronous vector env (``is_async``: ``recv()`` returns the next
``batch_size`` ready sub-envs, ``send(actions, env_ids)`` steps them) the loop is
ready-first: each iteration receives the ready sub-envs, runs one forward for
just those rows and sends their actions. Each sub-env then writes at its own row
pointer into the same ``(rows, num_envs)`` buffers (fancy indexing, one
assignment per column per iteration); episodes are cut per sub-env at the end as
in the synchronous loop. Every sub-env always has one action in flight between
iterations and between calls: its current observation and that action are carried
in the row after the lookback, so the next call's first ``recv()`` continues it.

The same loop serves ``SingleAgentEnvRunner`` and the old-stack ``RolloutWorker``
(which turns the episodes into ``SampleBatch``es at the edge).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.core import _nested
from envrunners.core._nested import map_structure
from envrunners.core.columns import Columns
from envrunners.env._episode_ids import new_episode_id
from envrunners.env.env_runner import ENV_STEP_FAILURE
from envrunners.env.single_agent_episode import SingleAgentEpisode
from envrunners.errors import EnvRunnerError, NonFiniteEnvDataError
from envrunners.sampling.buffers import ColumnBuffer, RecurrentState, cell_writer
from envrunners.sampling.finite_checks import ObsRewardCheck, episode_step_error
from envrunners.sampling.sample_result import EpisodeStats, SampleResult

__all__ = ["ActFn", "SingleAgentSampleResult", "SingleAgentSampler", "StatefulActFn"]

#: ``act_fn(obs_batch, explore, t) -> (actions, extra_model_outputs)``
ActFn = Callable[[Any, bool, int], tuple[np.ndarray, dict[str, np.ndarray]]]

#: With ``sampler.recurrent`` set: ``act_fn(obs_batch, explore, t, state, extra_inputs)
#: -> (actions, extra_model_outputs, state_out)``; ``state`` / ``state_out`` have one
#: row per sub-env, ``extra_inputs`` is ``recurrent.extra_inputs`` (None or prev actions/rewards).
StatefulActFn = Callable[
    [Any, bool, int, Any, "dict[str, Any] | None"], tuple[Any, dict[str, Any], Any]
]

#: A ``run()`` gives up (``EnvRunnerError``) once sub-env failures have cost this many
#: times the steps it was asked for (at least 100 steps): the env fails too often for
#: dropping its broken episodes and sampling more to ever fill the batch.
MAX_LOST_STEPS_FACTOR = 20

#: What ``run()`` returns.
SingleAgentSampleResult = SampleResult[SingleAgentEpisode, EpisodeStats]


@dataclass(slots=True)
class _EpisodeState:
    """Per-sub-env bookkeeping for the episode in progress (slots: one GC-tracked object
    fewer per episode)."""

    id_: str
    t0: int = 0  # episode timestep of this call's first obs row for this episode
    start_time: float = 0.0
    len_before: int = 0  # steps in earlier, already returned chunks
    ret_before: float = 0.0


def _new_episode_state() -> _EpisodeState:
    return _EpisodeState(id_=new_episode_id(), start_time=time.time())


class SingleAgentSampler:
    """Runs the sampling loop over one vector env; keeps episode state between calls.

    Args:
        env: A vector env whose ``step`` returns ``infos`` as a list of dicts.
        observation_space: The (module-side) single observation space for episodes.
        action_space: The single action space for episodes.
        step_fn: ``step_fn(actions_for_env)`` -> the 5-tuple, or ``ENV_STEP_FAILURE``
            after it recreated the whole vector env.
        obs_fn: Env-to-module transform of a raw observation batch (e.g. a filter).
        action_fn: Module-to-env transform of an action batch (clip/unsquash).
        reward_fn: Transform of the reward batch before it is stored (clipping).
        lookback: ``episode_lookback_horizon``: items carried into continuation chunks.
        recv_fn: For an asynchronous env: ``recv_fn()`` -> ``(env_ids, obs, rewards,
            terminated, truncated, infos)`` of the ready sub-envs, or ``ENV_STEP_FAILURE``
            after it recreated the whole vector env (default: ``env.recv()``).
        send_fn: For an asynchronous env: ``send_fn(actions, env_ids)`` -> None, or
            ``ENV_STEP_FAILURE`` after it recreated the env (default: ``env.send``).
    """

    def __init__(
        self,
        env: gym.vector.VectorEnv,
        *,
        observation_space: gym.Space,
        action_space: gym.Space,
        step_fn: Callable[[Any], Any],
        obs_fn: Callable[[Any], Any] | None = None,
        action_fn: Callable[[np.ndarray], np.ndarray] | None = None,
        reward_fn: Callable[[np.ndarray], np.ndarray] | None = None,
        lookback: int = 1,
        recv_fn: Callable[[], Any] | None = None,
        send_fn: Callable[[Any, np.ndarray], Any] | None = None,
    ):
        self.env = env
        self.num_envs = env.num_envs
        self.observation_space = observation_space
        self.action_space = action_space
        self.step_fn = step_fn
        self.obs_fn = obs_fn or (lambda o: o)
        self.action_fn = action_fn or (lambda a: a)
        self.reward_fn = reward_fn
        self.lookback = max(0, int(lookback))
        self.recv_fn = recv_fn or (lambda: self.env.recv())
        self.send_fn = send_fn or (lambda actions, env_ids: self.env.send(actions, env_ids))
        self._obs: ColumnBuffer | None = None
        self._actions: ColumnBuffer | None = None
        self._extras: dict[str, ColumnBuffer] = {}
        self._extras_written: set[str] = set()  # extra columns filled by this run()
        self._rewards: np.ndarray = np.zeros((0, self.num_envs), np.float32)
        self._terms: np.ndarray = np.zeros((0, self.num_envs), np.bool_)
        self._truncs: np.ndarray = np.zeros((0, self.num_envs), np.bool_)
        self._infos: list[list[dict] | None] = []
        self._cur_obs: Any = None
        #: The current row's info dicts (None: all empty, or no observation in hand).
        self._cur_infos: list[dict] | None = None
        self._pending = np.zeros(self.num_envs, np.bool_)
        # Ready-first mode (``start_async``): sub-envs whose first (reset) observation
        # has not arrived yet; every other sub-env has its current observation and its
        # in-flight action in row ``_base``.
        self._async_live = False
        self._fresh = np.zeros(self.num_envs, np.bool_)
        self._states: list[_EpisodeState] = []
        self._rows_capacity = 0
        # Rows [0, _base) of every column carry the lookback of each sub-env's
        # continuing episode (the last ``lookback`` steps of the previous call);
        # ``_lb_len[i]`` of them are valid for sub-env ``i``.
        self._base = 0
        self._lb_len = [0] * self.num_envs
        self._seq: np.ndarray = np.zeros((0, self.num_envs), np.int64)
        self.weights_seq_no = 0
        #: Called with (raw_obs, actions_for_env) on the next step only (env checking).
        self.check_fn: Callable[[Any, Any], None] | None = None
        #: A stateful module's per-sub-env state (None: stateless, ``act_fn`` is an ``ActFn``).
        self.recurrent: RecurrentState | None = None
        #: The per-step check of raw observations and rewards (None: no check).
        self.finite_check: ObsRewardCheck | None = None
        #: ``on_non_finite(errors, results)``: handles the step whose data ``finite_check``
        #: rejected (one error per bad sub-env); returns the step's (patched) results or
        #: ``ENV_STEP_FAILURE``, or raises. None: the first error is raised.
        self.on_non_finite: Callable[[list[NonFiniteEnvDataError], Any], Any] | None = None

    # -- episode state -------------------------------------------------------------
    def start(self, raw_obs: Any, infos: list[dict]) -> None:
        """Begin fresh episodes on every sub-env from a reset's observations."""
        self._cur_obs = map_structure(np.copy, self.obs_fn(raw_obs))
        self._cur_infos = list(infos)
        self._begin_episodes(ready_first=False)

    def start_async(self) -> None:
        """Begin fresh episodes on every sub-env of an asynchronous env just ``async_reset``.

        No observation is in hand: each sub-env's reset observation arrives with its
        first ``recv()``, and ``run()`` steps ready-first from then on.
        """
        self._cur_obs = None
        self._cur_infos = None
        self._begin_episodes(ready_first=True)

    def _begin_episodes(self, ready_first: bool) -> None:
        self._async_live = ready_first
        self._fresh[:] = ready_first
        self._pending[:] = False
        self._states = [_new_episode_state() for _ in range(self.num_envs)]
        self._lb_len = [0] * self.num_envs
        if self.recurrent is not None:
            self.recurrent.reset()

    @property
    def ready_first(self) -> bool:
        """Whether the loop steps ready-first (``start_async()`` began this env's episodes)."""
        return self._async_live

    @property
    def started(self) -> bool:
        """Whether ``start()`` (or ``start_async()``) was called (the env has been reset)."""
        return self._cur_obs is not None or self._async_live

    def _capacity(self, rows: int) -> None:
        """Make room for ``rows`` step rows (and ``rows + 1`` observation rows)."""
        if self._obs is None and self._cur_obs is not None:
            example = map_structure(lambda a: np.asarray(a), self._cur_obs)
            self._obs = ColumnBuffer(example, rows + 1)
        if self._obs is not None:  # ready-first: made from the first received batch
            self._obs.ensure(rows + 1)
        if self._actions is not None:
            self._actions.ensure(rows)
        for buf in self._extras.values():
            buf.ensure(rows)
        cap = len(self._rewards)
        if rows > cap:
            new = max(rows, 2 * cap)
            self._rewards = np.resize(self._rewards, (new, self.num_envs))
            self._terms = np.resize(self._terms, (new, self.num_envs))
            self._truncs = np.resize(self._truncs, (new, self.num_envs))
            self._seq = np.resize(self._seq, (new, self.num_envs))
        if len(self._infos) < rows + 1:  # doubling too: the ready-first loop grows row by row
            self._infos.extend([None] * (max(rows + 1, 2 * len(self._infos)) - len(self._infos)))
        # Step rows that fit in every column (extras made later get the obs capacity).
        self._rows_capacity = min(
            len(self._rewards),
            len(self._infos) - 1,
            self._obs.capacity - 1 if self._obs is not None else rows,
            self._actions.capacity if self._actions is not None else rows,
            *(buf.capacity for buf in self._extras.values()),
        )

    def _write_step_outputs(self, row: int, actions: Any, extras: dict) -> None:
        capacity = self._obs.capacity
        if self._actions is None:
            self._actions = ColumnBuffer(actions, capacity)
        self._actions.write(row, actions)
        buffers = self._extras
        for key, value in extras.items():
            buf = buffers.get(key)
            if buf is None:
                buf = buffers[key] = ColumnBuffer(value, capacity)
            buf.write(row, value)
        self._extras_written.update(extras)

    # -- the loop ------------------------------------------------------------------
    def run(
        self,
        *,
        act_fn: ActFn | StatefulActFn | None,
        explore: bool,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        random_actions: bool = False,
        t_offset: int = 0,
    ) -> SingleAgentSampleResult:
        """Sample ``num_timesteps`` env steps or ``num_episodes`` whole episodes.

        Timestep mode returns finished episodes plus the in-progress chunk of every
        sub-env that stepped (continued by the next call with the same id);
        episode mode returns finished episodes only.

        ``act_fn`` is a ``StatefulActFn`` when ``recurrent`` is set. Per vector step
        the loop does one act, one env step, one row write per column and a few
        whole-batch numpy ops; which rows belong to which episode
        is noted as ``(sub-env, first row, last row)`` and all episodes are cut out
        of the buffers after the loop.
        """
        if not self.started:
            raise RuntimeError("SingleAgentSampler.run() called before start()")
        if self._async_live:
            return self._run_ready_first(
                act_fn, explore, num_timesteps, num_episodes, random_actions, t_offset
            )
        n_envs = self.num_envs
        result: SingleAgentSampleResult = SampleResult()
        episode_mode = num_episodes is not None
        target = int(num_episodes if episode_mode else num_timesteps)
        base = self._prepare_lookback_rows()
        self._capacity(base + (64 if episode_mode else -(-target // n_envs) + 2))
        self._obs.write(base, self._cur_obs)
        cur_infos = self._cur_infos
        self._infos[base] = cur_infos if cur_infos and any(cur_infos) else None
        prev_written, self._extras_written = self._extras_written, set()
        seg_start = [base] * n_envs
        states = self._states
        # (sub-env, first obs row, last obs row, episode state, end time) per finished
        # episode, in the order they finished.
        finished: list[tuple[int, int, int, _EpisodeState, float]] = []
        pending = np.flatnonzero(self._pending).tolist()  # sub-envs autoresetting now
        env = self.env
        action_space = env.action_space
        obs_fn, action_fn, step_fn, reward_fn = (
            self.obs_fn,
            self.action_fn,
            self.step_fn,
            self.reward_fn,
        )
        has_errors = hasattr(env, "last_errors") and hasattr(env, "failed")
        # Random actions do not run the module: the state stands still (no STATE_OUT
        # is recorded) but is still reset when a sub-env's episode starts.
        recurrent = self.recurrent
        finite_check = self.finite_check
        finite_ok = finite_check.ok_for(n_envs) if finite_check is not None else None
        # Sub-envs that fail before any episode survives would make a timestep-mode
        # call loop forever: past this many steps lost to failures, it gives up.
        lost_steps, max_lost_steps = 0, MAX_LOST_STEPS_FACTOR * max(target, n_envs, 100)
        ts = eps = 0
        row = base
        while (eps < target) if episode_mode else (ts < target):
            if row >= self._rows_capacity:
                self._capacity(row + 1)
            if random_actions or act_fn is None:
                actions = np.asarray(action_space.sample())
                extras: dict[str, np.ndarray] = {}
            elif recurrent is None:
                actions, extras = act_fn(self._obs.row(row), explore, t_offset + ts)
            else:
                actions, extras, state_out = act_fn(
                    self._obs.row(row),
                    explore,
                    t_offset + ts,
                    recurrent.state,
                    recurrent.extra_inputs,
                )
                extras[Columns.STATE_OUT] = recurrent.state = state_out
            env_actions = action_fn(actions)
            results = step_fn(env_actions)
            if (
                finite_ok is not None
                and results is not ENV_STEP_FAILURE
                and not finite_ok(results[0], results[1])
            ):  # the whole batch, with a test planned for its space and size
                results = self._non_finite(results, row, seg_start, pending)
            if results is ENV_STEP_FAILURE:
                # The whole vector env was recreated (the step_fn logged the failure):
                # every in-progress episode is lost, including those that finished in
                # this call but were not returned yet; ``start`` resets the state.
                result.num_env_failures += 1
                result.num_dropped_episodes += n_envs - len(pending)
                obs, infos = self._reset_after_failure()
                self.start(obs, infos)
                states = self._states
                self._obs.write(base, self._cur_obs)
                self._infos[base] = self._cur_infos if any(self._cur_infos) else None
                seg_start = [base] * n_envs
                finished = []
                pending = []
                ts = eps = 0
                row = base
                continue
            self._write_step_outputs(row, actions, extras)
            raw_obs, rewards, terms, truncs, infos = results
            if self.check_fn is not None:
                check, self.check_fn = self.check_fn, None
                check(raw_obs, env_actions)
            new_start = pending
            if has_errors and env.last_errors:
                failed = np.flatnonzero(env.failed).tolist()
                lost = [i for i in failed if i not in pending]
                result.num_dropped_episodes += len(lost)
                result.num_sub_env_failures += len(failed)
                new_start = sorted(set(pending) | set(failed))
                # The dropped episodes' steps of this call were counted; they are not
                # returned, so sample that many more (the batch keeps its size).
                dropped = sum(row - seg_start[i] for i in lost)
                ts -= dropped
                lost_steps += dropped + len(failed)
                if lost_steps > max_lost_steps:
                    raise _keep_failing_error(lost_steps, result.num_sub_env_failures)
            row += 1
            self._obs.write(row, obs_fn(raw_obs))
            self._rewards[row - 1] = rewards if reward_fn is None else reward_fn(rewards)
            self._terms[row - 1] = terms
            self._truncs[row - 1] = truncs
            self._infos[row] = infos if any(infos) else None
            ts += n_envs - len(new_start)
            done = np.logical_or(terms, truncs)
            if recurrent is not None:
                recurrent.after_step(actions, self._rewards[row - 1])
            if new_start:
                for i in new_start:
                    seg_start[i] = row
                    states[i] = _new_episode_state()
                    done[i] = False  # (one item: cheaper than indexing with the list)
                if recurrent is not None:
                    # The reset observation in this row starts from the initial state.
                    recurrent.reset(new_start)
            if np.count_nonzero(done):  # (a C call; ``done.any()`` goes through Python)
                pending = np.flatnonzero(done).tolist()
                now = time.time()
                for i in pending:
                    finished.append((i, seg_start[i], row, states[i], now))
                    eps += 1
                    if episode_mode and eps >= target:
                        break
            else:
                pending = []
        self._pending = np.zeros(n_envs, np.bool_)
        self._pending[pending] = True
        result.env_steps = result.agent_steps = ts  # one agent per env step
        for key in self._extras_written - prev_written:
            # Not carried by the previous call (e.g. it sampled random actions):
            # its lookback rows hold stale values; zeros stand in, as for a new key.
            map_structure(lambda a: a[:base].fill(0), self._extras[key].data)
        self._seq[base:row] = self.weights_seq_no
        self._cut_episodes(result, finished, seg_start, row, episode_mode)
        self._carry_lookback(seg_start, row, episode_mode)
        if row == base:  # no step: the carried rows are still the earlier call's
            self._extras_written = prev_written
        self._cur_obs = map_structure(np.copy, self._obs.row(row))
        self._cur_infos = self._infos[row]  # None: no info dict in the last row
        return result

    # -- the ready-first loop (asynchronous vector envs) ----------------------------
    def _run_ready_first(
        self,
        act_fn: ActFn | StatefulActFn | None,
        explore: bool,
        num_timesteps: int | None,
        num_episodes: int | None,
        random_actions: bool,
        t_offset: int,
    ) -> SingleAgentSampleResult:
        """``run()`` on an asynchronous env: act on whichever sub-envs are ready first.

        Per iteration: one ``recv()`` of the ready sub-envs ``ids``, their results
        written at their own rows (flat cells ``cptr[ids]``, fancy indexing), one forward for
        just those rows (a stateful module gets and returns their state rows) and one
        ``send``. The rules are the synchronous loop's per sub-env: a result after a
        done is the reset observation (not a timestep), sub-env failures drop their
        episode, a whole-env failure restarts the call. At the end every sub-env has
        one action in flight; its current row is carried (with the lookback) to the
        next call, whose first ``recv()`` continues it.
        """
        n_envs = self.num_envs
        result: SingleAgentSampleResult = SampleResult()
        episode_mode = num_episodes is not None
        target = int(num_episodes if episode_mode else num_timesteps)
        env = self.env
        base = self._prepare_lookback_rows(with_current=True)
        batch = max(1, int(getattr(env, "batch_size", n_envs) or n_envs))
        self._capacity(base + (64 if episode_mode else -(-target // batch) + 2))
        fresh, pending = self._fresh, self._pending
        carried = ~fresh  # their current obs and in-flight action are in row ``base``
        infos_rows = self._infos
        infos_rows[base + 1 :] = [None] * (len(infos_rows) - base - 1)
        if infos_rows[base] is not None:
            for i in np.flatnonzero(fresh).tolist():
                infos_rows[base][i] = {}
        prev_written, self._extras_written = self._extras_written, set()
        # Each sub-env's current observation as a flat cell ``row * n_envs + env`` (see
        # ``ColumnBuffer.cells``): one fancy index per batch gives both its row and column.
        env_cells = np.arange(n_envs, dtype=np.intp)
        cptr = env_cells + base * n_envs
        seg_start = np.full(n_envs, base, np.int64)  # its episode's first row in this call
        states = self._states
        finished: list[tuple[int, int, int, _EpisodeState, float]] = []
        action_space = env.action_space
        obs_fn, action_fn, reward_fn = self.obs_fn, self.action_fn, self.reward_fn
        recv_fn, send_fn = self.recv_fn, self.send_fn
        has_errors = hasattr(env, "last_errors") and hasattr(env, "failed")
        recurrent = self.recurrent
        if recurrent is not None:
            recurrent.own()
        finite_check = self.finite_check
        finite_ok = finite_check.ok_for(batch) if finite_check is not None else None
        lost_steps, max_lost_steps = 0, MAX_LOST_STEPS_FACTOR * max(target, n_envs, 100)
        ts = eps = 0
        n_fresh = int(fresh.sum())
        top = base  # no sub-env's row is past this
        send_failed = False
        # ``n_envs`` repeated, per batch size: a cell's next row (an array operand adds
        # faster than a Python int).
        next_row: dict[int, np.ndarray] = {}
        # Flat views of the step columns and the observations (None: nested), made
        # again when ``_capacity`` replaces the arrays; the output columns' writes.
        flat_rewards, flat_terms, flat_truncs, flat_obs, write_obs = self._flat_step_columns()
        writes: _OutputWrites | None = None
        while send_failed or ((eps < target) if episode_mode else (ts < target)):
            results = ENV_STEP_FAILURE if send_failed else recv_fn()
            send_failed = False
            if (
                finite_ok is not None
                and results is not ENV_STEP_FAILURE
                and not finite_ok(results[1], results[2])
            ):
                results = self._non_finite_async(results, cptr // n_envs, seg_start)
            if results is ENV_STEP_FAILURE:
                # The whole vector env was recreated (in recv, send or the non-finite
                # handler): as in the synchronous loop, every in-progress episode of
                # this call is lost and the call starts over.
                result.num_env_failures += 1
                result.num_dropped_episodes += int(n_envs - pending.sum() - fresh.sum())
                self._restart_async()
                env = self.env
                n_fresh = n_envs
                cptr[:] = env_cells + base * n_envs
                seg_start[:] = base
                carried[:] = False
                states = self._states
                finished = []
                ts = eps = 0
                top = base
                flat_rewards, flat_terms, flat_truncs, flat_obs, write_obs = (
                    self._flat_step_columns()
                )
                writes = None
                continue
            env_ids, raw_obs, rewards, terms, truncs, infos = results
            # Platform ints: numpy indexes with them several times faster than with
            # EnvPool's int32 ids (``send`` gets the env's own ids back).
            ids = np.asarray(env_ids, np.intp)
            k = len(ids)
            top += 1
            if top + 1 >= self._rows_capacity:
                self._capacity(top + 2)
                flat_rewards, flat_terms, flat_truncs, flat_obs, write_obs = (
                    self._flat_step_columns()
                )
                writes = None
            cells = cptr[ids]  # the current observations' cells: this step's row
            first = fresh[ids] if n_fresh else None
            # A reset observation (first ever, or after a done) is not a timestep.
            new = pending[ids] if first is None else first | pending[ids]
            if has_errors and env.last_errors:
                failed = np.asarray(env.failed, np.bool_)[ids]
                lost = ids[failed & ~new].tolist()
                result.num_dropped_episodes += len(lost)
                result.num_sub_env_failures += int(failed.sum())
                dropped = int(sum(cptr[i] // n_envs - seg_start[i] for i in lost))
                ts -= dropped
                lost_steps += dropped + int(failed.sum())
                if lost_steps > max_lost_steps:
                    raise _keep_failing_error(lost_steps, result.num_sub_env_failures)
                new = new | failed
            if first is not None and first.any():  # a first reset obs fills row ``base``
                new_cells = cells + ~first * n_envs
                fresh[ids] = False
                n_fresh -= int(first.sum())
            else:
                step = next_row.get(k)
                if step is None:
                    step = next_row[k] = np.full(k, n_envs, np.intp)
                new_cells = cells + step
            flat_rewards[cells] = rewards if reward_fn is None else reward_fn(rewards)
            cptr[ids] = new_cells
            obs = obs_fn(raw_obs)
            if flat_obs is not None:
                write_obs(new_cells, obs)
            else:
                if self._obs is None:
                    self._obs = ColumnBuffer.for_envs(obs, n_envs, self._rows_capacity + 1)
                    flat_obs, write_obs = self._flat_step_columns()[3:]
                self._obs.write_at(new_cells, obs)
            if any(infos):
                self._store_infos(new_cells // n_envs, ids, infos)
            n_new = int(np.count_nonzero(new))
            ts += k - n_new
            done = np.logical_or(terms, truncs)
            if recurrent is not None and self._actions is not None:
                recurrent.after_step_rows(ids, self._actions.gather(cells), rewards)
            if n_new:
                starts = ids[new]
                seg_start[starts] = new_cells[new] // n_envs
                for i in starts.tolist():
                    states[i] = _new_episode_state()
                done[new] = False
                if recurrent is not None:
                    recurrent.reset(starts.tolist())
                pending[ids] = done
                n_done = np.count_nonzero(done)
            else:  # ``pending[ids]`` is all False: only a done changes it
                n_done = np.count_nonzero(done)
                if n_done:
                    pending[ids] = done
            if n_done:
                # The flags are read at the last step of finished episodes only, so they
                # are written in batches with a done.
                flat_terms[cells] = terms
                flat_truncs[cells] = truncs
                now = time.time()
                for j in np.flatnonzero(done).tolist():
                    i = int(ids[j])
                    row = int(new_cells[j]) // n_envs
                    finished.append((i, int(seg_start[i]), row, states[i], now))
                    eps += 1
                    if episode_mode and eps >= target:
                        break
            # One forward for the ready rows; their actions go out at once.
            if random_actions or act_fn is None:
                actions = _first_rows(action_space.sample(), k)
                extras: dict[str, Any] = {}
            else:
                if flat_obs is not None:
                    act_obs = flat_obs.take(new_cells, axis=0)
                else:
                    act_obs = self._obs.gather(new_cells)
                if recurrent is None:
                    actions, extras = act_fn(act_obs, explore, t_offset + ts)
                else:
                    state_in, extra_in = recurrent.rows(ids)
                    actions, extras, state_out = act_fn(
                        act_obs, explore, t_offset + ts, state_in, extra_in
                    )
                    recurrent.set_rows(ids, state_out)
                    extras[Columns.STATE_OUT] = state_out
            env_actions = action_fn(actions)
            if writes is not None and writes.fits(extras):
                writes.write(new_cells, actions, extras)
            else:
                self._write_outputs_at(new_cells, actions, extras)
                writes = _OutputWrites.plan(self, extras)
            if self.check_fn is not None:
                check, self.check_fn = self.check_fn, None
                check(raw_obs, env_actions)
            # A failed send recreated the env: the next iteration restarts the call.
            send_failed = send_fn(env_actions, env_ids) is ENV_STEP_FAILURE
            # The env's arrays go now, while it steps, not at the next batch's arrival:
            # EnvPool allocates that batch's buffer then (freeing at once waits on its lock).
            results = env_ids = raw_obs = obs = rewards = terms = truncs = None
        result.env_steps = result.agent_steps = ts
        ptr = cptr // n_envs  # each sub-env's current observation row
        end = int(ptr.max())
        for key in self._extras_written - prev_written:
            # Not written by the previous call: its carried rows hold stale values.
            def zero(a: np.ndarray) -> None:
                a[:base] = 0
                a[base, carried] = 0

            map_structure(zero, self._extras[key].data)
        seq_carried = self._seq[base, carried]
        self._seq[base : end + 1] = self.weights_seq_no
        self._seq[base, carried] = seq_carried  # those actions came from the last call
        self._cut_episodes(
            result, finished, seg_start.tolist(), end, episode_mode, ends=ptr.tolist()
        )
        self._carry_async(seg_start, ptr, end, episode_mode)
        if end == base:  # nothing stepped: the carried rows are still the earlier call's
            self._extras_written |= prev_written
        return result

    def _write_outputs_at(self, cells: np.ndarray, actions: Any, extras: dict) -> None:
        """Write a ready-first batch's actions and extra outputs at each sub-env's row
        (``cells``: ``row * num_envs + env`` per sub-env, see ``ColumnBuffer.cells``)."""
        buf = self._actions
        if buf is None:
            buf = self._actions = ColumnBuffer.for_envs(actions, self.num_envs, self._obs.capacity)
        buf.write_at(cells, actions)
        buffers = self._extras
        for key, value in extras.items():
            buf = buffers.get(key)
            if buf is None:
                buf = buffers[key] = ColumnBuffer.for_envs(value, self.num_envs, self._obs.capacity)
            buf.write_at(cells, value)
        self._extras_written.update(extras)

    def _flat_step_columns(self) -> tuple[Any, ...]:
        """The reward, terminated and truncated columns and the observations as flat
        views (cell ``row * num_envs + env``), for the ready-first loop's writes, and
        the observations' ``cell_writer``; both None while the observations have no
        buffer or are nested."""
        flat_obs = self._obs.cells() if self._obs is not None else None
        if type(flat_obs) is not np.ndarray:
            flat_obs = None
        return (
            self._rewards.reshape(-1),
            self._terms.reshape(-1),
            self._truncs.reshape(-1),
            flat_obs,
            None if flat_obs is None else cell_writer(flat_obs),
        )

    def _store_infos(self, rows: np.ndarray, ids: np.ndarray, infos: list[dict]) -> None:
        """Keep the non-empty info dicts of a ready-first batch at each sub-env's row."""
        table = self._infos
        for j, info in enumerate(infos):
            if info:
                r = int(rows[j])
                if table[r] is None:
                    table[r] = [{} for _ in range(self.num_envs)]
                table[r][int(ids[j])] = info

    def _restart_async(self) -> None:
        """After the env was recreated: reset it asynchronously and start over."""
        self.env.async_reset()
        self.start_async()

    def _carry_async(
        self, seg_start: np.ndarray, ptr: np.ndarray, end: int, episode_mode: bool
    ) -> None:
        """Move each sub-env's rows ``[ptr - lookback, ptr]`` to rows ``[0, lookback]``.

        Row ``ptr[i]`` holds sub-env ``i``'s current observation and its in-flight
        action (the next call's row ``lookback``); the rows before it are its lookback,
        valid back to its episode's first row. One fancy-index copy per column.
        """
        base, n = self._base, self.num_envs
        if episode_mode:  # no lookback after an episode-mode call (as in the sync loop)
            self._lb_len = [0] * n
        else:
            lb = np.asarray(self._lb_len, np.int64)
            first = np.where(seg_start == base, seg_start - lb, seg_start)
            lb_len = np.minimum(base, ptr - first)
            lb_len[self._pending | self._fresh] = 0
            self._lb_len = lb_len.tolist()
        if end == base:
            return
        rows = ptr[None, :] + np.arange(-base, 1)[:, None]
        cols = np.arange(n)[None, :]
        for col in self._columns():
            map_structure(lambda a: a.__setitem__(slice(0, base + 1), a[rows, cols]), col)
        table = self._infos
        if any(table[: end + 1]):
            table[: base + 1] = [
                [({} if table[r] is None else table[r][i]) for i, r in enumerate(line)]
                for line in rows.tolist()
            ]
        else:
            table[: base + 1] = [None] * (base + 1)

    def _non_finite_async(self, results: Any, ptr: np.ndarray, seg_start: np.ndarray) -> Any:
        """``_non_finite`` for a ready-first batch: errors name the sub-envs' ids."""
        ids = results[0]
        found = self.finite_check.find(results[1], results[2])
        if not found:
            return results
        errors = []
        for j, column, value in found:
            i = int(ids[j])
            if self._pending[i] or self._fresh[i]:
                step, episode_id = 0, None
            else:
                state = self._states[i]
                step, episode_id = state.t0 + int(ptr[i] + 1 - seg_start[i]), state.id_
            errors.append(episode_step_error(i, column, value, step, episode_id))
        if self.on_non_finite is None:
            raise errors[0]
        return self.on_non_finite(errors, results)

    def _non_finite(self, results: Any, row: int, seg_start: list[int], pending: list[int]) -> Any:
        """A step whose observations or rewards are not all finite: name them, then handle.

        Each bad sub-env gets a ``NonFiniteEnvDataError`` naming its index, the step of
        its episode and the column; ``on_non_finite`` decides (recreate the sub-env or
        raise). The observations have not been filtered or stored yet.
        """
        found = self.finite_check.find(results[0], results[1])
        if not found:  # the fast test overflowed on large finite values
            return results
        errors = []
        for i, column, value in found:
            if i in pending:  # the reset observation of its next episode
                step, episode_id = 0, None
            else:
                state = self._states[i]
                step, episode_id = state.t0 + row + 1 - seg_start[i], state.id_
            errors.append(episode_step_error(i, column, value, step, episode_id))
        if self.on_non_finite is None:
            raise errors[0]
        return self.on_non_finite(errors, results)

    def _prepare_lookback_rows(self, with_current: bool = False) -> int:
        """Make rows ``[0, lookback)`` the carried-lookback rows; returns ``lookback``.

        If ``lookback`` changed since the last call, the newest carried rows move so
        that they again end right before the first row of this call (``with_current``:
        ready-first mode, where the row after them, each sub-env's current observation
        and in-flight action, moves with them).
        """
        new, old = self.lookback, self._base
        self._capacity(new + 1)
        if new != old:
            keep = min(old, new)
            extra = int(with_current)
            if keep + extra:
                src, dst = slice(old - keep, old + extra), slice(new - keep, new + extra)
                for col in self._columns():
                    map_structure(lambda a: a.__setitem__(dst, a[src].copy()), col)
                self._infos[dst] = self._infos[src]
            self._lb_len = [min(n, keep) for n in self._lb_len]
            self._base = new
        return new

    def _columns(self) -> list[Any]:
        """Every step-aligned array (tree) whose lookback rows are carried."""
        cols = [self._rewards, self._seq]
        if self._obs is not None:
            cols.insert(0, self._obs.data)
        if self._actions is not None:
            cols.append(self._actions.data)
        cols.extend(buf.data for buf in self._extras.values())
        return cols

    def _carry_lookback(self, seg_start: list[int], row: int, episode_mode: bool) -> None:
        """Copy each column's last ``lookback`` rows to rows ``[0, lookback)``.

        Sub-env ``i``'s episode continues into the next call unless it just ended
        (pending reset) or this was an episode-mode call (the next one resets);
        its carried rows are valid up to its episode's first row.
        """
        base = self._base
        if episode_mode or not base:
            self._lb_len = [0] * self.num_envs
            return
        lb_len = []
        for i, start in enumerate(seg_start):
            if self._pending[i]:
                lb_len.append(0)
                continue
            first = start - (self._lb_len[i] if start == base else 0)
            lb_len.append(min(base, row - first))
        self._lb_len = lb_len
        if row == base:
            return
        src = slice(row - base, row)
        for col in self._columns():
            map_structure(lambda a: a.__setitem__(slice(0, base), a[src].copy()), col)
        self._infos[0:base] = self._infos[src]

    def _cut_episodes(
        self,
        result: SingleAgentSampleResult,
        finished: list[tuple[int, int, int, _EpisodeState, float]],
        seg_start: list[int],
        row: int,
        episode_mode: bool,
        ends: list[int] | None = None,
    ) -> None:
        """Build the finished episodes and (timestep mode) every sub-env's ongoing chunk.

        Each column's rows ``[0, row]`` are copied once into a sub-env-major block;
        episodes hold views of their rows of it (no two episodes share a row), so a
        call costs a few copies per column rather than a few per episode. A chunk
        continuing an episode starts with its carried lookback rows. ``ends`` (ready-first
        mode) is each sub-env's own last observation row (``row`` is their maximum).
        """
        base = self._base
        if ends is None:
            ends = [row] * self.num_envs
        ongoing = []
        if not episode_mode:
            ongoing = [
                i
                for i in range(self.num_envs)
                if not self._pending[i] and not self._fresh[i] and ends[i] - seg_start[i] > 0
            ]
        if not finished and not ongoing:
            return
        blocks = _Blocks(self, row)
        lb_len = self._lb_len
        # One scan for the whole call: with no info dict in any row, every episode's
        # infos are empty dicts (the common case, without a per-row look per episode).
        any_infos = any(self._infos[: row + 1])

        def first_row(env: int, start: int) -> int:
            return start - lb_len[env] if start == base else start

        done, done_index, stats_out = result.done, result.done_env_index, result.episode_stats
        for i, start, stop, state, end_time in finished:
            episode, stats = self._build(
                blocks, i, first_row(i, start), start, stop, state, True, end_time, any_infos
            )
            done.append(episode)
            done_index.append(i)
            stats_out.append(stats)
        for i in ongoing:
            start = seg_start[i]
            chunk, _ = self._build(
                blocks,
                i,
                first_row(i, start),
                start,
                ends[i],
                self._states[i],
                False,
                0.0,
                any_infos,
            )
            result.ongoing.append(chunk)
            result.ongoing_env_index.append(i)

    def _reset_after_failure(self) -> tuple[Any, list[dict]]:
        obs, infos = self.env.reset()
        return obs, infos

    def _infos_for(
        self, env: int, start: int, stop: int, any_infos: bool = True
    ) -> list[dict] | None:
        """Sub-env ``env``'s info dicts of rows ``[start, stop)``; None when all are empty
        (``from_columns`` then leaves them unmade: an ``EmptyInfosBuffer``)."""
        rows = self._infos
        if not any_infos or not any(rows[start:stop]):  # no sub-env returned an info dict
            return None
        return [({} if rows[r] is None else rows[r][env]) for r in range(start, stop)]

    def _build(
        self,
        blocks: _Blocks,
        env: int,
        first: int,
        start: int,
        last_obs_row: int,
        state: _EpisodeState,
        finished: bool,
        end_time: float,
        any_infos: bool = True,
    ) -> tuple[SingleAgentEpisode, EpisodeStats]:
        """Cut sub-env ``env``'s episode out of rows ``[first, last_obs_row]``.

        Rows ``[first, start)`` are the lookback carried from the previous chunk;
        ``any_infos`` False: no row of this call holds an info dict.
        """
        n = last_obs_row - start
        extras = {
            k: column[env, first:last_obs_row] if flat else column(env, first, last_obs_row)
            for k, column, flat in blocks.extras
        }
        extras["weights_seq_no"] = blocks.seq_no[env, first:last_obs_row]
        terminated = bool(finished and self._terms[last_obs_row - 1, env])
        truncated = bool(finished and not terminated and self._truncs[last_obs_row - 1, env])
        episode = SingleAgentEpisode.from_columns(
            id_=state.id_,
            observations=blocks.obs(env, first, last_obs_row + 1),
            actions=blocks.actions(env, first, last_obs_row),
            rewards=blocks.rewards[env, first:last_obs_row],
            infos=self._infos_for(env, first, last_obs_row + 1, any_infos),
            extra_model_outputs=extras,
            terminated=terminated,
            truncated=truncated,
            t_started=state.t0,
            len_lookback_buffer=start - first,
            observation_space=self.observation_space,
            action_space=self.action_space,
            copy=False,
        )
        chunk_return = blocks.reward_sum(env, start, last_obs_row)
        stats = EpisodeStats(
            length=state.len_before + n,
            ret=state.ret_before + chunk_return,
            duration_s=(end_time or time.time()) - state.start_time,
        )
        if not finished:
            state.t0 += n
            state.len_before += n
            state.ret_before += chunk_return
        return episode, stats


def _first_rows(batch: Any, k: int) -> Any:
    """The first ``k`` rows of each leaf of ``batch``."""
    return map_structure(lambda a: np.asarray(a)[:k], batch)


def _keep_failing_error(lost_steps: int, failures: int) -> EnvRunnerError:
    return EnvRunnerError(
        f"sub-environments keep failing: {failures} failures in this sample() call lost "
        f"{lost_steps} steps, more than {MAX_LOST_STEPS_FACTOR}x the steps asked for, so "
        "no batch can be filled. Fix the env (the log has the first failure's traceback)."
    )


class _Blocks:
    """Sub-env-major copies ``(num_envs, rows, ...)`` of one call's columns.

    One copy per column per call; an episode's columns are views of its sub-env's
    rows, which no other episode and no later call touches.
    """

    def __init__(self, sampler: SingleAgentSampler, row: int):
        self.obs = _slicer(_to_env_major(sampler._obs.data, row + 1))
        actions = sampler._actions
        self.actions = _slicer(_to_env_major(actions.data, row) if actions is not None else None)
        self.rewards = sampler._rewards[:row].T.copy()
        # Per sub-env running sums (float64) give every chunk's return by one subtraction.
        self._cum_rewards = np.zeros((sampler.num_envs, row + 1))
        np.cumsum(self.rewards, axis=1, out=self._cum_rewards[:, 1:])
        self.seq_no = sampler._seq[:row].T.copy()
        #: ``(key, block, flat)``: a plain array block is sliced directly (``flat``),
        #: a nested one through its ``_slicer``.
        self.extras = []
        for k, buf in sampler._extras.items():
            if k in sampler._extras_written:
                block = _to_env_major(buf.data, row)
                flat = isinstance(block, np.ndarray)
                self.extras.append((k, block if flat else _slicer(block), flat))

    def reward_sum(self, env: int, start: int, stop: int) -> float:
        """Sum of sub-env ``env``'s rewards in rows ``[start, stop)``."""
        cum = self._cum_rewards
        return float(cum[env, stop] - cum[env, start])


class _OutputWrites:
    """The ready-first loop's writes of a batch's actions and extra outputs: one fancy
    assignment per column leaf into its flat view (``ColumnBuffer.cells``), without the
    buffer lookups and tree walks of ``_write_outputs_at``. Valid while the columns keep
    their arrays (until ``_capacity`` grows them) and the outputs their keys."""

    __slots__ = ("keys", "actions", "columns")

    def __init__(self, keys: frozenset, actions: Callable, columns: tuple):
        self.keys = keys
        self.actions = actions
        self.columns = columns  # (key, writer of its flat view)

    @classmethod
    def plan(cls, sampler: SingleAgentSampler, extras: dict) -> _OutputWrites:
        """The writes into ``sampler``'s columns for outputs keyed like ``extras`` (after
        ``_write_outputs_at`` made the columns)."""
        columns = tuple((key, _leaf_writer(sampler._extras[key].cells())) for key in extras)
        return cls(frozenset(extras), _leaf_writer(sampler._actions.cells()), columns)

    def fits(self, extras: dict) -> bool:
        """Whether ``extras`` has the planned keys."""
        return extras.keys() == self.keys

    def write(self, cells: np.ndarray, actions: Any, extras: dict) -> None:
        """Write row ``j`` of the actions and of each output at cell ``cells[j]``."""
        self.actions(cells, actions)
        for key, write in self.columns:
            write(cells, extras[key])


def _leaf_writer(flat: Any) -> Callable[[np.ndarray, Any], None]:
    """``write(cells, value)`` into a column's flat view (see ``ColumnBuffer.cells``): its
    ``cell_writer``, or for a nested column (a stateful module's ``state_out``, Dict
    actions) one per leaf, each given the value's leaf at the same path."""
    if type(flat) is np.ndarray:
        return cell_writer(flat)
    writers = [cell_writer(leaf) for leaf in _nested.flatten(flat)]

    def write(cells: np.ndarray, value: Any) -> None:
        for write_leaf, leaf in zip(writers, _nested.flatten(value), strict=True):
            write_leaf(cells, leaf)

    return write


def _to_env_major(data: Any, rows: int) -> Any:
    # ``copy()`` (not ``ascontiguousarray``): with one sub-env the swap is already
    # contiguous and would stay a view of the reused buffer.
    return map_structure(lambda a: np.swapaxes(a[:rows], 0, 1).copy(), data)


def _slicer(block: Any) -> Callable[[int, int, int], Any]:
    """``f(env, start, stop)`` -> the view of those rows of ``block`` (or of each leaf)."""
    if isinstance(block, np.ndarray):
        return lambda env, start, stop: block[env, start:stop]
    return lambda env, start, stop: map_structure(lambda a: a[env, start:stop], block)
