"""Tests for ``SingleAgentEpisode`` (spec §7.2 and the §18.12 catalogue)."""

from __future__ import annotations

import copy
import time

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envrunners.env.single_agent_episode import SingleAgentEpisode
from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from envrunners.errors import SpaceError

OBS_SPACE = gym.spaces.Discrete(1000)
ACT_SPACE = gym.spaces.Discrete(4)


def _stepped(n, *, terminated_at_end=False, extras=True, id_=None):
    """An episode reset with obs 0 and stepped n times: obs i, action i%4, reward i/10."""
    ep = SingleAgentEpisode(id_, observation_space=OBS_SPACE, action_space=ACT_SPACE)
    ep.add_env_reset(0, {"t": 0})
    for i in range(1, n + 1):
        ep.add_env_step(
            i,
            (i - 1) % 4,
            i / 10,
            {"t": i},
            terminated=terminated_at_end and i == n,
            extra_model_outputs={"logp": -i / 100} if extras else None,
        )
    return ep


def _data(n, lookback=0):
    obs = list(range(n + 1))
    return dict(
        observations=obs,
        actions=[i % 4 for i in range(n)],
        rewards=[float(i) for i in range(n)],
        len_lookback_buffer=lookback,
    )


def assert_same_episode(a, b, *, check_numpy=True):
    """Episodes hold the same data, counters, flags and ids."""
    assert (a.id_, a.t_started, a.t) == (b.id_, b.t_started, b.t)
    assert (a.is_terminated, a.is_truncated) == (b.is_terminated, b.is_truncated)
    for name in ("observations", "infos", "actions", "rewards"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.lookback == y.lookback, name
        if check_numpy:
            assert x == y, name
        else:
            assert _as_list(x.get(slice(-x.len_incl_lookback() - 1, None))) == _as_list(
                y.get(slice(-y.len_incl_lookback() - 1, None))
            ), name
    assert set(a.extra_model_outputs) == set(b.extra_model_outputs)
    for k in a.extra_model_outputs:
        assert _as_list(a.get_extra_model_outputs(k)) == _as_list(b.get_extra_model_outputs(k))


def _as_list(x):
    return [v.item() if isinstance(v, np.generic) else v for v in list(x)]


# ------------------------------------------------------------------ construction
def test_init_lookback_and_t():
    ep = SingleAgentEpisode(**_data(100))
    assert len(ep) == 100 and ep.t == 100 and ep.t_started == 0
    ep = SingleAgentEpisode(**_data(100, lookback=10))
    assert len(ep) == 90 and ep.t == 90 and len(ep.rewards) == 90 and len(ep.rewards.data) == 100
    ep = SingleAgentEpisode(**_data(100, lookback=10), t_started=50)
    assert ep.t == 140 and len(ep) == 90


def test_init_auto_lookback_makes_all_data_lookback():
    ep = SingleAgentEpisode(observations=[0, 1, 2, 3, 4], actions=[1, 2, 3, 4], rewards=[0.1] * 4)
    assert len(ep) == 0 and ep.t_started == 0 and ep.t == 0 and ep.observations.lookback == 4
    assert ep.get_observations() == [4]
    ep = SingleAgentEpisode(**{**_data(4), "len_lookback_buffer": 99})
    assert ep.observations.lookback == 4 and len(ep) == 0


def test_init_defaults():
    ep = SingleAgentEpisode()
    assert len(ep.id_) == 32 and int(ep.id_, 16) >= 0
    assert not ep.is_reset and not ep.is_done and not ep.is_numpy
    assert ep.custom_data == {} and ep.t == ep.t_started == 0 and len(ep) == 0
    ep = SingleAgentEpisode(observations=[1, 2], actions=[0], rewards=[1.0], len_lookback_buffer=0)
    assert ep.get_infos() == [{}, {}]
    ep.infos.get(0)["x"] = 1
    assert ep.get_infos(1) == {}  # separate dicts


def test_init_numpy_columns_are_finalized_and_inputs_not_aliased():
    obs = [0, 1, 2]
    ep = SingleAgentEpisode(
        observations=obs, actions=[0, 1], rewards=[0.0, 1.0], len_lookback_buffer=0
    )
    ep.add_env_step(3, 0, 0.0)
    assert obs == [0, 1, 2]
    ep = SingleAgentEpisode(
        observations=np.arange(3), actions=np.arange(2), rewards=np.zeros(2), len_lookback_buffer=0
    )
    assert ep.is_numpy and ep.observations.finalized and len(ep) == 2


@pytest.mark.parametrize("bad", [-1, "all", 1.5])
def test_init_bad_lookback(bad):
    with pytest.raises(ValueError, match="len_lookback_buffer must be 'auto' or an int >= 0"):
        SingleAgentEpisode(**{**_data(3), "len_lookback_buffer": bad})


def test_init_inconsistent_lengths_raise_assertion():
    with pytest.raises(AssertionError, match=r"len\(observations\)=3 must be len\(actions\)\+1=3"):
        SingleAgentEpisode(
            observations=[0, 1, 2], actions=[0, 1], rewards=[0.0], len_lookback_buffer=0
        )
    with pytest.raises(AssertionError, match=r"len\(observations\)=2 != len\(infos\)=1"):
        SingleAgentEpisode(
            observations=[0, 1], infos=[{}], actions=[0], rewards=[0.0], len_lookback_buffer=0
        )
    with pytest.raises(
        AssertionError, match=r"len\(extra_model_outputs\['v'\]\)=2 != len\(actions\)=1"
    ):
        SingleAgentEpisode(
            observations=[0, 1],
            actions=[0],
            rewards=[0.0],
            extra_model_outputs={"v": [1, 2]},
            len_lookback_buffer=0,
        )


# ------------------------------------------------------------------ adding data
def test_add_env_reset():
    ep = SingleAgentEpisode(observation_space=OBS_SPACE)
    ep.add_env_reset(5, {"a": 1})
    assert len(ep.observations) == 1 and len(ep.infos) == 1 and ep.t == ep.t_started == 0
    assert len(ep) == 0 and ep.is_reset and ep.get_infos(0) == {"a": 1}
    assert ep._start_time is not None
    with pytest.raises(AssertionError, match="add_env_reset\\(\\) was already called"):
        ep.add_env_reset(6)
    fresh = SingleAgentEpisode()
    fresh.add_env_reset(0)
    assert fresh.get_infos(-1) == {}


def test_add_env_step_counts_and_flags():
    for k in (1, 5, 17):
        ep = _stepped(k, terminated_at_end=True)
        assert ep.t == len(ep.observations) - 1 == k and ep.t_started == 0
        assert len(ep.actions) == len(ep.rewards) == len(ep.infos) - 1 == k
        assert ep.is_terminated and not ep.is_truncated and ep.is_done
        assert ep.get_extra_model_outputs("logp", -1) == -k / 100
        assert ep._last_added_observation == k and ep._last_added_infos == {"t": k}
    ep = _stepped(2)
    ep.add_env_step(3, 1, 1.0, truncated=True)
    assert ep.is_truncated and not ep.is_terminated and ep.get_infos(-1) == {}


def test_add_env_step_errors():
    ep = _stepped(2, terminated_at_end=True)
    with pytest.raises(AssertionError, match="The agent is already done: no data can be added"):
        ep.add_env_step(9, 0, 0.0)
    with pytest.raises(AssertionError, match="Call add_env_reset\\(\\) before add_env_step\\(\\)"):
        SingleAgentEpisode().add_env_step(1, 0, 0.0)
    with pytest.raises(AssertionError, match="Cannot reset an episode that is already done"):
        SingleAgentEpisode(terminated=True).add_env_reset(0)


def test_add_env_step_after_to_numpy_concatenates():
    ep = _stepped(3).to_numpy()
    ep.add_env_step(4, 3, 0.4, extra_model_outputs={"logp": -0.04, "new": 1})
    assert ep.is_numpy and isinstance(ep.observations.data, np.ndarray)
    assert ep.get_observations().tolist() == [0, 1, 2, 3, 4]
    assert ep.get_actions().tolist() == [0, 1, 2, 3] and ep.t == 4
    assert ep.extra_model_outputs["new"].finalized and ep.get_extra_model_outputs(
        "new"
    ).tolist() == [1]


def test_validate_check_spaces_on_demand():
    ep = _stepped(3)
    ep.validate(check_spaces=True)
    # 7 is not in Discrete(4): not checked per step.
    ep.add_env_step(4, 7, 0.0, extra_model_outputs={"logp": 0.0})
    with pytest.raises(SpaceError, match=r"The action at index 3 is not in Discrete\(4\): 7"):
        ep.validate(check_spaces=True)
    ep.to_numpy()
    with pytest.raises(SpaceError, match="The action at index 3"):
        ep.validate(check_spaces=True)


def test_validate_t_mismatch():
    ep = _stepped(2)
    ep.t = 5
    with pytest.raises(AssertionError, match=r"t - t_started = 5 - 0 != len\(rewards\)=2"):
        ep.validate()


# ------------------------------------------------------------------ properties
def test_properties_and_spaces():
    ep = _stepped(2)
    assert ep.observation_space == OBS_SPACE and ep.observations.space == OBS_SPACE
    ep.action_space = gym.spaces.Discrete(5)
    assert ep.actions.space == gym.spaces.Discrete(5)
    ep.observation_space = gym.spaces.Discrete(7)
    assert ep.observations.space_struct == gym.spaces.Discrete(7)
    assert ep.rewards.space == gym.spaces.Box(-np.inf, np.inf, (), np.float32)
    ep.custom_data["k"] = 1
    assert ep.custom_data == {"k": 1}


def test_return_duration_steps_repr():
    ep = SingleAgentEpisode(**_data(4, lookback=1), t_started=3)
    assert ep.get_return() == pytest.approx(1 + 2 + 3)  # lookback reward 0.0 excluded
    assert ep.env_steps() == ep.agent_steps() == len(ep) == 3
    assert repr(ep) == f"SAEps(len=3 done=False R=6.0 id_={ep.id_})"
    assert SingleAgentEpisode().get_duration_s() == 0.0
    ep = _stepped(1)
    time.sleep(0.001)
    ep.add_env_step(2, 0, 0.0)
    assert ep.get_duration_s() > 0.0
    assert SingleAgentEpisode().get_return() == 0.0


def test_getitem_only_slices_and_deprecated_methods():
    ep = _stepped(3)
    with pytest.raises(NotImplementedError, match="only supports slicing"):
        ep[0]
    with pytest.raises(ValueError, match="add_temporary_timestep_data\\(\\) is deprecated"):
        ep.add_temporary_timestep_data("k", 1)
    with pytest.raises(ValueError, match="get_temporary_timestep_data\\(\\) is deprecated"):
        ep.get_temporary_timestep_data("k")


# ------------------------------------------------------------------ getters / setters
@pytest.mark.parametrize("numpy", [False, True])
def test_getter_docstring_examples(numpy):
    ep = SingleAgentEpisode(
        observations=[0, 1, 2, 3],
        actions=[1, 2, 3],
        rewards=[1.0, 2.0, 3.0],
        observation_space=gym.spaces.Discrete(4),
        action_space=gym.spaces.Discrete(4),
        len_lookback_buffer=0,
    )
    if numpy:
        ep.to_numpy()
    assert ep.get_observations(-1) == 3
    assert list(ep.get_observations([0, 2])) == [0, 2]
    assert list(ep.get_observations(slice(-2, None))) == [2, 3]
    assert list(ep.get_observations(slice(-6, -2), fill=-9)) == [-9, -9, 0, 1]
    assert list(ep.get_observations(slice(2, 5), fill=-7)) == [2, 3, -7]
    assert ep.get_observations(2, one_hot_discrete=True).tolist() == [0, 0, 1, 0]
    got = ep.get_observations(-1, neg_index_as_lookback=True, fill=0.0, one_hot_discrete=True)
    assert got.tolist() == [0, 0, 0, 0]
    assert ep.get_actions(0, one_hot_discrete=True).tolist() == [0, 1, 0, 0]
    assert list(ep.get_rewards(slice(1, None))) == [2.0, 3.0]
    assert ep.get_rewards(-1, neg_index_as_lookback=True, fill=0.0) == 0.0
    assert ep.get_infos(-1) == {} and ep.get_infos(9, fill={"x": 0}) == {"x": 0}


def test_getters_with_lookback():
    ep = SingleAgentEpisode(**_data(10, lookback=4), t_started=4)
    assert ep.get_observations(0) == 4 and ep.get_observations(-1, neg_index_as_lookback=True) == 3
    assert ep.get_actions(-2, neg_index_as_lookback=True) == 2
    assert ep.get_rewards(slice(-2, 1), neg_index_as_lookback=True) == [2.0, 3.0, 4.0]
    assert ep.get_observations(slice(-6, -3), neg_index_as_lookback=True, fill=-1) == [-1, -1, 0]


def test_extra_model_outputs_getters_and_setters():
    ep = _stepped(4)
    assert ep.get_extra_model_outputs("logp") == [-0.01, -0.02, -0.03, -0.04]
    assert ep.get_extra_model_outputs("logp", slice(-5, 1), fill=0.0) == [0.0, -0.01]
    ep.set_extra_model_outputs(key="logp", new_data=1.0, at_indices=0)
    assert ep.get_extra_model_outputs("logp", 0) == 1.0
    with pytest.raises(
        KeyError, match="This episode has no extra model output 'vf'; it has \\['logp'\\]"
    ):
        ep.get_extra_model_outputs("vf")
    with pytest.raises(KeyError, match="no extra model output 'vf'"):
        ep.set_extra_model_outputs(key="vf", new_data=1.0, at_indices=0)


@pytest.mark.parametrize("numpy", [False, True])
def test_setters(numpy):
    ep = _stepped(4)
    if numpy:
        ep.to_numpy()
    ep.set_observations(new_data=[10, 20], at_indices=slice(-2, None))
    ep.set_actions(new_data=3, at_indices=0)
    ep.set_rewards(new_data=[0.0, 0.0, 0.0, 5.0])
    ep.set_infos(new_data={"z": 1}, at_indices=-1)
    assert list(ep.get_observations()) == [0, 1, 2, 10, 20]
    assert ep.get_actions(0) == 3 and ep.get_return() == 5.0 and ep.get_infos(-1) == {"z": 1}
    with pytest.raises(IndexError, match="Cannot set 1 items at 4 positions"):
        ep.set_rewards(new_data=[1.0])
    with pytest.raises(IndexError, match="out of range"):
        ep.set_actions(new_data=1, at_indices=4)


# ------------------------------------------------------------------ to_numpy / data dict
def test_to_numpy():
    ep = _stepped(5)
    assert not ep.is_numpy
    assert ep.to_numpy() is ep
    assert ep.is_numpy and isinstance(ep.get_observations(), np.ndarray)
    assert ep.get_actions().tolist() == [0, 1, 2, 3, 0]
    assert ep.get_rewards().tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert isinstance(ep.get_extra_model_outputs("logp"), np.ndarray)
    assert isinstance(ep.infos.data, list) and not ep.infos.finalized
    reset_only = SingleAgentEpisode()
    reset_only.add_env_reset(np.zeros(2))
    reset_only.to_numpy()
    assert reset_only.observations.finalized and not reset_only.is_numpy


def test_to_numpy_nested_observations():
    space = gym.spaces.Dict(
        {"a": gym.spaces.Box(-1, 1, (2,), np.float32), "b": gym.spaces.Discrete(3)}
    )
    ep = SingleAgentEpisode(observation_space=space, action_space=ACT_SPACE)
    ep.add_env_reset({"a": np.zeros(2, np.float32), "b": 0})
    for i in range(3):
        ep.add_env_step({"a": np.full(2, i, np.float32), "b": i}, 1, 1.0)
    ep.to_numpy()
    obs = ep.get_observations()
    assert obs["a"].shape == (4, 2) and obs["b"].tolist() == [0, 0, 1, 2]
    assert ep.get_observations(-1, one_hot_discrete=True)["b"].tolist() == [0, 0, 1]
    ep.add_env_step({"a": np.ones(2, np.float32), "b": 1}, 0, 0.0)
    assert ep.get_observations()["b"].tolist() == [0, 0, 1, 2, 1]


@pytest.mark.parametrize("numpy", [False, True])
def test_get_data_dict(numpy):
    ep = SingleAgentEpisode(**_data(6, lookback=2), t_started=10, terminated=True)
    if numpy:
        ep.to_numpy()
    d = ep.get_data_dict()
    assert set(d) == {
        "obs",
        "infos",
        "actions",
        "rewards",
        "terminateds",
        "truncateds",
        "t",
        "eps_id",
    }
    for v in d.values():
        assert len(v) == len(ep) == 4
        assert isinstance(v, np.ndarray) == numpy
    assert list(d["obs"]) == [2, 3, 4, 5] and list(d["actions"]) == [2, 3, 0, 1]
    assert list(d["rewards"]) == [2.0, 3.0, 4.0, 5.0] and list(d["t"]) == [10, 11, 12, 13]
    assert list(d["terminateds"]) == [False, False, False, True]
    assert not any(d["truncateds"]) and list(d["eps_id"]) == [ep.id_] * 4
    assert SingleAgentEpisode().get_data_dict()["obs"] == []


def test_get_data_dict_includes_extras():
    d = _stepped(3).to_numpy().get_data_dict()
    assert d["logp"].tolist() == [-0.01, -0.02, -0.03]


def test_get_sample_batch():
    pytest.importorskip("envrunners.policy.sample_batch")
    ep = _stepped(5).to_numpy()
    batch = ep.get_sample_batch()
    assert len(batch) == 5 and batch["t"].tolist() == [0, 1, 2, 3, 4]
    assert batch["obs"].tolist() == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------ cut
def test_cut_spec_example():
    ep = SingleAgentEpisode(
        observations=[0, 1, 2, 3, 4], actions=[1, 2, 3, 4], rewards=[0.1] * 4, len_lookback_buffer=0
    )
    succ = ep.cut(len_lookback_buffer=2)
    assert succ.observations.data == [2, 3, 4] and succ.observations.lookback == 2
    assert succ.actions.data == [3, 4] and succ.actions.lookback == 2
    assert succ.t_started == succ.t == 4 and len(succ) == 0 and succ.id_ == ep.id_
    assert succ.get_observations(-1, neg_index_as_lookback=True) == 3


def test_cut_continuity_and_independence():
    ep1 = _stepped(10)
    ep1.custom_data["nested"] = {"x": [1]}
    ep2 = ep1.cut()
    assert ep2.id_ == ep1.id_ and ep1.t == ep2.t == ep2.t_started == 10
    assert ep1.get_observations(-1) == ep2.get_observations(0)
    assert ep1.get_infos(-1) == ep2.get_infos(0)
    assert ep2.actions.data == [] and ep2.rewards.data == [] and len(ep2) == 0
    assert ep2.observation_space == OBS_SPACE and ep2.action_space == ACT_SPACE
    ep2.custom_data["nested"]["x"].append(2)
    ep2.get_infos(0)["changed"] = True
    for i in range(3):
        ep2.add_env_step(11 + i, 0, 1.0, extra_model_outputs={"logp": 0.0})
    assert ep1.t == 10 and len(ep1.observations) == 11 and ep1.custom_data["nested"] == {"x": [1]}
    assert "changed" not in ep1.get_infos(-1)
    assert ep2.t == 13 and len(ep2) == 3


def test_cut_lookback_shrinks_and_errors():
    ep = _stepped(2)
    succ = ep.cut(len_lookback_buffer=50)
    assert (
        succ.observations.lookback == 2
        and succ.get_observations(-2, neg_index_as_lookback=True) == 0
    )
    assert succ.get_extra_model_outputs("logp", -1, neg_index_as_lookback=True) == -0.02
    with pytest.raises(ValueError, match="len_lookback_buffer must be >= 0, got -1"):
        ep.cut(-1)
    ep.add_env_step(3, 0, 0.0, terminated=True)
    with pytest.raises(AssertionError, match="Cannot cut\\(\\) an episode that is already done"):
        ep.cut()


def test_cut_of_numpy_episode_stays_numpy():
    ep = _stepped(5).to_numpy()
    for lb in (0, 2):
        succ = ep.cut(lb)
        assert succ.is_numpy and succ.observations.finalized and len(succ) == 0
        succ.add_env_step(6, 1, 0.5, extra_model_outputs={"logp": 0.0})
        assert succ.get_actions().tolist() == [1] and succ.get_observations().tolist() == [5, 6]
        assert ep.get_observations().tolist() == [0, 1, 2, 3, 4, 5]


def test_cut_of_unreset_episode():
    succ = SingleAgentEpisode().cut()
    assert not succ.is_reset and succ.t_started == 0


# ------------------------------------------------------------------ slice
@pytest.mark.parametrize("n, split", [(100, 50), (99, 33)])
def test_slices_numpy(n, split):
    ep = _stepped(n).to_numpy()
    e1, e2 = ep[:split], ep.slice(slice(split, None))
    assert e1.is_numpy and e2.is_numpy and len(e1) == split and len(e2) == n - split
    assert e1.id_ == e2.id_ == ep.id_ and e1.t == split and e2.t_started == split
    assert e1.get_observations(-1) == e2.get_observations(0)


def test_slices_with_lookback_and_t_started():
    ep = SingleAgentEpisode(**_data(60, lookback=10), t_started=15)
    e1, e2 = ep[:20], ep[20:]
    assert (e1.t_started, e1.t, e2.t_started, e2.t) == (15, 35, 35, 65)
    assert e1.observations.lookback == 10 and e2.observations.lookback == 10
    assert e1.get_observations(-1, neg_index_as_lookback=True) == 9
    assert e2.get_observations(-1, neg_index_as_lookback=True) == 29
    assert e2.get_actions(-10, neg_index_as_lookback=True) == 20 % 4
    assert e2.get_observations(-1) == 60


def test_slice_docstring_example_and_flags():
    ep = SingleAgentEpisode(
        observations=[0, 1, 2, 3, 4, 5],
        actions=[1, 2, 3, 4, 5],
        rewards=[0.1, 0.2, 0.3, 0.4, 0.5],
        len_lookback_buffer=0,
        terminated=True,
    )
    s = ep[:1]
    assert s.get_observations() == [0, 1] and s.get_actions() == [1] and not s.is_done
    s = ep[-2:]
    assert s.get_observations() == [3, 4, 5] and s.get_actions() == [4, 5]
    assert s.get_rewards() == [0.4, 0.5] and s.is_terminated and s.t_started == 3
    assert len(ep[2:2]) == 0 and ep[2:1].t == ep[2:1].t_started == 2
    assert ep.slice(slice(1, 4), len_lookback_buffer=0).observations.lookback == 0
    assert ep.slice(slice(3, None), len_lookback_buffer=5).observations.lookback == 3
    with pytest.raises(ValueError, match="needs step 1, got 2"):
        ep[::2]


def test_slice_copies_data():
    ep = _stepped(6).to_numpy()
    s = ep[2:4]
    s.set_observations(new_data=99, at_indices=0)
    assert ep.get_observations(2) == 2


# ------------------------------------------------------------------ concat
def test_concat_episode_spec():
    ep1 = _stepped(100)
    ep2 = ep1.cut()
    for i in range(101, 201):
        ep2.add_env_step(i, (i - 1) % 4, i / 10, {"t": i}, extra_model_outputs={"logp": -i / 100})
    ep2.custom_data["a"] = 2
    ep1.custom_data.update(a=1, b=1)
    ep1.concat_episode(ep2)
    assert ep1.t_started == 0 and ep1.t == 200
    assert len(ep1.actions) == len(ep1.rewards) == len(ep1.get_extra_model_outputs("logp")) == 200
    assert len(ep1.observations) == len(ep1.infos) == 201
    assert ep2.observations[5] == ep1.observations[105]
    assert ep1.custom_data == {"a": 2, "b": 1}
    assert_same_episode(ep1, _stepped(200, id_=ep1.id_))


def test_concat_episode_errors_leave_self_intact():
    ep1 = _stepped(5)
    ep2 = ep1.cut()
    ep2.add_env_step(6, 0, 0.0, extra_model_outputs={"logp": 0.0})
    wrong_id = copy.deepcopy(ep2)
    wrong_id.id_ = "other"
    with pytest.raises(AssertionError, match="Cannot concat episodes with different ids"):
        ep1.concat_episode(wrong_id)
    shifted = ep1.cut()
    shifted.t_started = shifted.t = 4
    with pytest.raises(AssertionError, match=r"self.t \(5\) must equal other.t_started \(4\)"):
        ep1.concat_episode(shifted)
    bad_obs = ep1.cut()
    bad_obs.set_observations(new_data=77, at_indices=0)
    with pytest.raises(AssertionError, match="first observation differs"):
        ep1.concat_episode(bad_obs)
    other_keys = SingleAgentEpisode(ep1.id_, observations=[5], infos=[{"t": 5}], t_started=5)
    other_keys.add_env_step(6, 0, 0.0, extra_model_outputs={"vf": 0.0})
    with pytest.raises(AssertionError, match="extra_model_outputs keys differ"):
        ep1.concat_episode(other_keys)
    assert ep1.t == 5 and len(ep1.observations) == 6
    done = _stepped(5, terminated_at_end=True)
    succ = SingleAgentEpisode(done.id_, observations=[5], t_started=5)
    with pytest.raises(AssertionError, match="already done"):
        done.concat_episode(succ)


def test_concat_numpy_and_list_mix():
    ep1 = _stepped(4).to_numpy()
    ep2 = ep1.cut(1)
    ep2.add_env_step(5, 0, 0.5, extra_model_outputs={"logp": -0.05}, truncated=True)
    ep1.concat_episode(ep2)
    assert (
        ep1.is_numpy and ep1.get_observations().tolist() == [0, 1, 2, 3, 4, 5] and ep1.is_truncated
    )
    ep3 = _stepped(4)
    ep4 = ep3.cut(1)
    ep4.add_env_step(5, 0, 0.5, extra_model_outputs={"logp": -0.05})
    ep3.concat_episode(ep4.to_numpy())
    assert [int(x) for x in ep3.get_observations()] == [0, 1, 2, 3, 4, 5] and not ep3.is_numpy


# ------------------------------------------------------------------ state
@pytest.mark.parametrize("numpy", [False, True])
def test_get_and_from_state(numpy):
    ep = _stepped(7)
    ep.agent_id, ep.module_id, ep.multi_agent_episode_id = "a0", "m0", "ma"
    ep.custom_data["x"] = 3
    ep = ep.cut(3)
    for i in range(8, 11):
        ep.add_env_step(i, 1, 1.0, extra_model_outputs={"logp": 0.5}, terminated=i == 10)
    if numpy:
        ep.to_numpy()
    state = ep.get_state()
    assert state["observation_space"] == {
        "space": "discrete",
        "n": 1000,
        "start": 0,
        "dtype": "int64",
    }
    restored = SingleAgentEpisode.from_state(state)
    assert_same_episode(restored, ep)
    for attr in (
        "agent_id",
        "module_id",
        "multi_agent_episode_id",
        "custom_data",
        "_start_time",
        "_last_step_time",
    ):
        assert getattr(restored, attr) == getattr(ep, attr), attr
    assert restored.observation_space == OBS_SPACE and restored.action_space == ACT_SPACE
    assert restored.observations.space == OBS_SPACE and restored.is_numpy == numpy
    assert restored.extra_model_outputs["logp"] == ep.extra_model_outputs["logp"]


def test_state_without_spaces_or_extras():
    ep = SingleAgentEpisode(**_data(3))
    state = ep.get_state()
    assert state["extra_model_outputs"] is None and state["observation_space"] is None
    assert_same_episode(SingleAgentEpisode.from_state(state), ep)


# ------------------------------------------------------------------ from_columns
def test_from_columns_basic():
    obs = np.arange(6, dtype=np.float32)[:, None]
    ep = SingleAgentEpisode.from_columns(
        observations=obs,
        actions=np.array([0, 1, 2, 3, 0]),
        rewards=np.ones(5, np.float32),
        extra_model_outputs={"logp": np.zeros(5, np.float32)},
        terminated=True,
        t_started=0,
        len_lookback_buffer=0,
        observation_space=gym.spaces.Box(0, 10, (1,), np.float32),
        action_space=ACT_SPACE,
    )
    assert ep.is_numpy and len(ep) == 5 and ep.t == 5 and ep.is_terminated
    assert ep.get_infos() == [{}] * 6 and ep.get_return() == 5.0
    ep.validate(check_spaces=True)
    obs[0, 0] = 99.0  # copy=True by default: the episode is unaffected
    assert ep.get_observations(0).tolist() == [0.0]


def test_from_columns_with_lookback_matches_constructor():
    n, k = 8, 3
    cols = dict(
        observations=np.arange(n + k + 1),
        actions=np.arange(n + k) % 4,
        rewards=np.arange(n + k, dtype=np.float64),
        infos=[{"i": i} for i in range(n + k + 1)],
        extra_model_outputs={"vf": np.arange(n + k) * 2.0},
    )
    fast = SingleAgentEpisode.from_columns(
        **cols,
        id_="ep",
        t_started=20,
        len_lookback_buffer=k,
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
    )
    slow = SingleAgentEpisode(
        "ep",
        **cols,
        t_started=20,
        len_lookback_buffer=k,
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
    )
    assert_same_episode(fast, slow)
    assert fast.t_started == 20 and fast.t == 28 and len(fast) == 8
    assert fast.get_observations(-1, neg_index_as_lookback=True) == 2


def test_from_columns_no_copy_shares_memory_and_nested():
    obs = {"a": np.zeros((3, 2)), "b": (np.arange(3),)}
    ep = SingleAgentEpisode.from_columns(
        observations=obs,
        actions=np.zeros(2),
        rewards=np.zeros(2),
        copy=False,
        agent_id="x",
        module_id="m",
    )
    assert ep.observations.data["a"] is obs["a"] and ep.agent_id == "x" and ep.module_id == "m"
    assert ep.get_observations(-1)["b"][0] == 2
    ep.add_env_step({"a": np.ones(2), "b": (3,)}, 1.0, 1.0)
    assert ep.get_observations()["b"][0].tolist() == [0, 1, 2, 3] and len(ep) == 3


def test_from_columns_bad_lengths():
    with pytest.raises(
        ValueError,
        match=r"len\(rewards\)=3 != len\(actions\)=2; len\(observations\)=2 != len\(actions\)\+1=3",
    ):
        SingleAgentEpisode.from_columns(
            observations=np.zeros(2), actions=np.zeros(2), rewards=np.zeros(3)
        )
    with pytest.raises(ValueError, match=r"len\(infos\)=1 != len\(actions\)\+1=3"):
        SingleAgentEpisode.from_columns(
            observations=np.zeros(3), actions=np.zeros(2), rewards=np.zeros(2), infos=[{}]
        )
    with pytest.raises(
        ValueError, match=r"len_lookback_buffer=3 must be in \[0, len\(actions\)=2\]"
    ):
        SingleAgentEpisode.from_columns(
            observations=np.zeros(3),
            actions=np.zeros(2),
            rewards=np.zeros(2),
            len_lookback_buffer=3,
        )
    with pytest.raises(
        ValueError, match=r"len\(extra_model_outputs\['v'\]\)=1 != len\(actions\)=2"
    ):
        SingleAgentEpisode.from_columns(
            observations=np.zeros(3),
            actions=np.zeros(2),
            rewards=np.zeros(2),
            extra_model_outputs={"v": np.zeros(1)},
        )


def test_from_columns_chunks_concat_to_whole():
    """A sampler's continuation chunks (lookback 1) concatenate back to the whole episode."""
    whole = _stepped(10).to_numpy()
    c1 = SingleAgentEpisode.from_columns(
        id_=whole.id_,
        observations=np.arange(5),
        actions=np.arange(4) % 4,
        rewards=np.arange(1, 5) / 10,
        infos=[{"t": i} for i in range(5)],
        extra_model_outputs={"logp": -np.arange(1, 5) / 100},
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
    )
    c2 = SingleAgentEpisode.from_columns(
        id_=whole.id_,
        observations=np.arange(3, 11),
        actions=np.arange(3, 10) % 4,
        rewards=np.arange(4, 11) / 10,
        infos=[{"t": i} for i in range(3, 11)],
        extra_model_outputs={"logp": -np.arange(4, 11) / 100},
        t_started=4,
        len_lookback_buffer=1,
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
    )
    c1.concat_episode(c2)
    assert_same_episode(c1, whole, check_numpy=False)


# ------------------------------------------------------------------ property tests
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 30), data=st.data(), numpy=st.booleans(), lookback=st.integers(0, 5))
def test_slice_then_concat_equals_original(n, data, numpy, lookback):
    ep = SingleAgentEpisode(**_data(n + lookback, lookback=lookback), t_started=7)
    if numpy:
        ep.to_numpy()
    k = data.draw(st.integers(0, n - 1))
    head, tail = ep[:k], ep[k:]
    assert len(head) + len(tail) == len(ep) and head.t == tail.t_started
    head.concat_episode(tail)
    assert_same_episode(head, ep)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 25),
    cuts=st.lists(st.integers(0, 25), max_size=4),
    lookback=st.integers(0, 4),
    numpy=st.booleans(),
)
def test_cut_continue_concat_equals_straight(n, cuts, lookback, numpy):
    straight = _stepped(n, terminated_at_end=True)
    chunks = []
    ep = SingleAgentEpisode(straight.id_, observation_space=OBS_SPACE, action_space=ACT_SPACE)
    ep.add_env_reset(0, {"t": 0})
    cut_points = {c for c in cuts if 0 < c < n}
    for i in range(1, n + 1):
        ep.add_env_step(
            i,
            (i - 1) % 4,
            i / 10,
            {"t": i},
            terminated=i == n,
            extra_model_outputs={"logp": -i / 100},
        )
        if i in cut_points:
            chunks.append(ep)
            ep = ep.cut(lookback)
            if numpy:
                chunks[-1].to_numpy()
    chunks.append(ep)
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole.concat_episode(chunk)
    assert_same_episode(whole, straight, check_numpy=False)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 20), lookback=st.integers(0, 5), numpy=st.booleans())
def test_state_round_trip_property(n, lookback, numpy):
    ep = SingleAgentEpisode(**_data(n + lookback, lookback=lookback), observation_space=OBS_SPACE)
    if numpy:
        ep.to_numpy()
    assert_same_episode(SingleAgentEpisode.from_state(ep.get_state()), ep)


def test_buffers_are_infinite_lookback_buffers():
    ep = _stepped(2)
    for name in ("observations", "infos", "actions", "rewards"):
        assert isinstance(getattr(ep, name), InfiniteLookbackBuffer)


@pytest.mark.parametrize("numpy", [False, True])
def test_pickle_round_trip(numpy):
    """Episodes travel between Ray actors by pickle (``__slots__`` included)."""
    import pickle

    ep = _stepped(4)
    if numpy:
        ep.to_numpy()
    assert_same_episode(pickle.loads(pickle.dumps(ep)), ep)


def test_concat_empty_successor_keeps_dtypes():
    ep = _stepped(3).to_numpy()
    ep.concat_episode(ep.cut())
    assert ep.get_actions().dtype == np.int64 and ep.t == 3


def test_from_columns_accepts_lists_of_items():
    ep = SingleAgentEpisode.from_columns(
        observations=[{"a": 0}, {"a": 1}], actions=[1], rewards=[0.5], infos=[{}, {"x": 1}]
    )
    assert ep.is_numpy and ep.get_observations()["a"].tolist() == [0, 1]
    assert ep.get_actions().tolist() == [1] and ep.get_infos(-1) == {"x": 1}
