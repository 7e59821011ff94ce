"""W1b: ``SharedMemoryVectorEnv`` stepping with no policy, against gymnasium's SyncVectorEnv.

Per setting (CartPole-v1 with 16 sub-envs, Pong with 8 wrapped as in W9) it measures
env steps/s, the time per call and the parent's CPU time per call
(``parent_cpu_us_per_call``: its thread's CPU, which a loaded machine inflates far less
than the wall time) of: gymnasium's in-process ``SyncVectorEnv``
(``sync_vector_env``, the same-run reference), ``SharedMemoryVectorEnv.step`` with every
sub-env per call (``shm_step``), and its ready-first ``recv``/``send`` loop with
``batch_size = num_envs // 2`` (``shm_recv_send``). Workers: one per core (the default).
Actions are fixed random ones; no policy runs, so this is the env side's ceiling.

``signal_*`` records time one parent-worker round trip carrying a CartPole-sized result
(8 sub-envs: observations, rewards, flags; 208 bytes) the ways the env could signal:
the bytes through a pipe (``signal_pipe``), or written to shared memory with a semaphore
(``signal_semaphore``, what ``SharedMemoryVectorEnv`` does) or an ``Event``
(``signal_event``) each way.

    python benchmarks/w1b_shared_memory.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import time
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
        spent = [0.0, 0]  # this (the parent's) thread's CPU seconds, env steps

        def timed() -> int:
            start = time.thread_time()
            done = loop()
            spent[0] += time.thread_time() - start
            spent[1] += done
            return done

        stats = median_rate(timed, repeats=repeats)
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
            "parent_cpu_us_per_call": 1e6 * spent[0] * per_call / spent[1],
            **{k: v for k, v in stats.items() if k != "per_s_median"},
        }
    finally:
        env.close()


_PAYLOAD = 8 * 4 * 4 + 8 * 8 + 2 * 8  # CartPole x 8: float32 obs, float64 rewards, flags


def _pipe_worker(conn) -> None:
    while conn.recv_bytes() != b"q":
        conn.send_bytes(bytes(_PAYLOAD))


def _semaphore_worker(buf, go, done) -> None:
    view = np.frombuffer(buf, dtype=np.uint8)
    while go.acquire(timeout=1.0):
        view[:] = 1
        done.release()


def _event_worker(buf, go, done) -> None:
    view = np.frombuffer(buf, dtype=np.uint8)
    while go.wait(timeout=1.0):
        go.clear()
        view[:] = 1
        done.set()


def _signalling(repeats: int, trips: int = 5000):
    """Round trips per second of each signalling way (parent <-> one worker process)."""
    ctx = mp.get_context("fork")
    buf = ctx.RawArray(ctypes.c_uint8, _PAYLOAD)
    out = np.frombuffer(buf, dtype=np.uint8)
    parent, child = ctx.Pipe()
    go, done = ctx.Semaphore(0), ctx.Semaphore(0)
    ev_go, ev_done = ctx.Event(), ctx.Event()

    def pipe_trips() -> int:
        for _ in range(trips):
            parent.send_bytes(b"s")
            out[:] = np.frombuffer(parent.recv_bytes(), dtype=np.uint8)
        return trips

    def semaphore_trips() -> int:
        for _ in range(trips):
            go.release()
            done.acquire()
            out.copy()
        return trips

    def event_trips() -> int:
        for _ in range(trips):
            ev_go.set()
            ev_done.wait()
            ev_done.clear()
            out.copy()
        return trips

    ways = (
        ("signal_pipe", _pipe_worker, (child,), pipe_trips),
        ("signal_semaphore", _semaphore_worker, (buf, go, done), semaphore_trips),
        ("signal_event", _event_worker, (buf, ev_go, ev_done), event_trips),
    )
    for name, target, args, loop in ways:
        proc = ctx.Process(target=target, args=args, daemon=True)
        proc.start()
        try:
            stats = median_rate(loop, repeats=repeats)
        finally:
            if name == "signal_pipe":
                parent.send_bytes(b"q")
            proc.join(3.0)
            if proc.is_alive():
                proc.terminate()
        yield {
            "workload": WORKLOAD,
            "target": "envrunners",
            "variant": name,
            "payload_bytes": _PAYLOAD,
            "round_trips_per_s": stats["per_s_median"],
            "us_per_round_trip": 1e6 / stats["per_s_median"],
            **{k: v for k, v in stats.items() if k != "per_s_median"},
        }


def run(target: str = "envrunners", repeats: int = 5):
    """Yield one record per signalling way, then per (env, variant)."""
    yield from _signalling(repeats)
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
