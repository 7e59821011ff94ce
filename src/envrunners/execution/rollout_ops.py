"""``synchronous_parallel_sample`` (``ray.rllib.execution.rollout_ops``).

Samples from all healthy remote runners of a group in rounds until the requested
number of steps is collected. Unlike RLlib, a runner that fails, is killed or
misses the deadline mid-round does not shrink the batch: the group takes it out
(a late runner at once, so later rounds do not wait for it), the healthy runners
top the batch up, and the failed one rejoins (with the latest state) as soon as
it is restored. A round does not wait for a straggler (a call running past a
tenth of the deadline) when the others can fill the batch (``_TopUpPass``).
Top-up rounds of new-stack runners ask each runner for its share of the missing
env steps, so a batch of N steps has N to N + num_envs x
num_runners - 1 steps, as without failures. A round in which no runner answers
within ``sample_timeout_s`` is an explicit ``RemoteEnvRunnerError`` when nothing
was collected (never an empty batch).
"""

from __future__ import annotations

import logging
import pickle
import time
import traceback
from typing import Any

from envrunners import errors
from envrunners.env._episode_transport import pack_episodes
from envrunners.env.single_agent_episode import SingleAgentEpisode
from envrunners.errors import ConfigError, EnvRunnerError
from envrunners.utils.gc_pause import paused_gc

__all__ = ["synchronous_parallel_sample"]

logger = logging.getLogger("envrunners")

#: Sample results up to this size travel pickled (see ``_sample_on_runner``).
_PICKLE_MAX_BYTES = 4 << 20


def _sample_on_runner(
    runner: Any, *, random_actions: bool, with_metrics: bool, num_timesteps: int | None = None
) -> Any:
    """Runner side: ``sample()`` (+ ``get_metrics()``); any failure is a runner fault.

    ``num_timesteps`` (top-up rounds) is passed on only when given, so runners
    whose ``sample()`` does not take it (old stack) are never asked for it.

    The result goes back pickled (plain ``pickle``, protocol 5): for a list of
    episodes that is about twice as fast as Ray's own serialization, and it is
    on the critical path of every round. Results plain pickle cannot handle, or
    bigger than 4 MiB (where Ray's zero-copy buffers win), go as they are.
    """
    try:
        kwargs: dict[str, Any] = {} if num_timesteps is None else {"num_timesteps": num_timesteps}
        if random_actions:
            kwargs["random_actions"] = True
        samples = runner.sample(**kwargs)
        result = (samples, runner.get_metrics()) if with_metrics else samples
    except EnvRunnerError:
        raise
    except Exception as err:
        raise EnvRunnerError(
            f"sample() raised {err!r}",
            runner_index=getattr(runner, "worker_index", None),
            remote_traceback=traceback.format_exc(),
        ) from err
    try:
        packed = pack_episodes(samples, SingleAgentEpisode)  # one block for all episodes
        data = pickle.dumps((packed, result[1]) if with_metrics else packed, protocol=5)
    except Exception:  # lambdas, local classes...: let Ray's cloudpickle do it
        return result
    # Big results (large observations) are better off with Ray's zero-copy buffers.
    return _Pickled(data) if len(data) <= _PICKLE_MAX_BYTES else result


class _Pickled:
    """A sample result pickled on the runner; ``load()`` on the driver."""

    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def load(self) -> Any:
        """Unpickle with the cyclic garbage collector paused.

        Why: a round's episodes are thousands of new container objects. With the
        collector on, they trigger young collections that promote them, and every
        ~15 rounds a full collection of the driver's whole heap (torch, Ray: ~200k
        objects, ~120 ms); that was half the driver's CPU per round. Paused, they
        are seen by at most one young collection and die (by refcount) young.
        """
        with paused_gc():
            return pickle.loads(self.data)


def _unpack(result: Any) -> Any:
    return result.load() if isinstance(result, _Pickled) else result


def _count(samples: Any, agent_steps: bool) -> int:
    """Env (or agent) steps in a list of episodes or in a (multi-agent) batch."""
    if isinstance(samples, list):
        if all(type(e) is SingleAgentEpisode for e in samples):  # env = agent steps
            return sum([e.t - e.t_started for e in samples])  # (their ``len()``)
        total = 0
        for episode in samples:
            if agent_steps and hasattr(episode, "agent_steps"):
                total += episode.agent_steps()
            elif hasattr(episode, "env_steps"):
                total += episode.env_steps()
            else:
                total += len(episode)
        return total
    if agent_steps and hasattr(samples, "agent_steps"):
        return samples.agent_steps()
    if hasattr(samples, "env_steps"):
        return samples.env_steps()
    return len(samples)


def _concat(samples: list[Any]) -> Any:
    if not samples:
        return []
    if isinstance(samples[0], list):
        return [episode for chunk in samples for episode in chunk]
    from envrunners.policy.sample_batch import concat_samples

    return concat_samples(samples)


def synchronous_parallel_sample(
    *,
    worker_set: Any,
    max_agent_steps: int | None = None,
    max_env_steps: int | None = None,
    concat: bool = True,
    sample_timeout_s: float | None = None,
    random_actions: bool = False,
    _uses_new_env_runners: bool = False,
    _return_metrics: bool = False,
) -> Any:
    """Sample from the group's runners until ``max_env_steps`` (or agent steps) are collected.

    Without a maximum, one round is sampled. Each round asks every healthy remote
    runner for one ``sample()`` (or the local runner, when there are no remote
    ones); once the maximum is reached the rest of that round is discarded.

    Args:
        worker_set: The ``EnvRunnerGroup``.
        max_agent_steps: Stop after this many agent steps.
        max_env_steps: Stop after this many env steps.
        concat: Flatten the episode lists (new stack) / concatenate the batches.
        sample_timeout_s: Deadline per round (None: the group's
            ``config.sample_timeout_s``); late runners' samples are dropped.
        random_actions: Sample with random actions.
        _uses_new_env_runners: Accepted for RLlib compatibility (detected anyway).
        _return_metrics: Also return each runner's ``get_metrics()``.

    Returns:
        The samples (a list of episodes, a batch, or per-runner lists if not
        ``concat``), and with ``_return_metrics`` a tuple ``(samples, metrics)``.

    Raises:
        ConfigError: Both maxima were given.
        RemoteEnvRunnerError: No runner delivered anything (all failed, dead or late),
            or a runner failed and failures are not ignored.
    """
    if max_agent_steps and max_env_steps:
        raise ConfigError(
            "synchronous_parallel_sample(): give max_agent_steps or max_env_steps, not both "
            f"(got {max_agent_steps} and {max_env_steps})."
        )
    limit = max_agent_steps or max_env_steps
    count_agents = bool(max_agent_steps)
    samples: list[Any] = []
    metrics: list[Any] = []
    steps = 0
    while (limit is None and steps == 0) or (limit is not None and steps < limit):
        if worker_set.num_remote_env_runners() == 0:
            local = worker_set.local_env_runner
            chunk = local.sample(random_actions=True) if random_actions else local.sample()
            round_results = [(chunk, local.get_metrics()) if _return_metrics else chunk]
        else:
            top_up = None
            if samples and limit is not None and not count_agents:
                top_up = limit - steps
            if limit is not None and not count_agents and _takes_step_counts(worker_set):
                round_results = _TopUpPass(
                    worker_set, random_actions, _return_metrics, sample_timeout_s
                ).run(limit - steps, bool(samples))
            else:
                round_results = _remote_round(
                    worker_set,
                    random_actions,
                    _return_metrics,
                    sample_timeout_s,
                    bool(samples),
                    top_up,
                )
            if round_results is None:
                logger.warning(
                    "synchronous_parallel_sample(): returning %d of the %s steps asked for; "
                    "see the errors above.",
                    steps,
                    limit,
                )
                break
        for result in round_results:
            chunk, stats = result if _return_metrics else (result, None)
            steps += _count(chunk, count_agents)
            samples.append(chunk)
            metrics.append(stats)
            if limit is not None and steps >= limit:
                break
    data = _concat(samples) if concat else samples
    return (data, metrics) if _return_metrics else data


def _takes_step_counts(group: Any) -> bool:
    """Whether the group's runners sample a given number of env steps (see ``_top_up_shares``)."""
    config = group._remote_config
    return bool(
        config.enable_env_runner_and_connector_v2
        and config.batch_mode == "truncate_episodes"
        and config.count_steps_by == "env_steps"
    )


def _top_up_shares(config: Any, ids: list[int], missing: int | None) -> list[int] | None:
    """Env steps to ask each runner for in a top-up round (None: a plain ``sample()``).

    Only new-stack runners in ``truncate_episodes`` mode counting env steps take
    a step count; each returns its share up to ``num_envs - 1`` more, so the round
    adds at most ``missing + len(ids) * num_envs - 1`` steps. A share is at most
    the runner's usual ``sample()`` (one fragment per sub-env), so rounds keep
    their length and restored runners rejoin between them.
    """
    if (
        missing is None
        or missing <= 0
        or not ids
        or not config.enable_env_runner_and_connector_v2
        or config.batch_mode != "truncate_episodes"
        or config.count_steps_by != "env_steps"
    ):
        return None
    share, extra = divmod(missing, len(ids))
    num_envs = int(config.num_envs_per_env_runner)
    return [
        min(share + (1 if k < extra else 0), config.get_rollout_fragment_length(i) * num_envs)
        for k, i in enumerate(ids)
    ]


def _remote_round(
    group: Any,
    random_actions: bool,
    with_metrics: bool,
    timeout: float | None,
    have_data: bool,
    missing: int | None = None,
) -> list[Any] | None:
    """One sampling round over the healthy remote runners (None: stop with what we have).

    ``missing``: the env steps still needed after an earlier round (a top-up round).
    """
    config = group._remote_config
    if group.num_healthy_remote_env_runners() == 0:
        wait = float(config.env_runner_health_probe_timeout_s)
        if not (config.restart_failed_env_runners and group._await_healthy(wait)):
            if have_data:
                return None
            raise errors.RemoteEnvRunnerError(
                f"No healthy remote env runners left (0 of {group.num_remote_env_runners()}; "
                f"none restored within env_runner_health_probe_timeout_s={wait}s). Enable "
                "restart_failed_env_runners, or check the runners' logs."
            )
    asked = group.healthy_env_runner_ids()
    kwargs: dict | list[dict] = {"random_actions": random_actions, "with_metrics": with_metrics}
    shares = _top_up_shares(config, asked, missing)
    if shares is not None:
        pairs = [(i, n) for i, n in zip(asked, shares) if n > 0]
        asked = [i for i, _ in pairs]
        kwargs = [{**kwargs, "num_timesteps": n} for _, n in pairs]
    results = group.foreach_env_runner(
        _sample_on_runner,
        kwargs=kwargs,
        local_env_runner=False,
        remote_worker_ids=asked,
        timeout_seconds=timeout,
    )
    if results:
        return [_unpack(r) for r in results]
    if group.num_healthy_remote_env_runners() < len(asked):
        return []  # runners failed this round: the next round waits for restored ones
    if have_data:
        return None
    raise errors.RemoteEnvRunnerError(
        f"No samples returned from remote env runners {asked} within sample_timeout_s="
        f"{timeout if timeout is not None else config.sample_timeout_s}s; they are slow or "
        "hung (num_env_runners_dropped_lifetime="
        f"{group.num_env_runners_dropped_lifetime()}). Raise sample_timeout_s, or lower "
        "rollout_fragment_length / num_envs_per_env_runner."
    )


#: A call is a straggler (no longer counted on) after this share of the deadline,
#: or after ``_STRAGGLER_FACTOR`` times the slowest call of the pass, if longer.
_STRAGGLER_SHARE = 0.1
_STRAGGLER_FACTOR = 3.0


class _Call:
    """One ``sample()`` call in flight: its runner, when it was sent, the steps asked."""

    __slots__ = ("actor_id", "sent_at", "asked", "counted")

    def __init__(self, actor_id: int, sent_at: float, asked: int):
        self.actor_id, self.sent_at, self.asked, self.counted = actor_id, sent_at, asked, True


class _TopUpPass:
    """Sample ``need`` env steps in rounds that do not wait for stragglers.

    Rounds as in ``_remote_round`` (a plain ``sample()`` from every healthy
    runner, then top-up rounds asking each for its share of the missing steps),
    but a call still running after ``_STRAGGLER_SHARE`` of the deadline (or
    ``_STRAGGLER_FACTOR`` x the slowest call so far, if longer) is no longer
    waited for: the next round starts without it, so the healthy runners fill
    the batch while it is in flight. Its result, if it comes while the batch is
    still short, is used when it fits (the batch stays within N + num_envs x
    num_runners - 1 steps), else dropped; a straggler still running when the
    batch is full is left to the group's late-call watch: out of service until
    it returns (that result is dropped, never used for a later batch) and killed
    as hung ``replace_env_runner_after_missed_deadlines`` deadlines after it was
    sent. The pass wakes for those kills, so a hung runner is replaced on time
    while the others keep sampling.
    """

    def __init__(self, group: Any, random_actions: bool, with_metrics: bool, timeout: Any):
        self.group = group
        self.manager = group._worker_manager
        self.config = group._remote_config
        self.random_actions = random_actions
        self.with_metrics = with_metrics
        self.timeout = group._deadline(timeout)
        self.calls: dict[Any, _Call] = {}
        self.slowest = 0.0
        self.fired = False

    def run(self, need: int, have_data: bool) -> list[Any] | None:
        """The results (``[]``: runners failed, try again; None: stop with what we have)."""
        group, manager = self.group, self.manager
        if group.num_healthy_remote_env_runners() == 0:
            return _remote_round(
                group, self.random_actions, self.with_metrics, self.timeout, have_data, need
            )
        group._recovery.maintain()
        results: list[Any] = []
        collected = 0
        num_envs = int(self.config.num_envs_per_env_runner)
        failed = False
        while True:
            now = time.monotonic()
            self._mark_stragglers(now)
            counted = any(c.counted for c in self.calls.values())
            if collected >= need and not counted:
                break
            if collected < need and not counted:  # a new round (the stragglers left out)
                self._fire_idle(need - collected, have_data or bool(results))
            if not self.calls:
                break
            ready = self._wait(now)
            got = manager.collect({r: self.calls[r].actor_id for r in ready}, ready)
            for ref, result in zip(ready, got.result_or_errors):
                call = self.calls.pop(ref)
                if not result.ok:
                    failed = True
                    continue
                value = _unpack(result.get())
                n = _count(value[0] if self.with_metrics else value, False)
                self.slowest = max(self.slowest, time.monotonic() - call.sent_at)
                others = sum(c.asked for c in self.calls.values() if c.counted)
                fits = call.counted or collected + others + n <= need + num_envs - 1
                if collected < need and fits:
                    results.append(value)
                    collected += n
                elif not call.counted:  # (the rest of a full first wave goes unlogged)
                    group._log_dropped([call.actor_id], "answered too late to fit the batch", 1)
            group._recovery.after_call(got, False)
            failed |= self._past_deadline(time.monotonic())
            group._recovery.maintain()
        self._set_aside()
        if results:
            return results
        if failed or self.fired:
            return []  # runners failed or were late: the next pass waits for restored ones
        if have_data:
            return None
        return _remote_round(
            group, self.random_actions, self.with_metrics, self.timeout, have_data, need
        )

    def _fire_idle(self, room: int, have_data: bool) -> None:
        """Ask the healthy runners without a call in flight for their share of ``room``."""
        busy = {c.actor_id for c in self.calls.values()}
        idle = [i for i in self.group.healthy_env_runner_ids() if i not in busy]
        if not idle or room <= 0:
            return
        base = {"random_actions": self.random_actions, "with_metrics": self.with_metrics}
        if not have_data and not self.fired:
            num_envs = int(self.config.num_envs_per_env_runner)
            asks = [(i, None, self.config.get_rollout_fragment_length(i) * num_envs) for i in idle]
        else:
            shares = _top_up_shares(self.config, idle, room) or []
            asks = [(i, n, n) for i, n in zip(idle, shares) if n > 0]
        for actor_id, num_timesteps, asked in asks:
            kwargs = base if num_timesteps is None else {**base, "num_timesteps": num_timesteps}
            ref = self.manager.fire(actor_id, _sample_on_runner, kwargs)
            self.calls[ref] = _Call(actor_id, time.monotonic(), asked)
        self.fired = self.fired or bool(asks)

    def _grace(self) -> float | None:
        if self.timeout is None or self.timeout <= 0:
            return None
        return max(_STRAGGLER_SHARE * self.timeout, _STRAGGLER_FACTOR * self.slowest)

    def _mark_stragglers(self, now: float) -> None:
        grace = self._grace()
        if grace is None:
            return
        for call in self.calls.values():
            if call.counted and now - call.sent_at >= grace:
                call.counted = False

    def _wait(self, now: float) -> list[Any]:
        """Wait for the first call to finish, or the next straggler, deadline or hung check."""
        import ray

        wake: list[float] = []
        grace = self._grace()
        if grace is not None:
            for call in self.calls.values():
                wake.append(call.sent_at + self.timeout)
                if call.counted:
                    wake.append(call.sent_at + grace)
        hung_at = self.manager.next_hung_check_at()
        if hung_at is not None:
            wake.append(hung_at)
        # A wake-up already due still waits a little: no busy loop on a stale one.
        left = None if not wake else max(0.005, min(wake) - now)
        refs = list(self.calls)
        ready, rest = ray.wait(refs, num_returns=1, timeout=left)
        if ready and rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        return ready

    def _past_deadline(self, now: float) -> bool:
        """Count the calls past their deadline as missed (their runners go out of service)."""
        if self.timeout is None or self.timeout <= 0:
            return False
        late = [(r, c) for r, c in self.calls.items() if now - c.sent_at >= self.timeout]
        for ref, call in late:
            del self.calls[ref]
            self.manager.missed_deadline(call.actor_id, ref, call.sent_at, self.timeout)
        if late:
            ids = [c.actor_id for _, c in late]
            self.group._log_dropped(ids, f"did not answer within {self.timeout}s", len(late))
        return bool(late)

    def _set_aside(self) -> None:
        """Leave the stragglers still running to the late-call watch (results dropped)."""
        if not self.calls:
            return
        for ref, call in self.calls.items():
            self.manager.set_aside(call.actor_id, ref, call.sent_at, float(self.timeout))
        ids = [c.actor_id for c in self.calls.values()]
        self.group._log_dropped(ids, "were still busy when the batch was full", len(ids))
        self.calls.clear()
