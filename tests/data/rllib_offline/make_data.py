"""Write the RLlib 2.60 offline test files (run with a Python that has ray[rllib]==2.60).

    /tmp/rllib-venv/bin/python tests/data/rllib_offline/make_data.py

Each directory is what ``OfflineSingleAgentEnvRunner`` (ray.rllib.offline.offline_env_runner)
wrote for one ``sample(num_timesteps=60, random_actions=True)`` call on CartPole-v1 (1 env,
seed 0, ``output_write_method_kwargs={"min_rows_per_file": 1000}`` so each is one file):
``episodes/`` with ``output_write_episodes=True`` (msgpack episode states in column ``item``),
``rows/`` with ``output_write_episodes=False, output_compress_columns=[]`` (one row per step),
``rows_packed/`` with RLlib's default ``output_compress_columns=["obs", "new_obs"]``
(obs/new_obs are cloudpickled, LZ4-compressed, base64 strings: the "pickled column" case).
"""

import glob
import os
import shutil

import ray
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.offline.offline_env_runner import OfflineSingleAgentEnvRunner

HERE = os.path.dirname(os.path.abspath(__file__))


def write(name, **offline):
    out = os.path.join(HERE, name)
    shutil.rmtree(out, ignore_errors=True)
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_envs_per_env_runner=1, rollout_fragment_length=60)
        .offline_data(output=out, output_write_method_kwargs={"min_rows_per_file": 1000}, **offline)
        .debugging(seed=0)
    )
    runner = OfflineSingleAgentEnvRunner(config=config, worker_index=1)
    runner.sample(num_timesteps=60, random_actions=True)
    runner.stop()
    # Keep only the Parquet files, flattened: <name>/<env>/run-.../<file>.parquet
    for i, f in enumerate(sorted(glob.glob(os.path.join(out, "**", "*.parquet"), recursive=True))):
        os.replace(f, os.path.join(out, f"part-{i}.parquet"))
    for d in sorted(glob.glob(os.path.join(out, "*")), reverse=True):
        if os.path.isdir(d):
            shutil.rmtree(d)


if __name__ == "__main__":
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    write("episodes", output_write_episodes=True)
    write("rows", output_write_episodes=False, output_compress_columns=[])
    write("rows_packed", output_write_episodes=False)
    ray.shutdown()
