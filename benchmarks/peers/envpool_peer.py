"""EnvPool with the lean loop: synchronous (``batch_size == num_envs``) and EnvPool's
asynchronous mode (``batch_size = num_envs // 2``: act on whichever half is ready first).

Atari options are ``envrunners.env.vector.envpool_vector_env.ATARI_DEFAULTS`` (the
new-stack wrapping's settings); frames go into the buffers channels-last.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from workloads import LeanLoop, Workload, median_rate, policy_net, record

from envrunners.env.vector.envpool_vector_env import ATARI_DEFAULTS


def _make(workload: Workload, batch_size: int):
    import envpool

    task = "CartPole-v1" if workload.name == "cartpole" else "Pong-v5"
    options = ATARI_DEFAULTS if workload.name == "pong" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return envpool.make(
            task,
            env_type="gymnasium",
            num_envs=workload.num_envs,
            batch_size=batch_size,
            seed=0,
            **options,
        )


def _layout(workload: Workload, obs: np.ndarray) -> np.ndarray:
    return np.moveaxis(obs, 1, -1) if workload.name == "pong" else obs


def run(workload: Workload, repeats: int):
    pool = _make(workload, workload.num_envs)
    obs, _ = pool.reset()
    net = policy_net(workload, int(pool.action_space.n))

    def step(actions):
        obs, rewards, terms, truncs, _ = pool.step(actions)
        return _layout(workload, obs), rewards, terms, truncs

    stats = median_rate(LeanLoop(workload, net, step, _layout(workload, obs)), repeats)
    pool.close()
    yield record(workload, "envpool", "lean_sync", "envpool.make(batch_size=num_envs)", **stats)
    yield record(
        workload,
        "envpool",
        "lean_async",
        f"envpool.make(batch_size={workload.num_envs // 2}), recv/send",
        **median_rate(_async_loop(workload, net), repeats),
    )


def _async_loop(workload: Workload, net: torch.nn.Module):
    """Recv the ready half, one forward for it, send its actions; same buffers per env step."""
    half = workload.num_envs // 2
    pool = _make(workload, half)
    pool.async_reset()
    iters = workload.vector_steps * 2
    shape = pool.observation_space.shape
    obs_buf = np.zeros(
        (iters + 1, half, *shape[1:], shape[0])
        if workload.name == "pong"
        else (iters + 1, half, *shape),
        pool.observation_space.dtype,
    )
    act_buf = np.zeros((iters, half), np.int64)
    logp_buf = np.zeros((iters, half), np.float32)
    rew_buf = np.zeros((iters, half), np.float32)

    def run() -> int:
        with torch.inference_mode():
            for t in range(iters):
                obs, rewards, terms, truncs, info = pool.recv()
                obs_buf[t] = _layout(workload, obs)
                rew_buf[t] = rewards
                logits = net(torch.from_numpy(obs_buf[t]))
                u = torch.rand_like(logits)
                a = torch.argmax(logits - torch.log(-torch.log(u)), dim=-1)
                logp_buf[t] = torch.log_softmax(logits, -1).gather(-1, a[:, None])[:, 0].numpy()
                act_buf[t] = a.numpy()
                pool.send(act_buf[t], info["env_id"])
        return iters * half

    return run
