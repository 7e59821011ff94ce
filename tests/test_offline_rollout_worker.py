"""Offline IO through a real RolloutWorker: recording with ``output=path``, reading with
``input_=path`` and with a ``{path: p, "sampler": q}`` mix (issue 7, item 6)."""

from __future__ import annotations

import glob

import gymnasium as gym
import numpy as np
import pytest

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.algorithms.pg import PGTorchPolicy
from envrunners.evaluation.rollout_worker import RolloutWorker
from envrunners.offline import JsonReader, JsonWriter, MixedInput, NoopOutput, ShuffledInput


def make_worker(**offline):
    config = (
        AlgorithmConfig()
        .env_runners(rollout_fragment_length=50)
        .training(train_batch_size=50)
        .debugging(seed=0)
        .offline_data(**offline)
    )
    return RolloutWorker(
        env_creator=lambda _: gym.make("CartPole-v1"),
        config=config,
        default_policy_class=PGTorchPolicy,
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("rec"))
    worker = make_worker(output=out)
    assert isinstance(worker.output_writer, JsonWriter)
    sampled = [worker.sample() for _ in range(3)]
    worker.output_writer.close()
    worker.stop()
    return out, sampled


def test_worker_records_everything_it_samples(recorded):
    out, sampled = recorded
    assert len(glob.glob(out + "/output-*_worker-0_*.json")) == 1
    back = list(JsonReader(out).read_all_files())
    assert [b.count for b in back] == [b.count for b in sampled]
    for orig, got in zip(sampled, back):
        for key in ("obs", "new_obs", "actions", "rewards", "terminateds", "eps_id"):
            np.testing.assert_array_equal(got[key], orig[key])
            assert got[key].dtype == np.asarray(orig[key]).dtype


def test_worker_without_output_uses_noop_output():
    worker = make_worker()
    assert isinstance(worker.output_writer, NoopOutput)
    worker.stop()


def test_worker_reads_from_files(recorded):
    out, sampled = recorded
    worker = make_worker(input_=out)
    assert isinstance(worker.input_reader, ShuffledInput)
    assert isinstance(worker.input_reader.child, JsonReader)
    known = {float(b["obs"][0, 0]) for b in sampled}
    for _ in range(5):
        batch = worker.sample()
        assert batch.count >= 50 and float(batch["obs"][0, 0]) in known
    worker.stop()


def test_worker_reads_from_a_mix_of_files_and_sampler(recorded):
    out, sampled = recorded
    worker = make_worker(input_={out: 0.5, "sampler": 0.5})
    mixed = worker.input_reader.child
    assert isinstance(mixed, MixedInput) and mixed.choices[1] is worker.sampler
    for _ in range(10):
        worker.sample()
    assert sum(mixed.counts) >= 10 and all(c > 0 for c in mixed.counts)
    worker.stop()
