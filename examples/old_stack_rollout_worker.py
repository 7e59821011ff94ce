"""Old API stack: a RolloutWorker with PPOTorchPolicy learns CartPole (SampleBatch in, weights out).

RLlib's classic loop, unchanged except for the import prefix: the worker samples
a ``SampleBatch`` (GAE already added by the policy's postprocessing), the policy
learns on it, ``get_metrics()`` reports the finished episodes. Pass
``--num-env-runners 2`` to sample from two remote RolloutWorkers of an
``EnvRunnerGroup`` instead, with the local worker's weights broadcast each round.

Run: python examples/old_stack_rollout_worker.py [--iterations 30] [--num-env-runners 0]
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch

from envrunners.algorithms.ppo import PPOConfig
from envrunners.algorithms.ppo.ppo_torch_policy import PPOTorchPolicy
from envrunners.env.env_runner_group import EnvRunnerGroup
from envrunners.execution.rollout_ops import synchronous_parallel_sample


def make_cartpole(env_context) -> gym.Env:
    """Env creator: gets an ``EnvContext`` (the env_config dict plus worker/vector index)."""
    return gym.make("CartPole-v1")


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--num-env-runners", type=int, default=0)
    parser.add_argument("--rollout-fragment-length", type=int, default=250)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # small MLPs learn fastest on one thread when cores are few

    config = (
        PPOConfig()
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=4,
            rollout_fragment_length=args.rollout_fragment_length,
        )
        .training(
            lr=1e-3,
            num_epochs=8,
            minibatch_size=128,
            lambda_=0.95,
            clip_param=0.2,
            vf_loss_coeff=0.5,
        )  # fmt: skip
        .rl_module(model_config={"fcnet_hiddens": [64, 64]})
        .debugging(seed=1)
    )
    group = EnvRunnerGroup(
        env_creator=make_cartpole, default_policy_class=PPOTorchPolicy, config=config
    )
    worker = group.local_env_runner  # a RolloutWorker: the config is old-stack
    returns: list[float] = []
    try:
        for i in range(1, args.iterations + 1):
            batch = synchronous_parallel_sample(worker_set=group)  # one SampleBatch
            worker.learn_on_batch(batch)  # PPO epochs on the local policy
            group.sync_weights()  # local worker -> remote workers (no-op without them)
            metrics = group.foreach_env_runner(
                lambda w: w.get_metrics(), local_env_runner=args.num_env_runners == 0
            )
            returns += [m.episode_reward for ms in metrics for m in ms]
            mean = float(np.mean(returns[-20:])) if returns else float("nan")
            print(f"iter {i:3d}  batch {batch.count:5d} rows  mean return {mean:6.1f}")
    finally:
        group.stop()
    return float(np.mean(returns[-20:])) if returns else float("nan")


if __name__ == "__main__":
    main()
