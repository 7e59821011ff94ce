"""W2: an EnvRunnerGroup of 2 remote runners x 8 CartPole-v1 envs, sample + sync each iteration.

One iteration = ``synchronous_parallel_sample(max_env_steps=4000)`` over the group
(PPO's default train batch; fragments "auto" → 250 steps per env) followed by
``sync_weights()`` from the local runner, as PPO's training step does. Reports
env steps/s, iteration latency, the cold group start (including Ray's start, as a
user sees it) and the runners' RSS. The reference variant ``local_1x16`` is one
in-process runner with the same 16 envs, ``sample(num_timesteps=4000)``.

``group_2x16_continuous`` (envrunners only: RLlib's PPO has no such mode) is the
continuous mode of ``config.env_runners(sample_continuously=True)``: 2 remote
runners x 16 envs keep sampling (``max_requests_in_flight_per_env_runner=2``
requests each) while the driver takes ``BATCH`` steps per iteration
(``ContinuousSampler.take``) and pushes weights without waiting
(``sync_weights()``). Its rate is the env steps the driver receives per second;
``continuous_vs_local`` compares it with ``local_1x16`` of the same run.

``cpu_ms_per_1k_steps`` (continuous and local) is the CPU time per 1,000 env
steps received, by process: the driver, the runners, and Ray's own processes
(raylet, GCS, dashboard: the started Ray's processes other than the runners).
With it the 2-core bound of the continuous variant is ``2 * local / sum(continuous)``.
``driver_gc`` (both) counts the driver's garbage collections in the timed window
and their CPU ms per 1,000 env steps, young (generations 0-1) and full. Both
timed windows start after a full ``gc.collect()``: one full collection of the
driver's ~230k-object heap costs ~100 ms, about 1 ms per 1,000 steps of a window,
and otherwise landed in one run's window and not in the next (how many did is
in ``driver_gc``).
"""

from __future__ import annotations

import collections
import gc
import statistics
import time

from common import api, median_rate

WORKLOAD = "W2"
BATCH = 4000
WARMUP_S = 12.0


#: Requests in flight per runner in the continuous variant (its staleness bound).
CONTINUOUS_IN_FLIGHT = 2


def _config(target: str, num_env_runners: int, num_envs: int, **runners):
    PPOConfig = api(target, "envrunners.algorithms.ppo").PPOConfig
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=num_envs,
            rollout_fragment_length="auto",  # RLlib's PPO default, set for both targets
            **runners,
        )
    )
    if target == "ray.rllib":
        config = config.api_stack(
            enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True
        )
    return config


def _pid(runner) -> int:
    import os

    return os.getpid()


def _cpu_seconds(runner_pids: list[int]) -> dict[str, float]:
    """CPU seconds so far of this process, the runners and the rest of this process' tree."""
    import psutil

    me = psutil.Process()
    out = {"driver": time.process_time(), "runners": 0.0, "ray_processes": 0.0}
    procs = {p.pid: p for p in me.children(recursive=True)}
    for pid in runner_pids:
        if pid not in procs:
            try:
                procs[pid] = psutil.Process(pid)
            except psutil.Error:
                continue
    for pid, proc in procs.items():
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        out["runners" if pid in runner_pids else "ray_processes"] += times.user + times.system
    return out


def _per_1k(before: dict[str, float], after: dict[str, float], steps: int) -> dict[str, float]:
    return {k: round(1e6 * (after[k] - before[k]) / max(steps, 1), 3) for k in before}


class _GCWatch:
    """Counts this process' garbage collections (and their time) while entered."""

    def __init__(self) -> None:
        self.counts: collections.Counter[int] = collections.Counter()
        self.seconds: collections.Counter[int] = collections.Counter()
        self._started = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.counts[info["generation"]] += 1
            self.seconds[info["generation"]] += time.process_time() - self._started

    def __enter__(self) -> _GCWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def record(self, steps: int) -> dict:
        """Collections in the window; their CPU ms per 1,000 env steps, young and full."""
        young = self.seconds[0] + self.seconds[1]
        return {
            "young_collections": self.counts[0] + self.counts[1],
            "full_collections": self.counts[2],
            "young_ms_per_1k_steps": round(1e6 * young / max(steps, 1), 3),
            "full_ms_per_1k_steps": round(1e6 * self.seconds[2] / max(steps, 1), 3),
        }


def _rss_mb(runner) -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _shutdown_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def group_iteration(group, sample) -> int:
    """One W2 iteration: a ``BATCH``-step synchronous sample, then a weight sync; its steps."""
    episodes = sample(
        worker_set=group,
        max_env_steps=BATCH,
        sample_timeout_s=60.0,
        _uses_new_env_runners=True,
    )
    group.sync_weights()
    return sum(len(e) for e in episodes)


def run_group(target: str, repeats: int) -> dict:
    """The 2 x 8 group: cold start, then ``repeats`` timed iterations after 2 warm-ups."""
    EnvRunnerGroup = api(target, "envrunners.env.env_runner_group").EnvRunnerGroup
    sample = api(target, "envrunners.execution.rollout_ops").synchronous_parallel_sample
    _shutdown_ray()
    config = _config(target, 2, 8)
    start = time.perf_counter()
    group = EnvRunnerGroup(config=config, num_env_runners=2, local_env_runner=True)
    start_s = time.perf_counter() - start

    def iteration() -> int:
        return group_iteration(group, sample)

    warm_until = time.perf_counter() + WARMUP_S
    for k in range(1000):  # >= 2 iterations and >= WARMUP_S: start-up work has settled
        iteration()
        if k >= 1 and time.perf_counter() >= warm_until:
            break
    latencies, rates = [], []
    for _ in range(max(repeats, 3)):
        t = time.perf_counter()
        n = iteration()
        dt = time.perf_counter() - t
        latencies.append(dt)
        rates.append(n / dt)
    rss = group.foreach_env_runner(_rss_mb, local_env_runner=False)
    group.stop()
    _shutdown_ray()
    return {
        "workload": WORKLOAD,
        "target": target,
        "variant": "group_2x8",
        "num_runners": 2,
        "num_envs": 16,
        "env_steps_per_s": statistics.median(rates),
        "per_s_min": min(rates),
        "per_s_max": max(rates),
        "iteration_ms_median": 1000 * statistics.median(latencies),
        "group_start_s": start_s,
        "runner_rss_mb": rss,
        "repeats": len(rates),
    }


def run_continuous(target: str, repeats: int) -> dict:
    """2 remote runners x 16 envs sampling continuously; the env steps/s the driver receives."""
    from envrunners.env.env_runner_group import EnvRunnerGroup
    from envrunners.execution._continuous_sampling import ContinuousSampler

    _shutdown_ray()
    config = _config(
        target,
        2,
        16,
        sample_continuously=True,
        max_requests_in_flight_per_env_runner=CONTINUOUS_IN_FLIGHT,
    )
    group = EnvRunnerGroup(config=config, num_env_runners=2, local_env_runner=True)
    sampler = ContinuousSampler(group)
    version = 0
    sync_s: list[float] = []

    def iteration() -> int:
        nonlocal version
        results = sampler.take(max_env_steps=BATCH, timeout_s=60.0)
        version += 1  # as after a learner update: a new version, pushed without waiting
        group.local_env_runner._weights_seq_no = version  # what a learner's push would say
        t = time.perf_counter()
        group.sync_weights()
        sync_s.append(time.perf_counter() - t)
        sampler.set_weights_version(version)
        return sum(r.env_steps for r in results)

    warm_until = time.perf_counter() + WARMUP_S
    for k in range(1000):
        iteration()
        if k >= 1 and time.perf_counter() >= warm_until:
            break
    rates, steps = [], 0
    sync_s.clear()
    runner_pids = group.foreach_env_runner(_pid, local_env_runner=False)
    gc.collect()
    cpu_before = _cpu_seconds(runner_pids)
    start = time.perf_counter()
    with _GCWatch() as gc_watch:
        for _ in range(max(3 * repeats, 10)):  # iterations vary: the queue may be full or not
            t = time.perf_counter()
            n = iteration()
            rates.append(n / (time.perf_counter() - t))
            steps += n
    seconds = time.perf_counter() - start
    cpu = _per_1k(cpu_before, _cpu_seconds(runner_pids), steps)
    sampler.stop()
    group.stop()
    _shutdown_ray()
    return {
        "workload": WORKLOAD,
        "target": target,
        "variant": "group_2x16_continuous",
        "num_runners": 2,
        "num_envs": 32,
        "max_requests_in_flight_per_env_runner": CONTINUOUS_IN_FLIGHT,
        "env_steps_per_s": steps / seconds,
        "per_s_min": min(rates),
        "per_s_max": max(rates),
        "iteration_ms_mean": 1000 * seconds / len(rates),
        "sync_weights_ms_mean": 1000 * statistics.mean(sync_s),
        "cpu_ms_per_1k_steps": cpu,
        "driver_gc": gc_watch.record(steps),
        # CPU cores these processes kept busy (2.0: both cores of a 2-core box, no idle).
        "cores_busy": sum(cpu.values()) * steps / seconds / 1e6,
        "repeats": len(rates),
    }


def run_local(target: str, repeats: int) -> dict:
    """One in-process runner with the same 16 envs (no Ray)."""
    runner_mod = api(target, "envrunners.env.single_agent_env_runner")
    runner = runner_mod.SingleAgentEnvRunner(config=_config(target, 0, 16))

    steps = 0

    def once() -> int:
        nonlocal steps
        n = sum(len(e) for e in runner.sample(num_timesteps=BATCH, explore=True))
        steps += n
        return n

    once()  # the warm-up, outside the CPU count
    gc.collect()
    steps, cpu_start = 0, time.process_time()
    with _GCWatch() as gc_watch:
        stats = median_rate(once, repeats=max(repeats, 3), warmup=0)
    cpu_ms = round(1e6 * (time.process_time() - cpu_start) / max(steps, 1), 3)
    runner.stop()
    return {
        "workload": WORKLOAD,
        "target": target,
        "variant": "local_1x16",
        "num_runners": 0,
        "num_envs": 16,
        "env_steps_per_s": stats["per_s_median"],
        "iteration_ms_median": 1000 * stats["seconds_median"],
        "cpu_ms_per_1k_steps": {"driver": cpu_ms},
        "driver_gc": gc_watch.record(steps),
        "repeats": stats["repeats"],
    }


def run(target: str, repeats: int = 5):
    """Yield the group record, the local reference, and (envrunners) their ratio."""
    group = run_group(target, repeats)
    yield group
    continuous = run_continuous(target, repeats) if target == "envrunners" else None
    if continuous is not None:
        yield continuous
    local = run_local(target, repeats)
    yield local
    yield {
        "workload": WORKLOAD,
        "target": target,
        "variant": "group_vs_local",
        "speedup": group["env_steps_per_s"] / local["env_steps_per_s"],
    }
    if continuous is not None:
        yield {
            "workload": WORKLOAD,
            "target": target,
            "variant": "continuous_vs_local",
            "speedup": continuous["env_steps_per_s"] / local["env_steps_per_s"],
            "bound_2_cores": 2
            * local["cpu_ms_per_1k_steps"]["driver"]
            / sum(continuous["cpu_ms_per_1k_steps"].values()),
        }
