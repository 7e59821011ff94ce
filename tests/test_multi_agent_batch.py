"""MultiAgentBatch and the module functions that combine batches (spec §15.2, §15.3, §18.7)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envrunners.errors import UnknownPolicyError
from envrunners.policy.sample_batch import (
    DEFAULT_POLICY_ID,
    MultiAgentBatch,
    SampleBatch,
    concat_samples,
    concat_samples_into_ma_batch,
    convert_ma_batch_to_sample_batch,
)
from envrunners.utils.compression import is_compressed

torch = pytest.importorskip("torch")


def policy_batch(eps, t, agent_index, obs=None):
    n = len(t)
    return SampleBatch(
        {
            "obs": np.arange(n) if obs is None else obs,
            "eps_id": eps,
            "t": t,
            "agent_index": agent_index,
            "seq_lens": [n],
        }
    )


def summary(slices):
    """[{pid: [(eps, t), ...]}] per slice, plus the slices' env steps."""
    out = []
    for ma in slices:
        out.append(
            {
                pid: list(zip(b["eps_id"].tolist(), b["t"].tolist()))
                for pid, b in ma.policy_batches.items()
            }
        )
    return out, [ma.env_steps() for ma in slices]


# ---------------------------------------------------------------- counting


def test_counts():
    p0 = SampleBatch({"a": [1, 2, 3]})
    p1 = SampleBatch({"a": [1, 2]})
    ma = MultiAgentBatch({"p0": p0, "p1": p1}, env_steps=3)
    assert ma.count == ma.env_steps() == len(ma) == 3
    assert ma.agent_steps() == 5
    assert ma["p1"] is p1
    assert ma.as_multi_agent() is ma
    assert repr(ma) == (
        "MultiAgentBatch({'p0': SampleBatch(3: ['a']), 'p1': SampleBatch(2: ['a'])}, env_steps=3)"
    )
    assert str(ma) == repr(ma)


def test_values_must_be_sample_batches():
    with pytest.raises(TypeError, match=r"policy 'p0' maps to a dict; every value must be a"):
        MultiAgentBatch({"p0": {"a": [1]}}, 1)
    with pytest.raises(AssertionError):  # RLlib asserted here
        MultiAgentBatch({"p0": [1]}, 1)


def test_unknown_policy_names_the_known_ones():
    ma = MultiAgentBatch({"policy_a": SampleBatch({"a": [1]})}, 1)
    with pytest.raises(UnknownPolicyError, match=r"no policy 'policy_b'.*Did you mean 'policy_a'"):
        ma["policy_b"]
    with pytest.raises(KeyError):
        ma["zzz"]


def test_copy_is_deep():
    ma = MultiAgentBatch({"p": SampleBatch({"a": np.array([1, 2])})}, 2)
    c = ma.copy()
    c["p"]["a"][0] = 9
    assert ma["p"]["a"][0] == 1 and c.count == 2


def test_size_bytes_sums_policies():
    p0 = SampleBatch({"a": np.zeros(3, dtype=np.float32)})
    p1 = SampleBatch({"a": np.zeros(2, dtype=np.int64)})
    assert MultiAgentBatch({"p0": p0, "p1": p1}, 3).size_bytes() == 12 + 16


def test_to_device_per_policy():
    ma = MultiAgentBatch({"p": SampleBatch({"a": np.zeros(2)})}, 2)
    assert ma.to_device("cpu") is ma
    assert torch.is_tensor(ma["p"]["a"]) and ma["p"]["a"].dtype == torch.float32
    with pytest.raises(NotImplementedError):
        ma.to_device("cpu", framework="tf2")


def test_compress_and_decompress_per_policy():
    obs = np.arange(6.0).reshape(3, 2)
    ma = MultiAgentBatch({"p": SampleBatch({"obs": obs.copy()})}, 3)
    assert ma.compress(bulk=True) is None
    assert is_compressed(ma["p"]["obs"])
    assert ma.decompress_if_needed() is ma
    np.testing.assert_array_equal(ma["p"]["obs"], obs)


def test_pickles():
    ma = MultiAgentBatch({"p": SampleBatch({"a": [1, 2]})}, 2)
    out = pickle.loads(pickle.dumps(ma))
    assert out.count == 2 and out["p"]["a"].tolist() == [1, 2]


def test_wrap_as_needed():
    b = SampleBatch({"a": [1, 2]})
    assert MultiAgentBatch.wrap_as_needed({DEFAULT_POLICY_ID: b}, 2) is b
    wrapped = MultiAgentBatch.wrap_as_needed({"other": b}, 2)
    assert isinstance(wrapped, MultiAgentBatch) and wrapped.count == 2
    two = MultiAgentBatch.wrap_as_needed({DEFAULT_POLICY_ID: b, "x": b}, 2)
    assert isinstance(two, MultiAgentBatch)
    empty = MultiAgentBatch.wrap_as_needed({}, 0)
    assert isinstance(empty, MultiAgentBatch) and empty.policy_batches == {}


def test_static_concat_samples_is_removed():
    with pytest.raises(ValueError, match=r"`MultiAgentBatch.concat_samples` has been removed"):
        MultiAgentBatch.concat_samples([])


# ---------------------------------------------------------------- timeslices


def test_timeslices_non_overlapping_eps():
    ma = MultiAgentBatch(
        {
            "p0": policy_batch([0, 0], [0, 1], [0, 0]),
            "p1": policy_batch([1, 1], [0, 1], [1, 1]),
        },
        4,
    )
    slices = ma.timeslices(k=1)
    assert summary(slices) == (
        [{"p0": [(0, 0)]}, {"p0": [(0, 1)]}, {"p1": [(1, 0)]}, {"p1": [(1, 1)]}],
        [1, 1, 1, 1],
    )
    for ma_slice in slices:
        for b in ma_slice.policy_batches.values():
            assert b["seq_lens"].tolist() == [1] and b.count == 1


def test_timeslices_partially_overlapping_eps():
    ma = MultiAgentBatch(
        {
            "p0": policy_batch([0, 0], [0, 1], [0, 0]),
            "p1": policy_batch([0, 0], [1, 2], [1, 1]),
        },
        3,
    )
    assert summary(ma.timeslices(1)) == (
        [{"p0": [(0, 0)]}, {"p0": [(0, 1)], "p1": [(0, 1)]}, {"p1": [(0, 2)]}],
        [1, 1, 1],
    )


def test_timeslices_fully_overlapping_eps():
    ma = MultiAgentBatch(
        {
            "p0": policy_batch([0, 0], [0, 1], [0, 0]),
            "p1": policy_batch([0, 0], [0, 1], [1, 1]),
        },
        2,
    )
    slices = ma.timeslices(1)
    assert summary(slices) == (
        [{"p0": [(0, 0)], "p1": [(0, 0)]}, {"p0": [(0, 1)], "p1": [(0, 1)]}],
        [1, 1],
    )
    assert [s.agent_steps() for s in slices] == [2, 2]


def test_timeslices_k_groups_env_steps_and_sorts_unsorted_rows():
    # Rows arrive out of order; two agents share one policy.
    p0 = SampleBatch(
        {
            "obs": np.array([13, 10, 21, 11, 20, 12]),
            "eps_id": [1, 1, 2, 1, 2, 1],
            "t": [3, 0, 1, 1, 0, 2],
            "agent_index": [0, 0, 1, 0, 1, 0],
        }
    )
    ma = MultiAgentBatch({"p0": p0}, 6)
    slices = ma.timeslices(3)
    assert [s.env_steps() for s in slices] == [3, 3]
    assert [s["p0"]["obs"].tolist() for s in slices] == [[10, 11, 12], [13, 20, 21]]
    assert "seq_lens" not in slices[0]["p0"]  # no seq_lens in, none out


def test_timeslices_keeps_state_in_of_each_rows_sequence():
    p0 = SampleBatch(
        {
            "obs": np.arange(3),
            "eps_id": [0, 0, 0],
            "t": [0, 1, 2],
            "agent_index": [0, 0, 0],
            "seq_lens": [2, 1],
            "state_in_0": np.array([[1.0], [2.0]]),
        }
    )
    slices = MultiAgentBatch({"p0": p0}, 3).timeslices(2)
    assert [s["p0"]["state_in_0"].tolist() for s in slices] == [[[1.0], [1.0]], [[2.0]]]
    assert [s["p0"]["seq_lens"].tolist() for s in slices] == [[1, 1], [1]]


def test_timeslices_errors():
    ma = MultiAgentBatch({"p0": SampleBatch({"eps_id": [0], "t": [0]})}, 1)
    with pytest.raises(KeyError, match=r"policy 'p0' lacks \['agent_index'\]"):
        ma.timeslices(1)
    with pytest.raises(ValueError, match=r"k must be >= 1, got 0"):
        ma.timeslices(0)
    empty = MultiAgentBatch({}, 0)
    with pytest.raises(ValueError, match=r"the batch has no rows"):
        empty.timeslices(1)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 2)), max_size=30),
    st.integers(1, 4),
)
def test_property_timeslices_cover_every_row_once(rows, k):
    rows = sorted(set(rows))  # unique (eps, t, agent)
    if not rows:
        return
    batches = {}
    for agent in {r[2] for r in rows}:
        mine = [r for r in rows if r[2] == agent]
        batches[f"p{agent}"] = SampleBatch(
            {
                "obs": np.array([100 * e + 10 * t + a for e, t, a in mine]),
                "eps_id": [r[0] for r in mine],
                "t": [r[1] for r in mine],
                "agent_index": [r[2] for r in mine],
            }
        )
    ma = MultiAgentBatch(batches, len({(e, t) for e, t, _ in rows}))
    slices = ma.timeslices(k)
    assert sum(s.env_steps() for s in slices) == ma.env_steps()
    assert all(s.env_steps() == k for s in slices[:-1])
    seen = sorted(o for s in slices for b in s.policy_batches.values() for o in b["obs"].tolist())
    assert seen == sorted(100 * e + 10 * t + a for e, t, a in rows)


# ---------------------------------------------------------------- module functions


def test_concat_samples_into_ma_batch():
    b = SampleBatch({"a": [1, 2, 3, 4]})
    out = concat_samples_into_ma_batch([b, b.as_multi_agent(), SampleBatch()])
    assert isinstance(out, MultiAgentBatch)
    assert out.count == 8 and out.agent_steps() == 8
    assert out[DEFAULT_POLICY_ID]["a"].tolist() == [1, 2, 3, 4, 1, 2, 3, 4]


def test_concat_multi_agent_batches_per_policy():
    m1 = MultiAgentBatch({"p0": SampleBatch({"a": [1]}), "p1": SampleBatch({"a": [2, 3]})}, 2)
    m2 = MultiAgentBatch({"p1": SampleBatch({"a": [4]}), "p2": SampleBatch({"a": [5]})}, 1)
    out = concat_samples([m1, m2])
    assert out.count == 3
    assert {p: b["a"].tolist() for p, b in out.policy_batches.items()} == {
        "p0": [1],
        "p1": [2, 3, 4],
        "p2": [5],
    }
    assert out.agent_steps() == 5


def test_concat_samples_into_ma_batch_bad_input():
    with pytest.raises(
        ValueError,
        match=r"`concat_samples_into_ma_batch` can only concat SampleBatch\|MultiAgentBatch "
        r"objects, not dict!",
    ):
        concat_samples_into_ma_batch([{"a": [1]}])


def test_convert_ma_batch_to_sample_batch():
    b = SampleBatch({"a": [1, 2]})
    assert convert_ma_batch_to_sample_batch(b.as_multi_agent()) is b
    assert convert_ma_batch_to_sample_batch(b) is b
    two = MultiAgentBatch({"p0": b, "p1": b}, 2)
    with pytest.raises(ValueError, match=r"more than one policy to a single-agent batch"):
        convert_ma_batch_to_sample_batch(two)
    other = b.as_multi_agent("p0")
    with pytest.raises(ValueError, match=r"holds policies \['p0'\]"):
        convert_ma_batch_to_sample_batch(other)
