"""A typical RLlib script, unchanged but for its imports: PPO solves CartPole with build_algo().

config -> ``build_algo()`` -> ``train()`` until the mean return reaches the goal ->
``evaluate()`` greedily -> ``save_to_path()`` -> ``Algorithm.from_checkpoint()``
-> the same greedy evaluation return. With RLlib, replace ``envrunners`` by
``ray.rllib`` in the two imports.

Run: python examples/rllib_script.py [--num-env-runners 2] [--iterations 60] [--stop-reward 450]
     python examples/rllib_script.py --num-env-runners 0 --iterations 2   # in-process, no Ray
"""

from __future__ import annotations

import argparse
import tempfile
import time

from envrunners.algorithms.algorithm import Algorithm
from envrunners.algorithms.ppo import PPOConfig


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-env-runners", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--train-batch-size", type=int, default=2048)
    parser.add_argument("--stop-reward", type=float, default=450.0)
    args = parser.parse_args(argv)

    config = (
        PPOConfig()
        .environment(args.env)
        .env_runners(
            num_env_runners=args.num_env_runners,
            num_envs_per_env_runner=8,
            rollout_fragment_length="auto",
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
        .evaluation(evaluation_duration=5, evaluation_config={"explore": False})
        .debugging(seed=0)
    )
    algo = config.build_algo()
    start = time.perf_counter()
    mean = float("nan")
    try:
        for _ in range(args.iterations):
            result = algo.train()
            mean = result["env_runners"].get("episode_return_mean", float("nan"))
            print(
                f"iter {result['training_iteration']:3d}  "
                f"steps {result['num_env_steps_sampled_lifetime']:7.0f}  "
                f"mean return {mean:6.1f}  "
                f"policy loss {result['learners']['default_policy']['policy_loss']:+.3f}  "
                f"{time.perf_counter() - start:6.1f} s"
            )
            if mean >= args.stop_reward:
                print(f"solved {args.env} after {result['training_iteration']} iterations")
                break
        greedy = algo.evaluate()["env_runners"]["episode_return_mean"]
        path = algo.save_to_path(tempfile.mkdtemp(prefix="rllib_script_"))
    finally:
        algo.stop()
    restored = Algorithm.from_checkpoint(path)
    try:
        again = restored.evaluate()["env_runners"]["episode_return_mean"]
    finally:
        restored.stop()
    print(f"greedy return {greedy:.1f}; restored from {path}: {again:.1f}")
    return mean


if __name__ == "__main__":
    main()
