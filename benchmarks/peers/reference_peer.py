"""The physical references: each env backend stepped with fixed random actions, no policy.

What the envs themselves allow on this host (no collector acting with a policy on the
same core can beat it): gymnasium ``SyncVectorEnv`` and a synchronous EnvPool pool.
And the in-process bound (``bound_in_process``): envrunners' own sub-env loop
(``FastSyncVectorEnv``) driven by PPO's default module's acting call
(``compute_actions_numpy``, explore) and nothing else: no episodes, no buffers, no
sampler. A runner that steps its envs in its own process does all of that work and
more, so this is the ceiling for the default backend (autoreset steps count as steps,
as in the other references). And its twin for the EnvPool backend
(``bound_envpool_ready_first``): an asynchronous ``EnvPoolVectorEnv`` set up as the
backend sets it up (ready-first half the envs, its thread count), each ready batch
acted on with the same call and sent back, nothing else: the ceiling of the
EnvPool backend, whose sampler does that and keeps the episodes. Two more
twins add what no sampler can skip: ``bound_envpool_ready_first_tracked`` also
notes per sub-env which results are reset observations (not timesteps) and counts
the timesteps, four numpy calls per batch; ``bound_envpool_ready_first_kept`` also
keeps every batch's arrays (references, no copies). On CartPole those few
microseconds cost far more than themselves: EnvPool's thread finishes its half of
the envs sooner, goes to sleep, and every ``send`` then pays for waking it.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from threadpoolctl import threadpool_limits
from workloads import Workload, env_fns, env_only, median_rate, record

from envrunners.core.rl_module.default_torch_rl_module import DefaultTorchRLModule
from envrunners.env.vector.envpool_vector_env import EnvPoolVectorEnv
from envrunners.env.vector.fast_sync_vector_env import FastSyncVectorEnv


def run(workload: Workload, repeats: int):
    env = gym.vector.SyncVectorEnv(env_fns(workload))
    env.reset(seed=0)
    n_act = int(env.single_action_space.n)
    stats = median_rate(env_only(workload, env.step, n_act), repeats)
    env.close()
    yield record(workload, "reference", "env_only_gymnasium_sync", "no policy", **stats)
    task = "CartPole-v1" if workload.name == "cartpole" else "Pong-v5"
    pool = EnvPoolVectorEnv(task, workload.num_envs, seed=0)
    pool.reset()
    stats = median_rate(env_only(workload, pool.pool.step, n_act), repeats)
    pool.close()
    yield record(
        workload, "reference", "env_only_envpool", "no policy, raw pool.step, sync", **stats
    )
    yield record(
        workload,
        "reference",
        "bound_in_process",
        "FastSyncVectorEnv + the default module's compute_actions_numpy, nothing else",
        **median_rate(_bound_in_process(workload), repeats),
    )
    settings = "EnvPoolVectorEnv, ready-first half the envs, + compute_actions_numpy"
    for keep in (None, "tracked", "kept"):
        loop, env = _bound_envpool_ready_first(workload, task, keep)
        stats = median_rate(loop, repeats)
        # Closed at once: a pool's threads left stepping when a later peer forks its
        # workers (gymnasium's AsyncVectorEnv) can crash the forked child.
        env.close()
        yield record(
            workload,
            "reference",
            "bound_envpool_ready_first" + (f"_{keep}" if keep else ""),
            settings
            + {
                None: ", nothing else",
                "tracked": " + timesteps counted per sub-env",
                "kept": " + timesteps counted per sub-env + every batch's arrays kept",
            }[keep],
            **stats,
        )


def _bound_in_process(workload: Workload):
    """The loop of ``bound_in_process`` (see the module docstring)."""
    env = FastSyncVectorEnv(env_fns(workload))
    obs, _ = env.reset(seed=0)
    module = _default_module(env)
    state = [np.asarray(obs)]

    def run() -> int:
        obs = state[0]
        with threadpool_limits(limits=1, user_api="blas"):  # one thread, as a runner acts
            for _ in range(workload.vector_steps):
                actions = module.compute_actions_numpy(obs, explore=True)["actions"]
                obs = env.step(actions)[0]
        state[0] = obs
        return workload.vector_steps * workload.num_envs

    return run


def _bound_envpool_ready_first(workload: Workload, task: str, keep: str | None = None):
    """The loop of ``bound_envpool_ready_first`` (see the module docstring); with ``keep``
    (``"tracked"`` or ``"kept"``) that of its twin. Returns the loop and its env."""
    batch = max(1, workload.num_envs // 2)
    env = EnvPoolVectorEnv(task, workload.num_envs, batch_size=batch, seed=0)
    env.async_reset()
    module = _default_module(env)
    calls = workload.vector_steps * workload.num_envs // batch
    # A sub-env's result after a done is its reset observation (not a timestep).
    pending = np.ones(workload.num_envs, np.bool_)

    def run() -> int:
        with threadpool_limits(limits=1, user_api="blas"):
            if keep is None:
                for _ in range(calls):
                    ids, obs = env.recv()[:2]
                    env.send(module.compute_actions_numpy(obs, explore=True)["actions"], ids)
                return calls * batch
            kept: list = []
            timesteps = 0
            for _ in range(calls):
                ids, obs, rewards, terms, truncs, _ = env.recv()
                timesteps += batch - int(np.count_nonzero(pending[ids]))
                pending[ids] = np.logical_or(terms, truncs)
                out = module.compute_actions_numpy(obs, explore=True)
                if keep == "kept":
                    kept.append((ids, obs, rewards, terms, truncs, out))
                env.send(out["actions"], ids)
        return timesteps

    return run, env


def _default_module(env: gym.vector.VectorEnv) -> DefaultTorchRLModule:
    """PPO's default inference-only module for ``env``'s single spaces (what a runner acts with)."""
    return DefaultTorchRLModule(
        observation_space=env.single_observation_space,
        action_space=env.single_action_space,
        model_config={},
        inference_only=True,
    )
