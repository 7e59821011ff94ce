"""W6: ``sync_weights()`` from the local runner to 2 remote runners, by module size.

Sizes: the default CartPole module, and MLPs of about 1M and 10M parameters
(``fcnet_hiddens`` [1000, 1000] and [3162, 3162]; runners hold the
inference-only module). One timed sync = ``sync_weights()`` followed by a
``foreach_env_runner`` barrier that returns once both runners have applied the
push (a later request waits behind it), so both targets are timed to arrival.
``put_get_ms`` is the reference: one ``ray.get(ray.put(weights))`` of the same
arrays in the driver. The target is ``sync_ms <= 2 x put_get_ms`` at 10M.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
from common import api

WORKLOAD = "W6"
SIZES = {"default": None, "1M": [1000, 1000], "10M": [3162, 3162]}
WARMUP = 30


def _config(target: str, hiddens):
    PPOConfig = api(target, "envrunners.algorithms.ppo").PPOConfig
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=2, num_envs_per_env_runner=1)
    )
    if hiddens is not None:
        config = config.rl_module(model_config={"fcnet_hiddens": hiddens})
    if target == "ray.rllib":
        config = config.api_stack(
            enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True
        )
    return config


def _barrier(runner) -> int:
    return 1


def _measure_pair(a, b, repeats: int, warmup: int = WARMUP) -> tuple[list[float], list[float]]:
    """Time ``a`` and ``b`` alternately (after ``warmup`` calls of each).

    Why the long warm-up: the object store's memory is mapped lazily, so the first
    few dozen 40 MB puts pay page faults that a running job no longer sees.
    """
    for _ in range(warmup):
        a()
        b()
    ta, tb = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        a()
        ta.append(time.perf_counter() - t)
        t = time.perf_counter()
        b()
        tb.append(time.perf_counter() - t)
    return ta, tb


def run(target: str, repeats: int = 5, sizes=tuple(SIZES)):
    """One record per module size."""
    import ray

    EnvRunnerGroup = api(target, "envrunners.env.env_runner_group").EnvRunnerGroup
    if ray.is_initialized():
        ray.shutdown()
    for size in sizes:
        group = EnvRunnerGroup(config=_config(target, SIZES[size]), local_env_runner=True)
        local = group.local_env_runner
        weights = local.get_state(components=["rl_module"])["rl_module"]
        arrays = [v for v in _leaves(weights)]
        num_params = int(sum(np.asarray(a).size for a in arrays))

        def sync(group=group) -> None:
            group.sync_weights()
            group.foreach_env_runner(_barrier, local_env_runner=False)

        def put_get(weights=weights) -> None:
            ray.get(ray.put(weights))

        sync_s, base_s = _measure_pair(sync, put_get, max(3 * repeats, 15))
        group.stop()
        sync_ms = 1000 * statistics.median(sync_s)
        base_ms = 1000 * statistics.median(base_s)
        yield {
            "workload": WORKLOAD,
            "target": target,
            "size": size,
            "num_params": num_params,
            "mb": 4 * num_params / 2**20,
            "sync_ms": sync_ms,
            "sync_ms_min": 1000 * min(sync_s),
            "put_get_ms": base_ms,
            "sync_vs_put_get": sync_ms / base_ms,
            "per_s": 1000.0 / sync_ms,
            "repeats": len(sync_s),
        }
    if ray.is_initialized():
        ray.shutdown()


def _leaves(tree):
    if isinstance(tree, dict):
        for value in tree.values():
            yield from _leaves(value)
    else:
        yield tree
