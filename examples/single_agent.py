"""New API stack, single agent: train PPO on CartPole with EnvRunnerGroup + PPOLearner.

This is what ``envrunners train`` does, in 40 lines you can edit: remote
``SingleAgentEnvRunner`` actors (on a local Ray the group starts and stops) sample
episodes, the single-file ``PPOLearner`` updates the weights, ``sync_weights``
pushes them back.

Run: python examples/single_agent.py [--num-env-runners 2] [--iterations 60]
     python examples/single_agent.py --num-env-runners 0 --iterations 2   # in-process, no Ray
"""

from __future__ import annotations

import argparse
import collections

from envrunners.algorithms.ppo import PPOConfig
from envrunners.algorithms.ppo.ppo_learner import PPOLearner
from envrunners.env.env_runner_group import EnvRunnerGroup
from envrunners.execution.rollout_ops import synchronous_parallel_sample


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-env-runners", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--train-batch-size", type=int, default=2048)
    parser.add_argument("--stop-reward", type=float, default=475.0)
    args = parser.parse_args(argv)

    config = (
        PPOConfig()
        .environment(args.env)
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=8,
            rollout_fragment_length="auto",  # train_batch_size / (runners x envs)
        )
        .training(
            train_batch_size=args.train_batch_size,
            lr=3e-4,
            num_epochs=10,
            minibatch_size=256,
            lambda_=0.95,
            clip_param=0.2,
            vf_loss_coeff=0.5,
            vf_clip_param=float("inf"),
            use_kl_loss=False,
        )
        .rl_module(model_config={"fcnet_hiddens": [64, 64]})
        .debugging(seed=0)
    )
    group = EnvRunnerGroup(config=config)  # starts a local Ray if it needs remote runners
    learner = PPOLearner.from_group(config, group)
    group.sync_weights(from_worker_or_learner_group=learner, inference_only=True)
    returns: collections.deque = collections.deque(maxlen=20)
    partial: dict[str, float] = collections.defaultdict(float)
    mean = float("nan")
    try:
        for i in range(1, args.iterations + 1):
            episodes = synchronous_parallel_sample(
                worker_set=group, max_env_steps=args.train_batch_size
            )
            for e in episodes:  # an episode may span several chunks (same id_)
                partial[e.id_] += e.get_return()
                if e.is_done:
                    returns.append(partial.pop(e.id_))
            stats = learner.update(episodes)
            group.sync_weights(from_worker_or_learner_group=learner, inference_only=True)
            mean = sum(returns) / len(returns) if returns else float("nan")
            print(
                f"iter {i:3d}  steps {sum(len(e) for e in episodes):5d}  "
                f"mean return {mean:6.1f}  policy loss {stats['policy_loss']:+.3f}  "
                f"healthy runners {group.num_healthy_remote_env_runners()}"
            )
            if len(returns) == returns.maxlen and mean >= args.stop_reward:
                print(f"solved {args.env} after {i} iterations")
                break
    finally:
        group.stop()  # stops the runners and the Ray it started
    return mean


if __name__ == "__main__":
    main()
