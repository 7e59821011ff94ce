"""Deferred extra model outputs (per-module tapes) give the same episodes as per-step recording.

The multi-agent sampler records extra model outputs through ``ExtrasTape``s when
the episodes are numpy'd afterwards and no episode callback listens; these
tests run the same seeded sampling with that path on and off and compare every
returned episode (timestamps aside), across random agent schedules (irregular
steps fall back to ``add_env_step`` mid-episode), lookbacks, count modes,
episode mode and outputs that stop fitting the tape mid-run.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.envs.multi_agent import ScheduleEnv, make_schedule
from tests.structs import same_tree

from envrunners.algorithms.ppo import PPOConfig
from envrunners.env.multi_agent_env import make_multi_agent
from envrunners.env.multi_agent_env_runner import MultiAgentEnvRunner
from envrunners.sampling import multi_agent as ma_sampling
from envrunners.sampling._multi_agent_extras import ExtrasTape

MultiAgentCartPole = make_multi_agent("CartPole-v1")


class FlaggedScheduleEnv(ScheduleEnv):
    """``ScheduleEnv`` whose flag dicts name every observing agent (so plain steps occur)."""

    def step(self, action_dict):
        obs, rew, term, trunc, infos = super().step(action_dict)
        for aid in obs:
            term.setdefault(aid, False)
            trunc.setdefault(aid, False)
        return obs, rew, term, trunc, infos


def _config(env, env_config, num_envs, lookback=1, agent_steps=False, mapping=None):
    return (
        PPOConfig()
        .environment(env, env_config=env_config)
        .env_runners(num_envs_per_env_runner=num_envs, episode_lookback_horizon=lookback)
        .multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=mapping or (lambda aid, ep, **kw: f"p{int(aid[1:]) % 2}"),
            count_steps_by="agent_steps" if agent_steps else "env_steps",
        )
        .debugging(seed=0)
    )


def _state(ep) -> dict:
    """The episode's state without timestamps and random ids (they differ between runs)."""
    state = ep.get_state()
    for key in ("start_time", "last_step_time", "id_", "agent_episode_ids"):
        state.pop(key, None)
    for sa in state["agent_episodes"].values():
        for key in ("_start_time", "_last_step_time", "id_", "multi_agent_episode_id"):
            sa.pop(key, None)
    return state


def _sample_all(config, calls, defer: bool, monkeypatch, tweak=None):
    """Run ``calls`` (kwargs of ``sample``) on a fresh runner; the states and metrics."""
    run = ma_sampling.MultiAgentSampler.run

    def forced(self, **kwargs):
        kwargs["defer_extras"] = kwargs.get("defer_extras", False) and defer
        return run(self, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(ma_sampling.MultiAgentSampler, "run", forced)
        r = MultiAgentEnvRunner(config)
        if tweak is not None:
            r._act = tweak(r._act)
        states, metrics = [], []
        for kwargs in calls:
            eps = r.sample(**kwargs)
            for e in eps:
                e.validate()
                assert all(sa.is_numpy for sa in e.agent_episodes.values())
            states.append([_state(e) for e in eps])
            m_ = r.get_metrics()
            metrics.append({k: m_.get(k) for k in ("num_env_steps_sampled", "num_episodes")})
        r.stop()
    return states, metrics


def _check_same(config, calls, monkeypatch, tweak=None):
    on = _sample_all(config, calls, True, monkeypatch, tweak)
    off = _sample_all(config, calls, False, monkeypatch, tweak)
    assert on[1] == off[1]
    assert len(on[0]) == len(off[0])
    for a, b in zip(on[0], off[0]):
        assert same_tree(a, b)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    num_agents=st.integers(1, 4),
    num_envs=st.integers(1, 3),
    chunks=st.lists(st.integers(1, 12), min_size=1, max_size=5),
    agent_steps=st.booleans(),
    length=st.integers(2, 12),
    p_obs=st.sampled_from([0.0, 0.3, 0.7, 0.9, 1.0]),
    lookback=st.integers(0, 3),
    env=st.sampled_from([ScheduleEnv, FlaggedScheduleEnv]),
)
def test_tape_path_matches_per_step_path_on_random_schedules(
    seed, num_agents, num_envs, chunks, agent_steps, length, p_obs, lookback, env
):
    sched = make_schedule(seed, num_agents=num_agents, length=length, p_obs=p_obs)
    config = _config(env, {"schedule": sched}, num_envs, lookback, agent_steps)
    calls = [{"num_timesteps": n} for n in chunks]
    with pytest.MonkeyPatch.context() as mp:
        _check_same(config, calls, mp)


@pytest.mark.parametrize("seed", range(4))
def test_tape_path_matches_when_plain_and_irregular_steps_mix(seed, monkeypatch):
    # agents that skip observations: plain steps, then hanging actions mid-episode
    sched = make_schedule(seed, num_agents=3, length=9, p_obs=0.7)
    config = _config(FlaggedScheduleEnv, {"schedule": sched}, 2, 1)
    _check_same(config, [{"num_timesteps": 12}, {"num_timesteps": 5}], monkeypatch)


def _cartpole(num_envs, lookback=1):
    return _config(
        MultiAgentCartPole,
        {"num_agents": 3},
        num_envs,
        lookback,
        mapping=lambda aid, ep, **kw: f"p{aid % 2}",
    )


@pytest.mark.parametrize("num_envs", [1, 3])
def test_tape_path_matches_across_calls_and_episode_mode(num_envs, monkeypatch):
    calls = [
        {"num_timesteps": 60},
        {"num_timesteps": 7},
        {"num_episodes": 2},
        {"num_timesteps": 30},
    ]
    _check_same(_cartpole(num_envs, lookback=2), calls, monkeypatch)


def _retyped_from_5th_call(act):
    """From the 5th forward pass on, ``action_logp`` is float64 (no longer fits the tape)."""
    calls = [0]

    def tweaked(module_id, obs, explore, t):
        out = act(module_id, obs, explore, t)
        calls[0] += 1
        if calls[0] >= 5:
            out["action_logp"] = np.asarray(out["action_logp"], dtype=np.float64)
        return out

    return tweaked


def _with_nested_output(act):
    """Every forward pass also returns a dict-valued extra output (nested tape columns)."""

    def tweaked(module_id, obs, explore, t):
        out = act(module_id, obs, explore, t)
        out["nested"] = {"a": np.arange(len(obs), dtype=np.int32)}
        return out

    return tweaked


def _with_list_output(act):
    """Every forward pass also returns a list-valued extra output (never fits the tape)."""

    def tweaked(module_id, obs, explore, t):
        out = act(module_id, obs, explore, t)
        out["listed"] = [{"a": k} for k in range(len(obs))]
        return out

    return tweaked


def _nested_retyped_from_5th_call(act):
    """A nested output whose leaf dtype changes from the 5th forward on (stops fitting)."""
    calls = [0]

    def tweaked(module_id, obs, explore, t):
        out = act(module_id, obs, explore, t)
        calls[0] += 1
        dtype = np.float64 if calls[0] >= 5 else np.float32
        out["state_out"] = {"h": np.ones((len(obs), 1, 2), dtype), "c": (np.zeros(len(obs)),)}
        return out

    return tweaked


@pytest.mark.parametrize(
    "tweak",
    [_retyped_from_5th_call, _with_nested_output, _with_list_output, _nested_retyped_from_5th_call],
)
def test_outputs_that_do_not_fit_the_tape_fall_back(tweak, monkeypatch):
    calls = [{"num_timesteps": 40}, {"num_timesteps": 40}]
    _check_same(_cartpole(2), calls, monkeypatch, tweak=tweak)


def test_tape_is_used_by_default_and_not_with_episode_callbacks_or_lists():
    seen = []
    run = ma_sampling.MultiAgentSampler.run

    def spy(self, **kwargs):
        res = run(self, **kwargs)
        seen.append(kwargs.get("defer_extras"))
        return res

    with pytest.MonkeyPatch.context() as m:
        m.setattr(ma_sampling.MultiAgentSampler, "run", spy)
        r = MultiAgentEnvRunner(_cartpole(2))
        r.sample(num_timesteps=20)
        r.stop()
        r = MultiAgentEnvRunner(_cartpole(2).env_runners(episodes_to_numpy=False))
        eps = r.sample(num_timesteps=20)
        assert all(not sa.is_numpy for e in eps for sa in e.agent_episodes.values())
        assert all(
            type(b.data) is list
            for e in eps
            for sa in e.agent_episodes.values()
            for b in sa.extra_model_outputs.values()
        )
        r.stop()
    assert seen == [True, False]


def test_extras_tape_grows_without_touching_written_rows():
    out = {"x": np.arange(200, dtype=np.float32), "y": np.ones((200, 2))}
    tape = ExtrasTape.create(out, 200)
    assert tape is not None
    assert ExtrasTape.create(out, 199) is None
    assert ExtrasTape.create({}, 200) is None
    assert ExtrasTape.create({"weights_seq_no": out["x"]}, 200) is None
    assert ExtrasTape.create({"o": np.array([None] * 200)}, 200) is None
    assert ExtrasTape.create({"s": np.float32(1.0)}, 200) is None
    assert tape.try_write({"x": out["x"].astype(np.float64), "y": out["y"]}, 200) is None
    assert tape.try_write({"y": out["y"], "x": out["x"]}, 200) is None
    assert tape.try_write({"x": out["x"], "y": np.ones((200, 3))}, 200) is None
    assert tape.try_write({"x": out["x"]}, 200) is None
    assert tape.try_write({"x": out["x"], "y": [[1.0, 1.0]] * 200}, 200) is None
    assert tape.n == 0
    assert tape.try_write(out, 200) == 0
    view = tape.row(3, 7)
    assert tape.try_write(out, 200) == 200  # grows past the first capacity
    assert tape.n == 400 and len(tape.cols["x"]) >= 400
    np.testing.assert_array_equal(tape.cols["x"][:400], np.tile(out["x"], 2))
    assert view["x"] == 3 and view["weights_seq_no"] == 7
    np.testing.assert_array_equal(view["y"], [1.0, 1.0])


def test_extras_tape_nested_columns():
    rows = 20
    state = {"h": np.arange(rows * 2, dtype=np.float32).reshape(rows, 1, 2), "c": (np.ones(rows),)}
    out = {"x": np.arange(rows, dtype=np.float32), "state_out": state}
    tape = ExtrasTape.create(out, rows)
    assert tape is not None
    assert ExtrasTape.create({"s": {"a": np.arange(3)}}, 2) is None  # wrong row count
    assert ExtrasTape.create({"s": {"a": [1, 2]}}, 2) is None  # not an array
    assert ExtrasTape.create({"s": {}}, 2) is None  # no leaves
    assert tape.try_write({"x": out["x"], "state_out": {"h": state["h"]}}, rows) is None
    assert (
        tape.try_write({"x": out["x"], "state_out": {"c": state["c"], "h": state["h"]}}, rows)
        is None
    )
    retyped = {"h": state["h"].astype(np.float64), "c": state["c"]}
    assert tape.try_write({"x": out["x"], "state_out": retyped}, rows) is None
    assert tape.try_write({"x": out["x"], "state_out": state["h"]}, rows) is None
    assert tape.n == 0
    for k in range(20):  # grows past the first capacity
        assert tape.try_write(out, rows) == k * rows
    row = tape.row(3, 7)
    assert row["weights_seq_no"] == 7 and row["x"] == 3
    assert same_tree(row["state_out"], {"h": state["h"][3], "c": (state["c"][0][3],)})
    taken = tape.cols["state_out"].take(np.array([1, rows + 2]))
    assert same_tree(taken, {"h": state["h"][[1, 2]], "c": (state["c"][0][[1, 2]],)})
