"""W2: an EnvRunnerGroup of 2 remote runners x 8 CartPole-v1 envs, sample + sync each iteration.

One iteration = ``synchronous_parallel_sample(max_env_steps=4000)`` over the group
(PPO's default train batch; fragments "auto" → 250 steps per env) followed by
``sync_weights()`` from the local runner, as PPO's training step does. Reports
env steps/s, iteration latency, the cold group start (including Ray's start, as a
user sees it) and the runners' RSS. The reference variant ``local_1x16`` is one
in-process runner with the same 16 envs, ``sample(num_timesteps=4000)``.
"""

from __future__ import annotations

import statistics
import time

from common import api, median_rate

WORKLOAD = "W2"
BATCH = 4000
WARMUP_S = 12.0


def _config(target: str, num_env_runners: int, num_envs: int):
    PPOConfig = api(target, "envrunners.algorithms.ppo").PPOConfig
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(
            num_env_runners=num_env_runners,
            num_envs_per_env_runner=num_envs,
            rollout_fragment_length="auto",  # RLlib's PPO default, set for both targets
        )
    )
    if target == "ray.rllib":
        config = config.api_stack(
            enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True
        )
    return config


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


def run_local(target: str, repeats: int) -> dict:
    """One in-process runner with the same 16 envs (no Ray)."""
    runner_mod = api(target, "envrunners.env.single_agent_env_runner")
    runner = runner_mod.SingleAgentEnvRunner(config=_config(target, 0, 16))

    def once() -> int:
        return sum(len(e) for e in runner.sample(num_timesteps=BATCH, explore=True))

    stats = median_rate(once, repeats=max(repeats, 3))
    runner.stop()
    return {
        "workload": WORKLOAD,
        "target": target,
        "variant": "local_1x16",
        "num_runners": 0,
        "num_envs": 16,
        "env_steps_per_s": stats["per_s_median"],
        "iteration_ms_median": 1000 * stats["seconds_median"],
        "repeats": stats["repeats"],
    }


def run(target: str, repeats: int = 5):
    """Yield the group record, the local reference, and (envrunners) their ratio."""
    group = run_group(target, repeats)
    yield group
    local = run_local(target, repeats)
    yield local
    yield {
        "workload": WORKLOAD,
        "target": target,
        "variant": "group_vs_local",
        "speedup": group["env_steps_per_s"] / local["env_steps_per_s"],
    }
