"""Offline data: record experience as JSON lines (no pickle), then read it back two ways.

1. New stack: a ``SingleAgentEnvRunner`` with ``offline_data(output=DIR)`` records
   every episode chunk it samples; ``read_episodes`` restores the exact chunks.
2. Old stack: a ``RolloutWorker`` with ``output=DIR`` records ``SampleBatch``es;
   ``JsonReader`` (also an old-stack ``input_``) reads them back, and reads the
   episode files of step 1 as batches too.

Files are written under a temporary name and renamed when complete, so a reader
never sees half a file. Inspect them with ``envrunners offline info DIR``.

Run: python examples/offline_record_read.py [--timesteps 2000] [--out /tmp/offline-demo]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import gymnasium as gym
import numpy as np

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.algorithms.pg import PGTorchPolicy
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.evaluation.rollout_worker import RolloutWorker
from envrunners.offline import JsonReader
from envrunners.offline.episode_writer import read_episodes


def record_episodes(out: Path, timesteps: int) -> list:
    """New stack: the runner records what it samples (one JSON line per episode chunk)."""
    config = (
        AlgorithmConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=4)
        .offline_data(output=str(out))
        .debugging(seed=0)
    )
    runner = SingleAgentEnvRunner(config=config)
    sampled = runner.sample(num_timesteps=timesteps, random_actions=True)
    runner.stop()  # publishes the open file
    return sampled


def record_batches(out: Path, timesteps: int) -> list:
    """Old stack: the worker's output writer records each SampleBatch it returns."""
    config = (
        AlgorithmConfig()
        .api_stack(enable_rl_module_and_learner=False, enable_env_runner_and_connector_v2=False)
        .env_runners(rollout_fragment_length=max(1, timesteps // 4))
        .offline_data(output=str(out))
        .debugging(seed=0)
    )
    worker = RolloutWorker(
        env_creator=lambda ctx: gym.make("CartPole-v1"),
        config=config,
        default_policy_class=PGTorchPolicy,
    )
    sampled = [worker.sample() for _ in range(4)]
    worker.output_writer.close()
    worker.stop()
    return sampled


def main(argv: list[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=2000)
    parser.add_argument("--out", default=None, help="directory (default: a temporary one)")
    args = parser.parse_args(argv)
    root = Path(args.out or tempfile.mkdtemp(prefix="envrunners-offline-"))

    episodes = record_episodes(root / "episodes", args.timesteps)
    restored = list(read_episodes(str(root / "episodes")))
    assert [e.id_ for e in restored] == [e.id_ for e in episodes]
    assert all(np.array_equal(a.get_actions(), b.get_actions()) for a, b in zip(restored, episodes))
    as_batches = list(JsonReader(str(root / "episodes")).read_all_files())
    print(
        f"episodes: recorded {len(episodes)} chunks ({sum(len(e) for e in episodes)} steps), "
        f"read back {len(restored)} identical chunks; JsonReader sees {len(as_batches)} batches"
    )

    batches = record_batches(root / "batches", args.timesteps)
    back = list(JsonReader(str(root / "batches")).read_all_files())
    assert [b.count for b in back] == [b.count for b in batches]
    assert all(np.array_equal(a["obs"], b["obs"]) for a, b in zip(back, batches))
    print(f"batches: recorded {len(batches)} SampleBatches, read back {len(back)} identical ones")
    print(f"files in {root} (try: envrunners offline info {root / 'batches'})")
    return {"episode_chunks": len(restored), "batches": len(back)}


if __name__ == "__main__":
    main()
