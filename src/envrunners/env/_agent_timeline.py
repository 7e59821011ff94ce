"""Env-step <-> agent-step index math of ``MultiAgentEpisode`` (pure functions).

Why: a multi-agent episode is indexed two ways. Env steps count calls to
``env.step()``; each agent counts only the steps at which it observed. The
per-agent mapping ``env_t_to_agent_t[aid]`` holds, for every env step position
of the chunk (lookback included), the agent's own timestep ``t`` (absolute, the
same numbers as ``SingleAgentEpisode.t``) or ``SKIP_ENV_TS_TAG`` ("S") if the
agent did not observe at that env step. These functions translate env-step
indices into positions of that mapping and into agent-relative buffer indices,
and split per-env-step multi-agent data (the episode constructor's input) into
per-agent columns. They work on plain lists and numbers, never on an episode.

Coordinates used below: a *position* ``p`` indexes a mapping's ``data`` list
(``0 .. lookback + len(episode)``); env-step index ``i >= 0`` is position
``lookback + i``. Observation ``p`` is what the env returned at that env step;
action ``p`` is what the agent did on observation ``p``; reward ``p`` is what it
got for the transition ``p -> p + 1`` (so it appears where the agent observes
again at ``p + 1``).
"""

from __future__ import annotations

from collections.abc import Collection, KeysView
from typing import Any

import numpy as np

from envrunners.errors import MultiAgentEnvError

__all__ = [
    "ACTIONS",
    "EXTRA",
    "INFOS",
    "NOT_GIVEN",
    "OBS",
    "REWARDS",
    "SKIP_ENV_TS_TAG",
    "AgentColumns",
    "agent_index",
    "as_agent_list",
    "env_step_positions",
    "last_obs_position",
    "split_by_agent",
]

SKIP_ENV_TS_TAG = "S"

#: The kinds of per-step data (``EXTRA``: one extra model output, named by a key).
OBS, INFOS, ACTIONS, REWARDS, EXTRA = "observations", "infos", "actions", "rewards", "extra"
#: "Not given" marker for per-agent values (None can be a real value).
NOT_GIVEN = object()


def as_agent_list(agent_ids: Any, known: Collection[Any]) -> list[Any]:
    """Normalise an ``agent_ids`` argument: None -> all known, one id -> ``[id]``."""
    if agent_ids is None:
        return list(known)
    if isinstance(agent_ids, (list, set, frozenset, KeysView)):
        return list(agent_ids)
    return [agent_ids]


def last_obs_position(data: list[Any], upto: int | None = None) -> int | None:
    """Return the last position ``<= upto`` (default: the end) that is not a skip, or None."""
    p = len(data) - 1 if upto is None else min(upto, len(data) - 1)
    while p >= 0:
        if data[p] != SKIP_ENV_TS_TAG:
            return p
        p -= 1
    return None


def env_step_positions(indices: Any, lookback: int, n: int, neg_index_as_lookback: bool) -> Any:
    """Translate env-step ``indices`` into mapping positions (unclipped).

    Returns an int for an int index, else a list (or range) of positions.
    ``n`` is the number of positions holding this kind of data (lookback included).
    """

    def pos(i: int) -> int:
        return lookback + i if (i >= 0 or neg_index_as_lookback) else n + i

    if indices is None:
        return range(lookback, n)
    if isinstance(indices, (int, np.integer)):
        return pos(int(indices))
    if isinstance(indices, slice):
        step = 1 if indices.step is None else int(indices.step)
        if step == 0:
            raise ValueError("slice step cannot be zero")
        if step > 0:
            start = lookback if indices.start is None else pos(int(indices.start))
            stop = n if indices.stop is None else pos(int(indices.stop))
        else:
            start = n - 1 if indices.start is None else pos(int(indices.start))
            stop = lookback - 1 if indices.stop is None else pos(int(indices.stop))
        return range(start, stop, step)
    return [pos(int(i)) for i in indices]


def agent_index(
    what: str, data: list[Any], p: int, t_started: int, num_steps: int, lookback: int
) -> int | None:
    """Return the agent-relative index (``neg_index_as_lookback`` style) at position ``p``.

    Args:
        what: The kind of data (``OBS``, ``INFOS``, ``ACTIONS``, ``REWARDS``, ``EXTRA``).
        data: The agent's env-step mapping.
        p: The position in ``data``.
        t_started: The agent episode's ``t_started``.
        num_steps: The agent episode's length (completed steps).
        lookback: The lookback of the agent's buffer holding ``what``.

    Returns:
        The index, or None where the agent has no item of this kind at that env
        step (it skipped, observed for the first time, or its action there is
        still hanging).
    """
    if what == REWARDS:
        v = data[p + 1]
        if v == SKIP_ENV_TS_TAG:
            return None
        rel = v - 1 - t_started
    else:
        v = data[p]
        if v == SKIP_ENV_TS_TAG:
            return None
        rel = v - t_started
        if what in (ACTIONS, EXTRA) and rel >= num_steps:
            return None  # no completed action on this observation (yet)
    if rel < -lookback:
        return None
    return rel


# ---------------------------------------------------------- constructor input
class AgentColumns:
    """One agent's data pulled out of a list of per-env-step multi-agent dicts.

    Attributes:
        observations: The agent's observations, in order (lookback included).
        infos: Infos aligned with ``observations``.
        actions: One action per completed agent step.
        rewards: One (summed) reward per completed agent step.
        extras: Per key, one value per completed agent step.
        obs_positions: The env-step position of each observation.
        pending_action: The action after the last observation (or ``NOT_GIVEN``).
        pending_extras: Its extra model outputs.
        pending_reward: Rewards received after the last observation.
        has_pending_reward: Whether any such reward was given.
        begin_reward: Rewards before the first observation, outside the lookback.
        has_begin_reward: Whether any such reward was given.
    """

    __slots__ = (
        "observations",
        "infos",
        "actions",
        "rewards",
        "extras",
        "obs_positions",
        "pending_action",
        "pending_extras",
        "pending_reward",
        "has_pending_reward",
        "begin_reward",
        "has_begin_reward",
    )

    def __init__(self) -> None:
        """Start empty."""
        self.observations: list[Any] = []
        self.infos: list[Any] = []
        self.actions: list[Any] = []
        self.rewards: list[Any] = []
        self.extras: dict[str, list[Any]] = {}
        self.obs_positions: list[int] = []
        self.pending_action: Any = NOT_GIVEN
        self.pending_extras: dict[str, Any] = {}
        self.pending_reward: Any = 0.0
        self.has_pending_reward = False
        self.begin_reward: Any = 0.0
        self.has_begin_reward = False

    @property
    def has_pending_action(self) -> bool:
        """Whether the agent acted after its last observation."""
        return self.pending_action is not NOT_GIVEN


def split_by_agent(
    observations: list[dict],
    infos: list[dict],
    actions: list[dict],
    rewards: list[dict],
    extra_model_outputs: list[dict],
    lookback: int,
) -> dict[Any, AgentColumns]:
    """Split per-env-step multi-agent dicts into per-agent columns.

    The rules are those of ``MultiAgentEpisode.add_env_step``: an agent's step
    runs from one observation to its next; the action is the one it sent on the
    first observation; the reward is the sum of everything it got in between.

    Args:
        observations: ``T + 1`` dicts ``{agent_id: obs}`` (position 0 first).
        infos: ``T + 1`` dicts ``{agent_id: info}``.
        actions: ``T`` dicts ``{agent_id: action}`` (action ``j`` was sent on
            observation ``j``).
        rewards: ``T`` dicts ``{agent_id: reward}`` (for the transition ``j -> j+1``).
        extra_model_outputs: ``T`` dicts ``{agent_id: {key: value}}``.
        lookback: How many leading env steps are lookback (rewards before an
            agent's first observation only count outside of it).

    Returns:
        ``{agent_id: AgentColumns}`` for every agent that appears anywhere.

    Raises:
        MultiAgentEnvError: An agent acts without an observation, acts twice
            before observing again, or observes twice without acting.
    """
    cols: dict[Any, AgentColumns] = {}

    def col(aid: Any) -> AgentColumns:
        c = cols.get(aid)
        if c is None:
            c = cols[aid] = AgentColumns()
        return c

    num_steps = len(rewards)
    for j in range(num_steps + 1):
        if j > 0:
            i = j - 1
            extras_i = extra_model_outputs[i]
            for aid, action in actions[i].items():
                c = col(aid)
                if not c.observations:
                    raise MultiAgentEnvError(
                        f"Agent {aid!r} has an action at env step position {i} but no "
                        "observation before it; an agent can only act on an observation."
                    )
                if c.has_pending_action:
                    raise MultiAgentEnvError(
                        f"Agent {aid!r} acts again at env step position {i} before "
                        "observing the result of its previous action."
                    )
                c.pending_action = action
                c.pending_extras = dict(extras_i.get(aid) or {})
            for aid, reward in rewards[i].items():
                c = col(aid)
                if c.observations:
                    c.pending_reward = c.pending_reward + reward
                    c.has_pending_reward = True
                elif i >= lookback:
                    c.begin_reward = c.begin_reward + reward
                    c.has_begin_reward = True
        infos_j = infos[j]
        for aid, obs in observations[j].items():
            c = col(aid)
            if c.observations:
                if not c.has_pending_action:
                    raise MultiAgentEnvError(
                        f"Agent {aid!r} observes at env step position {j} without having "
                        f"acted on its observation at position {c.obs_positions[-1]}."
                    )
                c.actions.append(c.pending_action)
                c.rewards.append(c.pending_reward)
                for k, v in c.pending_extras.items():
                    c.extras.setdefault(k, []).append(v)
                c.pending_action, c.pending_extras = NOT_GIVEN, {}
                c.pending_reward, c.has_pending_reward = 0.0, False
            c.observations.append(obs)
            c.infos.append(infos_j.get(aid) or {})
            c.obs_positions.append(j)
    return cols
