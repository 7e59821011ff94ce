"""W8: write and read 1M CartPole steps with JsonWriter/JsonReader (MB/s both ways).

The data are real CartPole-v1 steps (random actions, seed 0; 100k stepped, tiled
to 1M with fresh episode ids) in the columns an old-stack PPO worker records, cut
into SampleBatches of 1000 rows (one line each). ``write``: all batches through
``JsonWriter`` into an empty directory, file closed. ``read``: every line back
through ``JsonReader.read_all_files()``. ``mb_per_s`` is the in-memory array data
(the same for both targets, infos excluded) per second; ``file_mb`` the bytes on disk.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
from common import api, median_rate

WORKLOAD = "W8"
TOTAL_STEPS = 1_000_000
BATCH_SIZE = 1000
_STEPPED = 100_000


def cartpole_columns(n: int = _STEPPED, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` real CartPole-v1 steps with random actions as batch columns."""
    import gymnasium as gym

    env = gym.make("CartPole-v1").unwrapped
    rng = np.random.default_rng(seed)
    obs_buf = np.empty((n, 4), np.float32)
    next_buf = np.empty((n, 4), np.float32)
    actions = rng.integers(0, 2, n)
    terminateds = np.zeros(n, bool)
    truncateds = np.zeros(n, bool)
    eps_id = np.empty(n, np.int64)
    t = np.empty(n, np.int64)
    obs, _ = env.reset(seed=seed)
    ep, step = 0, 0
    for i in range(n):
        obs_buf[i] = obs
        obs, _, term, _, _ = env.step(int(actions[i]))
        trunc = step + 1 >= 500
        next_buf[i], terminateds[i], truncateds[i] = obs, term, trunc and not term
        eps_id[i], t[i] = ep, step
        step += 1
        if term or trunc:
            obs, _ = env.reset()
            ep, step = ep + 1, 0
    logits = rng.standard_normal((n, 2)).astype(np.float32)
    logp = (logits[np.arange(n), actions] - np.logaddexp(logits[:, 0], logits[:, 1])).astype(
        np.float32
    )
    return {
        "obs": obs_buf,
        "new_obs": next_buf,
        "actions": actions.astype(np.int64),
        "rewards": np.ones(n, np.float32),
        "terminateds": terminateds,
        "truncateds": truncateds,
        "eps_id": eps_id,
        "unroll_id": np.arange(n, dtype=np.int64) // 200,
        "agent_index": np.zeros(n, np.int64),
        "t": t,
        "action_prob": np.exp(logp),
        "action_logp": logp,
        "action_dist_inputs": logits,
        "vf_preds": rng.standard_normal(n).astype(np.float32),
    }


def make_batches(target: str, total: int = TOTAL_STEPS, size: int = BATCH_SIZE) -> list:
    """SampleBatches of ``size`` rows covering ``total`` steps (identical on both targets)."""
    SampleBatch = api(target, "envrunners.policy.sample_batch").SampleBatch
    base = cartpole_columns(min(total, _STEPPED))
    n_base = len(base["obs"])
    batches = []
    for start in range(0, total, size):
        lo = start % n_base
        cols = {k: v[lo : lo + size].copy() for k, v in base.items()}
        cols["eps_id"] += (start // n_base) * 1_000_000
        cols["infos"] = [{} for _ in range(size)]
        batches.append(SampleBatch(cols))
    return batches


def data_bytes(batches: list) -> int:
    """In-memory bytes of the array columns (infos excluded)."""
    return sum(v.nbytes for b in batches for k, v in b.items() if isinstance(v, np.ndarray))


def run(target: str, repeats: int = 5, total: int = TOTAL_STEPS, size: int = BATCH_SIZE):
    """Yield one ``write`` and one ``read`` record."""
    writer_mod = api(target, "envrunners.offline.json_writer")
    reader_mod = api(target, "envrunners.offline.json_reader")
    batches = make_batches(target, total, size)
    mb = data_bytes(batches) / 1e6
    root = tempfile.mkdtemp(prefix="w8_")
    out = os.path.join(root, "out")

    def write_once() -> int:
        shutil.rmtree(out, ignore_errors=True)
        writer = writer_mod.JsonWriter(out)
        for b in batches:
            writer.write(b)
        if hasattr(writer, "close"):
            writer.close()
        else:  # RLlib's JsonWriter has no close(); its file is flushed per write
            writer.cur_file.close()
        return total

    def read_once() -> int:
        reader = reader_mod.JsonReader(out)
        steps = sum(b.count for b in reader.read_all_files())
        assert steps == total, (steps, total)
        return steps

    try:
        for variant, fn in (("write", write_once), ("read", read_once)):
            stats = median_rate(fn, repeats=repeats)
            file_mb = sum(e.stat().st_size for e in os.scandir(out)) / 1e6
            yield {
                "workload": WORKLOAD,
                "target": target,
                "variant": variant,
                "size": size,
                "steps": total,
                "mb_per_s": mb * stats["per_s_median"] / total,
                "steps_per_s": stats["per_s_median"],
                "data_mb": mb,
                "file_mb": file_mb,
                **{k: v for k, v in stats.items() if k != "per_s_median"},
            }
    finally:
        shutil.rmtree(root, ignore_errors=True)
