"""Remote runners adopt pushed weights as copy-on-write views instead of copying them.

Checks that adopted weights equal the learner's, that an in-place write to a
runner's module stays private (neither the object store nor another runner sees
it), that the previous weights' memory is released at the next sync, and that
the local runner (which a learner may share) keeps copying.
"""

from __future__ import annotations

import gc
import sys
import weakref

import numpy as np
import pytest
import ray
import ray.cloudpickle
import torch
from tests.waiting import wait_until

from envrunners.algorithms.algorithm_config import AlgorithmConfig
from envrunners.core.rl_module.default_torch_rl_module import DefaultTorchRLModule
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.env.env_runner_group import EnvRunnerGroup
from envrunners.utils.cow_arrays import AdoptableState, adoptable_state

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

HIDDENS = [700, 700]  # about 2 MB of inference weights: above cow_arrays.MIN_BYTES


def weights_of(runner) -> dict:
    return runner.get_state(components="rl_module")["rl_module"]


def plasma_private_mappings(_runner=None) -> int:
    """How many private (copy-on-write) mappings of the object store this process has."""
    count = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and "plasma" in fields[5] and fields[1].endswith("p"):
                count += 1
    return count


def adopted(runner) -> bool:
    return bool(getattr(runner.module, "_adopted_storage", False))


# ---------------------------------------------------------------------- units
def test_views_are_private_writable_and_pin_the_object(ray_session):
    original = {"a": np.arange(300_000, dtype=np.float32), "b": {"c": np.ones((600, 700))}}
    ref = ray.put(original)
    state = adoptable_state(ray.get(ref))
    assert isinstance(state, AdoptableState) and isinstance(state["b"], AdoptableState)
    np.testing.assert_array_equal(state["a"], original["a"])
    np.testing.assert_array_equal(state["b"]["c"], original["b"]["c"])
    assert state["a"].flags.writeable
    state["a"] += 1  # copy-on-write: only this process's pages change
    np.testing.assert_array_equal(ray.get(ref)["a"], original["a"])
    pinned = weakref.ref(state["a"].base)
    del ref
    gc.collect()
    np.testing.assert_array_equal(state["b"]["c"], original["b"]["c"])  # still pinned
    del state
    gc.collect()
    assert pinned() is None


def test_small_or_heap_states_are_not_viewed(ray_session):
    assert adoptable_state(ray.get(ray.put({"w": np.ones(10, np.float32)}))) is None
    assert adoptable_state({"w": np.ones(1_000_000, np.float32)}) is None  # heap, not shared


def test_module_adopts_then_copies_into_fresh_memory(ray_session):
    import gymnasium as gym

    module = DefaultTorchRLModule(
        observation_space=gym.spaces.Box(-1, 1, (4,), np.float32),
        action_space=gym.spaces.Discrete(2),
        inference_only=True,
        model_config={"fcnet_hiddens": HIDDENS},
    )
    source = {k: v + 1 for k, v in module.get_state().items()}
    ref = ray.put(source)
    state = adoptable_state(ray.get(ref))
    module.set_state(state)
    name, param = next(iter(module.state_dict(keep_vars=True).items()))
    assert param.data_ptr() == state[name].__array_interface__["data"][0]  # no copy
    for key, value in module.get_state().items():
        np.testing.assert_array_equal(value, source[key])
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.0)  # training in place: private pages, the object is untouched
    np.testing.assert_array_equal(ray.get(ref)[name], source[name])
    module.set_state(source)  # a plain state copies, into fresh memory
    assert param.data_ptr() != state[name].__array_interface__["data"][0]
    np.testing.assert_array_equal(module.get_state()[name], source[name])


# ---------------------------------------------------------------------- group
def group_config(hiddens: list[int]) -> AlgorithmConfig:
    """Two remote CartPole runners (no CPUs reserved) with an MLP of ``hiddens``."""
    return (
        AlgorithmConfig()
        .rl_module(rl_module_spec=RLModuleSpec())
        .environment("CartPole-v1")
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=0, rollout_fragment_length=10)
        .rl_module(model_config={"fcnet_hiddens": hiddens})
        .debugging(seed=0)
    )


@pytest.fixture(scope="module")
def big_group(ray_session):
    group = EnvRunnerGroup(config=group_config(HIDDENS), standby_env_runner=False)
    yield group
    group.stop()


def _push(group, factor: float, seq: int) -> dict:
    local = group.local_env_runner
    weights = {k: v * 0 + factor for k, v in weights_of(local).items()}
    local.set_state({"rl_module": weights, "weights_seq_no": seq})
    group.sync_weights(timeout_seconds=None)
    return weights


def test_runners_adopt_the_learners_exact_weights(big_group):
    weights = _push(big_group, 2.0, 1)
    weights = _push(big_group, 3.0, 2)  # back to back: the second replaces the first
    results = big_group.foreach_env_runner(
        lambda r: (weights_of(r), r._weights_seq_no, adopted(r)), local_env_runner=False
    )
    assert len(results) == 2
    for state, seq, took in results:
        assert seq == 2 and took
        for key, value in weights.items():
            np.testing.assert_array_equal(state[key], value)
    assert not adopted(big_group.local_env_runner)  # the driver's runner copies


def test_in_place_write_on_one_runner_stays_private(big_group):
    weights = _push(big_group, 5.0, 3)

    def train_in_place(runner):
        with torch.no_grad():
            for p in runner.module.parameters():
                p.mul_(-1.0)
        runner.sample(num_timesteps=20)  # and it still acts
        return True

    assert big_group.foreach_env_runner(
        train_in_place, local_env_runner=False, remote_worker_ids=[1]
    ) == [True]
    first, second = big_group.foreach_env_runner(weights_of, local_env_runner=False)
    pushed = ray.get(big_group._broadcast.weights["rl_module"])
    for key, value in weights.items():
        np.testing.assert_array_equal(first[key], -value)
        np.testing.assert_array_equal(second[key], value)  # the other runner: untouched
        np.testing.assert_array_equal(pushed[key], value)  # the object store: untouched
    _push(big_group, 6.0, 4)  # the written runner adopts the next push again
    first, _ = big_group.foreach_env_runner(weights_of, local_env_runner=False)
    assert all(np.all(v == 6.0) for v in first.values())


def test_previous_weights_are_released_across_syncs(big_group):
    for seq in range(10, 20):
        _push(big_group, float(seq), seq)
    # Only the weights in use stay mapped (the previous ones are let go of on a
    # background thread, right after each push has answered).
    assert wait_until(
        lambda: (
            big_group.foreach_env_runner(plasma_private_mappings, local_env_runner=False) == [1, 1]
        ),
        timeout=10,
    )


def test_sync_from_a_ppo_learner_reads_views_once_and_later_training_stays_out(ray_session):
    from envrunners.algorithms.ppo import PPOConfig
    from envrunners.algorithms.ppo.ppo_learner import PPOLearner

    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=2, num_cpus_per_env_runner=0, rollout_fragment_length=32)
        .training(train_batch_size=64, minibatch_size=32, num_epochs=1, lr=1e-2)
        .rl_module(model_config={"fcnet_hiddens": HIDDENS})
        .debugging(seed=0)
    )
    group = EnvRunnerGroup(config=config, standby_env_runner=False)
    try:
        learner = PPOLearner.from_group(config, group)

        def batch():
            return group.foreach_env_runner(
                lambda r: r.sample(num_timesteps=64), local_env_runner=False
            )[0]

        learner.update(batch())
        group.sync_weights(
            from_worker_or_learner_group=learner, inference_only=True, timeout_seconds=None
        )
        want = learner.module.get_state(inference_only=True)
        learner.update(batch())  # trains on: the runners keep what was synced
        states = group.foreach_env_runner(lambda r: (weights_of(r), r._weights_seq_no))
        assert len(states) == 3
        for state, seq in states:
            assert seq == learner.weights_seq_no - 1
            for key, value in want.items():
                np.testing.assert_array_equal(state[key], value)
    finally:
        group.stop()
