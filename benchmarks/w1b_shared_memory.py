"""W1b: ``SharedMemoryVectorEnv`` stepping with no policy, against gymnasium's SyncVectorEnv.

Per setting (CartPole-v1 with 16 sub-envs, Pong with 8 wrapped as in W9) it measures
env steps/s and the time per call of: gymnasium's in-process ``SyncVectorEnv``
(``sync_vector_env``, the same-run reference), ``SharedMemoryVectorEnv.step`` with every
sub-env per call (``shm_step``), and its ready-first ``recv``/``send`` loop with
``batch_size = num_envs // 2`` (``shm_recv_send``). Workers: one per core (the default).
Actions are fixed random ones; no policy runs, so this is the env side's ceiling.

    python benchmarks/w1b_shared_memory.py [--repeats 5]
"""

from __future__ import annotations

import argparse
from functools import partial

import gymnasium as gym
import numpy as np
from common import emit, median_rate

WORKLOAD = "W1b"
SETTINGS = (("CartPole-v1", 16, 4000), ("Pong", 8, 400))


def _fns(env: str, n: int) -> list:
    if env == "CartPole-v1":
        return [partial(gym.make, "CartPole-v1") for _ in range(n)]
    from w9_atari_pong import make_pong

    return [partial(make_pong, "envrunners") for _ in range(n)]


def _available(env: str) -> bool:
    if env == "CartPole-v1":
        return True
    try:
        import ale_py  # noqa: F401
    except ImportError:
        return False
    return True


def _sync_loop(env, actions: np.ndarray) -> int:
    for row in actions:
        env.step(row)
    return actions.size


def _recv_send_loop(env, actions: np.ndarray) -> int:
    done, steps, n = 0, actions.shape[0], actions.shape[1]
    while done < steps * n:
        ids, *_ = env.recv()
        env.send(actions[done // n % steps][ids], ids)
        done += len(ids)
    return done


def _build(variant: str, env_id: str, n: int):
    from envrunners.env.vector.shared_memory_vector_env import SharedMemoryVectorEnv

    if variant == "sync_vector_env":
        return gym.vector.SyncVectorEnv(_fns(env_id, n))
    batch = n // 2 if variant == "shm_recv_send" else None
    return SharedMemoryVectorEnv(_fns(env_id, n), batch_size=batch, copy=False)


def _measure(variant: str, env_id: str, n: int, timesteps: int, repeats: int) -> dict:
    env = _build(variant, env_id, n)
    try:
        steps = -(-timesteps // n)
        rng = np.random.default_rng(0)
        actions = np.stack([env.action_space.sample() for _ in range(steps)])
        actions = rng.permutation(actions)
        if variant == "shm_recv_send":
            env.async_reset(seed=0)
            loop = partial(_recv_send_loop, env, actions)
        else:
            env.reset(seed=0)
            loop = partial(_sync_loop, env, actions)
        stats = median_rate(loop, repeats=repeats)
        per_call = getattr(env, "batch_size", n)
        return {
            "workload": WORKLOAD,
            "target": "envrunners",
            "variant": variant,
            "env": env_id,
            "num_envs": n,
            "num_workers": getattr(env, "num_workers", None),
            "batch_size": per_call,
            "num_timesteps": steps * n,
            "env_steps_per_s": stats["per_s_median"],
            "us_per_call": 1e6 * per_call / stats["per_s_median"],
            **{k: v for k, v in stats.items() if k != "per_s_median"},
        }
    finally:
        env.close()


def run(target: str = "envrunners", repeats: int = 5):
    """Yield one record per (env, variant)."""
    for env_id, n, timesteps in SETTINGS:
        if not _available(env_id):
            yield {"workload": WORKLOAD, "env": env_id, "skipped": "ale_py is not installed"}
            continue
        for variant in ("sync_vector_env", "shm_step", "shm_recv_send"):
            yield _measure(variant, env_id, n, timesteps, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for record in run(repeats=args.repeats):
        emit(record)


if __name__ == "__main__":
    main()
