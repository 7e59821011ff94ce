"""The single-agent sampling loop: vector steps into column buffers, episodes at the end.

One iteration = one batched policy call for all sub-envs, one ``env.step`` of the
vector env and one row written per column. No per-step, per-sub-env Python
objects are made: episodes (``SingleAgentEpisode``) are built once per
``run()`` from slices of the buffers. Gymnasium's ``NEXT_STEP`` autoreset is
followed: the step after a sub-env's episode ended returns its reset observation,
ignores its action and is not counted as a timestep.

The same loop serves ``SingleAgentEnvRunner`` and the old-stack ``RolloutWorker``
(which turns the episodes into ``SampleBatch``es at the edge).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.env.single_agent_episode import SingleAgentEpisode
from envrunners.sampling.buffers import ColumnBuffer, tree_map

__all__ = ["ActFn", "EpisodeStats", "SampleResult", "SingleAgentSampler", "STEP_FAILED"]

#: Returned by a ``step_fn`` when the whole vector env failed and was recreated.
STEP_FAILED = "env_step_failure"

#: ``act_fn(obs_batch, explore, t) -> (actions, extra_model_outputs)``
ActFn = Callable[[Any, bool, int], tuple[np.ndarray, dict[str, np.ndarray]]]


@dataclass
class EpisodeStats:
    """Whole-episode numbers of one finished episode (all of its chunks together)."""

    length: int
    ret: float
    duration_s: float


@dataclass
class SampleResult:
    """What one ``run()`` produced."""

    done: list[SingleAgentEpisode] = field(default_factory=list)
    ongoing: list[SingleAgentEpisode] = field(default_factory=list)
    done_env_index: list[int] = field(default_factory=list)
    ongoing_env_index: list[int] = field(default_factory=list)
    env_steps: int = 0
    episode_stats: list[EpisodeStats] = field(default_factory=list)
    num_dropped_episodes: int = 0
    num_env_failures: int = 0

    @property
    def episodes(self) -> list[SingleAgentEpisode]:
        """Finished episodes first, then ongoing chunks in sub-env order (RLlib's order)."""
        return self.done + self.ongoing


@dataclass
class _EpisodeState:
    """Per-sub-env bookkeeping for the episode in progress."""

    id_: str
    t0: int = 0  # episode timestep of this call's first obs row for this episode
    start_time: float = 0.0
    len_before: int = 0  # steps in earlier, already returned chunks
    ret_before: float = 0.0
    lookback: dict[str, Any] | None = None  # tails of the previous chunk (continuations)


def _new_episode_state() -> _EpisodeState:
    # 32 random hex digits, like ``uuid.uuid4().hex`` at a third of the cost.
    return _EpisodeState(id_=os.urandom(16).hex(), start_time=time.time())


def _tail(x: Any, n: int) -> Any:
    return tree_map(lambda a: a[len(a) - n :].copy(), x) if n else tree_map(lambda a: a[:0], x)


def _concat(a: Any, b: Any) -> Any:
    return tree_map(lambda x, y: np.concatenate([x, y]), a, b)


class SingleAgentSampler:
    """Runs the sampling loop over one vector env; keeps episode state between calls.

    Args:
        env: A vector env whose ``step`` returns ``infos`` as a list of dicts.
        observation_space: The (module-side) single observation space for episodes.
        action_space: The single action space for episodes.
        step_fn: ``step_fn(actions_for_env)`` -> the 5-tuple, or ``STEP_FAILED``.
        obs_fn: Env-to-module transform of a raw observation batch (e.g. a filter).
        action_fn: Module-to-env transform of an action batch (clip/unsquash).
        reward_fn: Transform of the reward batch before it is stored (clipping).
        lookback: ``episode_lookback_horizon``: items carried into continuation chunks.
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
        self._obs: ColumnBuffer | None = None
        self._actions: ColumnBuffer | None = None
        self._extras: dict[str, ColumnBuffer] = {}
        self._extras_written: set[str] = set()  # extra columns filled by this run()
        self._rewards: np.ndarray = np.zeros((0, self.num_envs), np.float32)
        self._terms: np.ndarray = np.zeros((0, self.num_envs), np.bool_)
        self._truncs: np.ndarray = np.zeros((0, self.num_envs), np.bool_)
        self._infos: list[list[dict] | None] = []
        self._cur_obs: Any = None
        self._cur_infos: list[dict] | None = None
        self._pending = np.zeros(self.num_envs, np.bool_)
        self._states: list[_EpisodeState] = []
        self._rows_capacity = 0
        self.weights_seq_no = 0
        #: Called with (raw_obs, actions_for_env) on the next step only (env checking).
        self.check_fn: Callable[[Any, Any], None] | None = None

    # -- episode state -------------------------------------------------------------
    def start(self, raw_obs: Any, infos: list[dict]) -> None:
        """Begin fresh episodes on every sub-env from a reset's observations."""
        self._cur_obs = tree_map(np.copy, self.obs_fn(raw_obs))
        self._cur_infos = list(infos)
        self._pending[:] = False
        self._states = [_new_episode_state() for _ in range(self.num_envs)]

    @property
    def started(self) -> bool:
        """Whether ``start()`` was called (the env has been reset)."""
        return self._cur_obs is not None

    def _capacity(self, rows: int) -> None:
        """Make room for ``rows`` step rows (and ``rows + 1`` observation rows)."""
        if self._obs is None:
            example = tree_map(lambda a: np.asarray(a), self._cur_obs)
            self._obs = ColumnBuffer(example, rows + 1)
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
        if len(self._infos) < rows + 1:
            self._infos.extend([None] * (rows + 1 - len(self._infos)))
        # Step rows that fit in every column (extras made later get the obs capacity).
        self._rows_capacity = min(
            len(self._rewards),
            len(self._infos) - 1,
            self._obs.capacity - 1,
            self._actions.capacity if self._actions is not None else rows,
            *(buf.capacity for buf in self._extras.values()),
        )

    def _write_step_outputs(self, row: int, actions: Any, extras: dict) -> None:
        capacity = self._obs.capacity
        if self._actions is None:
            self._actions = ColumnBuffer(actions, capacity)
        self._actions.write(row, actions)
        for key, value in extras.items():
            buf = self._extras.get(key)
            if buf is None:
                buf = self._extras[key] = ColumnBuffer(value, capacity)
            buf.write(row, value)
            self._extras_written.add(key)

    # -- the loop ------------------------------------------------------------------
    def run(
        self,
        *,
        act_fn: ActFn | None,
        explore: bool,
        num_timesteps: int | None = None,
        num_episodes: int | None = None,
        random_actions: bool = False,
        t_offset: int = 0,
    ) -> SampleResult:
        """Sample ``num_timesteps`` env steps or ``num_episodes`` whole episodes.

        Timestep mode returns finished episodes plus the in-progress chunk of every
        sub-env that stepped (continued by the next call with the same id);
        episode mode returns finished episodes only.

        Per vector step the loop does one act, one env step, one row write per
        column and a few whole-batch numpy ops; which rows belong to which episode
        is noted as ``(sub-env, first row, last row)`` and all episodes are cut out
        of the buffers after the loop.
        """
        if not self.started:
            raise RuntimeError("SingleAgentSampler.run() called before start()")
        n_envs = self.num_envs
        result = SampleResult()
        episode_mode = num_episodes is not None
        target = int(num_episodes if episode_mode else num_timesteps)
        self._capacity(64 if episode_mode else -(-target // n_envs) + 2)
        self._obs.write(0, self._cur_obs)
        self._infos[0] = self._cur_infos
        self._extras_written = set()
        seg_start = [0] * n_envs
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
        ts = eps = row = 0
        while (eps < target) if episode_mode else (ts < target):
            if row >= self._rows_capacity:
                self._capacity(row + 1)
            if random_actions or act_fn is None:
                actions = np.asarray(action_space.sample())
                extras: dict[str, np.ndarray] = {}
            else:
                actions, extras = act_fn(self._obs.row(row), explore, t_offset + ts)
            env_actions = action_fn(actions)
            results = step_fn(env_actions)
            if isinstance(results, str):  # STEP_FAILED
                # The whole vector env was recreated (the step_fn counted the failure):
                # every in-progress episode is lost, including those that finished in
                # this call but were not returned yet.
                result.num_dropped_episodes += n_envs - len(pending)
                obs, infos = self._reset_after_failure()
                self.start(obs, infos)
                states = self._states
                self._obs.write(0, self._cur_obs)
                self._infos[0] = self._cur_infos
                seg_start = [0] * n_envs
                finished = []
                pending = []
                row = ts = eps = 0
                continue
            self._write_step_outputs(row, actions, extras)
            raw_obs, rewards, terms, truncs, infos = results
            if self.check_fn is not None:
                check, self.check_fn = self.check_fn, None
                check(raw_obs, env_actions)
            new_start = pending
            if has_errors and env.last_errors:
                failed = np.flatnonzero(env.failed).tolist()
                result.num_dropped_episodes += len(set(failed) - set(pending))
                result.num_env_failures += len(failed)
                new_start = sorted(set(pending) | set(failed))
            row += 1
            self._obs.write(row, obs_fn(raw_obs))
            self._rewards[row - 1] = rewards if reward_fn is None else reward_fn(rewards)
            self._terms[row - 1] = terms
            self._truncs[row - 1] = truncs
            self._infos[row] = infos if any(infos) else None
            ts += n_envs - len(new_start)
            done = np.logical_or(terms, truncs)
            if new_start:
                for i in new_start:
                    seg_start[i] = row
                    states[i] = _new_episode_state()
                done[new_start] = False
            if done.any():
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
        result.env_steps = ts
        self._cut_episodes(result, finished, seg_start, row, episode_mode)
        self._cur_obs = tree_map(np.copy, self._obs.row(row))
        self._cur_infos = self._infos[row] or [{} for _ in range(n_envs)]
        return result

    def _cut_episodes(
        self,
        result: SampleResult,
        finished: list[tuple[int, int, int, _EpisodeState, float]],
        seg_start: list[int],
        row: int,
        episode_mode: bool,
    ) -> None:
        """Build the finished episodes and (timestep mode) every sub-env's ongoing chunk.

        Each column's rows ``[0, row]`` are copied once into a sub-env-major block;
        episodes hold views of their rows of it (no two episodes share a row), so a
        call costs a few copies per column rather than a few per episode.
        """
        ongoing = []
        if not episode_mode:
            for i in range(self.num_envs):
                if self._pending[i]:
                    continue
                start = seg_start[i]
                if row - start > 0:
                    ongoing.append(i)
                elif start > 0:  # reset on the very last step: carry the fresh episode over
                    self._states[i].lookback = None
        if not finished and not ongoing:
            return
        blocks = _Blocks(self, row)
        for i, start, stop, state, end_time in finished:
            episode, stats = self._build(blocks, i, start, stop, state, True, end_time)
            result.done.append(episode)
            result.done_env_index.append(i)
            result.episode_stats.append(stats)
        for i in ongoing:
            chunk, _ = self._build(blocks, i, seg_start[i], row, self._states[i], False, 0.0)
            result.ongoing.append(chunk)
            result.ongoing_env_index.append(i)

    def _reset_after_failure(self) -> tuple[Any, list[dict]]:
        obs, infos = self.env.reset()
        return obs, infos

    def _infos_for(self, env: int, start: int, stop: int) -> list[dict]:
        rows = self._infos
        return [({} if rows[r] is None else rows[r][env]) for r in range(start, stop)]

    def _build(
        self,
        blocks: _Blocks,
        env: int,
        start: int,
        last_obs_row: int,
        state: _EpisodeState,
        finished: bool,
        end_time: float,
    ) -> tuple[SingleAgentEpisode, EpisodeStats]:
        """Cut sub-env ``env``'s episode out of rows ``[start, last_obs_row]``."""
        n = last_obs_row - start
        obs = blocks.obs(env, start, last_obs_row + 1)
        actions = blocks.actions(env, start, last_obs_row)
        rewards = blocks.rewards[env, start:last_obs_row]
        extras = {k: b(env, start, last_obs_row) for k, b in blocks.extras.items()}
        extras["weights_seq_no"] = blocks.seq_no[env, start:last_obs_row]
        infos = self._infos_for(env, start, last_obs_row + 1)
        lb = state.lookback if start == 0 else None
        n_lb = 0
        if lb is not None:
            n_lb = len(lb["rewards"])
            obs = _concat(lb["obs"], obs)
            actions = _concat(lb["actions"], actions)
            rewards = np.concatenate([lb["rewards"], rewards])
            infos = lb["infos"] + infos
            for k in extras:
                if k in lb["extras"]:
                    extras[k] = _concat(lb["extras"][k], extras[k])
                else:  # e.g. the previous chunk was sampled with random actions
                    pad = tree_map(lambda a: np.zeros((n_lb, *a.shape[1:]), a.dtype), extras[k])
                    extras[k] = _concat(pad, extras[k])
        terminated = bool(finished and self._terms[last_obs_row - 1, env])
        truncated = bool(finished and not terminated and self._truncs[last_obs_row - 1, env])
        episode = SingleAgentEpisode.from_columns(
            id_=state.id_,
            observations=obs,
            actions=actions,
            rewards=rewards,
            infos=infos,
            extra_model_outputs=extras,
            terminated=terminated,
            truncated=truncated,
            t_started=state.t0,
            len_lookback_buffer=n_lb,
            observation_space=self.observation_space,
            action_space=self.action_space,
            copy=False,
        )
        chunk_return = float(rewards[n_lb:].sum())
        stats = EpisodeStats(
            length=state.len_before + n,
            ret=state.ret_before + chunk_return,
            duration_s=(end_time or time.time()) - state.start_time,
        )
        if not finished:
            keep = min(self.lookback, n_lb + n)
            state.lookback = {
                # obs: the `keep` items before the current (last) observation
                "obs": tree_map(lambda a: a[len(a) - 1 - keep : len(a) - 1].copy(), obs),
                "infos": infos[len(infos) - 1 - keep : len(infos) - 1],
                "actions": _tail(actions, keep),
                "rewards": rewards[len(rewards) - keep :].copy(),
                "extras": {k: _tail(v, keep) for k, v in extras.items()},
            }
            state.t0 += n
            state.len_before += n
            state.ret_before += chunk_return
        return episode, stats


class _Blocks:
    """Sub-env-major copies ``(num_envs, rows, ...)`` of one call's columns.

    One copy per column per call; an episode's columns are views of its sub-env's
    rows, which no other episode and no later call touches.
    """

    def __init__(self, sampler: SingleAgentSampler, row: int):
        self._obs = _to_env_major(sampler._obs.data, row + 1)
        self._actions = _to_env_major(sampler._actions.data, row) if row else None
        self.rewards = sampler._rewards[:row].T.copy()
        self.seq_no = np.full((sampler.num_envs, row), sampler.weights_seq_no, dtype=np.int64)
        self.extras = {
            k: _slicer(_to_env_major(buf.data, row))
            for k, buf in sampler._extras.items()
            if k in sampler._extras_written
        }

    def obs(self, env: int, start: int, stop: int) -> Any:
        return _env_rows(self._obs, env, start, stop)

    def actions(self, env: int, start: int, stop: int) -> Any:
        return _env_rows(self._actions, env, start, stop)


def _to_env_major(data: Any, rows: int) -> Any:
    # ``copy()`` (not ``ascontiguousarray``): with one sub-env the swap is already
    # contiguous and would stay a view of the reused buffer.
    return tree_map(lambda a: np.swapaxes(a[:rows], 0, 1).copy(), data)


def _env_rows(block: Any, env: int, start: int, stop: int) -> Any:
    if isinstance(block, np.ndarray):
        return block[env, start:stop]
    return tree_map(lambda a: a[env, start:stop], block)


def _slicer(block: Any) -> Callable[[int, int, int], Any]:
    return lambda env, start, stop: _env_rows(block, env, start, stop)
