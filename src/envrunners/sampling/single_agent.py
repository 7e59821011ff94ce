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

import time
import uuid
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
    return _EpisodeState(id_=uuid.uuid4().hex, start_time=time.time())


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
        """
        if not self.started:
            raise RuntimeError("SingleAgentSampler.run() called before start()")
        n_envs = self.num_envs
        result = SampleResult()
        episode_mode = num_episodes is not None
        target = num_episodes if episode_mode else num_timesteps
        est_rows = 64 if episode_mode else -(-int(target) // n_envs) + 2
        self._capacity(est_rows)
        self._obs.write(0, self._cur_obs)
        self._infos[0] = self._cur_infos
        self._extras_written = set()
        seg_start = np.zeros(n_envs, np.int64)
        ts = 0
        eps = 0
        row = 0
        action_space = self.env.action_space
        while (eps < target) if episode_mode else (ts < target):
            self._capacity(row + 1)
            if random_actions or act_fn is None:
                actions = np.asarray(action_space.sample())
                extras: dict[str, np.ndarray] = {}
            else:
                actions, extras = act_fn(self._obs.row(row), explore, t_offset + ts)
            env_actions = self.action_fn(actions)
            results = self.step_fn(env_actions)
            if isinstance(results, str) and results == STEP_FAILED:
                # The whole vector env was recreated (the step_fn counted the failure):
                # every in-progress episode is lost.
                result.num_dropped_episodes += int((~self._pending).sum())
                obs, infos = self._reset_after_failure()
                self.start(obs, infos)
                self._obs.write(0, self._cur_obs)
                self._infos[0] = self._cur_infos
                seg_start[:] = 0
                row = 0
                ts = 0
                continue
            self._write_step_outputs(row, actions, extras)
            raw_obs, rewards, terms, truncs, infos = results
            if self.check_fn is not None:
                check, self.check_fn = self.check_fn, None
                check(raw_obs, env_actions)
            new_start = self._pending.copy()
            failed = getattr(self.env, "failed", None)
            if failed is not None and failed.any():
                dropped = failed & ~self._pending
                result.num_dropped_episodes += int(dropped.sum())
                result.num_env_failures += int(failed.sum())
                new_start |= failed
            self._obs.write(row + 1, self.obs_fn(raw_obs))
            self._rewards[row] = rewards if self.reward_fn is None else self.reward_fn(rewards)
            self._terms[row] = terms
            self._truncs[row] = truncs
            self._infos[row + 1] = infos if any(infos) else None
            stepped = ~new_start
            ts += int(stepped.sum())
            if new_start.any():
                for i in np.flatnonzero(new_start):
                    seg_start[i] = row + 1
                    self._states[i] = _new_episode_state()
            done = (terms | truncs) & stepped
            self._pending = done
            row += 1
            if done.any():
                for i in np.flatnonzero(done):
                    episode, stats = self._build(int(i), int(seg_start[i]), row, finished=True)
                    result.done.append(episode)
                    result.done_env_index.append(int(i))
                    result.episode_stats.append(stats)
                    eps += 1
                    if episode_mode and eps >= target:
                        break
        result.env_steps = ts
        if not episode_mode:
            for i in range(n_envs):
                if self._pending[i]:
                    continue
                start = int(seg_start[i])
                if row - start > 0:
                    chunk, _ = self._build(i, start, row, finished=False)
                    result.ongoing.append(chunk)
                    result.ongoing_env_index.append(i)
                elif start > 0:  # reset on the very last step: carry the fresh episode over
                    self._states[i].lookback = None
        self._cur_obs = tree_map(np.copy, self._obs.row(row))
        self._cur_infos = self._infos[row] or [{} for _ in range(n_envs)]
        return result

    def _reset_after_failure(self) -> tuple[Any, list[dict]]:
        obs, infos = self.env.reset()
        return obs, infos

    def _infos_for(self, env: int, start: int, stop: int) -> list[dict]:
        rows = self._infos
        return [({} if rows[r] is None else rows[r][env]) for r in range(start, stop)]

    def _build(
        self, env: int, start: int, last_obs_row: int, *, finished: bool
    ) -> tuple[SingleAgentEpisode, EpisodeStats]:
        """Cut sub-env ``env``'s episode out of rows ``[start, last_obs_row]``."""
        state = self._states[env]
        n = last_obs_row - start
        obs = self._obs.env_slice(start, last_obs_row + 1, env)
        actions = self._actions.env_slice(start, last_obs_row, env)
        rewards = self._rewards[start:last_obs_row, env].copy()
        extras = {
            k: b.env_slice(start, last_obs_row, env)
            for k, b in self._extras.items()
            if k in self._extras_written
        }
        extras["weights_seq_no"] = np.full(n, self.weights_seq_no, dtype=np.int64)
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
            duration_s=time.time() - state.start_time,
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
