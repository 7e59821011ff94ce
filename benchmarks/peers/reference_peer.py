"""The physical references: each env backend stepped with fixed random actions, no policy.

What the envs themselves allow on this host (no collector acting with a policy on the
same core can beat it): gymnasium ``SyncVectorEnv`` and a synchronous EnvPool pool.
"""

from __future__ import annotations

import gymnasium as gym
from workloads import Workload, env_fns, env_only, median_rate, record

from envrunners.env.vector.envpool_vector_env import EnvPoolVectorEnv


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
