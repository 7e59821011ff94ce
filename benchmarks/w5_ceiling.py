"""W5: the ceiling: a bare gymnasium SyncVectorEnv loop with one MLP forward per step.

The same MLP as the default module (4 -> 256 -> 256 -> 2, tanh, plus a value
head), one torch thread. ``naive``: torch.distributions sampling and a Python
list per step. ``lean``: preallocated buffers and Gumbel-max sampling.
``env_only``: the vector env stepped with fixed random actions, no policy: what
the env alone allows (no sampler that runs the policy on the same core can beat
it, and ``lean`` bounds one that acts with this MLP). At 16 and 128 envs.
Target-independent (it uses neither library).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from common import median_rate

WORKLOAD = "W5"


def _mlp() -> torch.nn.Module:
    def tower(out: int) -> torch.nn.Sequential:
        return torch.nn.Sequential(
            torch.nn.Linear(4, 256),
            torch.nn.Tanh(),
            torch.nn.Linear(256, 256),
            torch.nn.Tanh(),
            torch.nn.Linear(256, out),
        )

    return torch.nn.ModuleDict({"pi": tower(2), "vf": tower(1)})


def run(target: str = "envrunners", repeats: int = 5, timesteps: int = 4000):
    """Yield the loops' env steps/s at 16 and 128 envs."""
    for num_envs in (16, 128):
        yield from _run_at(repeats, num_envs, timesteps)


def _run_at(repeats: int, num_envs: int, timesteps: int):
    """The naive, lean and env-only loops at ``num_envs`` sub-envs."""
    torch.set_num_threads(1)
    net = _mlp()
    env = gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="sync")
    obs, _ = env.reset(seed=0)
    state = {"obs": obs}
    steps = -(-timesteps // num_envs)

    def naive() -> int:
        rows = []
        o = state["obs"]
        for _ in range(steps):
            with torch.no_grad():
                logits = net["pi"](torch.as_tensor(o, dtype=torch.float32))
                dist = torch.distributions.Categorical(logits=logits)
                a = dist.sample()
                logp = dist.log_prob(a)
            o2, r, te, tr, _ = env.step(a.numpy())
            rows.append((o, a.numpy(), logp.numpy(), r, te, tr))
            o = o2
        state["obs"] = o
        return steps * num_envs

    obs_buf = np.zeros((steps + 1, num_envs, 4), np.float32)
    act_buf = np.zeros((steps, num_envs), np.int64)
    logp_buf = np.zeros((steps, num_envs), np.float32)
    rew_buf = np.zeros((steps, num_envs), np.float32)

    def lean() -> int:
        obs_buf[0] = state["obs"]
        with torch.inference_mode():
            for t in range(steps):
                logits = net["pi"](torch.from_numpy(obs_buf[t]))
                u = torch.rand_like(logits)
                a = torch.argmax(logits - torch.log(-torch.log(u)), dim=-1)
                logp = torch.log_softmax(logits, -1).gather(-1, a[:, None])[:, 0]
                act_buf[t] = a.numpy()
                logp_buf[t] = logp.numpy()
                o2, r, te, tr, _ = env.step(act_buf[t])
                obs_buf[t + 1] = o2
                rew_buf[t] = r
        state["obs"] = obs_buf[steps]
        return steps * num_envs

    def env_only() -> int:
        for t in range(steps):
            env.step(act_buf[t])
        return steps * num_envs

    act_buf[:] = np.random.default_rng(0).integers(0, 2, act_buf.shape)
    for name, fn in (("naive", naive), ("lean", lean), ("env_only", env_only)):
        stats = median_rate(fn, repeats=repeats)
        yield {
            "workload": WORKLOAD,
            "target": "ceiling",
            "variant": name,
            "env": "CartPole-v1",
            "num_envs": num_envs,
            "num_timesteps": steps * num_envs,
            "env_steps_per_s": stats["per_s_median"],
            **{k: v for k, v in stats.items() if k != "per_s_median"},
        }
