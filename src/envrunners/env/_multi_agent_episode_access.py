"""Getters and setters of ``MultiAgentEpisode`` (private mixin).

Why: the read/write API is large but mechanical; the env-step index translation
it needs lives in ``_multi_agent_episode_index``, and the episode module itself
stays focused on recording steps. Getters index env steps by default
(``env_steps=True``): only agents that observed at a requested env step appear
there. With ``env_steps=False`` indices are each agent's own steps. Setters
always take each agent's own steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envrunners.env import _multi_agent_episode_index as idx

if TYPE_CHECKING:
    from envrunners.env.single_agent_episode import SingleAgentEpisode

__all__ = ["MultiAgentAccessMixin"]

MultiAgentDict = dict[Any, Any]


class MultiAgentAccessMixin:
    """Index-based read and write access to a multi-agent episode's data."""

    agent_episodes: dict[Any, SingleAgentEpisode]

    # --------------------------------------------------------------- getters
    def get_observations(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> MultiAgentDict | list[MultiAgentDict]:
        """Return observations by env step (default) or by each agent's own step.

        With ``env_steps=True`` only agents that observed at a requested env step
        appear there (unless ``fill`` is given, which pads every requested agent).

        Args:
            indices: None (the whole chunk), an int, a list of ints or a slice.
            agent_ids: None (all agents), one agent id or a collection of them.
            env_steps: Read ``indices`` as env steps (True) or agent steps.
            neg_index_as_lookback: Negative indices reach into the lookback.
            fill: Pad out-of-range or skipped positions with this value.
            one_hot_discrete: One-hot encode discrete observations.
            return_list: Return a list with one ``{agent_id: obs}`` per env step.

        Returns:
            ``{agent_id: obs or batch}``, or a list of ``{agent_id: obs}``.

        Example:
            After the reset ``{a: 0, b: 0}`` and a step in which only ``a``
            observed ``1``: ``get_observations(-1) == {"a": 1}`` and
            ``get_observations([0, 1]) == {"a": [0, 1], "b": [0]}``.
        """
        return idx.get_data(
            self,
            idx.OBS,
            indices,
            agent_ids,
            env_steps=env_steps,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            one_hot_discrete=one_hot_discrete,
            return_list=return_list,
        )

    def get_infos(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> MultiAgentDict | list[MultiAgentDict]:
        """Return infos (aligned with observations); see ``get_observations``."""
        return idx.get_data(
            self,
            idx.INFOS,
            indices,
            agent_ids,
            env_steps=env_steps,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            return_list=return_list,
        )

    def get_actions(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        one_hot_discrete: bool = False,
        return_list: bool = False,
    ) -> MultiAgentDict | list[MultiAgentDict]:
        """Return actions; env step ``i`` holds the actions sent on observations ``i``.

        An action still hanging (no observation after it yet) is not included;
        it is in ``_hanging_actions_end``. See ``get_observations`` for the args.
        """
        return idx.get_data(
            self,
            idx.ACTIONS,
            indices,
            agent_ids,
            env_steps=env_steps,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            one_hot_discrete=one_hot_discrete,
            return_list=return_list,
        )

    def get_rewards(
        self,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> MultiAgentDict | list[MultiAgentDict]:
        """Return agent-step rewards; env step ``i`` holds those of agents observing at ``i+1``.

        Hanging (not yet completed) rewards are not included. See
        ``get_observations`` for the args.
        """
        return idx.get_data(
            self,
            idx.REWARDS,
            indices,
            agent_ids,
            env_steps=env_steps,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            return_list=return_list,
        )

    def get_extra_model_outputs(
        self,
        key: str,
        indices: Any = None,
        agent_ids: Any = None,
        *,
        env_steps: bool = True,
        neg_index_as_lookback: bool = False,
        fill: Any = None,
        return_list: bool = False,
    ) -> MultiAgentDict | list[MultiAgentDict]:
        """Return the extra model output ``key`` (aligned with actions); agents without it are left out."""
        return idx.get_data(
            self,
            idx.EXTRA,
            indices,
            agent_ids,
            key=key,
            env_steps=env_steps,
            neg_index_as_lookback=neg_index_as_lookback,
            fill=fill,
            return_list=return_list,
        )

    # --------------------------------------------------------------- setters
    def _sa(self, agent_id: Any) -> SingleAgentEpisode:
        """Return the agent's episode or raise a KeyError naming the known agents."""
        try:
            return self.agent_episodes[agent_id]
        except KeyError:
            raise KeyError(
                f"Agent {agent_id!r} has no episode here; agents: {sorted(map(str, self.agent_episodes))}."
            ) from None

    def set_observations(
        self,
        *,
        new_data: MultiAgentDict,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Overwrite observations per agent; ``at_indices`` are each agent's own steps."""
        for aid, data in new_data.items():
            self._sa(aid).observations.set(
                data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
            )

    def set_actions(
        self,
        *,
        new_data: MultiAgentDict,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Overwrite actions per agent; ``at_indices`` are each agent's own steps."""
        for aid, data in new_data.items():
            self._sa(aid).actions.set(
                data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
            )

    def set_rewards(
        self,
        *,
        new_data: MultiAgentDict,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Overwrite rewards per agent; ``at_indices`` are each agent's own steps."""
        for aid, data in new_data.items():
            self._sa(aid).rewards.set(
                data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback
            )

    def set_extra_model_outputs(
        self,
        *,
        key: str,
        new_data: MultiAgentDict,
        at_indices: Any = None,
        neg_index_as_lookback: bool = False,
    ) -> None:
        """Overwrite the extra model output ``key`` per agent (agent-step indices)."""
        for aid, data in new_data.items():
            buf = self._sa(aid).extra_model_outputs.get(key)
            if buf is None:
                raise KeyError(f"Agent {aid!r} has no extra model output {key!r}.")
            buf.set(data, at_indices=at_indices, neg_index_as_lookback=neg_index_as_lookback)
