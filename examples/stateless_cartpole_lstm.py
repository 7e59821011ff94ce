"""Memory: PPO with the default LSTM learns StatelessCartPole, which an MLP cannot.

StatelessCartPole is CartPole with the two velocities removed from the
observation (cart position and pole angle only). One frame does not tell which
way the pole is falling, so a memoryless policy stays near a random one; an LSTM
can infer the velocities from the last few frames. The runners record each
step's ``STATE_OUT``; ``PPOLearner`` cuts the episodes into ``max_seq_len``
sequences, starts each from the recorded state before it and trains by
backpropagation through time. ``envrunners train --env
envrunners/StatelessCartPole-v1 --use-lstm`` runs the same setup from the command line.

Run: python examples/stateless_cartpole_lstm.py [--num-env-runners 2] [--stop-reward 150]
     python examples/stateless_cartpole_lstm.py --no-lstm   # the MLP baseline, for contrast
     python examples/stateless_cartpole_lstm.py --num-env-runners 0 --iterations 2   # smoke
"""

from __future__ import annotations

import argparse
import collections
import time

from envrunners.algorithms.ppo import PPOConfig
from envrunners.algorithms.ppo.ppo_learner import PPOLearner
from envrunners.env.env_runner_group import EnvRunnerGroup
from envrunners.execution.rollout_ops import synchronous_parallel_sample


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-env-runners", type=int, default=2)
    parser.add_argument("--num-envs-per-env-runner", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--train-batch-size", type=int, default=2048)
    parser.add_argument("--lstm-cell-size", type=int, default=64)
    parser.add_argument("--max-seq-len", type=int, default=20)
    parser.add_argument("--stop-reward", type=float, default=150.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-lstm", action="store_true", help="baseline: the same PPO with a memoryless MLP"
    )
    args = parser.parse_args(argv)

    config = (
        PPOConfig()
        .environment("envrunners/StatelessCartPole-v1")
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=args.num_envs_per_env_runner,
            rollout_fragment_length="auto",  # train_batch_size / (runners x envs)
        )
        .training(
            train_batch_size=args.train_batch_size,
            lr=1e-3,
            num_epochs=6,
            minibatch_size=512,
            lambda_=0.95,
            clip_param=0.2,
            vf_loss_coeff=0.5,
            vf_clip_param=float("inf"),
            use_kl_loss=False,
        )
        .rl_module(
            model_config={
                "use_lstm": not args.no_lstm,
                "lstm_cell_size": args.lstm_cell_size,
                "max_seq_len": args.max_seq_len,
                "fcnet_hiddens": [64],
            }
        )
        .debugging(seed=args.seed)
    )
    group = EnvRunnerGroup(config=config)  # starts a local Ray if it needs remote runners
    learner = PPOLearner.from_group(config, group)
    group.sync_weights(from_worker_or_learner_group=learner, inference_only=True)
    returns: collections.deque = collections.deque(maxlen=20)
    partial: dict[str, float] = collections.defaultdict(float)
    mean, env_steps, start = float("nan"), 0, time.perf_counter()
    try:
        for i in range(1, args.iterations + 1):
            episodes = synchronous_parallel_sample(
                worker_set=group, max_env_steps=args.train_batch_size
            )
            env_steps += sum(len(e) for e in episodes)
            for e in episodes:  # an episode may span several chunks (same id_)
                partial[e.id_] += e.get_return()
                if e.is_done:
                    returns.append(partial.pop(e.id_))
            stats = learner.update(episodes)
            group.sync_weights(from_worker_or_learner_group=learner, inference_only=True)
            mean = sum(returns) / len(returns) if returns else float("nan")
            print(
                f"iter {i:3d}  env steps {env_steps:7d}  mean return {mean:6.1f}  "
                f"policy loss {stats['policy_loss']:+.3f}  vf loss {stats['vf_loss']:.3f}  "
                f"{time.perf_counter() - start:6.0f} s",
                flush=True,
            )
            if len(returns) == returns.maxlen and mean >= args.stop_reward:
                print(f"reached mean return {mean:.1f} >= {args.stop_reward:g} after "
                      f"{env_steps} env steps ({i} iterations)")  # fmt: skip
                break
    finally:
        group.stop()  # stops the runners and the Ray it started
    return mean


if __name__ == "__main__":
    main()
