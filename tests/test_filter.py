"""Tests for envrunners.utils.filter and envrunners.utils.filter_manager (spec §14, §18.10)."""

from __future__ import annotations

import json
import logging
import pickle
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from envrunners.errors import ConfigError, UnknownPolicyError
from envrunners.utils.filter import (
    ConcurrentMeanStdFilter,
    Filter,
    MeanStdFilter,
    NoFilter,
    RunningStat,
    get_filter,
)
from envrunners.utils.filter_manager import FilterManager

SHAPES = [(), (3,), (3, 4)]


def _check_stats(rs: RunningStat, data: np.ndarray) -> None:
    assert rs.n == len(data)
    np.testing.assert_allclose(rs.mean, data.mean(axis=0), rtol=1e-9, atol=1e-9)
    if len(data) > 1:
        np.testing.assert_allclose(rs.var, data.var(axis=0, ddof=1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rs.std, data.std(axis=0, ddof=1), rtol=1e-5, atol=1e-6)


# -- NoFilter ---------------------------------------------------------------------------
def test_nofilter_passes_through_and_converts():
    f = NoFilter()
    arr, d, t = np.arange(3), {"a": 1}, (1, 2)
    assert f(arr) is arr and f(d) is d and f(t) is t
    np.testing.assert_array_equal(f([1, 2]), np.array([1, 2]))
    assert f.copy() is f and f.as_serializable() is f
    f.apply_changes(NoFilter())
    f.sync(NoFilter())
    f.reset_buffer()
    assert f.get_state() == {}


def test_nofilter_conversion_error():
    class Bad:
        def __array__(self, *args, **kwargs):
            raise TypeError("nope")

    with pytest.raises(ValueError, match="Failed to convert to array:"):
        NoFilter()(Bad())


def test_filter_base_is_abstract():
    with pytest.raises(NotImplementedError):
        Filter().copy()


# -- RunningStat ------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
def test_running_stat_rowwise_matches_numpy(shape):
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(40, *shape))
    rs = RunningStat(shape)
    for i, row in enumerate(data):
        rs.push(row)
        _check_stats(rs, data[: i + 1])


@pytest.mark.parametrize("shape", SHAPES)
def test_running_stat_batchwise_matches_numpy(shape):
    rng = np.random.default_rng(1)
    data = rng.normal(-1.0, 5.0, size=(100, *shape)).astype(np.float32)
    rs = RunningStat(shape)
    for lo, hi in [(0, 1), (1, 17), (17, 17), (17, 64), (64, 100)]:
        rs.push(data[lo:hi])
        _check_stats(rs, data[:hi].astype(np.float64))
    assert rs.num_pushes_delta == 100


def test_running_stat_n1_var_is_zero():
    rs = RunningStat()
    rs.push(1.0)
    assert rs.var == 0.0 and rs.std == 0.0 and rs.var.dtype == np.float32
    rs.push(3.0)
    assert rs.mean == 2.0 and rs.var == 2.0


def test_running_stat_bad_shape():
    rs = RunningStat((3,))
    with pytest.raises(ValueError, match=r"Unexpected input shape \(4,\), expected \(3,\)"):
        rs.push(np.zeros(4))
    with pytest.raises(ValueError, match="Unexpected input shape"):
        rs.push(np.zeros((2, 2, 3)))
    with pytest.raises(ValueError, match="Cannot merge RunningStat of shape"):
        rs.update(RunningStat((2,)))


@pytest.mark.parametrize("shape", SHAPES)
def test_running_stat_update_equals_concatenation(shape):
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(5, *shape)), rng.normal(4.0, 3.0, size=(9, *shape))
    rs1, rs2, rs_all = RunningStat(shape), RunningStat(shape), RunningStat(shape)
    for row in a:
        rs1.push(row)
    rs2.push(b)
    rs_all.push(np.concatenate([a, b]))
    rs1.update(rs2)
    _check_stats(rs1, np.concatenate([a, b]))
    np.testing.assert_allclose(rs1.mean, rs_all.mean)
    np.testing.assert_allclose(rs1.std, rs_all.std, rtol=1e-6)
    # Own delta unchanged by a merge: it still describes the 5 pushed rows.
    assert rs1.num_pushes_delta == 5
    np.testing.assert_allclose(rs1.mean_delta_array, a.mean(axis=0))
    rs1.push(a[0])  # totals and delta both advance after they diverged
    assert (rs1.n, rs1.num_pushes_delta) == (15, 6)
    np.testing.assert_allclose(rs1.mean_delta_array, np.concatenate([a, a[:1]]).mean(axis=0))


def test_running_stat_update_with_empty_is_noop():
    rs = RunningStat((2,))
    rs.push(np.ones((3, 2)))
    rs.update(RunningStat((2,)))
    assert rs.n == 3
    empty = RunningStat((2,))
    empty.update(rs)
    assert empty.n == 3 and empty.num_pushes_delta == 0


def test_running_stat_state_roundtrip_and_copy():
    rs = RunningStat((2,))
    rs.push(np.array([[1.0, 2.0], [3.0, 5.0]]))
    other = RunningStat((2,))
    other.push(np.array([7.0, 7.0]))
    rs.update(other)
    state = json.loads(json.dumps(rs.to_state()))  # plain data
    back = RunningStat.from_state(state)
    assert back.to_state() == rs.to_state()
    cp = rs.copy()
    cp.push(np.array([100.0, 100.0]))
    assert rs.n == 3 and cp.n == 4
    with pytest.raises(ValueError, match="read-only"):
        rs.mean[0] = 1.0


@settings(max_examples=60, deadline=None)
@given(
    data=hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 60), st.just(2)),
        elements=st.floats(-1e3, 1e3, allow_nan=False),
    ),
    cuts=st.lists(st.integers(0, 60), max_size=8),
    groups=st.integers(1, 4),
)
def test_any_split_merged_equals_whole(data, cuts, groups):
    """Batches of any split, pushed into several RunningStats and merged, equal one over all."""
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    stats = [RunningStat((2,)) for _ in range(groups)]
    for k, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        stats[k % groups].push(data[lo:hi])
    merged = RunningStat((2,))
    for rs in stats:
        merged.update(rs)
    whole = RunningStat((2,))
    whole.push(data)
    assert merged.n == whole.n == len(data)
    np.testing.assert_allclose(merged.mean, whole.mean, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(
        merged.sum_sq_diff_array, whole.sum_sq_diff_array, rtol=1e-7, atol=1e-6
    )


# -- MeanStdFilter -----------------------------------------------------------------------
def test_mean_std_filter_spec_numbers():
    f = MeanStdFilter((3,))
    np.testing.assert_allclose(f([1, 2, 3]), [0, 0, 0])
    np.testing.assert_allclose(f([3, 2, 1]), [0.70710678, 0, -0.70710678], rtol=1e-6)
    g = MeanStdFilter((), clip=None)
    out = [float(g(v)) for v in (1, 2, 3)]
    np.testing.assert_allclose(out, [0.0, 0.70710678, 0.99999999], rtol=1e-6)


def test_mean_std_filter_apply_changes_and_sync_numbers():
    a, b = MeanStdFilter(()), MeanStdFilter(())
    a(1)
    a(2)
    summary = lambda f: [f.running_stats.n, float(f.running_stats.mean), f.buffer.n]  # noqa: E731
    assert summary(a) == [2, 1.5, 2]
    b(10)
    a.apply_changes(b)
    assert summary(a) == pytest.approx([3, 13 / 3, 2])
    a.apply_changes(b, with_buffer=True)
    assert summary(a) == [4, 5.75, 1]
    a.sync(b)
    assert summary(a) == [1, 10.0, 1]


def test_mean_std_filter_buffer_sequence():
    filt = MeanStdFilter((3,))
    for i in range(5):
        filt(np.full(3, float(i)))
    assert filt.running_stats.n == filt.buffer.n == 5
    filt2 = MeanStdFilter((3,))
    filt2.sync(filt)
    assert filt2.running_stats.n == filt2.buffer.n == 5
    filt.reset_buffer()
    assert filt.buffer.n == 0 and filt2.buffer.n == 5
    filt.apply_changes(filt2, with_buffer=False)
    assert (filt.buffer.n, filt.running_stats.n) == (0, 10)
    filt.apply_changes(filt2, with_buffer=True)
    assert (filt.buffer.n, filt.running_stats.n) == (5, 15)
    filt.clear_buffer()
    assert filt.buffer.n == 0


def test_demean_destd_clip_on_known_data():
    data = np.array([[0.0, 10.0], [2.0, 30.0], [4.0, 50.0]])
    f = MeanStdFilter((2,), clip=None)
    f(data)
    x = np.array([4.0, 10.0])
    np.testing.assert_allclose(f(x, update=False), [1.0, -1.0], rtol=1e-6)
    assert f.running_stats.n == 3  # update=False left the stats alone
    only_mean = MeanStdFilter((2,), destd=False, clip=None)
    only_mean(data)
    np.testing.assert_allclose(only_mean(x, update=False), [2.0, -20.0])
    only_std = MeanStdFilter((2,), demean=False, clip=None)
    only_std(data)
    np.testing.assert_allclose(only_std(x, update=False), [2.0, 0.5], rtol=1e-6)
    clipped = MeanStdFilter((2,), clip=0.5)
    clipped(data)
    np.testing.assert_allclose(clipped(x, update=False), [0.5, -0.5])


def test_filter_dtype_and_input_untouched():
    f = MeanStdFilter((4,))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    before = x.copy()
    assert f(x).dtype == np.float32
    np.testing.assert_array_equal(x, before)
    assert MeanStdFilter((2,))(np.array([1, 2])).dtype == np.float64


def test_batch_call_matches_rows():
    rng = np.random.default_rng(3)
    batch = rng.normal(2.0, 3.0, size=(16, 4)).astype(np.float32)
    fb, fr = MeanStdFilter((4,)), MeanStdFilter((4,))
    out_b = fb(batch)
    for row in batch:
        fr(row)
    # Same statistics either way...
    assert fb.running_stats.n == fr.running_stats.n == fb.buffer.n == 16
    np.testing.assert_allclose(fb.running_stats.mean, fr.running_stats.mean, rtol=1e-6)
    np.testing.assert_allclose(fb.running_stats.var, fr.running_stats.var, rtol=1e-5)
    # ...and the batch is normalised with the stats after pushing all of it.
    rows = np.stack([fr(row, update=False) for row in batch])
    np.testing.assert_allclose(out_b, rows, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fb(batch, update=False), out_b, rtol=1e-6)
    assert fb(np.zeros((0, 4), np.float32)).shape == (0, 4)


def test_filter_bad_shape():
    with pytest.raises(ValueError, match=r"Unexpected input shape \(5,\), expected \(4,\)"):
        MeanStdFilter((4,))(np.zeros(5))


def test_copy_is_independent_and_picklable():
    f = MeanStdFilter((2,))
    f(np.ones((3, 2)))
    c = f.copy()
    c(np.zeros((5, 2)))
    assert f.running_stats.n == 3 and c.running_stats.n == 8
    p = pickle.loads(pickle.dumps(f))
    np.testing.assert_array_equal(p.running_stats.mean, f.running_stats.mean)
    assert isinstance(f.as_serializable(), MeanStdFilter) and f.as_serializable() is not f


def test_nested_dict_tuple_shapes():
    shape = {"pos": (2,), "id": None, "pair": ((3,), ())}
    f = MeanStdFilter(shape, clip=None)
    obs = {"pos": np.array([1.0, 2.0]), "id": 7, "pair": (np.zeros(3), 1.0)}
    out = f(obs)
    assert out["id"] == 7
    np.testing.assert_array_equal(out["pos"], [0.0, 0.0])
    f({"pos": np.array([[3.0, 2.0]]), "id": 1, "pair": (np.ones((1, 3)), np.array([3.0]))})
    assert f.running_stats["pos"].n == 2 and f.running_stats["id"] is None
    assert f.running_stats["pair"][1].n == 2
    back = MeanStdFilter.from_state(f.get_state())
    assert back.shape == f.shape
    np.testing.assert_allclose(back.running_stats["pair"][0].mean, [0.5, 0.5, 0.5])
    with pytest.raises(ConfigError, match="Unsupported filter shape"):
        MeanStdFilter({"a": "nope"})


def test_state_roundtrip_and_merge_states():
    rng = np.random.default_rng(4)
    data = [rng.normal(i, 1.0 + i, size=(10 + i, 3)) for i in range(3)]
    base = MeanStdFilter((3,))
    base(data[0])
    workers = [base.copy() for _ in range(2)]
    for w in workers:
        w.reset_buffer()
    workers[0](data[1])
    workers[1](data[2])
    restored = MeanStdFilter((3,))
    restored.set_state(workers[0].get_state())
    assert restored.get_state()["running_stats"]["num_pushes"] == len(data[0]) + len(data[1])
    merged = MeanStdFilter.from_state(
        MeanStdFilter.merge_states([base.get_state()] + [w.get_state() for w in workers])
    )
    _check_stats(merged.running_stats, np.concatenate(data))
    assert merged.buffer.n == 0
    with pytest.raises(ValueError, match="at least one state"):
        MeanStdFilter.merge_states([])


# -- ConcurrentMeanStdFilter ---------------------------------------------------------------
def test_concurrent_filter_under_threads():
    f = ConcurrentMeanStdFilter((4,))
    rng = np.random.default_rng(5)
    chunks = [rng.normal(size=(50, 4)) for _ in range(8)]

    def work(chunk: np.ndarray) -> None:
        for i in range(0, len(chunk), 5):
            f(chunk[i : i + 5])
            if i % 20 == 0:
                f.get_state()

    threads = [threading.Thread(target=work, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    _check_stats(f.running_stats, np.concatenate(chunks))
    assert f.buffer.n == 400
    assert type(f.as_serializable()) is MeanStdFilter
    assert type(f.copy()) is ConcurrentMeanStdFilter
    p = pickle.loads(pickle.dumps(f))
    assert p.running_stats.n == 400 and p(np.zeros(4)).shape == (4,)


# -- get_filter -----------------------------------------------------------------------------
def test_get_filter_names_and_callable():
    f = get_filter("MeanStdFilter", (3,))
    assert type(f) is MeanStdFilter and f.clip is None
    c = get_filter("ConcurrentMeanStdFilter", (3,))
    assert type(c) is ConcurrentMeanStdFilter and c.clip is None
    assert isinstance(get_filter("NoFilter", (3,)), NoFilter)
    custom = get_filter(lambda shape: MeanStdFilter(shape, clip=2.0), (5,))
    assert custom.shape == (5,) and custom.clip == 2.0


def test_get_filter_errors():
    with pytest.raises(
        ConfigError,
        match=r"Unknown observation_filter: 'MeanStdFiltr'; expected one of 'MeanStdFilter', "
        r"'ConcurrentMeanStdFilter', 'NoFilter' or a callable\(shape\).*Did you mean",
    ):
        get_filter("MeanStdFiltr", (3,))
    with pytest.raises(ConfigError, match=r"Unknown observation_filter: 42;") as info:
        get_filter(42, (3,))
    assert "Did you mean" not in str(info.value)


# -- FilterManager ----------------------------------------------------------------------------
class FakeWorker:
    """Stands in for a remote RolloutWorker: just its filters API."""

    def __init__(self, shape=(3,)):
        self.filters = {"default_policy": MeanStdFilter(shape)}

    def get_filters(self, flush_after=False):
        out = {k: f.as_serializable() for k, f in self.filters.items()}
        if flush_after:
            for f in self.filters.values():
                f.reset_buffer()
        return out

    def sync_filters(self, new_filters):
        assert all(k in new_filters for k in self.filters)
        for k in self.filters:
            self.filters[k].sync(new_filters[k])


class FakeWorkerSet:
    """Runs funcs on in-process workers; results go through pickle like Ray's transfer."""

    def __init__(self, workers, answering=None):
        self.workers = workers
        self.answering = answering if answering is not None else len(workers)
        self.calls = []

    def foreach_env_runner(self, func, *, local_env_runner=True, timeout_seconds=None, **kw):
        assert local_env_runner is False
        self.calls.append(timeout_seconds)
        return [pickle.loads(pickle.dumps(func(w))) for w in self.workers[: self.answering]]

    def num_healthy_remote_env_runners(self):
        return len(self.workers)


def test_synchronize_two_workers():
    rng = np.random.default_rng(6)
    local = {"default_policy": MeanStdFilter((3,))}
    d0 = rng.normal(size=(10, 3))
    local["default_policy"](d0)
    local["default_policy"].reset_buffer()
    workers = [FakeWorker(), FakeWorker()]
    d1, d2 = rng.normal(1.0, 2.0, size=(7, 3)), rng.normal(-3.0, 0.5, size=(12, 3))
    workers[0].filters["default_policy"](d1)
    workers[1].filters["default_policy"](d2)
    ws = FakeWorkerSet(workers)
    FilterManager.synchronize(local, ws, timeout_seconds=5.0)
    assert ws.calls == [5.0, 5.0]
    lf = local["default_policy"]
    _check_stats(lf.running_stats, np.concatenate([d0, d1, d2]))
    assert lf.buffer.n == 0
    for w in workers:
        rf = w.filters["default_policy"]
        assert rf.running_stats.n == 29 and rf.buffer.n == 0
        np.testing.assert_allclose(rf.running_stats.mean, lf.running_stats.mean)
        np.testing.assert_allclose(rf.running_stats.var, lf.running_stats.var)
    # A second round with no new data changes nothing (deltas are not counted twice).
    FilterManager.synchronize(local, ws)
    assert lf.running_stats.n == 29


def test_synchronize_spec_case_and_flags():
    local = {"p": MeanStdFilter(())}
    for i in range(10):
        local["p"](i)
    local["p"].reset_buffer()
    w = FakeWorker(())
    w.filters = {"p": MeanStdFilter(())}
    for i in range(10):
        w.filters["p"](i)
    ws = FakeWorkerSet([w])
    FilterManager.synchronize(local, ws, update_remote=False, use_remote_data_for_update=False)
    assert ws.calls == []
    FilterManager.synchronize(local, ws)
    assert (local["p"].running_stats.n, local["p"].buffer.n) == (20, 0)
    assert (w.filters["p"].running_stats.n, w.filters["p"].buffer.n) == (20, 0)


def test_synchronize_unknown_policy_and_missing_runner(caplog):
    w = FakeWorker()
    w.filters["default_policy"](np.ones(3))
    with pytest.raises(UnknownPolicyError, match="policy 'default_policy'.*local filters are for"):
        FilterManager.synchronize({"other": MeanStdFilter((3,))}, FakeWorkerSet([w]))
    ws = FakeWorkerSet([FakeWorker(), FakeWorker()], answering=1)
    with caplog.at_level(logging.ERROR, logger="envrunners.utils.filter_manager"):
        FilterManager.synchronize({"default_policy": MeanStdFilter((3,))}, ws, timeout_seconds=1)
    assert "got filters from 1 of 2 healthy remote env runners" in caplog.text


def test_synchronize_through_ray_object_store(ray_session):
    local = {"default_policy": MeanStdFilter((3,))}
    workers = [FakeWorker(), FakeWorker()]
    for w in workers:
        w.filters["default_policy"](np.arange(6.0).reshape(2, 3))
    FilterManager.synchronize(local, FakeWorkerSet(workers))
    assert workers[1].filters["default_policy"].running_stats.n == 4
