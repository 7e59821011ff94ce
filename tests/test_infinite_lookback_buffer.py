"""Tests for ``InfiniteLookbackBuffer`` (spec §7.1): lists vs finalized, lookback, fill, one-hot."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

D4 = gym.spaces.Discrete(4)


def _buf(data, lookback=0, space=None, finalized=False):
    b = InfiniteLookbackBuffer(list(data), lookback=lookback, space=space)
    if finalized:
        b.finalize()
    return b


def _eq(a, b):
    """Compare get() results from list and finalized buffers alike."""
    if isinstance(a, dict):
        return set(a) == set(b) and all(_eq(a[k], b[k]) for k in a)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    return True


# ------------------------------------------------------------------ construction
def test_defaults_and_finalized_flag():
    b = InfiniteLookbackBuffer()
    assert b.data == [] and b.lookback == 0 and not b.finalized and b.space is None
    assert len(b) == 0 and b.len_incl_lookback() == 0
    a = InfiniteLookbackBuffer(np.arange(5), lookback=2)
    assert a.finalized and len(a) == 3 and a.len_incl_lookback() == 5


def test_lookback_is_capped_at_data_length():
    b = InfiniteLookbackBuffer([1, 2, 3], lookback=10)
    assert b.lookback == 3 and len(b) == 0


def test_space_sets_space_struct():
    space = gym.spaces.Dict({"a": D4, "b": gym.spaces.Tuple([D4])})
    b = InfiniteLookbackBuffer(space=space)
    assert b.space_struct == {"a": D4, "b": (D4,)}
    b.space = D4
    assert b.space_struct == D4


def test_nested_finalized_length_is_first_leaf():
    b = InfiniteLookbackBuffer({"a": np.zeros((4, 2)), "b": (np.zeros(4),)}, lookback=1)
    assert b.finalized and b.len_incl_lookback() == 4 and len(b) == 3


# ----------------------------------------------------------------------- mutation
@pytest.mark.parametrize("finalized", [False, True])
def test_append_extend_pop_concat(finalized):
    b = _buf([0, 1, 2], lookback=1, finalized=finalized)
    b.append(3)
    assert list(b.get()) == [1, 2, 3]
    b.extend([4, 5])
    assert list(b.get()) == [1, 2, 3, 4, 5]
    b.pop()
    assert list(b.get()) == [1, 2, 3, 4]
    b.pop(0)  # data position 0 (the lookback item)
    assert b.len_incl_lookback() == 4
    other = _buf([9, 7, 8], lookback=1)
    b.concat(other)  # other's lookback (9) is excluded
    assert list(b.get(slice(-2, None))) == [7, 8]
    assert b.finalized == finalized


def test_extend_list_buffer_with_numpy_and_nested_batches():
    b = InfiniteLookbackBuffer([1])
    b.extend(np.array([2, 3]))
    assert [int(x) for x in b.data] == [1, 2, 3]
    n = InfiniteLookbackBuffer([{"a": 0}])
    n.extend({"a": np.array([1, 2])})
    assert [int(x["a"]) for x in n.data] == [0, 1, 2]


def test_finalized_pop_out_of_range():
    b = InfiniteLookbackBuffer(np.arange(2))
    with pytest.raises(IndexError, match="pop index 5 out of range for 2 items"):
        b.pop(5)


def test_finalize_nested_and_empty_with_space():
    space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,), np.float32), "y": D4})
    b = InfiniteLookbackBuffer([{"x": np.ones(2, np.float32), "y": 1}] * 3, space=space)
    b.finalize()
    assert b.finalized and b.data["x"].shape == (3, 2) and b.data["y"].tolist() == [1, 1, 1]
    b.finalize()  # idempotent
    assert b.data["x"].shape == (3, 2)
    e = InfiniteLookbackBuffer(space=space)
    e.finalize()
    assert e.data["x"].shape == (0, 2) and e.data["x"].dtype == np.float32
    assert e.data["y"].shape == (0,) and e.data["y"].dtype == np.int64
    e.append({"x": np.zeros(2, np.float32), "y": 3})
    assert len(e) == 1 and e.get(0)["y"] == 3


def test_append_on_finalized_nested():
    b = InfiniteLookbackBuffer({"a": np.zeros((2, 3)), "b": (np.arange(2),)})
    b.append({"a": np.ones(3), "b": (7,)})
    assert b.data["a"].shape == (3, 3) and b.data["b"][0].tolist() == [0, 1, 7]


def test_add():
    b = InfiniteLookbackBuffer([1, 2, 3], lookback=1, space=D4)
    plus = b + 1
    assert plus.data == [2, 3, 4] and plus.lookback == 1 and plus.space == D4
    other = InfiniteLookbackBuffer([10, 11, 12], lookback=2)
    assert (b + other).data == [1, 2, 3, 12]
    assert (b + [5, 6]).data == [1, 2, 3, 5, 6]
    assert b.data == [1, 2, 3]  # unchanged
    b.finalize()
    with pytest.raises(RuntimeError, match="Cannot use `\\+` on a finalized"):
        b + 1  # noqa: B018


# ----------------------------------------------------------------------- get
@pytest.mark.parametrize("finalized", [False, True])
def test_docstring_examples(finalized):
    b = _buf([0, 1, 2, 3], space=D4, finalized=finalized)
    assert b.get(-1) == 3
    _eq(b.get([0, 2]), [0, 2])
    _eq(b.get(slice(-2, None)), [2, 3])
    _eq(b.get(slice(-6, -2), fill=-9), [-9, -9, 0, 1])
    _eq(b.get(slice(2, 5), fill=-7), [2, 3, -7])
    _eq(b.get(2, one_hot_discrete=True), [0, 0, 1, 0])
    _eq(b.get(-1, neg_index_as_lookback=True, fill=0.0, one_hot_discrete=True), [0, 0, 0, 0])
    assert b[1] == 1
    _eq(b[1:3], [1, 2])


@pytest.mark.parametrize("finalized", [False, True])
def test_get_with_lookback(finalized):
    # data 0..9; lookback 3 -> visible items 3..9.
    b = _buf(range(10), lookback=3, finalized=finalized)
    _eq(b.get(), list(range(3, 10)))
    assert b.get(0) == 3 and b.get(-1) == 9
    assert b.get(-1, neg_index_as_lookback=True) == 2
    assert b.get(-3, neg_index_as_lookback=True) == 0
    _eq(b.get(slice(-2, 2), neg_index_as_lookback=True), [1, 2, 3, 4])
    _eq(b.get(slice(-5, 1), neg_index_as_lookback=True, fill=-1), [-1, -1, 0, 1, 2, 3])
    # Negative indices without the flag count from the end and may reach into the lookback.
    _eq(b.get(slice(-9, None)), list(range(1, 10)))
    _eq(b.get(slice(-12, -8), fill=-1), [-1, -1, 0, 1])
    # A slice without fill is clipped like Python's.
    _eq(b.get(slice(5, 100)), [8, 9])
    _eq(b.get(slice(-100, -8)), [0, 1])
    _eq(b.get(slice(None, None, 3)), [3, 6, 9])
    _eq(b.get(slice(None, None, -3)), [9, 6, 3])
    _eq(b.get([0, -1, 6, 7], fill=-5), [3, 9, 9, -5])


@pytest.mark.parametrize("finalized", [False, True])
def test_int_index_out_of_range_raises_without_fill(finalized):
    b = _buf([0, 1, 2], lookback=1, finalized=finalized)
    with pytest.raises(IndexError, match="Index 2 is out of range: the buffer has 2 items"):
        b.get(2)
    with pytest.raises(IndexError, match="pass fill= to pad"):
        b.get(-2, neg_index_as_lookback=True)
    assert b.get(2, fill=7) == 7


def test_fill_is_shaped_like_the_space():
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    b = InfiniteLookbackBuffer([np.zeros(2, np.float32)], space=box)
    f = b.get(5, fill=3.0)
    assert f.shape == (2,) and f.dtype == np.float32 and f.tolist() == [3.0, 3.0]
    b.finalize()
    out = b.get(slice(-3, None), fill=1.0)
    assert out.shape == (3, 2) and out[:2].tolist() == [[1, 1], [1, 1]]


def test_fill_without_space_shaped_like_data():
    b = InfiniteLookbackBuffer([np.zeros(3)])
    assert b.get(4, fill=2).tolist() == [2, 2, 2]
    empty = InfiniteLookbackBuffer()
    assert empty.get(0, fill=5) == 5


@pytest.mark.parametrize("finalized", [False, True])
def test_one_hot_multi_discrete_and_fill(finalized):
    space = gym.spaces.MultiDiscrete([2, 3])
    b = _buf([np.array([0, 2]), np.array([1, 0])], space=space, finalized=finalized)
    _eq(b.get(0, one_hot_discrete=True), [1, 0, 0, 0, 1])
    out = b.get(slice(-3, None), one_hot_discrete=True, fill=0)
    _eq(out, [[0, 0, 0, 0, 0], [1, 0, 0, 0, 1], [0, 1, 1, 0, 0]])


@pytest.mark.parametrize("finalized", [False, True])
def test_nested_get_fill_one_hot(finalized):
    space = gym.spaces.Dict({"d": gym.spaces.Discrete(3), "x": gym.spaces.Box(0, 1, (2,))})
    items = [{"d": i % 3, "x": np.full(2, i, np.float32)} for i in range(4)]
    b = _buf(items, lookback=1, space=space, finalized=finalized)
    last = b.get(-1)
    assert int(last["d"]) == 0 and last["x"].tolist() == [3, 3]
    one = b.get(-1, neg_index_as_lookback=True, one_hot_discrete=True)
    assert one["d"].tolist() == [1, 0, 0]
    out = b.get(slice(-3, 1), neg_index_as_lookback=True, fill=0, one_hot_discrete=True)
    if finalized:
        assert out["d"].tolist() == [[0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 1, 0]]
        assert out["x"].shape == (4, 2)
    else:
        assert [o["d"].tolist() for o in out] == [[0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 1, 0]]


@pytest.mark.parametrize("finalized", [False, True])
def test_private_hanging_value_options(finalized):
    b = _buf([0, 1, 2, 3], lookback=1, finalized=finalized)
    _eq(b.get(_ignore_last_ts=True), [1, 2])
    _eq(b.get(_add_last_ts_value=9), [1, 2, 3, 9])
    assert b.get(-1, _ignore_last_ts=True, _add_last_ts_value=7) == 7
    assert b.len_incl_lookback() == 4  # nothing changed


# ----------------------------------------------------------------------- set
@pytest.mark.parametrize("finalized", [False, True])
def test_set(finalized):
    b = _buf(range(6), lookback=2, finalized=finalized)
    b.set(20, at_indices=0)
    b[-1] = 50
    b.set(10, at_indices=-1, neg_index_as_lookback=True)
    _eq(b.get(slice(-2, None), neg_index_as_lookback=True), [0, 10, 20, 3, 4, 50])
    b.set([7, 8], at_indices=slice(1, 3))
    b.set([1, 2], at_indices=[0, -1])
    _eq(b.get(), [1, 7, 8, 2])
    b.set([6, 6, 6, 6])
    _eq(b.get(), [6, 6, 6, 6])


@pytest.mark.parametrize("finalized", [False, True])
def test_set_bad_inputs(finalized):
    b = _buf(range(4), lookback=1, finalized=finalized)
    with pytest.raises(IndexError, match="Cannot set index 3: out of range"):
        b.set(1, at_indices=3)
    with pytest.raises(IndexError, match="Cannot set 1 items at 3 positions"):
        b.set([1])
    with pytest.raises(IndexError, match="positions out of range"):
        b.set([1, 2], at_indices=slice(2, 4))


def test_set_nested_finalized():
    b = InfiniteLookbackBuffer({"a": np.zeros((3, 2))})
    b.set({"a": np.ones(2)}, at_indices=1)
    b.set({"a": np.full((2, 2), 5.0)}, at_indices=slice(-2, None))
    assert b.data["a"].tolist() == [[0, 0], [5, 5], [5, 5]]


# ----------------------------------------------------------------------- state / eq
@pytest.mark.parametrize("finalized", [False, True])
def test_state_round_trip_and_eq(finalized):
    b = _buf(range(5), lookback=2, space=gym.spaces.Discrete(5), finalized=finalized)
    state = b.get_state()
    assert state["lookback"] == 2 and state["finalized"] == finalized
    assert state["space"] == {"space": "discrete", "n": 5, "start": 0, "dtype": "int64"}
    restored = InfiniteLookbackBuffer.from_state(state)
    assert restored == b
    assert restored != _buf(range(5), lookback=1, space=gym.spaces.Discrete(5), finalized=finalized)
    assert restored != _buf(range(5), lookback=2, finalized=finalized)
    assert restored != _buf(
        range(5), lookback=2, space=gym.spaces.Discrete(5), finalized=not finalized
    )
    assert b != "not a buffer"


def test_state_does_not_alias_list_data():
    b = InfiniteLookbackBuffer([1, 2])
    state = b.get_state()
    b.append(3)
    assert state["data"] == [1, 2]


# ----------------------------------------------------------------------- properties
@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 8),
    lookback=st.integers(0, 8),
    start=st.one_of(st.none(), st.integers(-12, 12)),
    stop=st.one_of(st.none(), st.integers(-12, 12)),
    step=st.sampled_from([None, 1, 2, -1]),
    neg_lb=st.booleans(),
    use_fill=st.booleans(),
)
def test_list_and_finalized_agree(n, lookback, start, stop, step, neg_lb, use_fill):
    """A finalized buffer returns exactly what the list buffer returns, for any slice."""
    fill = -1 if use_fill else None
    a = _buf(range(n), lookback=lookback)
    b = _buf(range(n), lookback=lookback, finalized=True)
    s = slice(start, stop, step)
    got_a = a.get(s, neg_index_as_lookback=neg_lb, fill=fill)
    got_b = b.get(s, neg_index_as_lookback=neg_lb, fill=fill)
    assert [int(x) for x in got_a] == np.asarray(got_b).astype(int).tolist()


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 8),
    lookback=st.integers(0, 8),
    start=st.integers(-12, 12),
    stop=st.integers(-12, 12),
    neg_lb=st.booleans(),
)
def test_slice_against_reference_model(n, lookback, start, stop, neg_lb):
    """Reference model: map each bound to a data position, keep positions in range."""
    b = _buf(range(n), lookback=lookback)
    lb = b.lookback

    def pos(i):
        return lb + i if i >= 0 or neg_lb else n + i

    expected = [p for p in range(n) if pos(start) <= p < pos(stop)]
    assert b.get(slice(start, stop), neg_index_as_lookback=neg_lb) == expected
    padded = b.get(slice(start, stop), neg_index_as_lookback=neg_lb, fill=-1)
    a, z = pos(start), pos(stop)
    if max(a, z) < 0 or min(a, z) >= n:  # wholly outside: |a - z| fills, either way (RLlib)
        assert padded == [-1] * abs(a - z)
    else:
        assert padded == [p if 0 <= p < n else -1 for p in range(a, z)]


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 8), lookback=st.integers(0, 8), idx=st.integers(-10, 10), neg_lb=st.booleans()
)
def test_set_then_get_round_trip(n, lookback, idx, neg_lb):
    for finalized in (False, True):
        b = _buf(range(n), lookback=lookback, finalized=finalized)
        try:
            b.set(99, at_indices=idx, neg_index_as_lookback=neg_lb)
        except IndexError:
            with pytest.raises(IndexError):
                b.get(idx, neg_index_as_lookback=neg_lb)
            continue
        assert b.get(idx, neg_index_as_lookback=neg_lb) == 99


def test_extend_finalized_with_nothing_keeps_dtype():
    b = InfiniteLookbackBuffer(np.arange(3))
    b.extend([])
    b.extend(np.zeros(0))
    assert b.data.dtype == np.int64 and b.data.tolist() == [0, 1, 2]


def test_pickle_round_trip():
    import pickle

    b = _buf(range(4), lookback=1, space=D4, finalized=True)
    assert pickle.loads(pickle.dumps(b)) == b
