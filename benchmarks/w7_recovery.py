"""W7: a runner fails mid-sampling; seconds until it is restored and serving again.

Group of 2 remote runners x 8 CartPole-v1 envs with each library's default
fault-tolerance settings (``restart_failed_env_runners=True``). The driver loops
like a training loop: ``synchronous_parallel_sample(max_env_steps=4000)``, then
``probe_unhealthy_env_runners()`` and, for restored runners, ``sync_weights``
(RLlib leaves that push to the Algorithm; envrunners also does it in the probe).
After ``WARMUP_S`` of such iterations, while a sample is in flight, runner 1 fails:

- ``sigkill``: its process gets ``SIGKILL``;
- ``exception``: its first sub-env's ``step`` raises (an application exception
  inside ``sample()``).

``restore_s`` runs from the fault to runner 1's first successful ``sample()``
after it. RLlib's default ``delay_between_env_runner_restarts_s`` is 60 s, so its
``exception`` case takes over a minute; it runs once. Target: ≤ 2 s for both.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import threading
import time

from common import api

WORKLOAD = "W7"
BATCH = 4000
DEADLINE_S = 180.0
WARMUP_S = 12.0


def _register_by_value() -> None:
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _config(target: str):
    PPOConfig = api(target, "envrunners.algorithms.ppo").PPOConfig
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=2, num_envs_per_env_runner=8, rollout_fragment_length="auto")
    )
    if target == "ray.rllib":
        config = config.api_stack(
            enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True
        )
    return config


def _pid(runner) -> int:
    return os.getpid()


def _sub_envs(runner) -> list:
    env = runner.env
    for _ in range(4):
        if hasattr(env, "envs"):
            return list(env.envs)
        env = getattr(env, "env", None)
        if env is None:
            break
    return list(runner.env.unwrapped.envs)


def _break_step(runner, delay_s: float) -> None:
    """Runner side: after ``delay_s``, make sub-env 0's ``step`` raise."""
    env = _sub_envs(runner)[0]

    def broken(action):
        raise RuntimeError("W7: injected application exception in env.step")

    def arm():
        time.sleep(delay_s)
        env.step = broken

    threading.Thread(target=arm, daemon=True).start()


def _serves(runner) -> int:
    return sum(len(e) for e in runner.sample())


def _one_fault(target: str, case: str) -> float:
    import ray

    EnvRunnerGroup = api(target, "envrunners.env.env_runner_group").EnvRunnerGroup
    sample = api(target, "envrunners.execution.rollout_ops").synchronous_parallel_sample
    if ray.is_initialized():
        ray.shutdown()
    group = EnvRunnerGroup(config=_config(target), num_env_runners=2, local_env_runner=True)
    try:

        def step() -> list[int]:
            try:
                sample(
                    worker_set=group,
                    max_env_steps=BATCH,
                    sample_timeout_s=60.0,
                    _uses_new_env_runners=True,
                )
            except Exception as err:  # a failed round is part of the scenario
                print(f"W7 {target}: sampling raised {type(err).__name__}", file=sys.stderr)
            restored = group.probe_unhealthy_env_runners() or []
            if restored:
                group.sync_weights(to_worker_indices=restored)
            return restored

        warm_until = time.perf_counter() + WARMUP_S
        while time.perf_counter() < warm_until:  # a running job, not a fresh group
            step()
        restarts = group.num_remote_worker_restarts()
        if case == "sigkill":
            pid = group.foreach_env_runner(_pid, remote_worker_ids=[1], local_env_runner=False)[0]
            timer = threading.Timer(0.05, os.kill, (pid, signal.SIGKILL))
            fault_at = time.perf_counter() + 0.05
            timer.start()
        else:
            group.foreach_env_runner(
                _break_step, kwargs={"delay_s": 0.05}, remote_worker_ids=[1], local_env_runner=False
            )
            fault_at = time.perf_counter() + 0.05
        deadline = fault_at + DEADLINE_S
        while time.perf_counter() < deadline:
            step()
            back = group.num_remote_worker_restarts() > restarts
            if back and 1 in group.healthy_env_runner_ids():
                try:
                    got = group.foreach_env_runner(
                        _serves, remote_worker_ids=[1], local_env_runner=False
                    )
                except Exception:
                    got = []
                if got and got[0] > 0:
                    return time.perf_counter() - fault_at
        return float("nan")
    finally:
        group.stop()
        if ray.is_initialized():
            ray.shutdown()


def run(target: str, repeats: int = 3, cases=("sigkill", "exception")):
    """One record per fault case (median over repeats)."""
    _register_by_value()
    for case in cases:
        n = 1 if (target == "ray.rllib" and case == "exception") else max(1, min(repeats, 3))
        times = [_one_fault(target, case) for _ in range(n)]
        ok = [t for t in times if t == t]
        med = statistics.median(ok) if ok else float("nan")
        yield {
            "workload": WORKLOAD,
            "target": target,
            "case": case,
            "restore_s": med,
            "restore_s_all": times,
            "per_s": (1.0 / med) if ok else 0.0,
            "repeats": n,
        }
