"""MixedInput, ShuffledInput, D4RLReader, IOContext, action postprocessing and the
input/output selection rules of spec §12.8."""

from __future__ import annotations

import gymnasium as gym
import h5py
import numpy as np
import pytest

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.errors import ConfigError, OfflineDataError
from envrunners.offline import (
    D4RLReader,
    InputReader,
    IOContext,
    JsonReader,
    JsonWriter,
    MixedInput,
    NoopOutput,
    OutputWriter,
    ShuffledInput,
    input_reader_from_config,
    output_writer_from_config,
    register_input,
    registry_contains_input,
    registry_get_input,
)
from envrunners.offline.d4rl_reader import qlearning_dataset
from envrunners.policy.sample_batch import SampleBatch


class ConstInput(InputReader):
    """Always returns a one-row batch tagged with ``value``."""

    def __init__(self, value):
        self.value = value

    def next(self):
        return SampleBatch({"src": np.array([self.value])})


class FakeWorker:
    def __init__(self, sampler=None, action_space=None):
        self.sampler = sampler
        self.policy_map = {"default_policy": FakePolicy(action_space)}


class FakePolicy:
    def __init__(self, action_space):
        self.action_space = action_space

    def postprocess_trajectory(self, batch):
        batch["advantages"] = batch["rewards"] * 2
        return batch


@pytest.fixture
def data_dir(tmp_path):
    with JsonWriter(str(tmp_path / "data")) as w:
        for i in range(5):
            w.write(SampleBatch({"src": np.array([-1]), "i": np.array([i])}))
    return str(tmp_path / "data")


# ------------------------------------------------------------------ base classes


def test_input_reader_and_output_writer_bases():
    with pytest.raises(NotImplementedError, match="must implement next"):
        InputReader().next()
    with pytest.raises(NotImplementedError, match="does not support TensorFlow"):
        InputReader().tf_input_ops()
    with pytest.raises(NotImplementedError, match="must implement write"):
        OutputWriter().write(SampleBatch())
    NoopOutput("anything", x=1).write(SampleBatch())


def test_io_context_defaults_and_sampler():
    ctx = IOContext()
    assert ctx.log_dir and ctx.worker_index == 0 and ctx.worker is None
    assert ctx.config.train_batch_size == 1 and ctx.config.actions_in_input_normalized is True
    assert ctx.input_config == {} and ctx.output_config == {}
    with pytest.raises(AttributeError, match="no worker"):
        ctx.default_sampler_input()
    w = FakeWorker(sampler="S")
    assert IOContext(worker=w).config.actions_in_input_normalized is False
    assert IOContext(worker=w).default_sampler_input() == "S"
    assert IOContext(config={"input_config": {"a": 1}}).input_config == {"a": 1}


# ------------------------------------------------------------------ MixedInput


def test_mixed_input_proportions_on_a_fixed_seed(data_dir):
    ctx = IOContext(worker=FakeWorker(sampler=ConstInput(1)), config={})
    mixed = MixedInput(
        {data_dir: 0.2, "sampler": 0.5, (lambda ioctx: ConstInput(2)): 0.3}, ctx, seed=0
    )
    draws = [int(mixed.next()["src"][0]) for _ in range(4000)]
    freq = {v: draws.count(v) / len(draws) for v in (-1, 1, 2)}
    assert abs(freq[-1] - 0.2) < 0.03 and abs(freq[1] - 0.5) < 0.03 and abs(freq[2] - 0.3) < 0.03
    assert sum(mixed.counts) == 4000
    again = MixedInput(
        {data_dir: 0.2, "sampler": 0.5, (lambda ioctx: ConstInput(2)): 0.3}, ctx, seed=0
    )
    assert [int(again.next()["src"][0]) for _ in range(4000)] == draws


def test_mixed_input_seed_from_config(data_dir):
    def draws(worker_index):
        ctx = IOContext(config={"seed": 5}, worker_index=worker_index, sampler=ConstInput(1))
        m = MixedInput({"sampler": 0.5, data_dir: 0.5}, ctx)
        return [int(m.next()["src"][0]) for _ in range(50)]

    assert draws(0) == draws(0) and draws(0) != draws(1)


def test_mixed_input_checks():
    ctx = IOContext(sampler=ConstInput(1))
    with pytest.raises(ValueError, match="Values must sum to 1.0"):
        MixedInput({"sampler": 0.5}, ctx)
    with pytest.raises(ValueError, match="Values must sum to 1.0"):
        MixedInput({"sampler": 1.5, (lambda c: ConstInput(0)): -0.5}, ctx)
    MixedInput(
        {"sampler": 0.7, (lambda c: ConstInput(0)): 0.2, (lambda c: ConstInput(3)): 0.1}, ctx
    )
    with pytest.raises(ValueError, match="worker has no sampler"):
        MixedInput({"sampler": 1.0}, IOContext(worker=FakeWorker(sampler=None)))


def test_registered_inputs():
    register_input("const7", lambda ioctx: ConstInput(7))
    assert registry_contains_input("const7") and not registry_contains_input("nope")
    assert registry_get_input("const7")(None).value == 7
    with pytest.raises(KeyError, match="no input registered under 'nope'"):
        registry_get_input("nope")
    with pytest.raises(TypeError, match="must be callable"):
        register_input("x", 3)
    mixed = MixedInput({"const7": 1.0}, IOContext())
    assert mixed.next()["src"][0] == 7


# ------------------------------------------------------------------ ShuffledInput


class Counter(InputReader):
    def __init__(self):
        self.i = 0

    def next(self):
        self.i += 1
        return self.i


def test_shuffled_input():
    assert [ShuffledInput(Counter(), 0).next() for _ in range(3)] == [1, 1, 1]
    plain = ShuffledInput(Counter(), 1)
    assert [plain.next() for _ in range(3)] == [1, 2, 3]
    child = Counter()
    shuffled = ShuffledInput(child, 10, seed=0)
    out = [shuffled.next() for _ in range(200)]
    assert child.i == 210 and len(shuffled.buffer) == 10
    assert out != sorted(out) and max(out) <= 210


# ------------------------------------------------------------------ D4RL


def d4rl_file(path, n=6, timeouts=True):
    with h5py.File(path, "w") as f:
        f["observations"] = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
        f["actions"] = np.arange(n * 2, dtype=np.float32).reshape(n, 2) / 10
        f["rewards"] = np.arange(n, dtype=np.float32)
        f["terminals"] = np.array([0, 0, 1, 0, 0, 0][:n], dtype=bool)
        if timeouts:
            f["timeouts"] = np.array([0, 0, 0, 0, 1, 0][:n], dtype=bool)
    return str(path)


def test_d4rl_reader_from_local_hdf5(tmp_path):
    reader = D4RLReader(d4rl_file(tmp_path / "hopper.hdf5"))
    ds = reader.dataset
    # rows 0..4 (the last has no successor), minus the timeout row 4
    np.testing.assert_array_equal(ds["rewards"], [0, 1, 2, 3])
    np.testing.assert_array_equal(ds["obs"][:, 0], [0, 3, 6, 9])
    np.testing.assert_array_equal(ds["new_obs"][:, 0], [3, 6, 9, 12])
    np.testing.assert_array_equal(ds["terminateds"], [False, False, True, False])
    assert ds["obs"].dtype == np.float32 and ds["terminateds"].dtype == bool
    rows = [reader.next() for _ in range(9)]
    assert all(len(r) == 1 for r in rows)
    assert [float(r["rewards"][0]) for r in rows] == [0, 1, 2, 3, 0, 1, 2, 3, 0]


def test_qlearning_dataset_without_timeouts_keeps_all_but_the_last_row():
    data = {"observations": np.arange(4)[:, None], "actions": np.zeros(4), "rewards": np.arange(4.0),
            "terminals": np.zeros(4)}  # fmt: skip
    out = qlearning_dataset(data)
    np.testing.assert_array_equal(out["rewards"], [0, 1, 2])
    np.testing.assert_array_equal(out["next_observations"][:, 0], [1, 2, 3])


def test_d4rl_reader_errors(tmp_path):
    with h5py.File(tmp_path / "bad.hdf5", "w") as f:
        f["observations"] = np.zeros((3, 1))
    with pytest.raises(OfflineDataError, match=r"missing \['actions', 'rewards', 'terminals'\]"):
        D4RLReader(str(tmp_path / "bad.hdf5"))
    with pytest.raises(OfflineDataError, match="not found"):
        D4RLReader(str(tmp_path / "nope.hdf5"))
    (tmp_path / "text.h5").write_text("not hdf5")
    with pytest.raises(OfflineDataError, match="cannot read it as HDF5"):
        D4RLReader(str(tmp_path / "text.h5"))
    with pytest.raises(OfflineDataError, match="no transitions"):
        D4RLReader(d4rl_file(tmp_path / "one.hdf5", n=1))
    with pytest.raises(OfflineDataError, match="needs the `d4rl` package"):
        D4RLReader("hopper-medium-v0")


# ------------------------------------------------------------------ actions, postprocessing


def test_actions_are_normalised_and_clipped_with_a_worker(tmp_path):
    with JsonWriter(str(tmp_path / "a")) as w:
        w.write(SampleBatch({"actions": np.array([[0.0], [5.0], [20.0]], np.float32),
                             "rewards": np.ones(3), "eps_id": np.array([1, 1, 2])}))  # fmt: skip
    worker = FakeWorker(action_space=gym.spaces.Box(0.0, 10.0, (1,), np.float32))
    cfg = AlgorithmConfig().training(train_batch_size=1)
    batch = JsonReader(str(tmp_path / "a"), IOContext(config=cfg, worker=worker)).next()
    np.testing.assert_allclose(batch["actions"][:, 0], [-1.0, 0.0, 3.0])
    assert batch["actions"].dtype == np.float32
    cfg.offline_data(actions_in_input_normalized=True).environment(clip_actions=True)
    batch = JsonReader(str(tmp_path / "a"), IOContext(config=cfg, worker=worker)).next()
    np.testing.assert_allclose(batch["actions"][:, 0], [0.0, 5.0, 10.0])
    with pytest.raises(ValueError, match="clip_actions=True needs the policy's action space"):
        JsonReader(str(tmp_path / "a"), IOContext(config=cfg)).next()


def test_postprocess_inputs_runs_the_policy_per_episode(tmp_path):
    with JsonWriter(str(tmp_path / "a")) as w:
        w.write(SampleBatch({"rewards": np.array([1.0, 2.0, 3.0]), "eps_id": np.array([1, 1, 2])}))
    cfg = {"train_batch_size": 1, "postprocess_inputs": True}
    batch = JsonReader(str(tmp_path / "a"), IOContext(config=cfg, worker=FakeWorker())).next()
    np.testing.assert_array_equal(batch["advantages"], [2.0, 4.0, 6.0])
    with pytest.raises(ValueError, match="postprocess_inputs=True needs a worker"):
        JsonReader(str(tmp_path / "a"), IOContext(config=cfg)).next()


# ------------------------------------------------------------------ selection (§12.8)


def select(input_, tmp_path=None, sampler=None, **offline):
    cfg = AlgorithmConfig().offline_data(input_=input_, **offline)
    return input_reader_from_config(cfg, IOContext(config=cfg), sampler=sampler)


def test_input_selection_rules(data_dir, tmp_path):
    sampler = ConstInput(1)
    assert select("sampler", sampler=sampler) is sampler
    assert select("sampler") is None
    assert isinstance(select(lambda ioctx: ConstInput(3)), ConstInput)
    reader = select(data_dir, shuffle_buffer_size=7)
    assert isinstance(reader, ShuffledInput) and reader.n == 7
    assert isinstance(reader.child, JsonReader)
    assert isinstance(select([data_dir]).child, JsonReader)
    mixed = select({data_dir: 0.5, "sampler": 0.5}, sampler=sampler, shuffle_buffer_size=3)
    assert isinstance(mixed, ShuffledInput) and isinstance(mixed.child, MixedInput)
    register_input("const9", lambda ioctx: ConstInput(9))
    assert select("const9").value == 9
    d4rl = select("d4rl." + d4rl_file(tmp_path / "x.hdf5"))
    assert isinstance(d4rl, D4RLReader)
    assert isinstance(select(d4rl_file(tmp_path / "y.h5")), D4RLReader)
    with pytest.raises(ConfigError, match="ray.data"):
        select("dataset")


def test_class_path_inputs_get_the_shuffle_buffer(data_dir):
    for path in (
        "envrunners.offline.json_reader.JsonReader",
        "ray.rllib.offline.json_reader.JsonReader",
    ):
        reader = select(path, input_config={"inputs": data_dir}, shuffle_buffer_size=123)
        assert isinstance(reader, ShuffledInput) and reader.n == 123
        assert isinstance(reader.child, JsonReader) and len(reader.child.files) == 1
    reader = select(JsonReader, input_config={"inputs": data_dir})
    assert isinstance(reader.child, JsonReader)


def test_output_selection_rules(tmp_path):
    def build(output, **kw):
        cfg = AlgorithmConfig().offline_data(output=output, **kw)
        return output_writer_from_config(cfg, IOContext(log_dir=str(tmp_path / "logs"), config=cfg))

    assert isinstance(build(None), NoopOutput)
    sentinel = NoopOutput()
    assert build(lambda ioctx: sentinel) is sentinel
    w = build("logdir", output_max_file_size=1234)
    assert (
        isinstance(w, JsonWriter) and w.path == str(tmp_path / "logs") and w.max_file_size == 1234
    )
    w = build(str(tmp_path / "out"), output_config={"drop_non_json_infos": True, "fsync": False})
    assert w.drop_non_json_infos is True
    w.write(SampleBatch({"obs": np.zeros((1, 2)), "infos": [{"bad": object()}]}))
    w.close()
    assert w.num_dropped_info_values == 1
    with pytest.raises(ConfigError, match="ray.data"):
        build("dataset")
