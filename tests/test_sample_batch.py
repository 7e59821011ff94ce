"""SampleBatch: every public method, with hand-computed values (spec §15.1, §15.3, §18.7)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envrunners.core.columns import Columns
from envrunners.policy.sample_batch import (
    DEFAULT_POLICY_ID,
    MultiAgentBatch,
    SampleBatch,
    attempt_count_timesteps,
    concat_samples,
)
from envrunners.utils.compression import is_compressed

torch = pytest.importorskip("torch")


def eq(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def s1_s2():
    s1 = SampleBatch({"a": np.array([1, 2, 3]), "b": {"c": np.array([4, 5, 6])}})
    s2 = SampleBatch({"a": np.array([2, 3, 4]), "b": {"c": np.array([5, 6, 7])}})
    return s1, s2


def seq_batch():
    return SampleBatch(
        {
            "a": np.array([1, 2, 3, 2, 3, 4]),
            "b": {"c": np.array([4, 5, 6, 5, 6, 7])},
            "seq_lens": [2, 3, 1],
            "state_in_0": [1.0, 3.0, 4.0],
        }
    )


# ----------------------------------------------------------------- constants


def test_column_constants_have_rllib_values():
    assert SampleBatch.OBS == SampleBatch.CUR_OBS == "obs"
    assert SampleBatch.NEXT_OBS == "new_obs"
    assert SampleBatch.DONES == "dones"
    expected = {
        "ACTIONS": "actions",
        "REWARDS": "rewards",
        "TERMINATEDS": "terminateds",
        "TRUNCATEDS": "truncateds",
        "INFOS": "infos",
        "EPS_ID": "eps_id",
        "UNROLL_ID": "unroll_id",
        "AGENT_INDEX": "agent_index",
        "ENV_ID": "env_id",
        "T": "t",
        "SEQ_LENS": "seq_lens",
        "ACTION_DIST_INPUTS": "action_dist_inputs",
        "ACTION_PROB": "action_prob",
        "ACTION_LOGP": "action_logp",
        "VF_PREDS": "vf_preds",
        "VALUES_BOOTSTRAPPED": "values_bootstrapped",
        "PREV_ACTIONS": "prev_actions",
        "PREV_REWARDS": "prev_rewards",
        "ACTION_DIST": "action_dist",
        "OBS_EMBEDS": "obs_embeds",
        "RETURNS_TO_GO": "returns_to_go",
        "ATTENTION_MASKS": "attention_masks",
    }
    for name, value in expected.items():
        assert getattr(SampleBatch, name) == value, name
    for name in ("OBS", "NEXT_OBS", "ACTIONS", "REWARDS", "INFOS", "EPS_ID", "SEQ_LENS", "T"):
        assert getattr(SampleBatch, name) == getattr(Columns, name)
    assert DEFAULT_POLICY_ID == "default_policy"


# -------------------------------------------------------------- construction


def test_lists_and_numbers_become_arrays_but_infos_stays_a_list():
    infos = [{"x": 1}, {"x": 2}]
    b = SampleBatch({"a": [1, 2], "n": 3, "nested": {"c": [[1.0], [2.0]]}, "infos": infos})
    assert isinstance(b["a"], np.ndarray) and b["a"].tolist() == [1, 2]
    assert isinstance(b["n"], np.ndarray) and b["n"].shape == ()
    assert isinstance(b["nested"]["c"], np.ndarray) and b["nested"]["c"].shape == (2, 1)
    assert b["infos"] is infos
    assert len(b) == b.count == 2


def test_dones_key_is_refused_in_dict_and_kwargs():
    with pytest.raises(KeyError, match=r"cannot be constructed anymore with a `DONES` key"):
        SampleBatch({"dones": [0, 1]})
    with pytest.raises(KeyError, match=r"'terminateds'.*'truncateds'"):
        SampleBatch(obs=[1, 2], dones=[0, 1])
    b = SampleBatch({"a": [1]})
    with pytest.raises(KeyError, match=r"Cannot set `DONES`"):
        b["dones"] = np.array([True])


def test_ragged_list_names_the_column():
    with pytest.raises(ValueError, match=r"column 'obs': cannot turn this list into a numpy"):
        SampleBatch({"obs": [[1, 2], [3]]})


def test_special_kwargs_and_is_training_from_data():
    b = SampleBatch(
        {"a": [1, 2], "is_training": True},
        _time_major=True,
        _max_seq_len=7,
        _zero_padded=True,
        _num_grad_updates=3.0,
    )
    assert "is_training" not in b and b.is_training is True
    assert (b.time_major, b.max_seq_len, b.zero_padded, b.num_grad_updates) == (True, 7, True, 3.0)
    assert SampleBatch({"a": [1]}, _is_training=True).is_training is True
    assert SampleBatch({"a": [1]}).is_training is False


def test_seq_lens_normalisation():
    assert "seq_lens" not in SampleBatch({"a": [1, 2], "seq_lens": None})
    assert "seq_lens" not in SampleBatch({"a": [1, 2], "seq_lens": []})
    b = SampleBatch({"a": [1, 2, 3], "seq_lens": [1, 2]})
    assert b["seq_lens"].dtype == np.int32
    assert b.max_seq_len == 2 and b.count == 3
    t = SampleBatch({"a": [1, 2, 3], "seq_lens": torch.tensor([1, 2])})
    assert torch.is_tensor(t["seq_lens"]) and t.count == 3
    assert SampleBatch({"a": [1, 2, 3], "seq_lens": [1, 2]}, _max_seq_len=9).max_seq_len == 9


@pytest.mark.parametrize(
    ("data", "count"),
    [
        ({"obs": {"a": np.array([[1], [2], [3]]), "b": np.zeros((3, 2))}}, 3),
        ({"obs": {"a": np.array([[1, 2, 3]])}}, 1),
        ({"infos": {"a": np.array([1, 2]), "b": np.array([3, 4])}}, 0),
        ({"state_in_0": np.zeros((2, 4)), "state_out_0": np.zeros((2, 4)), "obs": [1, 2, 3]}, 3),
        ({"state_in_0": np.zeros((2, 4)), "state_out_0": np.zeros((2, 4))}, 0),
        ({"obs": np.arange(6), "seq_lens": np.array([[1], [2], [3]])}, 6),
        ({"new_obs": {"a": {"b": np.zeros((3, 1))}, "c": np.zeros((3, 1))}}, 3),
        ({"a": np.zeros(0), "b": np.arange(4)}, 4),  # a zero-length column is skipped
        ({}, 0),
    ],
)
def test_count(data, count):
    assert attempt_count_timesteps(data) == count
    assert SampleBatch(data).count == count


def test_len_and_size_bytes():
    b = SampleBatch({"a": [1, 2, 3], "b": {"c": [4, 5, 6]}, "seq_lens": [1, 2]})
    assert len(b) == b.env_steps() == b.agent_steps() == 3
    assert b.size_bytes() == b["a"].nbytes + b["b"]["c"].nbytes + b["seq_lens"].nbytes
    b2 = SampleBatch({"t": torch.zeros(4, dtype=torch.float32)})
    assert b2.size_bytes() == 16


def test_repr():
    assert repr(SampleBatch({"a": [1, 2, 3], "b": [4, 5, 6]})) == "SampleBatch(3: ['a', 'b'])"
    assert str(SampleBatch()) == "SampleBatch(0: [])"
    assert repr(seq_batch()) == "SampleBatch(6 (seqs=3): ['a', 'b', 'state_in_0'])"


def test_pickle_round_trip_keeps_data_and_settings():
    b = seq_batch()
    b.right_zero_pad(3)
    b.set_training()
    b.set_get_interceptor(np.negative)
    _ = b["a"]  # fill the interceptor cache
    out = pickle.loads(pickle.dumps(b))
    assert type(out) is SampleBatch
    eq(dict.__getitem__(out, "a"), dict.__getitem__(b, "a"))
    assert (out.count, out.zero_padded, out.max_seq_len, out.is_training) == (6, True, 3, True)
    assert out.intercepted_values == {}
    eq(out["a"], -dict.__getitem__(b, "a"))
    deep = copy.deepcopy(b)
    dict.__getitem__(deep, "b")["c"][0] = 100
    assert dict.__getitem__(b, "b")["c"][0] == 4


# ---------------------------------------------------------------- item access


def test_dict_properties_of_sample_batches():
    b = SampleBatch({"a": np.array([1, 2]), "b": np.array([3, 4]), "c": np.array([5, 6])})
    b["d"] = np.array([7, 8])
    assert b.added_keys == {"d"}
    _ = b["a"], b["b"]
    assert b.accessed_keys == {"a", "b"}
    del b["c"]
    assert b.deleted_keys == {"c"}
    assert list(b.keys()) == ["a", "b", "d"]
    assert [v.tolist() for v in b.values()] == [[1, 2], [3, 4], [7, 8]]
    assert [k for k, _ in b.items()] == ["a", "b", "d"]


def test_dones_reads_terminateds_only():
    b = SampleBatch({"terminateds": [False, True], "truncateds": [True, False]})
    eq(b["dones"], [False, True])


def test_is_training_key_is_deprecated_but_works():
    b = SampleBatch({"a": [1]}, _is_training=True)
    with pytest.warns(DeprecationWarning, match=r"batch.is_training"):
        assert b["is_training"] is True
    b["is_training"] = False
    assert b.is_training is False and "is_training" not in b


def test_get_and_columns():
    b = SampleBatch({"a": [1, 2], "b": [3, 4]})
    assert b.get("zz") is None
    assert b.get("zz", 5) == 5
    eq(b.get("a"), [1, 2])
    assert [c.tolist() for c in b.columns(["b", "a"])] == [[3, 4], [1, 2]]
    with pytest.raises(KeyError):
        b.columns(["nope"])


def test_interceptors():
    some_array = np.array([1, 2, 3])
    b = SampleBatch({"a": some_array})
    assert b["a"] is some_array
    calls = []

    def plus_one(v):
        calls.append(1)
        return v + 1

    b.set_get_interceptor(plus_one)
    eq(b["a"], [2, 3, 4])
    eq(b.get("a"), [2, 3, 4])
    assert len(calls) == 1  # cached
    b.set_get_interceptor(plus_one)  # same fn: cache kept
    _ = b["a"]
    assert len(calls) == 1
    b.set_get_interceptor(lambda v: v * 10)
    eq(b["a"], [10, 20, 30])
    # A value written while intercepting is taken as already converted.
    b["a"] = np.array([7, 7, 7])
    eq(b["a"], [7, 7, 7])
    b["new"] = np.array([1, 1, 1])
    eq(b["new"], [10, 10, 10])
    b.set_get_interceptor(None)
    eq(b["a"], [7, 7, 7])


def test_is_training_is_the_raw_bool_even_with_an_interceptor():
    b = SampleBatch({"a": [1]})
    b.set_get_interceptor(lambda v: v * 10)
    assert b.is_training is False
    b.set_training(True)
    assert b.is_training is True
    b.set_training()
    assert b.is_training is True
    b.set_training(False)
    assert b.is_training is False


# ---------------------------------------------------------------- predicates


def test_is_terminated_or_truncated():
    assert SampleBatch({"terminateds": [0, 1]}).is_terminated_or_truncated()
    assert not SampleBatch({"terminateds": [1, 0]}).is_terminated_or_truncated()
    assert SampleBatch({"terminateds": [0, 0], "truncateds": [0, 1]}).is_terminated_or_truncated()
    assert not SampleBatch(
        {"terminateds": [0, 0], "truncateds": [1, 0]}
    ).is_terminated_or_truncated()
    assert not SampleBatch({"terminateds": np.zeros(0)}).is_terminated_or_truncated()
    with pytest.raises(KeyError):
        SampleBatch({"a": [1]}).is_terminated_or_truncated()


def test_is_single_trajectory():
    assert SampleBatch({"terminateds": [0, 0, 1]}).is_single_trajectory()
    assert not SampleBatch({"terminateds": [0, 1, 0]}).is_single_trajectory()
    assert not SampleBatch(
        {"terminateds": [0, 0, 0], "truncateds": [1, 0, 0]}
    ).is_single_trajectory()
    assert SampleBatch({"terminateds": [0, 0], "truncateds": [0, 1]}).is_single_trajectory()


# ---------------------------------------------------------------- copy


def test_copy():
    b = SampleBatch(
        {
            "a": np.array([1, 2, 3, 2, 3, 4]),
            "b": {"c": np.array([4, 5, 6, 5, 6, 7])},
            "seq_lens": [2, 3, 1],
            "state_in_0": [1.0, 3.0, 4.0],
            "infos": [{}, {}, {}, {}, {}, {}],
        },
        _time_major=True,
        _num_grad_updates=2.0,
    )
    b.set_get_interceptor(np.negative)
    deep = b.copy()
    deep_raw = {k: dict.__getitem__(deep, k) for k in deep}
    deep_raw["a"][0] = 100
    deep_raw["b"]["c"][0] = 100
    deep_raw["seq_lens"][0] = 100
    deep_raw["state_in_0"][0] = 100
    deep_raw["infos"].append({"extra": 1})
    assert dict.__getitem__(b, "a")[0] == 1
    assert dict.__getitem__(b, "b")["c"][0] == 4
    assert dict.__getitem__(b, "seq_lens")[0] == 2
    assert dict.__getitem__(b, "state_in_0")[0] == 1.0
    assert len(dict.__getitem__(b, "infos")) == 6
    assert deep.time_major is True and deep.num_grad_updates == 2.0 and deep.max_seq_len == 3
    assert deep.get_interceptor is np.negative
    assert deep.added_keys is b.added_keys and deep.accessed_keys is b.accessed_keys

    shallow = b.copy(shallow=True)
    dict.__getitem__(shallow, "a")[0] = 100
    dict.__getitem__(shallow, "b")["c"][0] = 100
    dict.__getitem__(shallow, "seq_lens")[0] = 100
    dict.__getitem__(shallow, "state_in_0")[0] = 100
    assert dict.__getitem__(b, "a")[0] == 100
    assert dict.__getitem__(b, "b")["c"][0] == 100
    assert dict.__getitem__(b, "seq_lens")[0] == 100
    assert dict.__getitem__(b, "state_in_0")[0] == 100


def test_copy_clones_torch_tensors():
    b = SampleBatch({"t": torch.zeros(3)})
    c = b.copy()
    c["t"][0] = 1.0
    assert b["t"][0] == 0.0


# ---------------------------------------------------------------- concat


def test_concat():
    s1, s2 = s1_s2()
    b = concat_samples([s1, s2])
    eq(b["a"], [1, 2, 3, 2, 3, 4])
    eq(b["b"]["c"], [4, 5, 6, 5, 6, 7])
    row = next(b.rows())
    assert row == {"a": 1, "b": {"c": 4}}
    c = s1.concat(s2)
    eq(c["a"], b["a"])
    eq(c["b"]["c"], b["b"]["c"])
    assert c.count == 6


def test_concat_max_seq_len():
    s1, _ = s1_s2()
    s2 = seq_batch()
    s3 = SampleBatch(
        {
            "a": np.array([1, 2]),
            "b": {"c": np.array([4, 5])},
            "seq_lens": [1, 1],
            "state_in_0": [0.0, 0.0],
        }
    )
    b = concat_samples([s2, s3])
    assert b.max_seq_len == s2.max_seq_len == 3
    eq(b["seq_lens"], [2, 3, 1, 1, 1])
    eq(b["state_in_0"], [1, 3, 4, 0, 0])
    assert b.count == 8
    with pytest.raises(ValueError, match=r"consistently either provide or omit `max_seq_len`"):
        concat_samples([s1, s2])


def test_concat_zero_padded_needs_one_max_seq_len():
    a = SampleBatch({"x": [1, 2], "seq_lens": [2]}).right_zero_pad(2)
    b = SampleBatch({"x": [1, 2], "seq_lens": [2]}).right_zero_pad(3)
    with pytest.raises(ValueError, match=r"zero-padded batches must share one `max_seq_len`"):
        concat_samples([a, b])
    c = SampleBatch({"x": [3], "seq_lens": [1]}).right_zero_pad(2)
    out = concat_samples([a, c])
    eq(out["x"], [1, 2, 3, 0])
    assert out.zero_padded and out.max_seq_len == 2 and out.count == 3


def test_concat_inconsistent_settings():
    a = SampleBatch({"x": [1]}, _time_major=True)
    b = SampleBatch({"x": [1]})
    with pytest.raises(ValueError, match=r"`zero_padded` and `time_major` settings must be"):
        concat_samples([a, b])


def test_concat_time_major_uses_axis_1():
    a = SampleBatch({"x": np.zeros((4, 2)), "seq_lens": [4, 4]}, _time_major=True)
    b = SampleBatch({"x": np.ones((4, 3)), "seq_lens": [4, 4, 4]}, _time_major=True)
    out = concat_samples([a, b])
    assert out["x"].shape == (4, 5)
    eq(out["seq_lens"], [4, 4, 4, 4, 4])
    assert out.time_major is True


def test_concat_skips_empty_keeps_first_keys_and_types():
    a = SampleBatch({"x": [1, 2], "infos": [{"i": 0}, {"i": 1}], "t": torch.tensor([1.0, 2.0])})
    b = SampleBatch({"x": [3], "infos": [{"i": 2}], "t": torch.tensor([3.0]), "extra": [9]})
    out = concat_samples([SampleBatch(), a, SampleBatch({"x": np.zeros(0)}), b])
    assert list(out.keys()) == ["x", "infos", "t"]  # extra keys of later batches are dropped
    assert out["infos"] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert torch.is_tensor(out["t"]) and out["t"].tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(KeyError, match=r"column 'extra' is in the first batch but missing"):
        concat_samples([b, a])
    assert concat_samples([]).count == 0
    assert isinstance(concat_samples([SampleBatch()]), SampleBatch)


def test_concat_num_grad_updates_is_count_weighted():
    a = SampleBatch({"x": [1, 2]}, _num_grad_updates=2.0)
    b = SampleBatch({"x": [1, 2, 3, 4]}, _num_grad_updates=5.0)
    c = SampleBatch({"x": [1]})
    assert concat_samples([a, b]).num_grad_updates == 4.0
    assert concat_samples([a, b, c]).num_grad_updates == 4.0
    assert concat_samples([c, c]).num_grad_updates == 0.0


def test_concat_bad_inputs():
    with pytest.raises(TypeError, match=r"item 1 is a dict; only SampleBatch and MultiAgentBatch"):
        concat_samples([SampleBatch({"x": [1]}), {"x": [2]}])
    with pytest.raises(ValueError, match=r"column 'x': Unsupported type for concatenation"):
        concat_samples([SampleBatch({"x": 1}), SampleBatch({"x": 2, "y": [1]})])
    with pytest.raises(ValueError, match=r"`SampleBatch.concat_samples` has been removed"):
        SampleBatch.concat_samples([])


def test_concat_with_multi_agent_input_gives_multi_agent_batch():
    a = SampleBatch({"x": [1, 2, 3, 4]})
    out = concat_samples([a, a.as_multi_agent()])
    assert isinstance(out, MultiAgentBatch)
    assert out.count == 8 and out.agent_steps() == 8


# ---------------------------------------------------------------- rows


def test_rows():
    b = SampleBatch(
        {
            "a": np.array([[1, 1], [2, 2], [3, 3]]),
            "b": {"c": np.array([[4, 4], [5, 5], [6, 6]])},
            "seq_lens": [1, 2],
        }
    )
    row = next(b.rows())
    assert list(row) == ["a", "b", "seq_lens"]
    eq(row["a"], [1, 1])
    eq(row["b"]["c"], [4, 4])
    assert row["seq_lens"] == 1
    rows = list(SampleBatch({"a": [1, 2, 3], "seq_lens": [1, 2]}).rows())
    assert rows == [{"a": 1, "seq_lens": 1}, {"a": 2, "seq_lens": 1}, {"a": 3, "seq_lens": 1}]


def test_rows_give_state_in_of_the_rows_sequence():
    rows = list(seq_batch().rows())
    assert [r["state_in_0"] for r in rows] == [1.0, 1.0, 3.0, 3.0, 3.0, 4.0]
    assert list(SampleBatch({"infos": [{"k": 1}], "a": [5]}).rows()) == [
        {"infos": {"k": 1}, "a": 5}
    ]


# ---------------------------------------------------------------- slicing


def test_slicing_without_seq_lens():
    s1 = SampleBatch({"a": np.array([1, 2, 3, 2, 3, 4]), "b": {"c": np.arange(6)}})
    eq(s1[1:4]["a"], [2, 3, 2])
    eq(s1[1:4]["b"]["c"], [1, 2, 3])
    assert s1[1:4].count == 3
    eq(s1[-2:]["a"], [3, 4])
    eq(s1[4:100]["a"], [3, 4])
    assert s1[5:2].count == 0
    s1[:3]["a"][0] = 100  # a view: the parent changes
    assert s1["a"][0] == 100
    with pytest.raises(ValueError, match=r"slicing needs step 1, got step 2"):
        s1[::2]


def test_slicing_keeps_settings_and_slices_infos():
    b = SampleBatch(
        {"a": [1, 2, 3], "infos": [{"i": 0}, {"i": 1}, {"i": 2}]},
        _is_training=True,
        _time_major=False,
        _num_grad_updates=1.5,
    )
    s = b[1:]
    assert s["infos"] == [{"i": 1}, {"i": 2}]
    assert (s.is_training, s.time_major, s.num_grad_updates) == (True, False, 1.5)
    s2 = b.slice(0, 2)
    assert s2["infos"] == [{"i": 0}, {"i": 1}] and s2.is_training


def test_slicing_with_seq_lens_selects_whole_sequences():
    s2 = seq_batch()
    t = s2[:3]
    eq(t["a"], [1, 2])
    eq(t["b"]["c"], [4, 5])
    eq(t["seq_lens"], [2])
    eq(t["state_in_0"], [1.0])
    assert t.count == 2
    t = s2[:5]
    eq(t["a"], [1, 2, 3, 2, 3])
    eq(t["seq_lens"], [2, 3])
    eq(t["state_in_0"], [1.0, 3.0])
    for full in (s2[:50], s2[:]):
        eq(full["a"], s2["a"])
        eq(full["seq_lens"], [2, 3, 1])
        eq(full["state_in_0"], [1.0, 3.0, 4.0])
    t = s2[3:6]  # row 3 lies in sequence 1: the slice starts at that sequence
    eq(t["a"], [3, 2, 3, 4])
    eq(t["seq_lens"], [3, 1])


def test_slicing_zero_padded_uses_padded_offsets():
    b = seq_batch().right_zero_pad(3)
    t = b[:5]
    eq(t["a"], [1, 2, 0, 3, 2, 3])
    eq(t["seq_lens"], [2, 3])
    assert t.zero_padded and t.max_seq_len == 3 and t.count == 5


def test_slicing_by_batch_id():
    b = SampleBatch(
        {
            "obs": np.arange(6).reshape(3, 2),  # B x T, one row per sequence
            "seq_lens": [2, 1, 2],
            "infos": ["i0", "i1", "i2", "i3", "i4"],
        }
    )
    b.enable_slicing_by_batch_id()
    t = b[1:3]
    eq(t["obs"], [[2, 3], [4, 5]])
    eq(t["seq_lens"], [1, 2])
    assert t["infos"] == ["i2", "i3", "i4"]
    b.disable_slicing_by_batch_id()
    assert b[0:2]["seq_lens"].tolist() == [2]


def test_slice_method_trims_sequences():
    s2 = seq_batch()
    t = s2.slice(1, 4)
    eq(t["a"], [2, 3, 2])
    eq(t["seq_lens"], [1, 2])
    eq(t["state_in_0"], [1.0, 3.0])
    assert t.count == 3 and int(t["seq_lens"].sum()) == 3
    t = s2.slice(3, 4)
    eq(t["a"], [2])
    eq(t["seq_lens"], [1])
    eq(t["state_in_0"], [3.0])
    t = s2.slice(0, 6)
    eq(t["seq_lens"], [2, 3, 1])


def test_slice_negative_start_left_zero_pads():
    s2 = seq_batch()
    t = s2.slice(-2, 3)
    eq(t["a"], [0, 0, 1, 2, 3])
    eq(t["b"]["c"], [0, 0, 4, 5, 6])
    eq(t["seq_lens"], [4, 1])
    eq(t["state_in_0"], [1.0, 3.0])
    assert t.count == 5 and t.max_seq_len == 4


def test_slice_with_explicit_state_range():
    s2 = seq_batch()
    t = s2.slice(2, 6, state_start=1, state_end=3)
    eq(t["a"], [3, 2, 3, 4])
    eq(t["seq_lens"], [3, 1])
    eq(t["state_in_0"], [3.0, 4.0])
    t = s2.slice(2, 5, state_start=1, state_end=3)  # the last sequence is trimmed to fit
    eq(t["seq_lens"], [3, 0])
    with pytest.raises(ValueError, match=r"give both state_start and state_end"):
        s2.slice(0, 2, state_start=0)


def test_slice_of_zero_padded_batch_is_refused():
    b = seq_batch().right_zero_pad(3)
    with pytest.raises(ValueError, match=r"zero-padded; use batch\[a:b\]"):
        b.slice(0, 2)


# ---------------------------------------------------------------- split


def test_split_by_episode():
    b = SampleBatch(
        {
            "a": np.arange(6),
            "eps_id": [0, 0, 0, 0, 1, 1],
            "terminateds": [0, 0, 0, 1, 0, 1],
        }
    )
    for key in (None, "eps_id", "dones"):
        parts = b.split_by_episode(key)
        assert [p["a"].tolist() for p in parts] == [[0, 1, 2, 3], [4, 5]], key
    del b["eps_id"]
    assert [p["a"].tolist() for p in b.split_by_episode()] == [[0, 1, 2, 3], [4, 5]]
    with pytest.raises(KeyError, match=r"has no 'eps_id' column"):
        b.split_by_episode("eps_id")
    b["terminateds"] = np.zeros(6)
    assert [p["a"].tolist() for p in b.split_by_episode()] == [[0, 1, 2, 3, 4, 5]]
    del b["terminateds"]
    with pytest.raises(KeyError, match=r"neither an 'eps_id' nor a 'terminateds'"):
        b.split_by_episode()
    with pytest.raises(KeyError, match=r"key='dones'\): this batch has no 'terminateds'"):
        b.split_by_episode("dones")


@pytest.mark.parametrize(
    ("dones", "expected"),
    [
        ([0, 0, 1, 0, 1], [[1, 2, 3], [4, 5]]),
        ([0, 0, 1, 0, 0], [[1, 2, 3], [4, 5]]),
        ([0, 0, 0, 0, 0], [[1, 2, 3, 4, 5]]),
        ([1, 1, 1, 1, 1], [[1], [2], [3], [4], [5]]),
    ],
)
def test_split_by_dones(dones, expected):
    b = SampleBatch({"a": [1, 2, 3, 4, 5], "terminateds": dones})
    assert [p["a"].tolist() for p in b.split_by_episode()] == expected


def test_split_by_dones_uses_truncateds_too():
    b = SampleBatch({"a": [1, 2, 3], "terminateds": [0, 0, 0], "truncateds": [0, 1, 0]})
    assert [p["a"].tolist() for p in b.split_by_episode("dones")] == [[1, 2], [3]]


def test_split_by_eps_id_examples():
    b = SampleBatch({"a": [1, 2, 3], "eps_id": [0, 0, 1]})
    assert [p["a"].tolist() for p in b.split_by_episode()] == [[1, 2], [3]]
    samples = SampleBatch({"actions": [1, 2, 3, 4], "obs": [4, 5, 6, 7], "eps_id": [1, 1, 2, 3]})
    assert [p.count for p in samples.split_by_episode()] == [2, 1, 1]
    # ids are not grouped: a recurring id starts a new slice
    b = SampleBatch({"a": [1, 2, 3], "eps_id": ["x", "y", "x"]})
    assert [p["a"].tolist() for p in b.split_by_episode()] == [[1], [2], [3]]


def test_split_by_episode_bad_key_and_empty():
    b = SampleBatch({"a": [1], "eps_id": [0]})
    with pytest.raises(ValueError, match=r"key must be None, 'eps_id' or 'dones', got 'foo'"):
        b.split_by_episode("foo")
    with pytest.raises(AssertionError):  # RLlib asserted here
        b.split_by_episode("foo")
    assert SampleBatch({"a": np.zeros(0), "eps_id": np.zeros(0)}).split_by_episode() == []


def test_split_by_episode_with_seq_lens_recuts_sequences():
    b = SampleBatch({"a": np.arange(5), "eps_id": [0, 0, 0, 1, 1], "seq_lens": [2, 3]})
    parts = b.split_by_episode()
    assert [p["seq_lens"].tolist() for p in parts] == [[2, 1], [2]]


# ---------------------------------------------------------------- timeslices


def test_timeslices():
    b = SampleBatch({"a": [1, 2, 3, 4]})
    assert [t["a"].tolist() for t in b.timeslices(num_slices=3)] == [[1], [2], [3, 4]]
    assert [t["a"].tolist() for t in b.timeslices(2)] == [[1, 2], [3, 4]]
    # RLlib hangs here; we end with a shorter slice.
    assert [t["a"].tolist() for t in b.timeslices(size=3)] == [[1, 2, 3], [4]]
    with pytest.warns(DeprecationWarning, match=r"timeslices\(size=...\)"):
        assert [t.count for t in b.timeslices(k=3)] == [3, 1]
    assert SampleBatch().timeslices(2) == []


def test_timeslices_with_seq_lens_recuts_sequences():
    parts = seq_batch().timeslices(4)
    assert [p["seq_lens"].tolist() for p in parts] == [[2, 2], [1, 1]]
    assert [p["state_in_0"].tolist() for p in parts] == [[1.0, 3.0], [3.0, 4.0]]


def test_timeslices_bad_arguments():
    b = SampleBatch({"a": [1, 2]})
    with pytest.raises(ValueError, match=r"exactly one of `size` or `num_slices`"):
        b.timeslices()
    with pytest.raises(ValueError, match=r"exactly one of `size` or `num_slices`"):
        b.timeslices(1, num_slices=2)
    with pytest.raises(ValueError, match=r"size must be >= 1, got 0"):
        b.timeslices(0)
    with pytest.raises(ValueError, match=r"num_slices must be >= 1, got 0"):
        b.timeslices(num_slices=0)


# ---------------------------------------------------------------- shuffle


def test_shuffle_permutes_all_columns_together_including_infos():
    np.random.seed(0)
    n = 50
    b = SampleBatch(
        {
            "a": np.arange(n),
            "b": {"c": np.arange(n) * 10},
            "pair": (np.arange(n) * 2, np.arange(n) * 3),
            "infos": [{"i": i} for i in range(n)],
            "t": torch.arange(n),
        }
    )
    assert b.shuffle() is b
    a = b["a"]
    assert sorted(a.tolist()) == list(range(n)) and a.tolist() != list(range(n))
    eq(b["b"]["c"], a * 10)
    eq(b["pair"][0], a * 2)
    eq(b["pair"][1], a * 3)
    assert [info["i"] for info in b["infos"]] == a.tolist()
    assert b["t"].tolist() == a.tolist()
    assert b.count == n


def test_shuffle_with_interceptor():
    np.random.seed(1)
    b = SampleBatch({"a": np.arange(20)})
    b.set_get_interceptor(lambda v: v + 1)
    before = b["a"]
    eq(before, np.arange(20) + 1)
    b.shuffle()
    after = b["a"]
    assert after.tolist() != before.tolist()  # recomputed, not the stale cache
    eq(after, dict.__getitem__(b, "a") + 1)


def test_shuffle_needs_zero_padding_with_seq_lens():
    b = seq_batch()
    with pytest.raises(ValueError, match=r"not possible when your data has `seq_lens` defined"):
        b.shuffle()


def test_shuffle_zero_padded_moves_whole_sequences():
    np.random.seed(3)
    b = SampleBatch(
        {
            "a": np.arange(1, 11),
            "seq_lens": [1, 2, 3, 4],
            "state_in_0": np.array([10.0, 20.0, 30.0, 40.0]),
        }
    ).right_zero_pad(4)
    b.shuffle()
    rows = b["a"].reshape(4, 4)
    for seq_len, state, row in zip(b["seq_lens"], b["state_in_0"], rows):
        first = {10.0: 1, 20.0: 2, 30.0: 4, 40.0: 7}[state]
        eq(row[:seq_len], np.arange(first, first + seq_len))
        eq(row[seq_len:], 0)


def test_shuffle_refuses_ragged_columns():
    b = SampleBatch({"a": np.arange(3)})
    dict.__setitem__(b, "b", np.arange(4))
    with pytest.raises(ValueError, match=r"shuffle: column 'b' has 4 rows, expected 3"):
        b.shuffle()


# ---------------------------------------------------------------- padding


def test_right_zero_padding():
    b = SampleBatch({"a": [1, 2, 3], "b": {"c": [4, 5, 6]}, "seq_lens": [1, 2]})
    assert b.right_zero_pad(max_seq_len=5) is b
    eq(b["a"], [1, 0, 0, 0, 0, 2, 3, 0, 0, 0])
    eq(b["b"]["c"], [4, 0, 0, 0, 0, 5, 6, 0, 0, 0])
    eq(b["seq_lens"], [1, 2])
    assert b.zero_padded and b.max_seq_len == 5 and b.count == 3


def test_right_zero_pad_objects_states_and_tensors():
    b = SampleBatch(
        {
            "infos": ["a", "b", "c"],
            "s": np.array(["x", "y", "z"]),
            "t": torch.tensor([1.0, 2.0, 3.0]),
            "seq_lens": [2, 1],
            "state_in_0": [7, 8],
        }
    ).right_zero_pad(3)
    assert b["infos"] == ["a", "b", None, "c", None, None]
    assert b["s"].tolist() == ["x", "y", None, "z", None, None]
    assert b["t"].tolist() == [1.0, 2.0, 0.0, 3.0, 0.0, 0.0]
    eq(b["state_in_0"], [7, 8])  # one row per sequence: not padded
    b2 = SampleBatch({"a": [1, 2], "seq_lens": [1, 1], "state_in_0": [5, 6]})
    b2.right_zero_pad(2, exclude_states=False)
    eq(b2["state_in_0"], [5, 0, 6, 0])


def test_right_zero_pad_errors():
    with pytest.raises(ValueError, match=r"Cannot right-zero-pad SampleBatch if no `seq_lens`"):
        SampleBatch({"a": [1]}).right_zero_pad(2)
    b = SampleBatch({"a": [1, 2, 3], "seq_lens": [3]})
    with pytest.raises(ValueError, match=r"a sequence has 3 rows, more than max_seq_len=2"):
        b.right_zero_pad(2)
    b.right_zero_pad(3)
    with pytest.raises(ValueError, match=r"already zero-padded \(max_seq_len=3\)"):
        b.right_zero_pad(3)
    with pytest.raises(ValueError, match=r"`SampleBatch.zero_pad` has been removed; use"):
        b.zero_pad(3)


# ---------------------------------------------------------------- devices


def test_to_device():
    b = SampleBatch(
        {
            "a": np.zeros((2, 3)),
            "b": {"c": (np.array([1, 2]), torch.zeros(2, dtype=torch.float64))},
            "d": torch.ones(2, dtype=torch.float64),
            "i": np.array([1, 2], dtype=np.int64),
            "seq_lens": [1, 1],
            "state_in_0": np.zeros((2, 4), dtype=np.float64),
            "infos": np.array([{"x": 1}, {"y": 2}]),
            "names": np.array(["u", "v"]),
        }
    )
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        out = b.copy()
        infos = out["infos"]
        assert out.to_device(device) is out
        for key in ("a", "d", "i", "seq_lens", "state_in_0"):
            assert torch.is_tensor(out[key]) and out[key].device.type == device, key
        assert out["a"].dtype == torch.float32
        assert out["d"].dtype == torch.float32
        assert out["state_in_0"].dtype == torch.float32
        assert out["i"].dtype == torch.int64
        assert out["seq_lens"].dtype == torch.int32
        assert isinstance(out["b"], dict) and isinstance(out["b"]["c"], tuple)
        assert torch.is_tensor(out["b"]["c"][0]) and torch.is_tensor(out["b"]["c"][1])
        assert out["b"]["c"][1].dtype == torch.float32
        assert out["infos"] is infos
        assert isinstance(out["names"], np.ndarray)
        assert out.count == 2
    with pytest.raises(NotImplementedError, match=r"framework='tf' is not supported"):
        b.to_device("cpu", framework="tf")


def test_to_device_then_slice_concat_and_read_only_arrays():
    ro = np.arange(4.0)
    ro.flags.writeable = False
    b = SampleBatch({"a": ro, "x": np.arange(4)}).to_device("cpu")
    assert b["a"].dtype == torch.float32
    c = concat_samples([b[:2], b[2:]])
    assert torch.is_tensor(c["x"]) and c["x"].tolist() == [0, 1, 2, 3]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_to_device_cuda_pinned_and_stream():
    b = SampleBatch({"a": np.arange(6.0)}).to_device("cuda", pin_memory=True, use_stream=True)
    assert b["a"].is_cuda and b["a"].tolist() == [0, 1, 2, 3, 4, 5]


# ---------------------------------------------------------------- compression


def test_compression():
    b = SampleBatch({"a": np.arange(6.0).reshape(3, 2), "b": {"c": np.array([4, 5, 6])}})
    b.compress(columns={"a", "b"}, bulk=True)
    assert is_compressed(b["a"])
    assert isinstance(b["b"], dict) and is_compressed(b["b"]["c"])
    b.decompress_if_needed(columns={"a", "b"})
    eq(b["a"], [[0, 1], [2, 3], [4, 5]])
    eq(b["b"]["c"], [4, 5, 6])
    row = next(b.rows())
    assert row["b"]["c"] == 4


def test_compression_per_row_default_columns():
    obs = np.random.rand(5, 3).astype(np.float32)
    b = SampleBatch({"obs": obs.copy(), "new_obs": obs.copy(), "a": np.arange(5)})
    assert b.compress() is b
    assert b["obs"].dtype == object and b["obs"].shape == (5,)
    assert all(is_compressed(x) for x in b["obs"])
    assert isinstance(b["a"], np.ndarray) and b["a"].dtype == np.int64
    b.compress()  # idempotent
    assert b.decompress_if_needed() is b
    eq(b["obs"], obs)
    eq(b["new_obs"], obs)
    assert b["obs"].dtype == np.float32
    b.decompress_if_needed()  # nothing left to unpack
    eq(b["obs"], obs)


def test_compression_keeps_empty_columns_and_refuses_objects():
    b = SampleBatch({"obs": np.zeros((0, 2), dtype=np.int8)})
    b.compress().decompress_if_needed()
    assert b["obs"].shape == (0, 2) and b["obs"].dtype == np.int8
    b = SampleBatch({"obs": np.array([{"x": 1}, {"x": 2}])})
    with pytest.raises(ValueError, match=r"only numeric, bool and fixed-width"):
        b.compress()


# ---------------------------------------------------------------- other


def test_as_multi_agent():
    b = SampleBatch({"a": [1, 2, 3]})
    ma = b.as_multi_agent()
    assert isinstance(ma, MultiAgentBatch)
    assert ma.policy_batches == {DEFAULT_POLICY_ID: b} and ma.count == 3
    assert list(b.as_multi_agent("pol").policy_batches) == ["pol"]


class _VR:
    def __init__(self, data_col=None):
        self.data_col = data_col


def test_get_single_step_input_dict():
    b = SampleBatch(
        {
            "obs": [[0.0], [1.0], [2.0]],
            "new_obs": [[1.0], [2.0], [3.0]],
            "actions": [5, 6, 7],
            "rewards": [0.5, 0.6, 0.7],
            "state_out_0": [[1, 1], [2, 2], [3, 3]],
        }
    )
    vrs = {
        "obs": _VR(),
        "prev_actions": _VR("actions"),
        "prev_rewards": _VR("rewards"),
        "state_in_0": _VR("state_out_0"),
        "missing": _VR(),
    }
    out = b.get_single_step_input_dict(vrs)
    assert isinstance(out, SampleBatch) and out.count == 1
    eq(out["obs"], [[3.0]])
    eq(out["prev_actions"], [7])
    eq(out["prev_rewards"], [0.7])
    eq(out["state_in_0"], [[3, 3]])
    eq(out["seq_lens"], [1])
    assert "missing" not in out
    out0 = b.get_single_step_input_dict({"obs": _VR(), "actions": _VR()}, index=0)
    eq(out0["obs"], [[0.0]])
    eq(out0["actions"], [5])


# ---------------------------------------------------------------- properties


@st.composite
def episode_batches(draw):
    lengths = draw(st.lists(st.integers(1, 6), min_size=0, max_size=6))
    eps = np.repeat(np.arange(len(lengths)), lengths)
    n = len(eps)
    term = np.zeros(n, dtype=bool)
    if n:
        term[np.cumsum(lengths) - 1] = True
    return SampleBatch(
        {
            "obs": np.arange(n, dtype=np.float32).reshape(n, 1) * 1.5,
            "nested": {"x": np.arange(n) * 7, "pair": (np.arange(n), -np.arange(n))},
            "eps_id": eps,
            "terminateds": term,
            "infos": [{"row": i} for i in range(n)],
        }
    ), lengths


def assert_same_rows(a: SampleBatch, b: SampleBatch):
    assert a.count == b.count
    if b.count == 0:  # concatenating only empty batches gives SampleBatch()
        return
    assert list(a.keys()) == list(b.keys())
    eq(a["obs"], b["obs"])
    eq(a["nested"]["x"], b["nested"]["x"])
    eq(a["nested"]["pair"][1], b["nested"]["pair"][1])
    assert a["infos"] == b["infos"]


@settings(max_examples=60, deadline=None)
@given(episode_batches(), st.data())
def test_property_slice_then_concat_round_trips(batch_and_lengths, data):
    batch, _ = batch_and_lengths
    cut = data.draw(st.integers(0, batch.count))
    left, right = batch[:cut], batch[cut:]
    assert left.count + right.count == batch.count
    assert_same_rows(concat_samples([left, right]), batch)


@settings(max_examples=60, deadline=None)
@given(episode_batches(), st.sampled_from([None, "eps_id", "dones"]))
def test_property_split_by_episode_round_trips(batch_and_lengths, key):
    batch, lengths = batch_and_lengths
    parts = batch.split_by_episode(key)
    assert [p.count for p in parts] == lengths
    for p in parts:
        assert len(set(p["eps_id"].tolist())) == 1
        assert p.is_single_trajectory() and p.is_terminated_or_truncated()
    assert_same_rows(concat_samples(parts), batch)


@settings(max_examples=60, deadline=None)
@given(episode_batches(), st.integers(1, 7), st.integers(1, 7))
def test_property_timeslices_round_trip(batch_and_lengths, size, num_slices):
    batch, _ = batch_and_lengths
    by_size = batch.timeslices(size)
    assert all(p.count == size for p in by_size[:-1])
    assert sum(p.count for p in by_size) == batch.count
    by_num = batch.timeslices(num_slices=num_slices)
    assert len(by_num) == num_slices
    assert sum(p.count for p in by_num) == batch.count
    if batch.count:
        assert_same_rows(concat_samples(by_size), batch)
        assert_same_rows(concat_samples(by_num), batch)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=6), st.data())
def test_property_seq_lens_slice_sums_and_padding(seq_lens, data):
    n = sum(seq_lens)
    batch = SampleBatch(
        {"a": np.arange(1, n + 1), "seq_lens": seq_lens, "state_in_0": np.arange(len(seq_lens))}
    )
    start = data.draw(st.integers(-3, n))
    end = data.draw(st.integers(max(start, 0), n))
    part = batch.slice(start, end)
    assert part.count == end - start == int(part["seq_lens"].sum())
    assert len(part["state_in_0"]) == len(part["seq_lens"])
    eq(
        part["a"],
        np.concatenate([np.zeros(max(-start, 0), int), np.arange(max(start, 0), end) + 1]),
    )
    padded = batch.copy().right_zero_pad(max(seq_lens))
    rows = padded["a"].reshape(len(seq_lens), max(seq_lens))
    eq(np.concatenate([r[:k] for r, k in zip(rows, seq_lens)]), batch["a"])
    assert (rows != 0).sum() == n


# ---------------------------------------------------------------- tree helpers


def test_tree_helpers_treat_lists_as_leaves_and_keep_structure():
    from collections import namedtuple

    from envrunners.utils import tree

    Pair = namedtuple("Pair", "x y")
    s = {"a": [1, 2], "b": (np.zeros(2), {"c": Pair(1, 2)})}
    assert tree.flatten(s)[0] == [1, 2]  # a list is one leaf
    assert len(tree.flatten(s)) == 4
    doubled = tree.map_structure(lambda v: v * 2, s)
    assert doubled["a"] == [1, 2, 1, 2] and isinstance(doubled["b"][1]["c"], Pair)
    assert doubled["b"][1]["c"] == Pair(2, 4)
    paths = [p for p, _ in tree.flatten_with_path(s)]
    assert paths == [("a",), ("b", 0), ("b", 1, "c", 0), ("b", 1, "c", 1)]
    assert tree.map_structure_with_path(lambda p, v: p, {"k": (1,)}) == {"k": (("k", 0),)}
    assert tree.unflatten_as(s, [0, 1, 2, 3])["b"][1]["c"] == Pair(2, 3)
    with pytest.raises(ValueError, match=r"fewer leaves"):
        tree.unflatten_as(s, [0])
    with pytest.raises(ValueError, match=r"1 leaves more"):
        tree.unflatten_as(s, [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"structures differ"):
        tree.map_structure(lambda a, b: a, (1, 2), (1,))
    added = tree.map_structure(lambda a, b: a + b, {"x": 1, "y": (2,)}, {"x": 10, "y": (20,)})
    assert added == {"x": 11, "y": (22,)}
