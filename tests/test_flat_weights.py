"""Module states that travel as one array (``FlatState``) and modules kept in one buffer.

A weight sync reads the source module's state for sending (``get_state(copy=False)``):
that moves its parameters into one buffer, inference-only entries first, so the
pushed state is one array. Checks that nothing a user can see changes: the same
values, the same parameter objects (an optimizer made before still trains them),
pickles no bigger, tied weights left alone; that a runner's module installs a
``FlatState`` with one copy in place (or falls back where layouts differ); and that
a real group's runners end up with the learner's exact weights.
"""

from __future__ import annotations

import copy
import pickle
import sys

import gymnasium as gym
import numpy as np
import pytest
import ray
import ray.cloudpickle
import torch
from tests.test_weight_adoption import group_config

from envrunners.core.rl_module._flat_storage import FlatState, flat_storage
from envrunners.core.rl_module._state_entries import state_entries
from envrunners.core.rl_module.default_torch_rl_module import DefaultTorchRLModule
from envrunners.core.rl_module.rl_module import RLModule
from envrunners.env.env_runner_group import EnvRunnerGroup

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

OBS = gym.spaces.Box(-1, 1, (4,), np.float32)
ACT = gym.spaces.Discrete(2)


def module(inference_only: bool = False, hiddens=(32, 32)) -> DefaultTorchRLModule:
    return DefaultTorchRLModule(
        observation_space=OBS,
        action_space=ACT,
        inference_only=inference_only,
        model_config={"fcnet_hiddens": list(hiddens)},
    )


def is_flat(m: torch.nn.Module) -> bool:
    return flat_storage(m, state_entries(m)) is not None


def out_of_band_buffers(obj) -> int:
    buffers = []
    pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return len(buffers)


# ---------------------------------------------------------------------- the sender
def test_state_read_for_sending_is_one_array_with_the_same_values():
    learner = module()
    before = learner.get_state()
    assert type(before) is dict and not is_flat(learner)  # a copy does not move anything
    params = list(learner.parameters())

    full = learner.get_state(copy=False)
    inference = learner.get_state(inference_only=True, copy=False)
    assert type(full) is FlatState and type(inference) is FlatState and is_flat(learner)
    assert list(learner.parameters()) == params  # the same parameter objects
    assert set(full) == set(before)
    assert set(inference) == {k for k in before if not k.startswith("vf")}
    for key, value in before.items():
        np.testing.assert_array_equal(full[key], value)
    # The inference state is the head of the same buffer: no copy.
    assert np.shares_memory(inference.flat, full.flat)
    assert inference.flat.size < full.flat.size
    assert out_of_band_buffers(inference) == 1
    assert out_of_band_buffers(before) == len(before)
    # A copy of a flat module is one array too, and independent of the module.
    snapshot = learner.get_state()
    assert type(snapshot) is FlatState and not np.shares_memory(snapshot.flat, full.flat)


def test_an_optimizer_made_before_still_trains_the_flattened_module():
    learner = module()
    optimizer = torch.optim.Adam(learner.parameters(), lr=0.1)
    obs = torch.randn(8, 4)
    expected = learner.forward_inference({"obs": obs})["action_dist_inputs"].detach().clone()
    views = learner.get_state(copy=False)  # flattens
    got = learner.forward_inference({"obs": obs})["action_dist_inputs"]
    torch.testing.assert_close(got, expected)
    before = {k: v.copy() for k, v in views.items()}
    loss = learner.forward_train({"obs": obs})["action_dist_inputs"].pow(2).sum()
    loss.backward()
    optimizer.step()
    after = learner.get_state(copy=False)
    changed = [k for k in before if not np.array_equal(before[k], after[k])]
    assert changed and all(not k.startswith("vf") for k in changed)
    # The views read for sending see the trained values (they are the module's memory).
    np.testing.assert_array_equal(views[changed[0]], after[changed[0]])
    # And the acting path follows the new values (numpy views of the new storage).
    with torch.no_grad():
        acted = learner.forward_inference({"obs": obs})["action_dist_inputs"]
    assert not torch.allclose(acted, expected)


def test_pickling_a_flattened_module_costs_no_more_bytes():
    learner = module(hiddens=(256, 256))
    size = len(pickle.dumps(learner))
    learner.get_state(copy=False)
    assert is_flat(learner)
    assert len(pickle.dumps(learner)) <= size + 1024  # each parameter: its own bytes only
    twin = copy.deepcopy(learner)
    with torch.no_grad():
        next(twin.parameters()).add_(1.0)
    key = next(iter(learner.get_state()))
    assert not np.array_equal(twin.get_state()[key], learner.get_state()[key])


def test_a_changed_flat_state_pickles_as_the_plain_dict_it_became():
    state = module().get_state(copy=False)
    key = next(iter(state))
    state[key] = np.zeros(3, np.float32)
    back = pickle.loads(pickle.dumps(state))
    assert type(back) is dict and back[key].shape == (3,)
    state = module().get_state(copy=False)
    state.pop(key)
    assert key not in pickle.loads(pickle.dumps(state))


class TiedModule(RLModule):
    """Two names for one parameter: flattening would untie them."""

    def setup(self) -> None:
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)
        self.b.weight = self.a.weight

    def _forward(self, batch, **kwargs):
        return {"action_dist_inputs": self.b(self.a(batch["obs"]))}


def test_tied_weights_are_left_as_they_are(monkeypatch):
    from envrunners.core.rl_module import _flat_storage

    tied = TiedModule(observation_space=OBS, action_space=gym.spaces.Box(-1, 1, (2,)))
    state = tied.get_state(copy=False)
    assert type(state) is dict and not is_flat(tied)
    assert tied.a.weight is tied.b.weight
    checks = []
    monkeypatch.setattr(_flat_storage, "can_flatten", lambda e: checks.append(e) or False)
    tied.get_state(copy=False)
    tied.set_state(module_like_flat_state(tied))
    assert checks == []  # refused once: not tried again on every sync
    tied.c = torch.nn.Linear(2, 2)  # new entries: tried again
    tied.get_state(copy=False)
    assert len(checks) == 1


def module_like_flat_state(m: torch.nn.Module) -> FlatState:
    state = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    names = tuple(state)
    layout = ("float32", names, tuple(state[n].shape for n in names))
    return FlatState(np.concatenate([state[n].ravel() for n in names]), layout)


# ---------------------------------------------------------------------- the receiver
def test_a_runner_module_installs_a_flat_state_with_one_copy_in_place():
    learner, runner = module(), module(inference_only=True)
    pushed = pickle.loads(pickle.dumps(learner.get_state(inference_only=True, copy=False)))
    pushed.flat.flags.writeable = False  # as Ray's object store hands it out
    assert type(pushed) is FlatState
    runner.set_state(pushed)
    assert is_flat(runner)
    pointers = [p.data_ptr() for p in runner.parameters()]
    versions = [p._version for p in runner.parameters()]
    for key, value in pushed.items():
        np.testing.assert_array_equal(runner.get_state()[key], value)

    with torch.no_grad():
        for p in learner.parameters():
            p.add_(1.0)
    pushed = pickle.loads(pickle.dumps(learner.get_state(inference_only=True, copy=False)))
    runner.set_state(pushed)
    assert [p.data_ptr() for p in runner.parameters()] == pointers  # copied in place
    assert all(p._version > v for p, v in zip(runner.parameters(), versions))
    assert not runner._storage_replaced
    for key, value in pushed.items():
        np.testing.assert_array_equal(runner.get_state()[key], value)
    obs = torch.randn(5, 4)
    torch.testing.assert_close(
        runner.forward_inference({"obs": obs})["action_dist_inputs"],
        learner.forward_inference({"obs": obs})["action_dist_inputs"],
    )


def test_other_layouts_take_the_general_path_and_bad_shapes_still_fail():
    learner, runner = module(), module(inference_only=True)
    full = learner.get_state(copy=False)  # more entries than the runner has
    runner.set_state(full)
    for key, value in runner.get_state().items():
        np.testing.assert_array_equal(value, full[key])
    other = module(hiddens=(16, 16)).get_state(inference_only=True, copy=False)
    with pytest.raises(ValueError, match="shape"):
        runner.set_state(other)


# ---------------------------------------------------------------------- a real group
@pytest.mark.parametrize("hiddens", [[32, 32], [700, 700]], ids=["copied", "adopted"])
def test_group_sync_gives_runners_the_exact_weights_as_one_array(ray_session, hiddens):
    group = EnvRunnerGroup(config=group_config(hiddens), standby_env_runner=False)
    try:
        local = group.local_env_runner
        for seq, factor in ((1, 2.0), (2, -3.0)):
            with torch.no_grad():
                for p in local.module.parameters():
                    p.fill_(factor)
            local._weights_seq_no = seq
            group.sync_weights(timeout_seconds=None)
        want = local.module.get_state()
        assert is_flat(local.module)

        def report(runner):
            m = runner.module
            return m.get_state(), is_flat(m), runner._weights_seq_no, m._adopted_storage

        results = group.foreach_env_runner(report, local_env_runner=False)
        assert len(results) == 2
        for state, flat, seq, adopted in results:
            assert flat and seq == 2 and adopted == (hiddens == [700, 700])
            assert set(state) == set(want)
            for key, value in want.items():
                np.testing.assert_array_equal(state[key], value)
        sampled = group.foreach_env_runner(
            lambda r: len(r.sample(num_timesteps=20)) > 0, local_env_runner=False
        )
        assert sampled == [True, True]
    finally:
        group.stop()


def test_a_multi_module_state_is_one_array_per_module():
    from envrunners.core.rl_module.multi_rl_module import MultiRLModule

    learner = MultiRLModule.from_modules({"p0": module(), "p1": module(hiddens=(8,))})
    runner = MultiRLModule.from_modules(
        {"p0": module(inference_only=True), "p1": module(inference_only=True, hiddens=(8,))}
    )
    pushed = learner.get_state(inference_only=True, copy=False)
    assert all(type(pushed[m]) is FlatState for m in ("p0", "p1"))
    assert out_of_band_buffers(pushed) == 2
    runner.set_state(pickle.loads(pickle.dumps(pushed)))
    for mid in ("p0", "p1"):
        assert is_flat(runner[mid])
        for key, value in pushed[mid].items():
            np.testing.assert_array_equal(runner[mid].get_state()[key], value)
