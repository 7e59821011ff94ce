"""W8b: write and read 1M CartPole steps as Parquet episodes (RLlib 2.60's new-stack layout).

The data are W8's real CartPole-v1 steps (random actions, seed 0; 100k stepped, tiled
to ``W8B_STEPS`` = 1M with fresh episode ids) as the episodes a PPO env runner returns,
with ``action_logp`` and ``action_dist_inputs`` outputs. Each target uses its own
episode form: envrunners' numpy'd chunks, RLlib's list-based chunks (as its
``OfflineSingleAgentEnvRunner`` records them, ``is_numpy=False``).

- ``write``: all episodes to Parquet, one episode per row (column ``item``). envrunners:
  ``ParquetEpisodeWriter.write`` + ``close``; RLlib: the body of
  ``OfflineSingleAgentEnvRunner.sample`` for ``output_write_episodes=True``:
  ``msgpack.packb(ep.get_state(), default=msgpack_numpy.encode)`` per episode, then
  ``ray.data.from_items(...).write_parquet(path)``.
- ``read``: the files back through Ray Data to decoded episodes, every step counted.
  envrunners: ``OfflineData(config).sample(..., return_iterator=True)`` (read_parquet ->
  ``OfflinePreLearner`` -> step tables); RLlib: ``ray.data.read_parquet`` ->
  ``map_batches`` with what ``OfflinePreLearner.__call__`` does for episodes
  (``SingleAgentEpisode.from_state(msgpack.unpackb(item, object_hook=mnp.decode))``).
- ``decode``: the same decoding without Ray (one process, file by file): envrunners
  ``read_parquet_episodes``; RLlib ``pyarrow.parquet.read_table`` + the decode above.
- ``read_bare_ray_data`` (envrunners only): the floor of any Ray Data read of these
  files, ``ray.data.read_parquet(path).iter_batches(batch_format="pyarrow")`` of the raw
  rows without decoding (steps/s counts the steps the rows hold).
- ``read_2_consumers`` (envrunners only): ``W8B_BIG_STEPS`` = 10M steps read through
  ``OfflineData.sample(num_shards=2)`` by two concurrent consumers; reports steps/s and
  the peak RSS of the driver and the peak summed PSS of Ray's processes (raylet,
  object store, workers; PSS splits shared object-store pages between them) next to the dataset's size
  on disk (streaming keeps RSS bounded by blocks in flight, not by the dataset).

Ray runs locally with 2 CPUs in the same process for both targets.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

import numpy as np
from common import api, median_rate

WORKLOAD = "W8B"
TOTAL_STEPS = int(os.environ.get("W8B_STEPS", 1_000_000))
BIG_STEPS = int(os.environ.get("W8B_BIG_STEPS", 10_000_000))
_STEPPED = 100_000


def _columns(total: int) -> dict[str, np.ndarray]:
    from w8_offline import cartpole_columns

    base = cartpole_columns(min(total, _STEPPED))
    reps = -(-total // len(base["obs"]))
    cols = {k: np.concatenate([v] * reps)[:total] for k, v in base.items()}
    n_base = len(base["obs"])
    cols["eps_id"] = cols["eps_id"] + (np.arange(total) // n_base) * 1_000_000
    return cols


def _bounds(cols: dict[str, np.ndarray]) -> np.ndarray:
    eps = cols["eps_id"]
    starts = np.flatnonzero(np.r_[True, eps[1:] != eps[:-1]])
    return np.r_[starts, len(eps)]


def make_episodes(target: str, total: int) -> list:
    """The episodes of ``total`` steps in ``target``'s own episode form."""
    import gymnasium as gym

    episode_cls = api(target, "envrunners.env.single_agent_episode").SingleAgentEpisode
    cols = _columns(total)
    env = gym.make("CartPole-v1")
    obs_space, act_space = env.observation_space, env.action_space
    bounds = _bounds(cols)
    out = []
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        obs = np.concatenate([cols["obs"][a:b], cols["new_obs"][b - 1 : b]])
        extra = {k2: cols[k2][a:b] for k2 in ("action_logp", "action_dist_inputs")}
        done = dict(terminated=bool(cols["terminateds"][b - 1]),
                    truncated=bool(cols["truncateds"][b - 1]))  # fmt: skip
        if target == "envrunners":
            ep = episode_cls.from_columns(
                observations=obs, actions=cols["actions"][a:b], rewards=cols["rewards"][a:b],
                extra_model_outputs=extra, observation_space=obs_space, action_space=act_space,
                id_=f"ep{k}", **done,
            )  # fmt: skip
        else:
            ep = episode_cls(
                id_=f"ep{k}", observations=list(obs), actions=list(cols["actions"][a:b]),
                rewards=list(cols["rewards"][a:b]),
                extra_model_outputs={k2: list(v) for k2, v in extra.items()},
                observation_space=obs_space, action_space=act_space, len_lookback_buffer=0,
                **done,
            )  # fmt: skip
        out.append(ep)
    return out


def _write_rllib(episodes: list, path: str) -> None:
    import msgpack
    import msgpack_numpy as mnp
    import ray.data

    items = [msgpack.packb(ep.get_state(), default=mnp.encode) for ep in episodes]
    ray.data.from_items(items).write_parquet(path)


def _write_ours(episodes: list, path: str) -> None:
    from envrunners.offline.parquet_writer import ParquetEpisodeWriter

    with ParquetEpisodeWriter(path, write_episodes=True, max_rows_per_file=1000) as writer:
        writer.write(episodes)


def _rllib_decode(batch: dict) -> dict:
    import msgpack
    import msgpack_numpy as mnp
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    eps = [SingleAgentEpisode.from_state(msgpack.unpackb(s, object_hook=mnp.decode))
           for s in batch["item"]]  # fmt: skip
    return {"steps": np.array([len(ep) for ep in eps], dtype=np.int64)}


def _read_rllib(path: str) -> int:
    import ray.data

    ds = ray.data.read_parquet(path).map_batches(_rllib_decode, batch_size=256)
    return int(sum(b["steps"].sum() for b in ds.iter_batches(batch_size=None)))


def _decode_rllib(path: str) -> int:
    import glob

    import pyarrow.parquet as pq

    files = sorted(glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True))
    return sum(int(_rllib_decode({"item": pq.read_table(f).column("item").to_pylist()})["steps"]
                   .sum()) for f in files)  # fmt: skip


def _decode_ours(path: str) -> int:
    from envrunners.offline.parquet_reader import read_parquet_episodes

    return sum(len(ep) for ep in read_parquet_episodes(path))


def _ours_config(path: str) -> object:
    from envrunners.algorithms.ppo import PPOConfig

    return PPOConfig().offline_data(input_=[path], input_read_episodes=True)


def _read_ours(path: str) -> int:
    from envrunners.offline.offline_data import OfflineData

    (it,) = OfflineData(_ours_config(path)).sample(256, return_iterator=True)
    return sum(len(b["rewards"]) for b in it.iter_batches(batch_size=None, batch_format="numpy"))


def _read_bare(path: str) -> int:
    """Ray Data's own floor: read_parquet().iter_batches() of the raw rows, no decoding."""
    import ray.data

    ds = ray.data.read_parquet(path)
    return sum(b.num_rows for b in ds.iter_batches(batch_size=None, batch_format="pyarrow"))


def _dir_mb(path: str) -> float:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs) / 1e6


def _read_two_consumers(root: str) -> dict:
    """Write BIG_STEPS steps (envrunners), read them with 2 streaming consumers, watch RSS."""
    import psutil

    from envrunners.offline.offline_data import OfflineData

    path = os.path.join(root, "big")
    base = make_episodes("envrunners", min(BIG_STEPS, 1_000_000))
    per_copy = sum(len(ep) for ep in base)
    copies = -(-BIG_STEPS // per_copy)
    from envrunners.offline.parquet_writer import ParquetEpisodeWriter

    with ParquetEpisodeWriter(path, write_episodes=True, max_rows_per_file=2000) as writer:
        for c in range(copies):
            for ep in base:
                ep.id_ = f"c{c}-{ep.id_.split('-')[-1]}"
            writer.write(base)
    del base
    proc = psutil.Process()

    def workers_rss() -> int:
        """PSS of Ray's processes: shared (object-store) pages split between them."""
        total = 0
        for child in proc.children(recursive=True):
            try:
                info = child.memory_full_info()
                total += getattr(info, "pss", info.rss)
            except psutil.Error:
                pass
        return total

    rss_before = proc.memory_info().rss
    workers_before = workers_rss()
    peak = [rss_before, workers_before]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            peak[1] = max(peak[1], workers_rss())
            time.sleep(0.2)

    shards = OfflineData(_ours_config(path)).sample(1024, num_shards=2)
    counts = [0, 0]

    def consume(i: int) -> None:
        for b in shards[i].iter_batches(batch_size=None, batch_format="numpy"):
            counts[i] += len(b["rewards"])

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    stop.set()
    total = sum(counts)
    return {
        "workload": WORKLOAD,
        "target": "envrunners",
        "variant": "read_2_consumers",
        "steps": total,
        "steps_per_s": total / seconds,
        "seconds": seconds,
        "consumer_steps": counts,
        "dataset_steps": copies * per_copy,
        "file_mb": _dir_mb(path),
        "driver_rss_mb_before": rss_before / 1e6,
        "driver_rss_mb_peak": peak[0] / 1e6,
        "ray_procs_pss_mb_before": workers_before / 1e6,
        "ray_procs_pss_mb_peak": peak[1] / 1e6,
    }


def run(target: str, repeats: int = 3, total: int = TOTAL_STEPS):
    """Yield ``write`` and ``read`` records (and ``read_2_consumers`` for envrunners)."""
    import ray

    repeats = min(repeats, 3)
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)  # fmt: skip
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    episodes = make_episodes(target, total)
    root = tempfile.mkdtemp(prefix="w8b_")
    out = os.path.join(root, "out")
    write = _write_ours if target == "envrunners" else _write_rllib
    read = _read_ours if target == "envrunners" else _read_rllib
    decode = _decode_ours if target == "envrunners" else _decode_rllib

    def write_once() -> int:
        shutil.rmtree(out, ignore_errors=True)
        write(episodes, out)
        return total

    def read_once() -> int:
        steps = read(out)
        assert steps == total, (steps, total)
        return steps

    def decode_once() -> int:
        steps = decode(out)
        assert steps == total, (steps, total)
        return steps

    try:
        variants = [("write", write_once), ("decode", decode_once), ("read", read_once)]
        if target == "envrunners":  # the floor: Ray Data's bare read of the same files

            def bare_once() -> int:
                assert _read_bare(out) == len(episodes)
                return total

            variants.append(("read_bare_ray_data", bare_once))
        for variant, fn in variants:
            stats = median_rate(fn, repeats=repeats)
            yield {
                "workload": WORKLOAD,
                "target": target,
                "variant": variant,
                "steps": total,
                "steps_per_s": stats["per_s_median"],
                "file_mb": _dir_mb(out),
                **{k: v for k, v in stats.items() if k != "per_s_median"},
            }
        if target == "envrunners" and BIG_STEPS:
            del episodes
            yield _read_two_consumers(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if started:
            ray.shutdown()
