"""Shared benchmark helpers: target-neutral imports, timing, JSON lines.

A workload is written once against the public API; ``api(target, "envrunners.x")``
imports ``envrunners.x`` or ``ray.rllib.x`` so the same code runs on both.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

TARGETS = ("envrunners", "ray.rllib")


def api(target: str, path: str) -> Any:
    """Import ``path`` (written with the ``envrunners`` prefix) for ``target``."""
    if target not in TARGETS:
        raise SystemExit(f"unknown --target {target!r}; expected one of {TARGETS}")
    return importlib.import_module(path.replace("envrunners", target, 1))


def target_available(target: str) -> bool:
    """Whether ``target`` can be imported in this interpreter."""
    try:
        importlib.import_module(target)
        return True
    except Exception:
        return False


def median_rate(fn: Callable[[], int], repeats: int, warmup: int = 1) -> dict[str, float]:
    """Run ``fn`` (returns units done) ``warmup + repeats`` times; median units/s."""
    for _ in range(warmup):
        fn()
    rates, secs = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        units = fn()
        dt = time.perf_counter() - start
        rates.append(units / dt)
        secs.append(dt)
    return {
        "per_s_median": statistics.median(rates),
        "per_s_min": min(rates),
        "per_s_max": max(rates),
        "seconds_median": statistics.median(secs),
        "repeats": repeats,
    }


def emit(record: dict[str, Any]) -> None:
    """Print one JSON line (the only output format of the benchmarks)."""
    record.setdefault("python", sys.version.split()[0])
    record.setdefault("cpus", os.cpu_count())
    print(json.dumps(record), flush=True)


def rss_mb() -> float:
    """This process's resident memory in MiB."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:  # pragma: no cover
        return float("nan")


def sample_rate_and_rss(runner, timesteps: int, repeats: int) -> dict[str, float]:
    """Median env steps/s of ``runner.sample(num_timesteps=timesteps, explore=True)`` and the
    process's largest RSS (MiB) seen right after a sample, while its episodes are alive."""
    peak = [0.0]

    def once() -> int:
        episodes = runner.sample(num_timesteps=timesteps, explore=True)
        peak[0] = max(peak[0], rss_mb())
        return sum(len(e) for e in episodes)

    stats = median_rate(once, repeats=repeats)
    return {**stats, "runner_rss_mb": peak[0]}


class TorchThreads:
    """``with TorchThreads(1): ...`` runs the block with ``n`` torch threads, then restores."""

    def __init__(self, n: int):
        self.n = n
        self.saved = 0

    def __enter__(self) -> TorchThreads:
        import torch

        self.saved = torch.get_num_threads()
        torch.set_num_threads(self.n)
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        torch.set_num_threads(self.saved)


def check_module(runner, layer: type) -> None:
    """Fail clearly when the runner's module lacks the network the workload measures."""
    import torch

    module = runner.module
    if isinstance(module, torch.nn.Module) and not any(
        isinstance(m, layer) for m in module.modules()
    ):
        raise RuntimeError(
            f"the default module built here is {type(module).__name__}, with no "
            f"{layer.__name__} layer: this build cannot make the network the workload "
            "measures, and timing another would mislead. Rerun once the default module "
            "builds it (issue 14)."
        )


def runner_record(base: dict, build: Callable[[], Any], timesteps: int, repeats: int) -> dict:
    """``base`` plus the runner's sample rate and RSS (``sample_rate_and_rss``), or plus an
    ``error`` naming why ``build()`` failed (printed to stderr too), so the workload's
    reference loops still run and report."""
    try:
        runner = build()
    except Exception as err:
        msg = (
            f"{base['workload']} --target {base['target']}: cannot build the runner: "
            f"{type(err).__name__}: {err}"
        )
        print(msg, file=sys.stderr, flush=True)
        return {**base, "error": msg}
    stats = sample_rate_and_rss(runner, timesteps, repeats)
    runner.stop()
    return {**base, "env_steps_per_s": stats.pop("per_s_median"), **stats}


def local_ppo_runner(target: str, env: Any, num_envs: int, model_config=None, layer=None):
    """A local ``SingleAgentEnvRunner`` with PPO's default module on ``env`` (new API stack on
    both targets). With ``layer`` (a torch module type), the built module must contain one
    (``check_module``), else the runner is stopped and ``RuntimeError`` raised."""
    PPOConfig = api(target, "envrunners.algorithms.ppo").PPOConfig
    runner_mod = api(target, "envrunners.env.single_agent_env_runner")
    config = (
        PPOConfig()
        .environment(env=env)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs)
    )
    if model_config is not None:
        config = config.rl_module(model_config=model_config)
    if target == "ray.rllib":
        config = config.api_stack(
            enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True
        )
    runner = runner_mod.SingleAgentEnvRunner(config=config)
    if layer is not None:
        try:
            check_module(runner, layer)
        except RuntimeError:
            runner.stop()
            raise
    return runner
