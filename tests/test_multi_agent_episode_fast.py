"""``MultiAgentEpisode.try_add_plain_env_step`` records exactly what ``add_env_step`` records.

Random step sequences (plain simultaneous-move steps mixed with agents that skip,
join late, end early, get rewards without observing, protocol errors) go into two
episodes: one only through ``add_env_step``, one as the sampler does it (the fast
path, falling back to ``add_env_step`` when it declines). Their states must match
after every step, errors included.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.structs import same_tree

from envrunners.env.multi_agent_episode import MultiAgentEpisode
from envrunners.errors import MultiAgentEnvError

AGENTS = [0, 1, 2]


def _state(ep: MultiAgentEpisode) -> dict:
    state = ep.get_state()
    for key in ("start_time", "last_step_time"):
        state.pop(key)
    for sa in state["agent_episodes"].values():
        sa.pop("_start_time", None)
        sa.pop("_last_step_time", None)
    state["done_agent_ids"] = sorted(ep._done_agent_ids)
    state["stepped"] = sorted(ep.get_agents_that_stepped())
    return state


def _sub(draw, pool, p_all):
    if draw(st.floats(0, 1)) < p_all:
        return list(pool)
    return draw(st.lists(st.sampled_from(AGENTS), unique=True))


@st.composite
def steps(draw):
    """Mostly plain steps for the agents that acted; sometimes anything goes."""
    out = []
    acting = list(AGENTS)
    for _ in range(draw(st.integers(1, 12))):
        actions = {a: draw(st.integers(0, 1)) for a in _sub(draw, acting, 0.8)}
        observed = _sub(draw, actions, 0.8)
        rewarded = _sub(draw, observed, 0.85)
        obs = {a: np.full(2, draw(st.integers(0, 9)), np.float32) for a in observed}
        rew = {a: float(draw(st.integers(-2, 2))) for a in rewarded}
        term = {a: draw(st.booleans()) and draw(st.booleans()) for a in _sub(draw, observed, 0.9)}
        trunc = {a: draw(st.integers(0, 9)) == 0 for a in _sub(draw, observed, 0.9)}
        term["__all__"] = draw(st.integers(0, 20)) == 0
        trunc["__all__"] = draw(st.integers(0, 30)) == 0
        infos = {a: {"k": 1} for a in _sub(draw, observed, 0.5)}
        extras = {a: {"logp": np.float32(0.5), "seq": 3} for a in actions}
        out.append((obs, actions, rew, infos, term, trunc, extras))
        acting = [a for a in obs if not (term.get(a) or trunc.get(a))]
    return out


@settings(max_examples=300, deadline=None)
@given(steps())
def test_fast_path_matches_add_env_step(schedule):
    reset_obs = {a: np.zeros(2, np.float32) for a in AGENTS}
    slow, fast = MultiAgentEpisode(id_="e"), MultiAgentEpisode(id_="e")
    for ep in (slow, fast):
        ep.add_env_reset(observations=reset_obs, infos={a: {} for a in AGENTS})
        for a, sa in ep.agent_episodes.items():
            sa.id_ = f"{a}"
    for step, (obs, act, rew, infos, term, trunc, extras) in enumerate(schedule):
        # The sampler's form of the extras: (keys, values) pairs (dicts work too).
        pairs = {a: (tuple(d), tuple(d.values())) for a, d in extras.items()}
        fast_extras = pairs if step % 2 else extras
        errors = []
        for ep, use_fast in ((slow, False), (fast, True)):
            try:
                if not (
                    use_fast
                    and ep.try_add_plain_env_step(
                        obs, act, rew, infos, term, trunc, fast_extras, 1.0
                    )
                ):
                    ep.add_env_step(
                        obs,
                        act,
                        rew,
                        infos,
                        terminateds=term,
                        truncateds=trunc,
                        extra_model_outputs=extras,
                    )
                errors.append(None)
            except MultiAgentEnvError as err:
                errors.append(str(err))
        assert errors[0] == errors[1]
        assert same_tree(_state(slow), _state(fast))
        if slow.is_done:
            break


def test_new_agent_episode_matches_constructor_and_reset():
    """The direct construction equals ``SingleAgentEpisode(...)`` + ``add_env_reset``."""
    import gymnasium as gym

    from envrunners.env.multi_agent_episode import new_agent_episode
    from envrunners.env.single_agent_episode import SingleAgentEpisode

    obs_space = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,)), "b": gym.spaces.Discrete(3)})
    for spaces in ((obs_space, gym.spaces.Discrete(2)), (None, None)):
        obs, info = {"a": np.zeros(2, np.float32), "b": 1}, {"x": 1}
        ref = SingleAgentEpisode(
            "id",
            observation_space=spaces[0],
            action_space=spaces[1],
            agent_id=3,
            module_id="m",
            multi_agent_episode_id="ma",
        )
        ref.add_env_reset(obs, info)
        new = new_agent_episode("id", obs, info, spaces[0], spaces[1], 3, "m", "ma")
        for name in SingleAgentEpisode.__slots__:
            a, b = getattr(ref, name), getattr(new, name)
            if name == "_start_time":
                assert isinstance(b, float)
            elif hasattr(a, "space_struct"):  # a buffer
                assert (a.data, a.lookback, a.finalized, a.space) == (
                    b.data,
                    b.lookback,
                    b.finalized,
                    b.space,
                )
                assert a.space_struct == b.space_struct
            else:
                assert a == b, name
        new.validate()
        assert len(new_agent_episode(None, obs, info, None, None, 0, "m", "ma").id_) == 32
