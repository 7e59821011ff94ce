"""PolicyMap (spec §13, §18.9): LRU caching, stashing and restoring policy states."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from gymnasium.spaces import Box, Discrete

from envrunners.algorithms.pg import PGTorchPolicy
from envrunners.errors import ConfigError, UnknownPolicyError
from envrunners.policy.policy_map import PolicyMap

OBS = Box(-1.0, 1.0, (4,), np.float32)
ACT = Discrete(2)
CONFIG = {"model": {"fcnet_hiddens": [8]}}
PROBE = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)


def dist_inputs(policy) -> np.ndarray:
    _, _, extra = policy.compute_actions(PROBE, explore=False)
    return extra["action_dist_inputs"]


def new_policy(seed: int) -> PGTorchPolicy:
    torch.manual_seed(seed)
    return PGTorchPolicy(OBS, ACT, CONFIG)


@pytest.mark.parametrize("swappable", [False, True])
def test_capacity_two_with_five_policies(swappable):
    pmap = PolicyMap(capacity=2, policy_states_are_swappable=swappable)
    expected = {}
    for i in range(5):
        pid = f"pol{i}"
        policy = new_policy(i)
        expected[pid] = dist_inputs(policy)
        pmap[pid] = policy
        want = [f"pol{i - 1}", pid] if i > 0 else [pid]
        assert list(pmap._deque) == want
        assert list(pmap.cache) == want
        assert pmap._valid_keys == {f"pol{j}" for j in range(i + 1)}
        assert len(pmap) == i + 1
    assert set(pmap._policy_state_refs) == {"pol0", "pol1", "pol2"}
    rng = random.Random(0)
    for _ in range(50):
        pid = f"pol{rng.randrange(5)}"
        policy = pmap[pid]
        assert pmap._deque[-1] == pid
        assert len(pmap._deque) == len(pmap.cache) == 2
        assert pid in pmap.cache
        np.testing.assert_allclose(dist_inputs(policy), expected[pid], rtol=1e-6, atol=1e-6)
    assert len(pmap._policy_state_refs) == 3


def test_swappable_reuses_the_evicted_object():
    pmap = PolicyMap(capacity=1, policy_states_are_swappable=True)
    a, b = new_policy(1), new_policy(2)
    pmap["a"] = a
    pmap["b"] = b  # stashes a
    restored = pmap["a"]
    assert restored is b  # the evicted object, now holding a's state
    np.testing.assert_allclose(dist_inputs(restored), dist_inputs(a), atol=1e-6)
    plain = PolicyMap(capacity=1)
    plain["a"], plain["b"] = new_policy(1), new_policy(2)
    assert plain["a"] is not plain.cache.get("b")


def test_dict_api_does_not_load_stashed_policies():
    pmap = PolicyMap(capacity=1)
    pmap.update({"a": new_policy(1)}, b=new_policy(2))
    assert sorted(pmap.keys()) == ["a", "b"] and sorted(pmap) == ["a", "b"]
    assert list(pmap.cache) == ["b"]
    assert "a" in pmap and "z" not in pmap
    assert str(pmap) == "<PolicyMap lru-caching-capacity=1 policy-IDs=['a', 'b']>"
    assert list(pmap.cache) == ["b"]  # neither keys() nor str() loaded 'a'
    assert pmap.get("z") is None
    assert pmap.get("a") is pmap.cache["a"]
    assert sorted(k for k, _ in pmap.items()) == ["a", "b"]
    assert len(list(pmap.values())) == 2
    del pmap["a"]
    assert sorted(pmap.keys()) == ["b"] and "a" not in pmap._policy_state_refs


def test_unknown_ids_and_bad_arguments():
    pmap = PolicyMap(capacity=3)
    pmap["p"] = new_policy(0)
    with pytest.raises(
        UnknownPolicyError,
        match=r"PolicyID 'q' not found in this PolicyMap! IDs stored in this map: \['p'\]",
    ):
        pmap["q"]
    with pytest.raises(KeyError):
        del pmap["q"]
    with pytest.raises(ConfigError, match="policy_config"):
        PolicyMap(policy_config={})
    with pytest.raises(ConfigError, match="capacity must be >= 1"):
        PolicyMap(capacity=0)
    PolicyMap(worker_index=1, num_workers=2, seed=3, session_creator=None)  # deprecated: ignored


def test_stashes_go_to_the_object_store_when_ray_runs(ray_session):
    pmap = PolicyMap(capacity=1)
    pmap["a"], pmap["b"] = new_policy(1), new_policy(2)
    assert type(pmap._policy_state_refs["a"]).__name__ == "ObjectRef"
    expected = dist_inputs(new_policy(1))
    np.testing.assert_allclose(dist_inputs(pmap["a"]), expected, atol=1e-6)
