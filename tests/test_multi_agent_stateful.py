"""Any RLModule in the multi-agent runner: user modules, per-agent recurrent state, nested spaces.

A counting module (its state: how often this agent acted, plus a nested random
walk) makes the carried state visible in the episodes: each agent's
``state_out`` rows must count 1, 2, 3, ... over its own episode, across
``sample()`` calls, whatever the other agents do (turn-based games) and whatever
happens to other sub-envs (a recreated sub-env resets only its own agents).
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from tests.envs.multi_agent import BadMultiAgentEnv, ScheduleEnv, TicTacToe, make_schedule
from tests.structs import same_tree
from tests.test_pettingzoo import _import_tictactoe

from envrunners.algorithms.ppo import PPOConfig
from envrunners.core import _nested
from envrunners.core.columns import Columns
from envrunners.core.distribution.torch.torch_distribution import TorchCategorical
from envrunners.core.rl_module._acting import act
from envrunners.core.rl_module.multi_rl_module import MultiRLModuleSpec
from envrunners.core.rl_module.rl_module import RLModuleSpec
from envrunners.core.rl_module.torch import TorchRLModule
from envrunners.env.multi_agent_env import MultiAgentEnv, make_multi_agent
from envrunners.env.multi_agent_env_runner import MultiAgentEnvRunner
from envrunners.env.wrappers.pettingzoo_env import PettingZooEnv
from envrunners.sampling import multi_agent as ma_sampling

MultiAgentCartPole = make_multi_agent("CartPole-v1")
STATE_OUT = Columns.STATE_OUT


# ------------------------------------------------------------------------------ modules
def _rows(obs) -> int:
    return int(_nested.flatten(obs)[0].shape[0])


class CountingModule(TorchRLModule):
    """Stateful: ``count`` = how often this agent acted; ``walk.x`` a random walk.

    Outputs ACTION_DIST_INPUTS (uniform logits, masked by an ``action_mask`` obs
    key if there is one) and ``count_in`` (the count it was given). Every forward's
    batch size is appended to ``batch_sizes`` and its state out to ``state_outs``.
    """

    batch_sizes: list[int] = []
    state_outs: list = []

    def setup(self):
        self.scale = torch.nn.Parameter(torch.ones(1))

    def get_initial_state(self):
        return {"count": torch.zeros(1), "walk": {"x": torch.zeros(2)}}

    def _forward(self, batch, **kwargs):
        obs = batch[Columns.OBS]  # (B, T=1, ...)
        state = batch[Columns.STATE_IN]
        rows = _rows(obs)
        CountingModule.batch_sizes.append(rows)
        count = state["count"] + 1.0
        walk = state["walk"]["x"] + torch.rand(rows, 2)
        n = int(self.action_space.n)
        logits = torch.zeros(rows, 1, n)
        if isinstance(obs, dict) and "action_mask" in obs:
            logits = torch.where(obs["action_mask"] > 0, logits, torch.full_like(logits, -1e9))
        out = {
            Columns.ACTION_DIST_INPUTS: logits * self.scale,
            "count_in": state["count"][:, None, 0],
            STATE_OUT: {"count": count, "walk": {"x": walk}},
        }
        CountingModule.state_outs.append(_nested.map_structure(lambda t: t.numpy().copy(), out))
        return out

    def get_exploration_action_dist_cls(self):
        return TorchCategorical

    get_inference_action_dist_cls = get_exploration_action_dist_cls


class OnesModule(TorchRLModule):
    """Stateless; returns ACTIONS (always 1) and ACTION_LOGP itself, no distribution."""

    calls: list[int] = []

    def _forward(self, batch, **kwargs):
        rows = _rows(batch[Columns.OBS])
        OnesModule.calls.append(rows)
        return {
            Columns.ACTIONS: torch.ones(rows, dtype=torch.int64),
            Columns.ACTION_LOGP: torch.full((rows,), -0.5),
        }


@pytest.fixture(autouse=True)
def _fresh_records():
    CountingModule.batch_sizes, CountingModule.state_outs, OnesModule.calls = [], [], []
    yield


def _config(env, env_config=None, num_envs=2, mapping=None, policies=("p0", "p1"), spec=None):
    config = (
        PPOConfig()
        .environment(env, env_config=env_config or {})
        .env_runners(num_envs_per_env_runner=num_envs)
        .multi_agent(
            policies=set(policies),
            policy_mapping_fn=mapping or (lambda aid, ep, **kw: f"p{int(str(aid)[-1]) % 2}"),
        )
        .debugging(seed=0)
    )
    if spec is not None:
        config = config.rl_module(rl_module_spec=spec)
    return config


def _counting_spec(**per_module):
    return MultiRLModuleSpec(
        rl_module_specs={mid: RLModuleSpec(module_class=cls) for mid, cls in per_module.items()}
    )


def _counts(sa) -> np.ndarray:
    """An agent chunk's recorded ``state_out`` counts, one per agent step."""
    return np.asarray(sa.get_extra_model_outputs(STATE_OUT)["count"]).reshape(-1)


def _chunks_by_agent(episode_lists):
    """``{(episode id, agent id): [agent chunk per sample() call]}`` over several calls."""
    out: dict = {}
    for eps in episode_lists:
        for e in eps:
            for aid, sa in e.agent_episodes.items():
                out.setdefault((e.id_, aid), []).append(sa)
    return out


def _check_counts(episode_lists, module_id="p0", whole=True):
    """Every agent of ``module_id`` counts 1..n over its episode (chunks joined)."""
    seen = 0
    for (_, _aid), chunks in _chunks_by_agent(episode_lists).items():
        if chunks[0].module_id != module_id:
            continue
        counts = np.concatenate([_counts(sa) for sa in chunks])
        first = counts[0] if not whole else 1.0
        np.testing.assert_array_equal(counts, np.arange(first, first + len(counts)))
        for sa in chunks:  # the count the module got = the state out of the agent's last step
            count_in = np.asarray(sa.get_extra_model_outputs("count_in")).reshape(-1)
            np.testing.assert_array_equal(count_in, _counts(sa) - 1)
        seen += 1
    assert seen > 0
    return seen


# ------------------------------------------------------------------------------ tests
def test_user_modules_per_module_id_one_forward_per_step():
    spec = _counting_spec(p0=CountingModule, p1=OnesModule)
    config = _config(MultiAgentCartPole, {"num_agents": 4}, num_envs=3, spec=spec)
    r = MultiAgentEnvRunner(config)
    assert r.module["p0"].is_stateful() and not r.module["p1"].is_stateful()
    vector_steps = []
    step = r._sampler.step_fn
    r._sampler.step_fn = lambda actions: vector_steps.append(1) or step(actions)
    calls = [r.sample(num_timesteps=25), r.sample(num_timesteps=40)]
    _check_counts(calls, "p0", whole=False)
    steps = {"p0": 0, "p1": 0}
    for e in calls[0] + calls[1]:
        e.validate()
        for sa in e.agent_episodes.values():
            steps[sa.module_id] += len(sa)
            if sa.module_id == "p1":
                assert set(np.asarray(sa.get_actions()).tolist()) == {1}
                np.testing.assert_array_equal(sa.get_extra_model_outputs("action_logp"), -0.5)
                assert STATE_OUT not in sa.extra_model_outputs
    # One forward per module per vector step, over all agents of all sub-envs mapped to it
    # (2 agents x 3 sub-envs), each row one recorded agent step.
    assert max(CountingModule.batch_sizes) == 6 and max(OnesModule.calls) == 6
    assert sum(CountingModule.batch_sizes) == steps["p0"]
    assert sum(OnesModule.calls) == steps["p1"]
    assert len(CountingModule.batch_sizes) <= len(vector_steps)
    assert len(OnesModule.calls) <= len(vector_steps)
    # greedy acting (forward_inference) carries the state the same way
    _check_counts([r.sample(num_timesteps=10, explore=False)], "p0", whole=False)
    r.stop()


def test_state_carried_across_calls_and_reset_at_episode_end():
    spec = _counting_spec(p0=CountingModule, p1=CountingModule)
    r = MultiAgentEnvRunner(_config(MultiAgentCartPole, {"num_agents": 2}, spec=spec))
    calls = [r.sample(num_timesteps=n) for n in (7, 30, 1, 60)]
    assert any(e.is_done for eps in calls for e in eps)  # episodes ended and restarted
    assert _check_counts(calls, "p0") + _check_counts(calls, "p1") >= 6
    # force_reset starts every agent again from the initial state
    eps = r.sample(num_timesteps=3, force_reset=True)
    assert all(_counts(sa)[0] == 1.0 for e in eps for sa in e.agent_episodes.values())
    # episode mode: fresh episodes, counts from 1
    _check_counts([r.sample(num_episodes=2)], "p0")
    r.stop()


def test_state_out_rows_are_the_forward_state_out():
    spec = _counting_spec(p0=CountingModule, p1=CountingModule)
    r = MultiAgentEnvRunner(_config(MultiAgentCartPole, {"num_agents": 3}, spec=spec))
    episodes = r.sample(num_timesteps=40) + r.sample(num_timesteps=15)
    forward_rows = {
        tuple(np.round(w, 6))
        for out in CountingModule.state_outs
        for w in out[STATE_OUT]["walk"]["x"].reshape(-1, 2)
    }
    recorded = 0
    for e in episodes:
        for sa in e.agent_episodes.values():
            state = sa.get_extra_model_outputs(STATE_OUT)
            assert state["count"].shape == (len(sa), 1) and state["count"].dtype == np.float32
            assert state["walk"]["x"].shape == (len(sa), 2)
            for w in state["walk"]["x"]:
                assert tuple(np.round(w, 6)) in forward_rows
                recorded += 1
    assert recorded == sum(len(sa) for e in episodes for sa in e.agent_episodes.values())
    r.stop()


def _state_trees(config, defer):
    run = ma_sampling.MultiAgentSampler.run

    def forced(self, **kwargs):
        kwargs["defer_extras"] = kwargs.get("defer_extras", False) and defer
        return run(self, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(ma_sampling.MultiAgentSampler, "run", forced)
        torch.manual_seed(0)
        r = MultiAgentEnvRunner(config)
        out = []
        for n in (20, 9, 33):
            for e in r.sample(num_timesteps=n):
                e.validate()
                out.append(
                    {
                        (aid, k): sa.get_extra_model_outputs(k)
                        for aid, sa in e.agent_episodes.items()
                        for k in sa.extra_model_outputs
                    }
                )
        r.stop()
    return out


@pytest.mark.parametrize("kind", ["counting", "default_lstm"])
def test_extras_tape_records_nested_state_like_the_per_step_path(kind):
    if kind == "counting":
        config = _config(
            MultiAgentCartPole, {"num_agents": 3}, spec=_counting_spec(p0=CountingModule)
        ).multi_agent(policies={"p0"}, policy_mapping_fn=lambda aid, ep, **kw: "p0")
    else:
        config = _config(MultiAgentCartPole, {"num_agents": 3}).rl_module(
            model_config={"use_lstm": True, "lstm_cell_size": 4, "fcnet_hiddens": [8]}
        )
    on, off = _state_trees(config, True), _state_trees(config, False)
    if kind == "counting":  # the walk is random: compare the deterministic parts
        for a, b in zip(on, off):
            for key in a:
                if key[1] == STATE_OUT:
                    a[key]["walk"] = b[key]["walk"] = None
    assert len(on) == len(off) and all(same_tree(a, b) for a, b in zip(on, off))


def test_default_lstm_state_per_agent_recomputed():
    config = _config(MultiAgentCartPole, {"num_agents": 2}).rl_module(
        model_config={"use_lstm": True, "lstm_cell_size": 8, "vf_share_layers": True}
    )
    r = MultiAgentEnvRunner(config)
    calls = [r.sample(num_timesteps=n) for n in (10, 25, 40)]
    episodes = [e for eps in calls for e in eps]
    assert any(e.is_done for e in episodes)
    checked = 0
    for (_, _), chunks in _chunks_by_agent(calls).items():
        first = chunks[0]
        if first.t_started != 0:
            continue  # an episode that began before the first call: nothing to start from
        module = r.module[first.module_id]
        obs = np.concatenate([np.asarray(sa.get_observations())[:-1] for sa in chunks])
        recorded = {
            k: np.concatenate([sa.get_extra_model_outputs(STATE_OUT)[k] for sa in chunks])
            for k in ("h", "c")
        }
        assert recorded["h"].shape == (len(obs), 1, 8)
        state = _nested.map_structure(lambda t: t.numpy()[None], module.get_initial_state())
        for t in range(len(obs)):
            _, _, state = act(module, obs[t : t + 1], False, state)
            for k in ("h", "c"):
                np.testing.assert_allclose(state[k][0], recorded[k][t], rtol=1e-5, atol=1e-6)
        checked += 1
    assert checked >= 4
    r.stop()


def test_turn_based_waiting_agent_keeps_its_state():
    # Both players share one module: its state rows are still per agent.
    config = _config(
        lambda cfg: PettingZooEnv(TicTacToe()),
        num_envs=2,
        policies=("p0",),
        mapping=lambda aid, ep, **kw: "p0",
        spec=_counting_spec(p0=CountingModule),
    )
    r = MultiAgentEnvRunner(config)
    calls = [r.sample(num_timesteps=n) for n in (3, 1, 8, 20)]
    assert any(len(sa) >= 2 for eps in calls for e in eps for sa in e.agent_episodes.values())
    # A player's count goes 1, 2, 3 over its own moves: the opponent's moves in
    # between did not touch it, and neither did the other sub-env.
    assert _check_counts(calls, "p0") >= 4
    r.stop()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_pettingzoo_tictactoe_dict_obs_with_one_module_per_player():
    tictactoe_v3 = _import_tictactoe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = _config(
            lambda cfg: tictactoe_v3.env(),
            num_envs=2,
            mapping=lambda aid, ep, **kw: f"p{int(aid[-1]) - 1}",
            spec=_counting_spec(p0=CountingModule, p1=CountingModule),
        )
        r = MultiAgentEnvRunner(config)
        calls = [r.sample(num_timesteps=n) for n in (5, 12, 30)]
    # the masked logits only pick legal moves: no episode ends with an illegal-move penalty
    assert all(round(e.get_return()) == 0 for eps in calls for e in eps if e.is_done) and any(
        e.is_done for eps in calls for e in eps
    )
    _check_counts(calls, "p0")
    _check_counts(calls, "p1")
    r.stop()


def test_recreated_sub_env_resets_only_its_agents_states():
    config = _config(
        BadMultiAgentEnv,
        {"bug": "raise"},
        num_envs=2,
        policies=("p0",),
        mapping=lambda aid, ep, **kw: "p0",
        spec=_counting_spec(p0=CountingModule),
    ).fault_tolerance(restart_failed_sub_environments=True)
    BadMultiAgentEnv.raises_left = 1  # sub-env 0 raises once, at its step 2
    try:
        r = MultiAgentEnvRunner(config)
        first = r.sample(num_timesteps=4)
        second = r.sample(num_timesteps=6)
    finally:
        BadMultiAgentEnv.raises_left = 10**9
    assert r.get_metrics()["num_env_step_failures"] == 1
    by_env = {}
    for eps in (first, second):
        for e in eps:
            by_env.setdefault(e.id_, []).append(e)
    starts = sorted(len(v[0]) + sum(len(x) for x in v[1:]) for v in by_env.values())
    assert len(by_env) == 2 and starts[0] < starts[1]  # one episode was restarted
    _check_counts([first, second], "p0")  # both count from 1: the restarted one anew
    # the uninterrupted sub-env's agents counted on over all its steps
    longest = max(by_env.values(), key=lambda v: sum(len(x) for x in v))
    for aid in ("a0", "a1"):
        counts = np.concatenate([_counts(x.agent_episodes[aid]) for x in longest])
        assert counts[-1] == sum(len(x) for x in longest)
    r.stop()


# ------------------------------------------------------------------------------ spaces
class StructuredEnv(MultiAgentEnv):
    """Three agents with Dict / Tuple observations and MultiDiscrete / Tuple / Dict actions.

    ``step`` asserts that every action lies in its agent's space; episodes last
    ``length`` steps.
    """

    def __init__(self, config=None):
        super().__init__()
        self.length = int((config or {}).get("length", 6))
        box = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        free = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)  # Gaussian samples fit
        self.possible_agents = self.agents = ["m0", "t1", "d2"]
        self.observation_spaces = {
            "m0": gym.spaces.Dict({"pos": box, "flag": gym.spaces.Discrete(2)}),
            "t1": gym.spaces.Tuple((box, gym.spaces.Discrete(3))),
            "d2": gym.spaces.Dict({"pos": box, "flag": gym.spaces.Discrete(2)}),
        }
        self.action_spaces = {
            "m0": gym.spaces.MultiDiscrete([3, 2]),
            "t1": gym.spaces.Tuple((gym.spaces.Discrete(2), free)),
            "d2": gym.spaces.Dict({"a": gym.spaces.Discrete(4), "b": free}),
        }
        self.t = 0

    def _obs(self):
        pos = np.full(3, self.t / 10, np.float32)
        return {
            "m0": {"pos": pos, "flag": self.t % 2},
            "t1": (pos, self.t % 3),
            "d2": {"pos": -pos, "flag": 1 - self.t % 2},
        }

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self._obs(), {}

    def step(self, action_dict):
        for aid, a in action_dict.items():
            assert self.action_spaces[aid].contains(a), (aid, a)
        self.t += 1
        done = self.t >= self.length
        rew = dict.fromkeys(self.agents, 1.0)
        flags = {**dict.fromkeys(self.agents, done), "__all__": done}
        return self._obs(), rew, flags, {**dict.fromkeys(self.agents, False), "__all__": False}, {}


@pytest.mark.parametrize("use_lstm", [False, True])
def test_structured_spaces_per_module(use_lstm):
    config = _config(
        StructuredEnv,
        num_envs=2,
        policies=("m", "t", "d"),
        mapping=lambda aid, ep, **kw: aid[0],
    ).rl_module(model_config={"use_lstm": use_lstm, "lstm_cell_size": 4, "fcnet_hiddens": [8]})
    r = MultiAgentEnvRunner(config)
    eps = r.sample(num_timesteps=9) + r.sample(num_timesteps=8)
    assert any(e.is_done for e in eps)
    for e in eps:
        e.validate()
        for aid, sa in e.agent_episodes.items():
            space = r.env.single_action_spaces[aid]
            acts = sa.get_actions()
            for t in range(len(sa)):
                assert space.contains(_nested.map_structure(lambda a, t=t: a[t], acts))
            obs = sa.get_observations()
            assert len(_nested.flatten(obs)[0]) == len(sa) + 1
            assert (STATE_OUT in sa.extra_model_outputs) == use_lstm
            if use_lstm:
                assert sa.get_extra_model_outputs(STATE_OUT)["actor"]["h"].shape == (
                    len(sa),
                    1,
                    4,
                )
    r.stop()


def test_agents_that_end_early_give_their_state_rows_back():
    sched = make_schedule(3, num_agents=4, length=10, p_obs=0.6)
    config = _config(
        ScheduleEnv,
        {"schedule": sched},
        num_envs=2,
        policies=("p0",),
        mapping=lambda aid, ep, **kw: "p0",
        spec=_counting_spec(p0=CountingModule),
    )
    r = MultiAgentEnvRunner(config)
    sampler = r._sampler
    for n in (3, 4, 5, 6, 7):
        _check_counts([r.sample(num_timesteps=n)], "p0", whole=False)
        for i, episode in enumerate(sampler.episodes):
            live = {a for a, sa in episode.agent_episodes.items() if not sa.is_done}
            assert set(sampler._slots[i]) <= live  # done agents hold no state row
        store = sampler._states["p0"]
        in_use = sum(len(s) for s in sampler._slots)
        assert store.size - len(store.free) == in_use <= 2 * 4
    r.stop()


class EchoPrevModule(CountingModule):
    """``CountingModule`` that also outputs the ``prev_actions`` / ``prev_rewards`` it got."""

    def _forward(self, batch, **kwargs):
        out = super()._forward(batch, **kwargs)
        out["echo_prev_action"] = batch["prev_actions"][:, 0].float()
        out["echo_prev_reward"] = batch["prev_rewards"][:, 0].float()
        return out


@pytest.mark.parametrize("env", ["cartpole", "tictactoe"])
def test_prev_actions_and_rewards_per_agent(env):
    flags = {"lstm_use_prev_action": True, "lstm_use_prev_reward": True}
    spec = MultiRLModuleSpec(
        rl_module_specs={"p0": RLModuleSpec(module_class=EchoPrevModule, model_config=flags)}
    )
    if env == "cartpole":
        config = _config(MultiAgentCartPole, {"num_agents": 3}, policies=("p0",), spec=spec)
    else:
        config = _config(lambda cfg: PettingZooEnv(TicTacToe()), policies=("p0",), spec=spec)
    config = config.multi_agent(policy_mapping_fn=lambda aid, ep, **kw: "p0")
    r = MultiAgentEnvRunner(config)
    calls = [r.sample(num_timesteps=n) for n in (4, 9, 30)]
    checked = 0
    for (_, _), chunks in _chunks_by_agent(calls).items():
        if chunks[0].t_started != 0:
            continue
        actions = np.concatenate([np.asarray(sa.get_actions()) for sa in chunks])
        rewards = np.concatenate([np.asarray(sa.get_rewards()) for sa in chunks])
        echo_a = np.concatenate([sa.get_extra_model_outputs("echo_prev_action") for sa in chunks])
        echo_r = np.concatenate([sa.get_extra_model_outputs("echo_prev_reward") for sa in chunks])
        np.testing.assert_array_equal(echo_a, np.concatenate([[0], actions[:-1]]))
        np.testing.assert_array_equal(echo_r, np.concatenate([[0.0], rewards[:-1]]))
        checked += 1
    assert checked >= 3
    # the default LSTM reads them too
    config = config.rl_module(
        rl_module_spec=None, model_config={"use_lstm": True, "lstm_cell_size": 4, **flags}
    )
    r2 = MultiAgentEnvRunner(config)
    assert sum(len(e) for e in r2.sample(num_timesteps=12)) == 12
    r.stop()
    r2.stop()


def test_whole_env_failure_resets_every_agent_state():
    from envrunners.env.env_runner import ENV_STEP_FAILURE

    spec = _counting_spec(p0=CountingModule)
    config = _config(MultiAgentCartPole, {"num_agents": 2}, policies=("p0",), spec=spec)
    r = MultiAgentEnvRunner(config.multi_agent(policy_mapping_fn=lambda aid, ep, **kw: "p0"))
    first = r.sample(num_timesteps=6)
    step, calls = r._sampler.step_fn, []

    def failing_once(actions):  # as _try_env_step answers after recreating the whole env
        calls.append(1)
        return ENV_STEP_FAILURE if len(calls) == 3 else step(actions)

    r._sampler.step_fn = failing_once
    second = r.sample(num_timesteps=8)
    assert len(calls) > 3
    assert {e.id_ for e in second}.isdisjoint({e.id_ for e in first})
    _check_counts([second], "p0")  # every agent starts again from the initial state
    r.stop()
