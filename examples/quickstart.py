"""Quickstart: sample CartPole with envrunners' SingleAgentEnvRunner, RLlib-style.

Run: python examples/quickstart.py [--num-envs 8] [--timesteps 2000]
"""

from __future__ import annotations

import argparse
import time

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.policy.sample_batch import concat_samples


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--timesteps", type=int, default=2000)
    args = parser.parse_args(argv)

    config = (
        AlgorithmConfig()
        .environment(args.env)
        .env_runners(num_envs_per_env_runner=args.num_envs)
        .debugging(seed=0)
    )
    runner = SingleAgentEnvRunner(config=config)
    start = time.perf_counter()
    episodes = runner.sample(num_timesteps=args.timesteps)
    elapsed = time.perf_counter() - start
    steps = sum(len(e) for e in episodes)
    done = [e for e in episodes if e.is_done]
    print(
        f"sampled {steps} env steps from {args.num_envs} envs in {elapsed:.3f}s "
        f"({steps / elapsed:,.0f} steps/s)"
    )
    print(f"{len(done)} finished episodes, {len(episodes) - len(done)} ongoing chunks")
    batch = concat_samples([e.get_sample_batch() for e in episodes])
    print(f"as one SampleBatch: {batch}")
    metrics = runner.get_metrics()
    if "episode_return_mean" in metrics:
        print(
            f"episode return mean {metrics['episode_return_mean']:.1f} "
            f"(min {metrics['episode_return_min']:.0f}, max {metrics['episode_return_max']:.0f})"
        )
    runner.stop()


if __name__ == "__main__":
    main()
