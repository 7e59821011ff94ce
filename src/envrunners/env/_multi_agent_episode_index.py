"""Env-step <-> agent-step index plumbing of ``MultiAgentEpisode`` (private).

Why: a multi-agent episode is indexed two ways. Env steps count calls to
``env.step()``; each agent counts only the steps at which it observed. The
per-agent mapping ``env_t_to_agent_t[aid]`` holds, for every env step position
of the chunk (lookback included), the agent's own timestep ``t`` (absolute, the
same numbers as ``SingleAgentEpisode.t``) or ``SKIP_ENV_TS_TAG`` ("S") if the
agent did not observe at that env step. This module turns env-step indices into
single-agent buffer reads, and splits per-env-step multi-agent data (the
``MultiAgentEpisode`` constructor input) into per-agent columns.

Coordinates used below: a *position* ``p`` indexes a mapping's ``data`` list
(``0 .. lookback + len(episode)``); env-step index ``i >= 0`` is position
``lookback + i``. Observation ``p`` is what the env returned at that env step;
action ``p`` is what the agent did on observation ``p``; reward ``p`` is what it
got for the transition ``p -> p + 1`` (so it appears where the agent observes
again at ``p + 1``).
"""

from __future__ import annotations

from collections.abc import Collection, KeysView
from typing import TYPE_CHECKING, Any

import numpy as np

from envrunners.errors import MultiAgentEnvError

if TYPE_CHECKING:
    from envrunners.env.multi_agent_episode import MultiAgentEpisode
    from envrunners.env.single_agent_episode import SingleAgentEpisode
    from envrunners.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

__all__ = [
    "SKIP_ENV_TS_TAG",
    "AgentColumns",
    "get_data",
    "last_obs_position",
    "space_for",
    "split_by_agent",
    "truncated_without_obs",
]

SKIP_ENV_TS_TAG = "S"

OBS, INFOS, ACTIONS, REWARDS, EXTRA = "observations", "infos", "actions", "rewards", "extra"
_M = object()  # "not given" marker for per-agent values


def space_for(spaces: Any, agent_id: Any) -> Any:
    """Return the space of ``agent_id`` from a dict (or ``gym.spaces.Dict``) of spaces."""
    if not spaces:
        return None
    return spaces.get(agent_id) if hasattr(spaces, "get") else None


def truncated_without_obs(aid: Any, env_t: int) -> str:
    """Return the error message for an agent truncated without a last observation."""
    return (
        f"Agent {aid!r} was truncated at env step {env_t} without a last observation! "
        "A truncated agent needs its final observation (for value bootstrapping): "
        "return one for it in that step's observations."
    )


# --------------------------------------------------------------------- helpers
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


def _positions(indices: Any, lookback: int, n: int, neg_index_as_lookback: bool) -> Any:
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


def _buffer_of(sa: SingleAgentEpisode, what: str, key: str | None) -> InfiniteLookbackBuffer | None:
    """Return the single-agent buffer holding ``what`` (None for a missing extra key)."""
    if what == EXTRA:
        return sa.extra_model_outputs.get(key)
    return getattr(sa, what)


def _rel_index(
    what: str, data: list[Any], p: int, sa: SingleAgentEpisode, buf: InfiniteLookbackBuffer
) -> int | None:
    """Return the agent-relative index (``neg_index_as_lookback`` style) at position ``p``.

    None means the agent has no item of this kind at that env step (it skipped,
    observed for the first time, or its action there is still hanging).
    """
    if what == REWARDS:
        v = data[p + 1]
        if v == SKIP_ENV_TS_TAG:
            return None
        rel = v - 1 - sa.t_started
    else:
        v = data[p]
        if v == SKIP_ENV_TS_TAG:
            return None
        rel = v - sa.t_started
        if what in (ACTIONS, EXTRA) and rel >= len(sa):
            return None  # no completed action on this observation (yet)
    if rel < -buf.lookback:
        return None
    return rel


# --------------------------------------------------------------------- getters
def get_data(
    episode: MultiAgentEpisode,
    what: str,
    indices: Any,
    agent_ids: Any,
    *,
    key: str | None = None,
    env_steps: bool = True,
    neg_index_as_lookback: bool = False,
    fill: Any = None,
    one_hot_discrete: bool = False,
    return_list: bool = False,
) -> Any:
    """Implement ``MultiAgentEpisode.get_observations/infos/actions/rewards/extra...``.

    Args:
        episode: The episode to read.
        what: One of ``"observations"``, ``"infos"``, ``"actions"``, ``"rewards"``,
            ``"extra"`` (then ``key`` names the extra model output).
        indices: None (all of this chunk), an int, a list of ints or a slice.
        agent_ids: None (all agents), one agent id or a collection of them.
        key: The extra model output key (``what == "extra"``).
        env_steps: Indices are env steps (True) or each agent's own steps (False).
        neg_index_as_lookback: Negative indices reach into the lookback.
        fill: Pad out-of-range (and, with ``env_steps``, skipped) positions.
        one_hot_discrete: One-hot encode discrete observations/actions.
        return_list: Return a list (one multi-agent dict per env step).

    Returns:
        A dict ``{agent_id: item or batch}``, or a list of such dicts.
    """
    get_kw: dict[str, Any] = {"fill": fill}
    if what in (OBS, ACTIONS):
        get_kw["one_hot_discrete"] = one_hot_discrete
    agents = as_agent_list(agent_ids, episode.agent_episodes.keys())

    if not env_steps:
        if return_list:
            raise ValueError("`return_list=True` needs `env_steps=True` (indices in env steps).")
        out = {}
        for aid in agents:
            sa = episode.agent_episodes.get(aid)
            buf = None if sa is None else _buffer_of(sa, what, key)
            if buf is not None:
                out[aid] = buf.get(indices, neg_index_as_lookback=neg_index_as_lookback, **get_kw)
        return out

    lookback = episode._len_lookback_buffers
    n_obs = lookback + len(episode) + 1
    n = n_obs if what in (OBS, INFOS) else n_obs - 1
    positions = _positions(indices, lookback, n, neg_index_as_lookback)
    single = isinstance(positions, int)
    if single and return_list:
        raise ValueError("`return_list=True` needs a list or slice of indices, not an int.")
    if single and not 0 <= positions < n and fill is None:
        raise IndexError(
            f"Env-step index {indices} is out of range: this chunk has {n - lookback} "
            f"{'observations' if n == n_obs else 'steps'} after a lookback of {lookback} "
            "(pass fill= to pad)."
        )
    if not single and fill is None:
        positions = [p for p in positions if 0 <= p < n]

    # Per agent: a relative index (or None for "absent") at every requested position.
    per_agent: dict[Any, tuple[InfiniteLookbackBuffer, list[int | None]]] = {}
    for aid in agents:
        sa = episode.agent_episodes.get(aid)
        if sa is None:
            continue
        buf = _buffer_of(sa, what, key)
        if buf is None:
            continue
        data = episode._mapping_data(aid)
        plist = [positions] if single else positions
        rels = [_rel_index(what, data, p, sa, buf) if 0 <= p < n else None for p in plist]
        per_agent[aid] = (buf, rels)

    far = 1 << 40  # a relative index that is out of range for every buffer (-> fill)
    if single or return_list:
        count = 1 if single else len(positions)
        rows: list[dict[Any, Any]] = [{} for _ in range(count)]
        for aid, (buf, rels) in per_agent.items():
            for j, rel in enumerate(rels):
                if rel is not None:
                    rows[j][aid] = buf.get(rel, neg_index_as_lookback=True, **get_kw)
                elif fill is not None:
                    rows[j][aid] = buf.get(far, neg_index_as_lookback=True, **get_kw)
        return rows[0] if single else rows

    out = {}
    for aid, (buf, rels) in per_agent.items():
        if fill is None:
            wanted = [r for r in rels if r is not None]
            if not wanted:
                continue
        else:
            wanted = [far if r is None else r for r in rels]
        out[aid] = buf.get(wanted, neg_index_as_lookback=True, **get_kw)
    return out


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
        pending_action: The action after the last observation (or ``_M``).
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
        self.pending_action: Any = _M
        self.pending_extras: dict[str, Any] = {}
        self.pending_reward: Any = 0.0
        self.has_pending_reward = False
        self.begin_reward: Any = 0.0
        self.has_begin_reward = False

    @property
    def has_pending_action(self) -> bool:
        """Whether the agent acted after its last observation."""
        return self.pending_action is not _M


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
                c.pending_action, c.pending_extras = _M, {}
                c.pending_reward, c.has_pending_reward = 0.0, False
            c.observations.append(obs)
            c.infos.append(infos_j.get(aid) or {})
            c.obs_positions.append(j)
    return cols
