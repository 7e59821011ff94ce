"""Tests of ``MultiAgentEpisode``: the spec's worked example, chunking, errors, properties.

The property-based part drives episodes with random agent-presence schedules
(agents acting in random subsets, joining late, leaving, terminating) and checks
the bookkeeping invariants (RLlib pain point P8).
"""

from __future__ import annotations

import json
import re

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envrunners.env.multi_agent_episode import SKIP_ENV_TS_TAG, MultiAgentEpisode
from envrunners.errors import MultiAgentEnvError

S = SKIP_ENV_TS_TAG


# --------------------------------------------------------------------- helpers
SA_IDS = {aid: f"sa-{aid}" for aid in ("a", "b", "c", "a0", "a1", "a2", "a3")}


def worked_example_two_steps() -> MultiAgentEpisode:
    """The spec's worked example up to its second step."""
    ep = MultiAgentEpisode("eps", agent_episode_ids=SA_IDS)
    ep.add_env_reset(observations={"a": 0, "b": 0})
    ep.add_env_step(
        observations={"a": 1},
        actions={"a": 0, "b": 1},
        rewards={"a": 1.0, "b": 0.5},
    )
    ep.add_env_step(
        observations={"a": 2, "b": 2},
        actions={"a": 0},
        rewards={"a": 1.0, "b": 0.25},
    )
    return ep


def mapping(ep: MultiAgentEpisode, aid) -> list:
    """The agent's env-step mapping (lookback excluded)."""
    buf = ep.env_t_to_agent_t[aid]
    return list(buf.data[buf.lookback :])


def agent_view(ep: MultiAgentEpisode, aid) -> dict:
    """Everything an agent's episode holds for this chunk (lookback excluded)."""
    sa = ep.agent_episodes[aid]
    return {
        "obs": list(sa.get_observations()),
        "infos": list(sa.get_infos()),
        "actions": list(sa.get_actions()),
        "rewards": [float(r) for r in sa.get_rewards()],
        "extras": {k: list(b.get()) for k, b in sa.extra_model_outputs.items()},
        "t_started": sa.t_started,
        "t": sa.t,
        "terminated": sa.is_terminated,
        "truncated": sa.is_truncated,
        "id_": sa.id_,
        "module_id": sa.module_id,
    }


def assert_same_episode(a: MultiAgentEpisode, b: MultiAgentEpisode) -> None:
    """Assert that two episodes hold the same data, mapping and hanging state."""
    assert a.id_ == b.id_
    assert (a.env_t_started, a.env_t) == (b.env_t_started, b.env_t)
    assert (a.is_terminated, a.is_truncated) == (b.is_terminated, b.is_truncated)
    assert a.agent_ids == b.agent_ids
    for aid in a.agent_ids:
        assert agent_view(a, aid) == agent_view(b, aid), aid
        assert mapping(a, aid) == mapping(b, aid), aid
    assert a._hanging_actions_end == b._hanging_actions_end
    assert a._hanging_extra_model_outputs_end == b._hanging_extra_model_outputs_end
    assert a._hanging_rewards_end == pytest.approx(b._hanging_rewards_end)
    assert a._hanging_rewards_begin == pytest.approx(b._hanging_rewards_begin)
    assert a.get_return() == pytest.approx(b.get_return())
    assert a.get_return(include_hanging_rewards=True) == pytest.approx(
        b.get_return(include_hanging_rewards=True)
    )
    assert (a.env_steps(), a.agent_steps()) == (b.env_steps(), b.agent_steps())
    assert a.get_agents_that_stepped() == b.get_agents_that_stepped()
    assert a.get_agents_to_act() == b.get_agents_to_act()


# ----------------------------------------------------------- worked example
def test_worked_example_from_the_spec():
    ep = worked_example_two_steps()
    # After the first step only "a" has a step; "b" acted and waits.
    a, b = ep.agent_episodes["a"], ep.agent_episodes["b"]
    assert (len(a), len(b)) == (2, 1)
    assert b.get_rewards() == [0.75]  # 0.5 (hanging) + 0.25
    assert mapping(ep, "a") == [0, 1, 2]
    assert mapping(ep, "b") == [0, S, 1]
    assert ep.get_agents_to_act() == {"a", "b"}
    assert ep.agent_steps() == 3
    assert ep.env_steps() == 2 == len(ep)
    assert ep.get_return() == pytest.approx(2.75)

    # A new agent "c" appears with a reward: it goes to the begin cache.
    ep.add_env_step(
        observations={"a": 3, "c": 0},
        actions={"a": 1, "b": 0},
        rewards={"a": 1.0, "c": 5.0},
    )
    assert ep._hanging_rewards_begin == {"c": 5.0}
    assert ep.get_return() == pytest.approx(3.75)
    assert ep.get_return(include_hanging_rewards=True) == pytest.approx(8.75)
    assert mapping(ep, "c") == [S, S, S, 0]
    assert mapping(ep, "b") == [0, S, 1, S]
    assert ep._hanging_actions_end == {"b": 0}
    assert ep.get_agents_to_act() == {"a", "c"}

    # The episode ends: "b" (pending action, no obs) gets its last obs duplicated.
    ep.add_env_step(
        observations={"a": 4, "c": 1},
        actions={"a": 0, "c": 1},
        rewards={"a": 1.0, "b": 2.0, "c": 1.0},
        terminateds={"__all__": True},
    )
    assert ep.is_done and ep.is_terminated and not ep.is_truncated
    assert all(sa.is_terminated for sa in ep.agent_episodes.values())
    assert ep.agent_episodes["b"].get_observations() == [0, 2, 2]
    assert ep.agent_episodes["b"].get_actions() == [1, 0]
    assert ep.agent_episodes["b"].get_rewards() == [0.75, 2.0]
    assert mapping(ep, "b") == [0, S, 1, S, 2]
    assert ep._hanging_actions_end == {} and ep._hanging_rewards_end == {}
    assert ep.get_terminateds() == {"a": True, "b": True, "c": True, "__all__": True}
    assert ep.agent_steps() == 4 + 2 + 1
    ep.validate()


def test_get_truncateds_reports_truncation_not_termination():
    ep = worked_example_two_steps()
    ep.add_env_step(
        observations={"a": 3, "b": 3},
        actions={"a": 0, "b": 0},
        rewards={"a": 0.0, "b": 0.0},
        truncateds={"__all__": True},
    )
    assert ep.is_truncated and not ep.is_terminated
    assert ep.get_truncateds() == {"a": True, "b": True, "__all__": True}
    assert ep.get_terminateds() == {"a": False, "b": False, "__all__": False}


def test_all_agents_done_terminates_the_episode():
    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={"a": 0, "b": 0})
    ep.add_env_step({"a": 1, "b": 1}, {"a": 0, "b": 0}, {"a": 1, "b": 1}, terminateds={"a": True})
    assert not ep.is_done and ep.get_agents_to_act() == {"b"}
    ep.add_env_step({"b": 2}, {"b": 0}, {"b": 1}, truncateds={"b": True})
    assert ep.is_terminated  # a mix of endings counts as terminated


def test_first_observation_that_is_already_terminal_is_dropped():
    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={"a": 0})
    ep.add_env_step({"a": 1, "c": 7}, {"a": 0}, {"a": 1, "c": 3.0}, terminateds={"c": True})
    assert ep.agent_ids == {"a"}
    assert "c" not in ep._hanging_rewards_begin


def test_add_env_step_is_lazy_for_agents_not_in_the_step():
    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={f"x{i}": 0 for i in range(50)} | {"a": 0})
    ep.add_env_step(
        {"a": 1},
        {f"x{i}": 0 for i in range(50)} | {"a": 0},
        {"a": 0.0},
        terminateds={f"x{i}": True for i in range(50)},
    )
    for t in range(2, 100):
        ep.add_env_step({"a": t}, {"a": 0}, {"a": 1.0})
    # Done agents' mappings were not touched per step ...
    assert len(ep._env_t_to_agent_t["x0"].data) == 2
    # ... and are complete whenever they are read.
    assert mapping(ep, "x0") == [0, 1] + [S] * 98
    assert ep.get_observations(-1) == {"a": 99}
    ep.validate()


def test_runner_style_pruning_of_empty_agent_episodes():
    ep = worked_example_two_steps()
    ep.add_env_step({"a": 3, "c": 0}, {"a": 1, "b": 0}, {"a": 1.0, "c": 5.0})
    succ = ep.cut()
    succ.add_env_step({"c": 1}, {"a": 0, "c": 0}, {"c": 1.0})
    del succ.agent_episodes["b"]  # what MultiAgentEnvRunner does with empty agent chunks
    succ.validate()
    assert succ.get_agents_to_act() == {"c"}
    assert set(succ.get_observations(-1)) == {"c"}
    assert succ.agent_steps() == 1


# -------------------------------------------------------------- constructor
def test_constructor_from_lists_matches_stepping():
    stepped = worked_example_two_steps()
    built = MultiAgentEpisode(
        stepped.id_,
        observations=[{"a": 0, "b": 0}, {"a": 1}, {"a": 2, "b": 2}],
        actions=[{"a": 0, "b": 1}, {"a": 0}],
        rewards=[{"a": 1.0, "b": 0.5}, {"a": 1.0, "b": 0.25}],
        len_lookback_buffer=0,
        agent_episode_ids=stepped.agent_episode_ids,
    )
    assert_same_episode(built, stepped)
    # "auto": all given data is lookback.
    auto = MultiAgentEpisode(
        observations=[{"a": 0, "b": 0}, {"a": 1}, {"a": 2, "b": 2}],
        actions=[{"a": 0, "b": 1}, {"a": 0}],
        rewards=[{"a": 1.0, "b": 0.5}, {"a": 1.0, "b": 0.25}],
        env_t_started=7,
    )
    assert (len(auto), auto.env_t_started, auto.env_t, auto.agent_steps()) == (0, 7, 7, 0)
    assert auto.get_observations(-1, neg_index_as_lookback=True) == {"a": 1}
    assert auto.get_rewards(-1, neg_index_as_lookback=True) == {"a": 1.0, "b": 0.75}
    assert auto.get_agents_to_act() == {"a", "b"}


def test_constructor_flags_and_bad_lengths():
    ep = MultiAgentEpisode(
        observations=[{"a": 0, "b": 0}, {"a": 1, "b": 1}],
        actions=[{"a": 0, "b": 0}],
        rewards=[{"a": 1.0, "b": 1.0}],
        terminateds={"a": True, "__all__": False},
        len_lookback_buffer=0,
    )
    assert ep.get_terminateds() == {"a": True, "b": False, "__all__": False}
    with pytest.raises(MultiAgentEnvError, match=r"len\(actions\)=0 \(expected 1\)"):
        MultiAgentEpisode(observations=[{"a": 0}, {"a": 1}], actions=[], rewards=[{"a": 0.0}])


# ------------------------------------------------------------------ getters
def test_env_step_getters():
    ep = worked_example_two_steps()
    assert ep.get_observations(-1) == {"a": 2, "b": 2}
    assert ep.get_observations(1) == {"a": 1}
    assert ep.get_observations() == {"a": [0, 1, 2], "b": [0, 2]}
    assert ep.get_observations([0, 1], agent_ids="b") == {"b": [0]}
    assert ep.get_observations(slice(0, 2), return_list=True) == [{"a": 0, "b": 0}, {"a": 1}]
    assert ep.get_observations(1, fill=-1) == {"a": 1, "b": -1}
    assert ep.get_observations(slice(-4, None), agent_ids=["b"], fill=-1) == {"b": [-1, 0, -1, 2]}
    assert ep.get_actions() == {"a": [0, 0], "b": [1]}
    assert ep.get_actions(1) == {"a": 0}  # "b" acted at env step 0, not 1
    assert ep.get_rewards(return_list=True) == [{"a": 1.0}, {"a": 1.0, "b": 0.75}]
    assert ep.get_rewards(-1, env_steps=False) == {"a": 1.0, "b": 0.75}
    assert ep.get_observations(0, env_steps=False) == {"a": 0, "b": 0}
    assert ep.get_infos(-1) == {"a": {}, "b": {}}
    with pytest.raises(IndexError, match="out of range"):
        ep.get_observations(5)
    with pytest.raises(ValueError, match="return_list=True"):
        ep.get_observations(-1, return_list=True)
    with pytest.raises(ValueError, match="env_steps=True"):
        ep.get_observations(slice(0, 2), env_steps=False, return_list=True)


def test_getters_with_spaces_one_hot_and_extra_outputs():
    spaces = {aid: gym.spaces.Discrete(4) for aid in ("a", "b")}
    ep = MultiAgentEpisode(observation_space=spaces, action_space=dict(spaces))
    ep.add_env_reset(observations={"a": 0, "b": 1})
    ep.add_env_step(
        {"a": 2},
        {"a": 3, "b": 1},
        {"a": 1.0},
        extra_model_outputs={"a": {"logp": -0.1}, "b": {"logp": -0.2}},
    )
    ep.add_env_step(
        {"a": 3, "b": 3},
        {"a": 0},
        {"a": 1.0, "b": 1.0},
        extra_model_outputs={"a": {"logp": -0.3}},
    )
    np.testing.assert_array_equal(
        ep.get_observations(-1, agent_ids="b", one_hot_discrete=True)["b"], [0, 0, 0, 1]
    )
    np.testing.assert_array_equal(
        ep.get_observations(1, agent_ids="b", fill=0, one_hot_discrete=True)["b"], [0, 0, 0, 0]
    )
    assert ep.get_extra_model_outputs("logp") == {"a": [-0.1, -0.3], "b": [-0.2]}
    assert ep.get_extra_model_outputs("logp", 0) == {"a": -0.1, "b": -0.2}
    np.testing.assert_array_equal(ep.get_actions(0, one_hot_discrete=True)["a"], [0, 0, 0, 1])


def test_setters_use_agent_steps():
    ep = worked_example_two_steps()
    ep.set_rewards(new_data={"b": 9.0}, at_indices=-1)
    ep.set_observations(new_data={"a": [10, 11, 12]})
    assert ep.get_rewards(-1, env_steps=False) == {"a": 1.0, "b": 9.0}
    assert ep.get_observations(-1) == {"a": 12, "b": 2}
    with pytest.raises(KeyError, match="no episode"):
        ep.set_actions(new_data={"zz": 1}, at_indices=0)


def test_sample_batch_numpy_and_repr(capsys):
    ep = worked_example_two_steps()
    batch = ep.get_sample_batch()
    assert batch.env_steps() == 2
    assert set(batch.policy_batches) == {"a", "b"}  # keyed by agent id
    assert batch.agent_steps() == 3
    ep.to_numpy()
    assert ep.is_numpy
    assert isinstance(ep.get_observations(slice(0, None))["a"], np.ndarray)
    ep.add_env_step({"a": 3}, {"a": 1, "b": 1}, {"a": 1.0})  # still works when numpy'd
    assert repr(ep).startswith("MAEps(len=3 done=False")
    ep.print()
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["env_t", "0", "1", "2", "3"]
    assert out[2].split() == ["b", "0", ".", "1", "."]


# ----------------------------------------------------------------- chunking
def test_cut_after_two_steps():
    ep = worked_example_two_steps()
    succ = ep.cut(len_lookback_buffer=1)
    assert succ.id_ == ep.id_
    assert succ.env_t_started == succ.env_t == 2 and len(succ) == 0
    assert succ.agent_episodes["a"].t == 2 and succ.agent_episodes["b"].t == 1
    assert succ.agent_episode_ids == ep.agent_episode_ids
    assert succ.get_agents_to_act() == {"a", "b"}
    assert succ.get_observations(-1, neg_index_as_lookback=True) == {"a": 1}
    assert succ.agent_steps() == 0 and succ.get_return() == 0.0
    succ.validate()
    with pytest.raises(ValueError):
        ep.cut(-1)


def test_cut_grows_lookback_and_carries_hanging_rewards():
    ep = worked_example_two_steps()
    ep.add_env_step({"a": 3}, {"a": 0, "b": 5}, {"a": 1.0, "b": 0.5})
    ep.add_env_step({"a": 4}, {"a": 0}, {"a": 1.0, "b": 0.25})
    ep.custom_data["k"] = [1]
    succ = ep.cut()  # "b" has waited since env step 2 -> lookback grows to 2
    assert succ._len_lookback_buffers == 2
    assert succ._hanging_actions_end == {"b": 5}
    assert succ._hanging_rewards_begin == {"b": 0.75} == ep._hanging_rewards_end
    assert succ.get_return(include_hanging_rewards=True) == pytest.approx(0.75)
    assert succ.custom_data == {"k": [1]} and succ.custom_data["k"] is not ep.custom_data["k"]
    succ.add_env_step({"a": 5, "b": 5}, {"a": 0}, {"a": 1.0, "b": 1.0})
    assert succ.agent_episodes["b"].get_rewards() == [1.75]  # carried 0.75 + 1.0
    assert succ._hanging_rewards_begin == {}
    assert ep.get_return() + succ.get_return() == pytest.approx(4 + 0.75 + 1 + 1.75)


def test_concat_after_cut_equals_uncut():
    def play(ep, steps):
        for kw in steps:
            ep.add_env_step(**kw)

    steps = [
        dict(observations={"a": 3, "c": 0}, actions={"a": 1, "b": 0}, rewards={"a": 1, "c": 5.0}),
        dict(
            observations={"a": 4},
            actions={"a": 0, "c": 1},
            rewards={"a": 0.0, "b": 0.5, "c": 1.0},
        ),
        dict(observations={"b": 5, "c": 2}, actions={"a": 1}, rewards={"a": 1.0, "b": 1.0}),
        dict(
            observations={"b": 6, "c": 3},
            actions={"b": 0, "c": 0},
            rewards={"a": 1, "b": 1, "c": 1},
            terminateds={"__all__": True},
        ),
    ]
    full = worked_example_two_steps()
    play(full, steps)
    for k in range(len(steps)):
        for lookback in (0, 1, 3):
            first = worked_example_two_steps()
            play(first, steps[:k])
            succ = first.cut(len_lookback_buffer=lookback)
            play(succ, steps[k:])
            total = first.get_return() + succ.get_return()
            assert total == pytest.approx(full.get_return())
            first.concat_episode(succ)
            assert_same_episode(first, full)


def test_concat_rejects_mismatches():
    ep = worked_example_two_steps()
    succ = ep.cut()
    other = MultiAgentEpisode()
    with pytest.raises(AssertionError, match="different ids"):
        ep.concat_episode(other)
    succ.env_t_started = 5
    with pytest.raises(AssertionError, match="must equal other.env_t_started"):
        ep.concat_episode(succ)


def test_slice():
    ep = worked_example_two_steps()
    ep.add_env_step({"a": 3}, {"a": 0, "b": 5}, {"a": 1.0, "b": 0.5})
    ep.add_env_step({"a": 4, "b": 4}, {"a": 0}, {"a": 1.0, "b": 0.25})
    first, second = ep[:3], ep.slice(slice(3, None))
    assert (len(first), len(second)) == (3, 1)
    assert first.id_ == second.id_ == ep.id_
    assert second.env_t_started == 3 and second.env_t == 4
    # "b" acted at env step 2 but observes only at 4, "a" acted on its obs at 3:
    # both actions hang at the end of the first slice.
    assert first._hanging_actions_end == {"a": 0, "b": 5}
    assert first.agent_episodes["b"].get_observations() == [0, 2]
    # The second slice's lookback grew to reach "b"'s last observation (env step 2).
    assert second._len_lookback_buffers == 1
    assert second.agent_episodes["b"].get_observations() == [2, 4]
    assert second.agent_episodes["b"].get_rewards() == [0.75]
    assert first.get_return() + second.get_return() == pytest.approx(ep.get_return())
    assert first.agent_steps() + second.agent_steps() == ep.agent_steps()
    first.concat_episode(second)
    assert_same_episode(first, ep)
    with pytest.raises(ValueError, match="step 1"):
        ep.slice(slice(0, 2, 2))
    with pytest.raises(NotImplementedError):
        ep[0]


def test_numpy_episode_slices_and_lookback_reads():
    ep = worked_example_two_steps()
    ep.add_env_step({"a": 3, "b": 3}, {"a": 0, "b": 1}, {"a": 1.0, "b": 1.0})
    ep.to_numpy()
    tail = ep.slice(slice(2, None), len_lookback_buffer=1)
    assert tail.is_numpy and len(tail) == 1 and tail.env_t_started == 2
    assert tail.get_observations(-1, neg_index_as_lookback=True) == {"a": 1}
    np.testing.assert_array_equal(tail.get_rewards(env_steps=False)["b"], [1.0])
    head = ep[:2]
    np.testing.assert_array_equal(head.get_observations()["a"], [0, 1, 2])
    head.concat_episode(tail)
    assert_same_episode(head, ep)


def test_get_state_round_trip_is_plain_data():
    spaces = {aid: gym.spaces.Discrete(10) for aid in ("a", "b", "c")}
    ep = worked_example_two_steps()
    ep.observation_space = gym.spaces.Dict(spaces)
    ep.add_env_step({"a": 3, "c": 0}, {"a": 1, "b": 0}, {"a": 1.0, "c": 5.0})
    ep.custom_data["note"] = "x"
    state = ep.get_state()
    json.dumps(state)  # plain data
    back = MultiAgentEpisode.from_state(json.loads(json.dumps(state)))
    assert_same_episode(back, ep)
    assert back.observation_space == ep.observation_space
    assert back.custom_data == {"note": "x"}
    assert back.module_for("a") == "default_policy"
    # The restored episode keeps going.
    back.add_env_step({"b": 3}, {"a": 0, "c": 0}, {"b": 1.0})
    assert back.agent_episodes["b"].get_rewards() == [0.75, 1.0]


def test_module_mapping_is_memoised():
    calls = []

    def fn(aid, episode, **kwargs):
        calls.append(aid)
        return f"m_{aid}"

    ep = MultiAgentEpisode(agent_to_module_mapping_fn=fn)
    ep.add_env_reset(observations={"a": 0, "b": 0})
    assert ep.module_for("a") == "m_a" and ep.agent_episodes["b"].module_id == "m_b"
    ep.module_for("a")
    assert calls == ["a", "b"]


# ------------------------------------------------------------------- errors
def test_add_env_step_on_done_episode():
    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={"a": 0})
    ep.add_env_step({"a": 1}, {"a": 0}, {"a": 0.0}, terminateds={"__all__": True})
    with pytest.raises(
        MultiAgentEnvError,
        match=re.escape("Cannot call `add_env_step` on a MultiAgentEpisode that is already done!"),
    ):
        ep.add_env_step({"a": 2}, {"a": 0}, {"a": 0.0})
    with pytest.raises(RuntimeError, match=re.escape("Can't call `MultiAgentEpisode.cut()`")):
        ep.cut()


def test_data_after_agent_done():
    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={"a": 0, "b": 0})
    ep.add_env_step({"a": 1, "b": 1}, {"a": 0, "b": 0}, {"a": 0, "b": 0}, terminateds={"a": True})
    with pytest.raises(
        MultiAgentEnvError, match=r"Agent 'a' is already done .* but received obs at env step 2"
    ):
        ep.add_env_step({"a": 2, "b": 2}, {"b": 0}, {"b": 0.0})
    with pytest.raises(MultiAgentEnvError, match=r"Agent 'a' is already done .*received reward"):
        ep.add_env_step({"b": 2}, {"b": 0}, {"a": 1.0, "b": 0.0})


def test_obs_and_action_without_reward():
    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={"a": 0, "b": 0})
    before = ep.get_state()
    with pytest.raises(
        MultiAgentEnvError,
        match=r"Agent 'b' received an observation and sent an action at env step 1 but did NOT "
        r"receive any reward",
    ):
        ep.add_env_step({"a": 1, "b": 1}, {"a": 0, "b": 0}, {"a": 1.0})
    assert ep.get_state() == before  # a failed step changes nothing


def test_truncation_without_observation():
    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={"a": 0, "b": 0})
    match = r"Agent 'b' was truncated at env step 1 without a last observation"
    with pytest.raises(MultiAgentEnvError, match=match):
        ep.add_env_step({"a": 1}, {"a": 0, "b": 0}, {"a": 1.0}, truncateds={"b": True})
    ep.add_env_step({"a": 1}, {"a": 0, "b": 0}, {"a": 1.0})
    with pytest.raises(MultiAgentEnvError, match=match.replace("1", "2")):
        ep.add_env_step({"a": 2}, {"a": 0}, {"a": 1.0}, truncateds={"__all__": True})


def test_protocol_errors_acting_and_observing_out_of_turn():
    ep = MultiAgentEpisode()
    ep.add_env_reset(observations={"a": 0})
    with pytest.raises(MultiAgentEnvError, match=r"Agent 'z' sent an action .* not received any"):
        ep.add_env_step({"a": 1}, {"a": 0, "z": 1}, {"a": 0.0})
    with pytest.raises(MultiAgentEnvError, match=r"Agent 'a' received an observation .* without"):
        ep.add_env_step({"a": 1}, {}, {"a": 0.0})
    ep.add_env_step({}, {"a": 0}, {})
    with pytest.raises(MultiAgentEnvError, match=r"Agent 'a' sent an action .* cannot act twice"):
        ep.add_env_step({"a": 1}, {"a": 0}, {"a": 0.0})
    with pytest.raises(MultiAgentEnvError, match="already has data"):
        ep.add_env_reset(observations={"a": 0})


# ------------------------------------------------------ property-based tests
AGENTS = ("a0", "a1", "a2", "a3")


@st.composite
def schedules(draw):
    """A protocol-conforming random run: the reset obs and a list of step kwargs.

    Agents act whenever they have a fresh observation (like the runner), observe
    again after a random delay, join late (sometimes with rewards before their
    first observation), terminate individually (with or without a last
    observation) or are truncated (always with one), until ``__all__`` ends the
    episode, every known agent is done, or the step budget runs out.
    """
    agents = AGENTS[: draw(st.integers(3, 4))]
    counter = iter(range(1, 10**6))
    state = dict.fromkeys(agents, "absent")
    reset_agents = draw(st.lists(st.sampled_from(agents), min_size=1, unique=True))
    reset = {aid: next(counter) for aid in reset_agents}
    for aid in reset:
        state[aid] = "to_act"
    steps = []
    max_steps = draw(st.integers(1, 24))
    reward = st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.25])
    for k in range(max_steps):
        actions = {aid: draw(st.integers(0, 3)) for aid, s in state.items() if s == "to_act"}
        extras = {aid: {"logp": -float(a) - 0.5} for aid, a in actions.items()}
        for aid in actions:
            state[aid] = "hanging"
        end = draw(st.sampled_from([None] * 14 + ["term", "trunc"]))
        if k == max_steps - 1 and draw(st.booleans()):
            end = draw(st.sampled_from(["term", "trunc"]))
        obs, rewards, terms, truncs = {}, {}, {}, {}
        for aid, s in state.items():
            if s == "hanging":
                see = end == "trunc" or draw(st.booleans())
                if draw(st.booleans()) or (see and aid in actions):
                    rewards[aid] = draw(reward)
                if see:
                    obs[aid] = next(counter)
                    ending = draw(st.sampled_from([None] * 14 + ["term", "trunc"]))
                    if ending == "term":
                        terms[aid] = True
                    elif ending == "trunc":
                        truncs[aid] = True
                elif draw(st.integers(0, 11)) == 0:
                    terms[aid] = True  # terminated while waiting: last obs duplicated
            elif s == "absent":
                if draw(st.integers(0, 3)) == 0:
                    rewards[aid] = draw(reward)
                if draw(st.integers(0, 2)) == 0:
                    obs[aid] = next(counter)
                    if draw(st.integers(0, 9)) == 0:
                        terms[aid] = True  # terminal first observation: dropped
        if end == "term":
            terms["__all__"] = True
        elif end == "trunc":
            truncs["__all__"] = True
        for aid in agents:
            s = state[aid]
            done = end is not None or terms.get(aid) or truncs.get(aid)
            if s == "absent" and aid in obs:
                state[aid] = "gone" if done else "to_act"
            elif s == "absent" and end is not None:
                state[aid] = "gone"
            elif s == "hanging":
                state[aid] = "done" if done else ("to_act" if aid in obs else "hanging")
        steps.append(
            dict(
                observations=obs,
                actions=actions,
                rewards=rewards,
                infos={aid: {"t": k} for aid in obs},
                terminateds=terms,
                truncateds=truncs,
                extra_model_outputs=extras,
            )
        )
        known = [s for s in state.values() if s in ("to_act", "hanging", "done")]
        if end is not None or (known and all(s == "done" for s in known)):
            break
    return reset, steps


def play(reset: dict, steps: list[dict], *, cut_at=(), lookback: int = 0, id_: str = "eps"):
    """Run a schedule; cut at the given step counts; return the list of chunks."""
    ep = MultiAgentEpisode(id_, agent_episode_ids=SA_IDS)
    ep.add_env_reset(observations=reset, infos={aid: {"t": -1} for aid in reset})
    chunks = [ep]
    for k, kw in enumerate(steps):
        if k in cut_at:
            chunks.append(chunks[-1].cut(len_lookback_buffer=lookback))
        chunks[-1].add_env_step(**kw)
    return chunks


def expected_totals(reset: dict, steps: list[dict]):
    """Replay a schedule on a tiny model: completed steps and rewards per agent."""
    steps_done = dict.fromkeys(AGENTS, 0)
    given = dict.fromkeys(AGENTS, 0.0)
    hanging = set()
    for kw in steps:
        for aid, r in kw["rewards"].items():
            given[aid] += r
        for aid in kw["actions"]:
            hanging.add(aid)
        all_term = kw["terminateds"].get("__all__", False)
        for aid in list(hanging):
            if aid in kw["observations"] or kw["terminateds"].get(aid) or all_term:
                hanging.discard(aid)
                steps_done[aid] += 1
    return steps_done, given


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=schedules())
def test_property_bookkeeping_invariants(run):
    reset, steps = run
    (ep,) = play(reset, steps)
    ep.validate()
    assert ep.env_steps() == len(steps) == len(ep) == ep.env_t
    assert ep.agent_steps() == sum(len(sa) for sa in ep.agent_episodes.values())
    steps_done, given = expected_totals(reset, steps)
    for aid, sa in ep.agent_episodes.items():
        sa.validate()
        assert len(sa) == steps_done[aid]
        data = mapping(ep, aid)
        assert len(data) == ep.env_t + 1
        assert sum(v != S for v in data) == len(sa) + 1
        assert [v for v in data if v != S] == list(range(len(sa) + 1))
    # Every reward given to an agent that has an episode is accounted for; so are
    # those of agents still waiting for their first observation.
    waiting = {a: r for a, r in ep._hanging_rewards_begin.items() if a not in ep.agent_episodes}
    for aid, r in waiting.items():
        assert r == pytest.approx(given[aid])
    assert not (ep.is_done and waiting)
    total = sum(given[aid] for aid in ep.agent_episodes) + sum(waiting.values())
    assert ep.get_return(include_hanging_rewards=True) == pytest.approx(total)
    stepped = ep.get_agents_that_stepped()
    ep._stepped_cache = None  # the O(1) cache agrees with the mapping
    assert ep.get_agents_that_stepped() == stepped
    if not ep.is_done:
        to_act = {
            aid
            for aid in ep.agent_episodes
            if aid in (steps[-1]["observations"] if steps else reset)
        }
        assert ep.get_agents_to_act() == {a for a in to_act if not ep.agent_episodes[a].is_done}
    else:
        assert not ep._hanging_actions_end and not ep._hanging_rewards_end
    # Getters agree with the agent episodes.
    obs = ep.get_observations()
    for aid, sa in ep.agent_episodes.items():
        assert list(obs[aid]) == list(sa.get_observations())
    # Env-step getters also report a hanging action's rewards (as RLlib does).
    rewards = ep.get_rewards(return_list=True, indices=slice(0, None))
    hanging = sum(
        ep._hanging_rewards_end.get(aid, 0.0)
        for aid in ep._hanging_actions_end
        if aid in ep.agent_episodes
    )
    assert sum(sum(d.values()) for d in rewards) == pytest.approx(ep.get_return() + hanging)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=schedules(), data=st.data())
def test_property_cut_and_concat_preserve_everything(run, data):
    reset, steps = run
    (full,) = play(reset, steps)
    cut_at = data.draw(st.sets(st.integers(0, max(len(steps) - 1, 0)), max_size=3))
    lookback = data.draw(st.integers(0, 3))
    chunks = play(reset, steps, cut_at=cut_at, lookback=lookback)
    for chunk in chunks:
        chunk.validate()
    assert sum(len(c) for c in chunks) == len(full)
    assert sum(c.agent_steps() for c in chunks) == full.agent_steps()
    assert sum(c.get_return() for c in chunks) == pytest.approx(full.get_return())
    first = chunks[0]
    for chunk in chunks[1:]:
        first.concat_episode(chunk)
    assert_same_episode(first, full)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=schedules(), data=st.data())
def test_property_slices_split_and_rejoin(run, data):
    reset, steps = run
    (full,) = play(reset, steps)
    k = data.draw(st.integers(0, len(full)))
    left, right = full[:k], full[k:]
    left.validate()
    right.validate()
    assert (len(left), len(right)) == (k, len(full) - k)
    assert left.agent_steps() + right.agent_steps() == full.agent_steps()
    assert left.get_return() + right.get_return() == pytest.approx(full.get_return())
    if k < len(full):
        left.concat_episode(right)
        assert_same_episode(left, full)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=schedules())
def test_property_state_round_trip_and_rebuild_from_lists(run):
    reset, steps = run
    (ep,) = play(reset, steps)
    back = MultiAgentEpisode.from_state(json.loads(json.dumps(ep.get_state())))
    assert_same_episode(back, ep)
    # Rebuilding from the env-step getters gives the same agent data.
    everything = slice(0, None)
    extras = ep.get_extra_model_outputs("logp", everything, return_list=True)
    rebuilt = MultiAgentEpisode(
        ep.id_,
        observations=ep.get_observations(everything, return_list=True),
        infos=ep.get_infos(everything, return_list=True),
        actions=ep.get_actions(everything, return_list=True),
        rewards=ep.get_rewards(everything, return_list=True),
        extra_model_outputs=[{aid: {"logp": v} for aid, v in d.items()} for d in extras],
        terminateds=ep.get_terminateds(),
        truncateds=ep.get_truncateds(),
        len_lookback_buffer=0,
        agent_episode_ids=ep.agent_episode_ids,
    )
    rebuilt.validate()
    assert rebuilt.agent_ids == ep.agent_ids
    for aid in ep.agent_ids:
        assert agent_view(rebuilt, aid) == agent_view(ep, aid)
        assert mapping(rebuilt, aid) == mapping(ep, aid)
    assert rebuilt.get_return() == pytest.approx(ep.get_return())
