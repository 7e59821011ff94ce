"""Check that RLlib 2.60 reads Parquet files that envrunners wrote (run with RLlib's Python).

    /tmp/rllib-venv/bin/python tests/data/rllib_offline/check_rllib_reads.py EPISODE_DIR ROWS_DIR

Trains RLlib's BC for one iteration on each directory (``OfflineData`` ->
``OfflinePreLearner`` -> learner), once with ``input_read_episodes=True`` on the
episode files and once on the step files, and prints the env steps it trained on.
Exits non-zero if RLlib cannot read a file.
"""

import sys

import gymnasium as gym
import ray
from ray.rllib.algorithms.bc import BCConfig


def train_once(path, episodes):
    config = (
        BCConfig()
        .environment(
            observation_space=gym.make("CartPole-v1").observation_space,
            action_space=gym.make("CartPole-v1").action_space,
        )
        .offline_data(
            input_=[path],
            input_read_episodes=episodes,
            dataset_num_iters_per_learner=1,
            map_batches_kwargs={"concurrency": 1, "num_cpus": 1},
        )
        .training(train_batch_size_per_learner=64)
        .evaluation(evaluation_interval=None)
    )
    algo = config.build_algo()
    result = algo.train()
    algo.stop()
    learner = result["learners"]["default_policy"]
    print(
        f"{'episodes' if episodes else 'rows'}: RLlib BC trained on "
        f"{learner['num_module_steps_trained']} module steps from {path}"
    )


if __name__ == "__main__":
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    train_once(sys.argv[1], True)
    train_once(sys.argv[2], False)
    ray.shutdown()
