"""The two peer workloads, their networks and envs, and the lean collection loop.

``cartpole``: CartPole-v1, 16 envs, PPO's default MLP (4 -> 256 -> 256 -> 2 tanh policy,
a separate 256-256 tanh value tower). ``pong``: ALE Pong wrapped as RLlib's new stack
wraps it (84x84 grayscale, frameskip 4, framestack 4, uint8), 8 envs, RLlib's default
84x84 CNN (``benchmarks/w9_atari_pong.default_cnn``). Every system runs with one torch
thread; what each one computes per step beyond the policy forward is its own design
(SB3 also runs the value net, every peer's records say so in ``settings``).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from w9_atari_pong import default_cnn, make_pong  # noqa: E402


class PeerUnavailable(Exception):
    """A peer cannot run here (package missing, or it would change torch); the message says why."""


@dataclass(frozen=True)
class Workload:
    """One workload: the env, how many copies, how many env steps per timed repeat."""

    name: str
    env_id: str
    num_envs: int
    timesteps: int

    @property
    def vector_steps(self) -> int:
        return -(-self.timesteps // self.num_envs)


WORKLOADS = {
    "cartpole": Workload("cartpole", "CartPole-v1", 16, 16 * 512),
    "pong": Workload("pong", "ale_py:ALE/Pong-v5", 8, 8 * 96),
}


def mlp_tower(out: int, inp: int = 4) -> torch.nn.Sequential:
    """PPO's default MLP tower: ``inp -> 256 -> 256 -> out``, tanh."""
    return torch.nn.Sequential(
        torch.nn.Linear(inp, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, out),
    )


def policy_net(workload: Workload, num_actions: int) -> torch.nn.Module:
    """The workload's policy network (logits from a batch of observations)."""
    if workload.name == "cartpole":
        return mlp_tower(num_actions)
    return default_cnn(num_actions)


def make_env(workload: Workload) -> gym.Env:
    """One gymnasium sub-env of the workload (Pong wrapped as RLlib's new stack does)."""
    if workload.name == "cartpole":
        return gym.make("CartPole-v1")
    return make_pong("envrunners")


def env_fns(workload: Workload) -> list[Callable[[], gym.Env]]:
    return [partial(make_env, workload) for _ in range(workload.num_envs)]


def median_rate(fn: Callable[[], int], repeats: int, warmup: int = 1) -> dict[str, float]:
    """Run ``fn`` (returns env steps) ``warmup + repeats`` times; median env steps/s."""
    for _ in range(warmup):
        fn()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        units = fn()
        rates.append(units / (time.perf_counter() - start))
    return {
        "env_steps_per_s": statistics.median(rates),
        "per_s_min": min(rates),
        "per_s_max": max(rates),
        "repeats": repeats,
    }


class LeanLoop:
    """The lean collection loop: one policy forward per vector step, Gumbel-max actions,
    preallocated obs/action/logp/reward/done buffers, nothing else.

    Args:
        step: ``step(actions) -> (obs, rewards, terminated, truncated)`` of all sub-envs.
        first_obs: The observations after the reset.
    """

    def __init__(
        self, workload: Workload, net: torch.nn.Module, step: Callable, first_obs: np.ndarray
    ):
        n, steps = workload.num_envs, workload.vector_steps
        self.workload, self.net, self.step = workload, net, step
        self.obs = np.zeros((steps + 1, *first_obs.shape), first_obs.dtype)
        self.obs[steps] = first_obs
        self.actions = np.zeros((steps, n), np.int64)
        self.logp = np.zeros((steps, n), np.float32)
        self.rewards = np.zeros((steps, n), np.float32)
        self.dones = np.zeros((steps, n), np.bool_)

    def __call__(self) -> int:
        steps = self.workload.vector_steps
        self.obs[0] = self.obs[steps]
        with torch.inference_mode():
            for t in range(steps):
                logits = self.net(torch.from_numpy(self.obs[t]))
                u = torch.rand_like(logits)
                a = torch.argmax(logits - torch.log(-torch.log(u)), dim=-1)
                self.logp[t] = torch.log_softmax(logits, -1).gather(-1, a[:, None])[:, 0].numpy()
                self.actions[t] = a.numpy()
                obs, rewards, terms, truncs = self.step(self.actions[t])
                self.obs[t + 1] = obs
                self.rewards[t] = rewards
                np.logical_or(terms, truncs, out=self.dones[t])
        return steps * self.workload.num_envs


def env_only(workload: Workload, step: Callable, num_actions: int) -> Callable[[], int]:
    """The physical reference: the env stepped with fixed random actions, no policy."""
    actions = np.random.default_rng(0).integers(
        0, num_actions, (workload.vector_steps, workload.num_envs)
    )

    def run() -> int:
        for t in range(workload.vector_steps):
            step(actions[t])
        return workload.vector_steps * workload.num_envs

    return run


def record(workload: Workload, system: str, variant: str, settings: str, **fields: Any) -> dict:
    """One JSON record of the suite."""
    return {
        "suite": "peers",
        "workload": workload.name,
        "system": system,
        "variant": variant,
        "env": workload.env_id,
        "num_envs": workload.num_envs,
        "num_timesteps": workload.vector_steps * workload.num_envs,
        "settings": settings,
        **fields,
    }
