"""Soak: sample for N minutes and watch resident memory (RSS) for growth.

Two workloads, one after the other, each for ``--minutes`` (default 30):

- ``local``: one in-process ``SingleAgentEnvRunner`` (PPO's default module,
  CartPole-v1, 16 envs) calling ``sample(num_timesteps=4000)`` in a loop and
  never ``get_metrics()`` (the case that used to grow without bound).
- ``group_2``: an ``EnvRunnerGroup`` of 2 remote runners x 8 envs,
  ``synchronous_parallel_sample(max_env_steps=4000)`` + ``sync_weights()`` per
  iteration, as PPO's training step (W2's config); RSS is the driver's plus each
  runner's.

RSS is sampled every ``--interval-s`` (default 30 s). Growth is measured from
the first sample after the warm-up (the first ``--warmup-fraction`` of the run,
default 0.25) to the last sample; the target is < 5%. One JSON line per workload:

    python benchmarks/soak.py --minutes 30
    python benchmarks/soak.py --minutes 2 --workloads local
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import api, emit, local_ppo_runner, rss_mb  # noqa: E402
from w2_group import _config as group_config  # noqa: E402
from w2_group import _rss_mb as runner_rss_mb  # noqa: E402
from w2_group import group_iteration  # noqa: E402

TARGET_GROWTH_PCT = 5.0
BATCH = 4000


def _soak(step, rss, minutes: float, interval_s: float, warmup_fraction: float) -> dict:
    """Call ``step()`` (returns env steps) for ``minutes``; ``rss()`` every ``interval_s``."""
    start = time.monotonic()
    end = start + minutes * 60.0
    warm_at = start + warmup_fraction * minutes * 60.0
    samples: list[tuple[float, float]] = [(0.0, rss())]
    next_sample = start + interval_s
    steps = 0
    while True:
        steps += step()
        now = time.monotonic()
        if now >= next_sample or now >= end:
            samples.append((round(now - start, 1), rss()))
            next_sample += interval_s
            if now >= end:
                break
    after_warmup = next((s for s in samples if s[0] >= warm_at - start), samples[-1])
    base, last = after_warmup[1], samples[-1][1]
    growth = (last - base) / base * 100.0 if base else float("nan")
    return {
        "minutes": minutes,
        "interval_s": interval_s,
        "env_steps": steps,
        "env_steps_per_s": steps / (samples[-1][0] or 1.0),
        "rss_mb_samples": [[t, round(m, 1)] for t, m in samples],
        "warmup_s": round(warm_at - start, 1),
        "rss_mb_after_warmup": round(base, 1),
        "rss_mb_end": round(last, 1),
        "rss_mb_max": round(max(m for _, m in samples), 1),
        "growth_pct": round(growth, 2),
        "target_growth_pct": TARGET_GROWTH_PCT,
        "ok": growth < TARGET_GROWTH_PCT,
    }


def soak_local(target: str, minutes: float, interval_s: float, warmup_fraction: float) -> dict:
    runner = local_ppo_runner(target, "CartPole-v1", 16)

    def step() -> int:
        return sum(len(e) for e in runner.sample(num_timesteps=BATCH, explore=True))

    try:
        result = _soak(step, rss_mb, minutes, interval_s, warmup_fraction)
    finally:
        runner.stop()
    return {"workload": "soak", "variant": "local", "target": target, "num_envs": 16, **result}


def soak_group(target: str, minutes: float, interval_s: float, warmup_fraction: float) -> dict:
    import ray

    EnvRunnerGroup = api(target, "envrunners.env.env_runner_group").EnvRunnerGroup
    sample = api(target, "envrunners.execution.rollout_ops").synchronous_parallel_sample
    if ray.is_initialized():
        ray.shutdown()
    group = EnvRunnerGroup(
        config=group_config(target, 2, 8), num_env_runners=2, local_env_runner=True
    )

    def step() -> int:
        return group_iteration(group, sample)

    def rss() -> float:
        remote = group.foreach_env_runner(runner_rss_mb, local_env_runner=False)
        return rss_mb() + sum(remote)

    try:
        result = _soak(step, rss, minutes, interval_s, warmup_fraction)
    finally:
        group.stop()
        ray.shutdown()
    return {
        "workload": "soak",
        "variant": "group_2",
        "target": target,
        "num_envs": 8,
        "num_runners": 2,
        **result,
    }


WORKLOADS = {"local": soak_local, "group": soak_group}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="per workload")
    parser.add_argument("--interval-s", type=float, default=30.0)
    parser.add_argument("--warmup-fraction", type=float, default=0.25)
    parser.add_argument("--workloads", default="local,group")
    parser.add_argument("--target", default="envrunners", choices=("envrunners", "ray.rllib"))
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; known: {sorted(WORKLOADS)}")
    ok = True
    for name in names:
        record = WORKLOADS[name](args.target, args.minutes, args.interval_s, args.warmup_fraction)
        emit(record)
        ok = ok and record["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
