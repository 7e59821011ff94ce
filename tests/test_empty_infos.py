"""Infos whose empty dicts are made on first use (``envrunners.env._empty_infos``).

Episodes built without infos (``from_columns(infos=None)``, the sampler's episodes
when the env returned none) must behave exactly like episodes holding a list of
distinct empty dicts: getters, setters, slicing, ``cut``, ``concat_episode``,
``get_state``/``from_state``, pickling, ``copy``, ``to_numpy`` and data dicts.
"""

from __future__ import annotations

import copy
import pickle

import gymnasium as gym
import numpy as np
import pytest

from envrunners.algorithms.ppo import PPOConfig
from envrunners.env._empty_infos import EmptyInfosBuffer
from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner
from envrunners.env.single_agent_episode import SingleAgentEpisode
from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from envrunners.policy.sample_batch import SampleBatch

OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT_SPACE = gym.spaces.Discrete(2)


def _pair(n=6, lookback=2, terminated=False):
    """The same chunk twice: infos left out (lazy) and given as distinct empty dicts."""
    rng = np.random.default_rng(1)
    k = n + lookback
    cols = dict(
        observations=rng.standard_normal((k + 1, 3)).astype(np.float32),
        actions=rng.integers(0, 2, k),
        rewards=rng.standard_normal(k).astype(np.float32),
        extra_model_outputs={"action_logp": rng.standard_normal(k).astype(np.float32)},
        len_lookback_buffer=lookback,
        t_started=3,
        terminated=terminated,
        observation_space=OBS_SPACE,
        action_space=ACT_SPACE,
        id_="a" * 32,
    )
    lazy = SingleAgentEpisode.from_columns(**cols)
    eager = SingleAgentEpisode.from_columns(infos=[{} for _ in range(k + 1)], **cols)
    return lazy, eager


def _same(a, b):
    """Equal in everything a user can read (the state dict covers every column)."""
    sa, sb = a.get_state(), b.get_state()
    assert type(a.infos) is type(b.infos) is InfiniteLookbackBuffer  # made by get_state
    assert sa.keys() == sb.keys()
    for key in sa:
        if key in ("observations", "actions", "rewards"):
            assert sa[key]["lookback"] == sb[key]["lookback"], key
            np.testing.assert_array_equal(sa[key]["data"], sb[key]["data"], err_msg=key)
        elif key != "extra_model_outputs":
            assert sa[key] == sb[key], key
    assert len(a) == len(b) and a.t == b.t and a.t_started == b.t_started


def test_lazy_until_read_then_distinct_dicts():
    lazy, eager = _pair()
    assert type(lazy.infos) is EmptyInfosBuffer
    assert len(lazy.infos) == len(eager.infos) == 7
    lazy.validate()  # lengths need no dicts
    assert type(lazy.infos) is EmptyInfosBuffer
    infos = lazy.get_infos()
    assert type(lazy.infos) is InfiniteLookbackBuffer
    assert infos == eager.get_infos() == [{}] * 7
    assert len({id(i) for i in lazy.infos.data}) == 9  # lookback included, all distinct
    infos[2]["mine"] = 1  # the episode's own dict, as with a list of dicts
    assert lazy.get_infos(2) == {"mine": 1}
    assert all(lazy.get_infos(i) == {} for i in range(7) if i != 2)
    assert lazy.get_infos(-1, neg_index_as_lookback=True) == {}
    lazy.infos.data[0]["lookback"] = True
    assert lazy.get_infos(0) == {}


@pytest.mark.parametrize(
    "read",
    [
        lambda ep: ep.infos.data,
        lambda ep: ep.get_infos(slice(1, 3)),
        lambda ep: ep.set_infos(new_data={"x": 1}, at_indices=0),
        lambda ep: ep.infos == InfiniteLookbackBuffer([{}] * 9, 2),
        lambda ep: ep.get_data_dict(),
        lambda ep: ep.get_state(),
        lambda ep: ep.infos.get_state(),
        lambda ep: ep.add_env_step(np.zeros(3, np.float32), 1, 0.5, infos={"last": 1}),
    ],
)
def test_every_access_makes_the_same_dicts(read):
    lazy, eager = _pair()
    read(lazy)
    read(eager)
    assert type(lazy.infos) is InfiniteLookbackBuffer
    assert lazy.infos.data == eager.infos.data
    assert lazy.infos.lookback == eager.infos.lookback


def test_slice_cut_concat_match_eager():
    lazy, eager = _pair()
    for a, b in [
        (lazy[1:4], eager[1:4]),
        (
            lazy.slice(slice(2, None), len_lookback_buffer=1),
            eager.slice(slice(2, None), len_lookback_buffer=1),
        ),
        (lazy.cut(len_lookback_buffer=2), eager.cut(len_lookback_buffer=2)),
    ]:
        assert type(a.infos) is EmptyInfosBuffer  # a derived chunk stays lazy
        assert len(a.infos) == len(b.infos) and a.infos.lookback == b.infos.lookback
        _same(a, b)
        assert a.infos.data == b.infos.data and len({id(i) for i in a.infos.data}) == len(
            a.infos.data
        )
    # concat makes the dicts of both (the successor's are shared, as with lists)
    for first_lazy, second_lazy in [(True, True), (True, False), (False, True)]:
        x_lazy, x_eager = _pair()
        head = x_lazy if first_lazy else x_eager
        ref_head = _pair()[1]
        succ = head.cut(len_lookback_buffer=1)
        if not second_lazy:
            succ.get_infos()
        obs = np.ones(3, np.float32)
        tail_cols = dict(
            observations=np.concatenate([succ.observations.data, np.stack([obs, obs])]),
            actions=np.concatenate([succ.actions.data, [1, 0]]),
            rewards=np.concatenate([succ.rewards.data, np.float32([1, 2])]),
            extra_model_outputs={
                "action_logp": np.concatenate(
                    [succ.extra_model_outputs["action_logp"].data, np.float32([0, 0])]
                )
            },
            len_lookback_buffer=1,
            t_started=head.t,
            observation_space=OBS_SPACE,
            action_space=ACT_SPACE,
            id_=head.id_,
        )
        tail = SingleAgentEpisode.from_columns(**tail_cols)
        ref_tail = SingleAgentEpisode.from_columns(infos=[{} for _ in range(4)], **tail_cols)
        if not second_lazy:
            tail.get_infos()
        head.concat_episode(tail)
        ref_head.concat_episode(ref_tail)
        assert type(head.infos) is InfiniteLookbackBuffer
        assert head.get_infos(-1) is tail.get_infos(-1)  # shared with the successor
        tail.get_infos(-2)["late"] = 1
        assert head.get_infos(-2) == {"late": 1}
        ref_tail.get_infos(-2)["late"] = 1
        assert len(head.infos) == len(ref_head.infos) == 9
        _same(head, ref_head)


def test_pickle_copy_state_round_trips():
    lazy, eager = _pair(terminated=True)
    for protocol in (2, 4, 5):
        back = pickle.loads(pickle.dumps(lazy, protocol=protocol))
        assert type(back.infos) is EmptyInfosBuffer  # travelled as a count
        _same(back, eager)
    deep = copy.deepcopy(lazy)
    assert type(deep.infos) is EmptyInfosBuffer
    shallow = copy.copy(lazy)
    assert shallow.infos is lazy.infos  # shared buffer: the same dicts for both
    shallow.get_infos(0)["shared"] = True
    assert lazy.get_infos(0) == {"shared": True} and deep.get_infos(0) == {}
    lazy2, _ = _pair(terminated=True)
    restored = SingleAgentEpisode.from_state(lazy2.get_state())
    _same(restored, eager)
    buf = EmptyInfosBuffer.of_length(4, 1)
    assert type(copy.copy(buf)) is InfiniteLookbackBuffer and type(buf) is InfiniteLookbackBuffer
    assert copy.copy(EmptyInfosBuffer.of_length(4, 1)).data == [{}] * 4


def test_numpy_and_batches():
    lazy, eager = _pair()
    assert lazy.to_numpy() is lazy and type(lazy.infos) is EmptyInfosBuffer
    a, b = lazy.get_data_dict(), eager.get_data_dict()
    assert list(a["infos"]) == list(b["infos"]) == [{}] * 6
    assert isinstance(lazy.get_sample_batch(), SampleBatch)
    default = SingleAgentEpisode(observations=[np.zeros(3, np.float32)], len_lookback_buffer=0)
    assert type(default.infos) is EmptyInfosBuffer and default.get_infos() == [{}]


def _runner(num_envs, infos_every=0):
    config = (
        PPOConfig()
        .environment(
            "CartPole-v1" if not infos_every else _InfoEveryEnv,
            env_config={} if not infos_every else {"every": infos_every},
        )
        .env_runners(num_envs_per_env_runner=num_envs)
        .debugging(seed=3)
    )
    return SingleAgentEnvRunner(config=config)


class _InfoEveryEnv(gym.Env):
    """Counts steps; an info dict on every ``every``-th step, none otherwise; 5-step episodes."""

    observation_space = gym.spaces.Box(0, 100, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, config=None):
        self.every = int((config or {}).get("every", 3))
        self.t = self.total = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        self.total += 1
        info = {"total": self.total} if self.total % self.every == 0 else {}
        return np.full(1, self.t, np.float32), 1.0, self.t >= 5, False, info


@pytest.mark.parametrize("infos_every", [0, 3])
def test_sampled_episodes_infos(infos_every):
    """No infos: lazy chunks of distinct dicts; some infos: the env's dicts where it gave them."""
    runner = _runner(3, infos_every)
    try:
        for _ in range(2):  # the second call continues chunks (lookback rows carried)
            episodes = runner.sample(num_timesteps=40)
            assert episodes
            for ep in episodes:
                lazy = type(ep.infos) is EmptyInfosBuffer
                infos = ep.get_infos()
                all_infos = ep.infos.data
                assert len(all_infos) == ep.observations.len_incl_lookback()
                assert len({id(i) for i in all_infos}) == len(all_infos)
                assert all(type(i) is dict for i in all_infos)
                if not infos_every:
                    assert lazy and not any(all_infos)
                else:
                    assert all(set(i) <= {"total"} for i in infos)
                    if ep.observations.len_incl_lookback() > 3:
                        assert any(all_infos)  # the env gave one every 3 steps of its own
            episodes[0].get_infos(0)["mutated"] = 1
            assert "mutated" not in episodes[0].get_infos(-1) or len(episodes[0]) == 0
    finally:
        runner.stop()


def test_sampled_episodes_equal_eager_rebuild():
    """A sampled (lazy) chunk equals the same chunk with a list of distinct empty dicts."""
    runner = _runner(4)
    try:
        runner.sample(num_timesteps=64)
        for ep in runner.sample(num_timesteps=64):
            assert type(ep.infos) is EmptyInfosBuffer
            k = ep.observations.lookback
            eager = SingleAgentEpisode.from_columns(
                observations=ep.observations.data,
                actions=ep.actions.data,
                rewards=ep.rewards.data,
                infos=[{} for _ in range(ep.observations.len_incl_lookback())],
                extra_model_outputs={k2: b.data for k2, b in ep.extra_model_outputs.items()},
                terminated=ep.is_terminated,
                truncated=ep.is_truncated,
                t_started=ep.t_started,
                len_lookback_buffer=k,
                observation_space=ep.observation_space,
                action_space=ep.action_space,
                id_=ep.id_,
            )
            back = pickle.loads(pickle.dumps(ep, protocol=5))
            _same(back, eager)
            _same(ep, eager)
    finally:
        runner.stop()
