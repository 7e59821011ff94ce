"""gymnasium ``SyncVectorEnv`` / ``AsyncVectorEnv`` (shared memory) with the lean loop."""

from __future__ import annotations

import gymnasium as gym
from workloads import LeanLoop, Workload, env_fns, median_rate, policy_net, record


def run(workload: Workload, repeats: int):
    for name in ("sync", "async"):
        if name == "sync":
            env = gym.vector.SyncVectorEnv(env_fns(workload))
        else:
            env = gym.vector.AsyncVectorEnv(env_fns(workload), shared_memory=True)
        obs, _ = env.reset(seed=0)
        net = policy_net(workload, int(env.single_action_space.n))

        def step(actions, env=env):
            obs, rewards, terms, truncs, _ = env.step(actions)
            return obs, rewards, terms, truncs

        stats = median_rate(LeanLoop(workload, net, step, obs), repeats)
        env.close()
        settings = f"{type(env).__name__} (NEXT_STEP autoreset), lean loop, 1 torch thread"
        yield record(workload, "gymnasium", f"lean_{name}", settings, **stats)
