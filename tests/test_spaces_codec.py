"""Tests for the plain-data gymnasium space codec and the nested-data helpers."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from envrunners.utils.spaces import (
    batch,
    get_base_struct_from_space,
    gym_space_from_dict,
    gym_space_to_dict,
    unbatch,
)

SPACES = [
    gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    gym.spaces.Box(-np.inf, np.inf, (2, 2), np.float64),
    gym.spaces.Box(np.array([0, -1]), np.array([5, 1]), (2,), np.int64),
    gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
    gym.spaces.Discrete(4),
    gym.spaces.Discrete(3, start=-1),
    gym.spaces.MultiDiscrete([2, 3, 4]),
    gym.spaces.MultiDiscrete([[2, 3], [4, 5]]),
    gym.spaces.MultiBinary(5),
    gym.spaces.MultiBinary([2, 3]),
    gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.Box(0, 1, (2,))}),
    gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.MultiBinary(3)]),
    gym.spaces.Dict(
        {
            "nested": gym.spaces.Tuple(
                [gym.spaces.Box(-1, 1, ()), gym.spaces.Dict({"x": gym.spaces.Discrete(5)})]
            )
        }
    ),
]


@pytest.mark.parametrize("space", SPACES, ids=lambda s: type(s).__name__)
def test_round_trip_is_equal_and_json_plain(space):
    d = gym_space_to_dict(space)
    # Plain data: survives JSON (inf allowed as Python floats).
    d2 = json.loads(json.dumps(d))
    restored = gym_space_from_dict(d2)
    assert restored == space
    assert type(restored) is type(space)
    if hasattr(space, "dtype") and space.dtype is not None:
        assert restored.dtype == space.dtype


def test_box_encoding_hand_checked():
    d = gym_space_to_dict(gym.spaces.Box(-1.0, 1.0, (3,), np.float32))
    assert d == {"space": "box", "low": -1.0, "high": 1.0, "shape": [3], "dtype": "float32"}
    d = gym_space_to_dict(
        gym.spaces.Box(np.array([0.0, -1.0], np.float32), np.array([1.0, 2.0], np.float32))
    )
    assert d["low"] == [0.0, -1.0] and d["high"] == [1.0, 2.0]


def test_discrete_and_composites_hand_checked():
    assert gym_space_to_dict(gym.spaces.Discrete(4)) == {
        "space": "discrete",
        "n": 4,
        "start": 0,
        "dtype": "int64",
    }
    d = gym_space_to_dict(
        gym.spaces.Dict({"b": gym.spaces.Discrete(2), "a": gym.spaces.Discrete(3)})
    )
    assert d["space"] == "dict" and list(d["spaces"]) == ["a", "b"]  # gymnasium sorts keys
    d = gym_space_to_dict(gym.spaces.Tuple([gym.spaces.Discrete(2)]))
    assert d == {"space": "tuple", "spaces": [gym_space_to_dict(gym.spaces.Discrete(2))]}


def test_unsupported_space_raises_type_error():
    with pytest.raises(TypeError, match="Cannot encode a Text space as plain data; supported"):
        gym_space_to_dict(gym.spaces.Text(5))


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"n": 3}, "Not an encoded space"),
        ("discrete", "Not an encoded space"),
        ({"space": "graph"}, "Unknown encoded space type 'graph'"),
    ],
)
def test_bad_encoded_space_raises_value_error(bad, match):
    with pytest.raises(ValueError, match=match):
        gym_space_from_dict(bad)


def test_base_struct_from_space():
    space = gym.spaces.Dict(
        {"a": gym.spaces.Tuple([gym.spaces.Discrete(2)]), "b": gym.spaces.Discrete(3)}
    )
    struct = get_base_struct_from_space(space)
    assert struct == {"a": (gym.spaces.Discrete(2),), "b": gym.spaces.Discrete(3)}
    assert get_base_struct_from_space(gym.spaces.Discrete(2)) == gym.spaces.Discrete(2)
    assert get_base_struct_from_space(None) is None


def test_batch_and_unbatch_nested():
    items = [{"a": np.array([i, i]), "b": (i, float(i))} for i in range(3)]
    b = batch(items)
    np.testing.assert_array_equal(b["a"], [[0, 0], [1, 1], [2, 2]])
    np.testing.assert_array_equal(b["b"][0], [0, 1, 2])
    np.testing.assert_array_equal(b["b"][1], [0.0, 1.0, 2.0])
    back = unbatch(b)
    assert len(back) == 3
    np.testing.assert_array_equal(back[2]["a"], [2, 2])
    assert back[1]["b"] == (1, 1.0)


def test_batch_of_scalars_and_empty():
    np.testing.assert_array_equal(batch([1, 2, 3]), [1, 2, 3])
    assert batch([]).shape == (0,)


def test_one_hot_helpers():
    from envrunners.utils.spaces import one_hot_encode, one_hot_size

    assert one_hot_size(gym.spaces.Discrete(3)) == 3
    assert one_hot_size(gym.spaces.MultiDiscrete([2, 3])) == 5
    assert one_hot_size(gym.spaces.Box(0, 1, (2,))) is None
    assert one_hot_encode(gym.spaces.Discrete(3, start=1), 2).tolist() == [0, 1, 0]
    out = one_hot_encode(gym.spaces.Discrete(3), np.array([0, 2]), batched=True)
    assert out.dtype == np.float32 and out.tolist() == [[1, 0, 0], [0, 0, 1]]
    md = one_hot_encode(gym.spaces.MultiDiscrete([2, 3]), np.array([[1, 2]]), batched=True)
    assert md.tolist() == [[0, 1, 0, 0, 1]]
    assert one_hot_encode(gym.spaces.Box(0, 1, (2,)), "x") == "x"
