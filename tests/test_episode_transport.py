"""Tests for episode pickling (``envrunners.env._episode_transport``).

Every kind of episode content must round-trip exactly through plain pickle
(each protocol), ``copy.deepcopy`` and Ray's object store, and a rebuilt
episode must stay an ordinary, mutable episode whose columns are views into one
block per episode.
"""

from __future__ import annotations

import collections
import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest

from envrunners.env import _episode_transport
from envrunners.env.multi_agent_episode import MultiAgentEpisode
from envrunners.env.single_agent_episode import SingleAgentEpisode
from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

BUFFERS = ("observations", "infos", "actions", "rewards")
Point = collections.namedtuple("Point", "x y")


def _assert_data_equal(a, b, where):
    """Same container types, same leaves (numpy: same dtype, shape and values)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        if a.dtype == object:
            assert all(x == y for x, y in zip(a.ravel(), b.ravel())), where
        else:
            np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_data_equal(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_data_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _assert_buffer_equal(a, b, where):
    assert type(a) is type(b), where
    assert (a.lookback, a.finalized) == (b.lookback, b.finalized), where
    assert a.space == b.space and a.space_struct == b.space_struct, where
    _assert_data_equal(a.data, b.data, where)


def assert_episodes_equal(a, b):
    """Field by field, every slot of ``SingleAgentEpisode`` (and a subclass's state)."""
    assert type(a) is type(b)
    for name in SingleAgentEpisode.__slots__:
        x, y = getattr(a, name), getattr(b, name)
        if name in BUFFERS:
            _assert_buffer_equal(x, y, name)
        elif name == "extra_model_outputs":
            assert list(x) == list(y)
            for key in x:
                _assert_buffer_equal(x[key], y[key], f"extra_model_outputs[{key!r}]")
        elif isinstance(x, np.ndarray) or name == "_custom_data":
            _assert_data_equal(x, y, name)
        else:
            assert x == y, name
    assert getattr(a, "__dict__", None) == getattr(b, "__dict__", None)


def _cartpole_like(n=5, lookback=2, **kwargs):
    rng = np.random.default_rng(0)
    k = n + lookback
    return SingleAgentEpisode.from_columns(
        observations=rng.standard_normal((k + 1, 4)).astype(np.float32),
        actions=rng.integers(0, 2, k),
        rewards=np.ones(k, np.float32),
        extra_model_outputs={
            "action_logp": rng.standard_normal(k).astype(np.float32),
            "action_dist_inputs": rng.standard_normal((k, 2)).astype(np.float32),
            "weights_seq_no": np.arange(k),
        },
        len_lookback_buffer=lookback,
        t_started=7,
        observation_space=gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
        action_space=gym.spaces.Discrete(2),
        start_time=1.5,
        last_step_time=2.5,
        **kwargs,
    )


def _frames_dict_tuple(n=4, namedtuple=True):
    """Dict/Tuple observations with uint8 frames, recurrent state and a namedtuple output."""
    space = gym.spaces.Dict(
        {
            "frame": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8),
            "pair": gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (2,)))),
        }
    )
    obs = {
        "frame": np.arange((n + 1) * 192, dtype=np.uint8).reshape(n + 1, 8, 8, 3),
        "pair": (np.arange(n + 1), np.zeros((n + 1, 2), np.float32)),
    }
    ep = SingleAgentEpisode.from_columns(
        observations=obs,
        actions=np.linspace(0, 1, n * 3).reshape(n, 3),
        rewards=np.arange(n, dtype=np.float32),
        infos=[{"step": i, "nested": {"a": [i]}} for i in range(n + 1)],
        extra_model_outputs={
            "state_out": {"h": np.ones((n, 16), np.float32), "c": np.zeros((n, 16), np.float32)},
            "point": Point(np.arange(n), np.arange(n) * 2.0),
            "objects": np.array([(1, 2), None, "x", 3][:n], dtype=object),
        },
        observation_space=space,
        action_space=gym.spaces.Box(0, 1, (3,)),
        terminated=True,
    )
    if not namedtuple:  # Point lives in this test module, which Ray workers cannot import
        del ep.extra_model_outputs["point"]
    ep.custom_data["note"] = np.arange(3)
    return ep


def _stepped(n=4):
    """A list-based (not numpy) episode built step by step, with infos and extras."""
    ep = SingleAgentEpisode(
        observation_space=gym.spaces.Discrete(100), action_space=gym.spaces.Discrete(4)
    )
    ep.add_env_reset(0, {"reset": True})
    for i in range(1, n + 1):
        ep.add_env_step(
            i, i % 4, float(i), {"i": i}, truncated=i == n, extra_model_outputs={"vf": i * 0.5}
        )
    return ep


def _variants():
    empty = SingleAgentEpisode(observation_space=gym.spaces.Discrete(3))
    numpyd = _stepped().to_numpy()
    zero_len = _cartpole_like(n=0, lookback=0)
    ongoing = _cartpole_like()
    successor = ongoing.cut(len_lookback_buffer=3)
    return {
        "cartpole": _cartpole_like(truncated=True),
        "frames_dict_tuple": _frames_dict_tuple(),
        "stepped_lists": _stepped(),
        "stepped_to_numpy": numpyd,
        "empty": empty,
        "zero_len": zero_len,
        "cut_successor": successor,
    }


VARIANTS = _variants()


@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_plain_pickle_round_trips_exactly(name, protocol):
    ep = VARIANTS[name]
    back = pickle.loads(pickle.dumps(ep, protocol=protocol))
    assert_episodes_equal(ep, back)
    back.validate()


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_deepcopy_round_trips_and_is_independent(name):
    ep = VARIANTS[name]
    back = copy.deepcopy(ep)
    assert_episodes_equal(ep, back)
    if ep.is_numpy and len(ep):
        back.set_rewards(new_data=np.full(len(ep), 9.0, np.float32))
        assert not np.any(ep.get_rewards() == 9.0)


def test_copy_copy_stays_shallow():
    ep = _cartpole_like()
    shallow = copy.copy(ep)
    assert shallow.observations is ep.observations
    assert shallow.extra_model_outputs is ep.extra_model_outputs
    assert_episodes_equal(ep, shallow)


def test_rebuilt_columns_are_views_into_one_block():
    back = pickle.loads(pickle.dumps(_frames_dict_tuple(), protocol=5))
    bases = {
        id(back.observations.data["frame"].base),
        id(back.observations.data["pair"][1].base),
        id(back.actions.data.base),
        id(back.rewards.data.base),
        id(back.extra_model_outputs["state_out"].data["h"].base),
    }
    assert len(bases) == 1
    assert back.observations.data["frame"].flags.writeable


def test_list_buffers_keep_the_identity_of_last_added_items():
    ep = _stepped()
    assert ep._last_added_infos is ep.infos.data[-1]
    back = pickle.loads(pickle.dumps(ep, protocol=5))
    assert back._last_added_infos is back.infos.data[-1]
    assert back._last_added_observation == back.observations.data[-1]


def test_empty_infos_come_back_as_distinct_dicts():
    back = pickle.loads(pickle.dumps(_cartpole_like(), protocol=5))
    infos = back.infos.data
    assert infos == [{}] * len(infos)
    assert len({id(i) for i in infos}) == len(infos)
    infos[0]["x"] = 1
    assert infos[1] == {}


def test_rebuilt_episode_can_be_stepped_cut_and_concatenated():
    ep = _cartpole_like(n=3, lookback=1)
    back = pickle.loads(pickle.dumps(ep, protocol=5))
    successor = back.cut(len_lookback_buffer=1)
    obs = np.zeros(4, np.float32)
    extras = {"action_logp": np.float32(0.5), "action_dist_inputs": np.zeros(2, np.float32)}
    extras["weights_seq_no"] = np.int64(3)
    successor.add_env_step(obs, 1, 1.0, terminated=True, extra_model_outputs=extras)
    back.concat_episode(successor)
    assert len(back) == 4 and back.is_terminated
    again = pickle.loads(pickle.dumps(back, protocol=5))
    assert_episodes_equal(back, again)
    again.set_rewards(new_data=np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(again.get_rewards(), np.arange(4))
    ongoing = pickle.loads(pickle.dumps(_cartpole_like(n=2), protocol=5))
    ongoing.add_env_step(obs, 0, 2.0, extra_model_outputs=extras)
    assert len(ongoing) == 3 and ongoing.get_rewards(-1) == 2.0


class _TaggedEpisode(SingleAgentEpisode):
    __slots__ = ("tag",)


class _DictEpisode(SingleAgentEpisode):
    pass


def test_subclasses_keep_their_class_and_own_state():
    tagged = _TaggedEpisode.from_columns(
        observations=np.zeros((3, 2)), actions=np.zeros(2), rewards=np.zeros(2)
    )
    tagged.tag = "x"
    free = _DictEpisode.from_columns(
        observations=np.zeros((2, 2)), actions=np.zeros(1), rewards=np.zeros(1)
    )
    free.note = {"a": 1}
    for ep in (tagged, free):
        back = pickle.loads(pickle.dumps(ep, protocol=5))
        assert_episodes_equal(ep, back)
    assert pickle.loads(pickle.dumps(tagged)).tag == "x"


def test_every_episode_slot_is_transported():
    names, _ = _episode_transport._plain_slots(SingleAgentEpisode)
    assert set(names) | {*BUFFERS, "extra_model_outputs"} == set(SingleAgentEpisode.__slots__)


def test_foreign_buffer_types_travel_whole():
    ep = _cartpole_like()

    class _Buf(InfiniteLookbackBuffer):
        __slots__ = ()

    ep.extra_model_outputs["odd"] = _Buf(np.arange(len(ep) + 2), lookback=2)
    back = copy.deepcopy(ep)
    assert type(back.extra_model_outputs["odd"]) is _Buf
    assert_episodes_equal(ep, back)


def test_multi_agent_episode_round_trips():
    ma = MultiAgentEpisode()
    ma.add_env_reset(observations={"a": 0, "b": 1}, infos={"a": {}, "b": {"x": 1}})
    for t in range(1, 4):
        ma.add_env_step(
            observations={"a": t, "b": t + 1},
            actions={"a": 0, "b": 1},
            rewards={"a": 1.0, "b": 0.5},
            extra_model_outputs={"a": {"vf": 0.1 * t}, "b": {"vf": 0.2 * t}},
        )
    ma.to_numpy()
    back = pickle.loads(pickle.dumps(ma, protocol=5))
    assert back.env_t == ma.env_t and set(back.agent_episodes) == {"a", "b"}
    for aid, sa in ma.agent_episodes.items():
        assert_episodes_equal(sa, back.agent_episodes[aid])
    assert back.get_return() == ma.get_return()


@pytest.mark.usefixtures("ray_session")
def test_ray_object_store_round_trips_exactly():
    import ray

    episodes = list(VARIANTS.values())
    back = ray.get(ray.put(episodes))
    for ep, b in zip(episodes, back):
        assert_episodes_equal(ep, b)
    # From the object store the block is read-only (as Ray's own arrays); a copy fixes it.
    cartpole = back[0]
    successor = cartpole.slice(slice(0, 2))
    successor.set_rewards(new_data=np.zeros(2, np.float32))

    @ray.remote
    def echo(eps):
        return [len(e) for e in eps], eps

    episodes[1] = _frames_dict_tuple(namedtuple=False)
    lengths, again = ray.get(echo.remote(episodes))
    assert lengths == [len(e) for e in episodes]
    for ep, b in zip(episodes, again):
        assert_episodes_equal(ep, b)


def _packed_round_trip(episodes, protocol=5):
    packed = _episode_transport.pack_episodes(episodes, SingleAgentEpisode)
    assert isinstance(packed, _episode_transport._PackedEpisodes)
    back = pickle.loads(pickle.dumps(packed, protocol=protocol))
    assert type(back) is list and len(back) == len(episodes)
    return back


@pytest.mark.parametrize("protocol", [2, 5])
def test_packed_list_round_trips_every_variant_exactly(protocol):
    tagged = _TaggedEpisode.from_columns(
        observations=np.zeros((3, 2)), actions=np.zeros(2), rewards=np.zeros(2)
    )
    tagged.tag = "x"
    episodes = [*VARIANTS.values(), tagged, _cartpole_like(n=3)]
    back = _packed_round_trip(episodes, protocol)
    for ep, b in zip(episodes, back):
        assert_episodes_equal(ep, b)
        b.validate()


def test_packed_list_shares_one_writable_block_and_episodes_stay_independent():
    episodes = [_cartpole_like(n=3), _frames_dict_tuple(), _cartpole_like(n=5)]
    back = _packed_round_trip(episodes)
    bases = {id(b.actions.data.base) for b in back}
    bases.add(id(back[1].observations.data["frame"].base))
    assert len(bases) == 1
    for b in back:  # aligned views, each into its own part of the block
        assert b.rewards.data.flags.writeable and b.rewards.data.flags.aligned
    back[0].set_rewards(new_data=np.full(3, 9.0, np.float32))
    np.testing.assert_array_equal(back[2].get_rewards(), episodes[2].get_rewards())
    np.testing.assert_array_equal(back[0].get_rewards(), np.full(3, 9.0))


def test_pack_episodes_leaves_everything_else_as_it_is():
    class _OwnReduce(SingleAgentEpisode):
        def __reduce_ex__(self, protocol):
            return super().__reduce_ex__(protocol)

    own = _OwnReduce.from_columns(observations=np.zeros((2, 2)), actions=[0], rewards=[0.0])
    batch = {"obs": np.zeros(3)}
    for samples in ([], batch, [_cartpole_like(), own], [_cartpole_like(), MultiAgentEpisode()]):
        assert _episode_transport.pack_episodes(samples, SingleAgentEpisode) is samples


@pytest.mark.parametrize("packed", [False, True])
def test_non_contiguous_columns_round_trip(packed):
    ep = _cartpole_like(n=4, lookback=0)
    wide = np.arange(40, dtype=np.float32).reshape(5, 8)
    ep.observations.data = wide[:, ::2]  # strided view
    ep.extra_model_outputs["action_dist_inputs"].data = np.asfortranarray(
        ep.extra_model_outputs["action_dist_inputs"].data
    )
    assert not ep.observations.data.flags.c_contiguous
    if packed:
        back = _packed_round_trip([_cartpole_like(), ep])[1]
    else:
        back = pickle.loads(pickle.dumps(ep, protocol=5))
    assert_episodes_equal(ep, back)


_OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
_ACT_SPACE = gym.spaces.Discrete(2)


def _runner_like(n, lookback, rewards_dtype=np.float32):
    """An episode as one runner makes them: its spaces shared with the others."""
    rng = np.random.default_rng(n)
    k = n + lookback
    return SingleAgentEpisode.from_columns(
        observations=rng.standard_normal((k + 1, 4)).astype(np.float32),
        actions=rng.integers(0, 2, k),
        rewards=np.ones(k, rewards_dtype),
        extra_model_outputs={
            "action_logp": rng.standard_normal(k).astype(np.float32),
            "action_dist_inputs": rng.standard_normal((k, 2)).astype(np.float32),
        },
        len_lookback_buffer=lookback,
        observation_space=_OBS_SPACE,
        action_space=_ACT_SPACE,
        terminated=n % 2 == 1,
    )


@pytest.mark.parametrize("protocol", [2, 5])
def test_one_layout_packs_by_column_and_round_trips_exactly(protocol):
    episodes = [_runner_like(3, 1), _runner_like(0, 0), _runner_like(7, 0), _runner_like(1, 2)]
    packed = _episode_transport.pack_episodes(episodes, SingleAgentEpisode)
    assert packed.__reduce_ex__(protocol)[0] is _episode_transport.rebuild_columnar
    back = _packed_round_trip(episodes, protocol)
    for ep, b in zip(episodes, back):
        assert_episodes_equal(ep, b)
        b.validate()
    arrays = [b.actions.data for b in back] + [b.observations.data for b in back]
    arrays += [b.extra_model_outputs["action_dist_inputs"].data for b in back[2:]]
    blocks = set()
    for array in arrays:  # slices of one view per column, each into the one block
        while isinstance(array.base, np.ndarray):
            array = array.base
        blocks.add(id(array.base))
    assert len(blocks) == 1
    for b in back:  # aligned, writable views, each into its own part of the block
        assert b.observations.data.flags.writeable and b.observations.data.flags.aligned
    back[0].set_rewards(new_data=np.full(3, 9.0, np.float32))
    np.testing.assert_array_equal(back[2].get_rewards(), episodes[2].get_rewards())


def test_a_column_of_another_layout_falls_back_to_one_header_per_episode():
    episodes = [_runner_like(3, 1), _runner_like(4, 1, rewards_dtype=np.float64)]
    packed = _episode_transport.pack_episodes(episodes, SingleAgentEpisode)
    assert packed.__reduce_ex__(5)[0] is _episode_transport.rebuild_episodes
    for ep, b in zip(episodes, _packed_round_trip(episodes)):
        assert_episodes_equal(ep, b)


def test_runner_samples_pack_by_column():
    from envrunners.algorithms.ppo import PPOConfig
    from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner

    config = PPOConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=2)
    runner = SingleAgentEnvRunner(config=config)
    try:
        runner.sample(num_timesteps=40)
        episodes = runner.sample(num_timesteps=60)
    finally:
        runner.stop()
    packed = _episode_transport.pack_episodes(episodes, SingleAgentEpisode)
    assert packed.__reduce_ex__(5)[0] is _episode_transport.rebuild_columnar
    for ep, b in zip(episodes, _packed_round_trip(episodes)):
        assert_episodes_equal(ep, b)


def test_one_layout_with_non_contiguous_columns_round_trips():
    episodes = [_runner_like(3, 1), _runner_like(4, 0)]
    wide = np.arange(60, dtype=np.float32).reshape(5, 12)
    episodes[1].observations.data = wide[:, ::3]  # strided view, same dtype and row shape
    dist = episodes[0].extra_model_outputs["action_dist_inputs"]
    dist.data = np.asfortranarray(dist.data)
    assert _episode_transport._columnar_header(
        episodes, SingleAgentEpisode, _episode_transport._Packer()
    )
    for ep, b in zip(episodes, _packed_round_trip(episodes)):
        assert_episodes_equal(ep, b)
