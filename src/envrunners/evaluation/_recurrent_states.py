"""Per-sub-env recurrent state of an old-stack ``Policy`` while the sampling core steps.

Why: a recurrent policy (``Policy.is_recurrent()``) needs, for every sub-env, the
state its last step returned, across steps and ``sample()`` calls, and the
initial state again when that sub-env's episode starts anew. The single-agent
core loop knows nothing of states; this object gives it an ``act`` function
that feeds and records the state (``state_in_*`` / ``state_out_*`` extra
columns of every step) and wraps the env's ``step`` to see episode boundaries:
with gymnasium's ``NEXT_STEP`` autoreset a sub-env whose episode ended at one
step is reset by the next one, after which its state starts over. Sub-envs
recreated after a failure (``env.failed``) and a recreated vector env
(``ENV_STEP_FAILURE``) start over too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from envrunners.env.env_runner import ENV_STEP_FAILURE

__all__ = ["SubEnvStates"]

PREV_ACTIONS = "prev_actions"
PREV_REWARDS = "prev_rewards"


class SubEnvStates:
    """The recurrent state (and previous action / reward) of each sub-env for one policy.

    Args:
        policy: A recurrent ``Policy`` (``get_initial_state()`` non-empty).
        num_envs: Sub-envs of the vector env it acts for.
    """

    def __init__(self, policy: Any, num_envs: int):
        self.policy = policy
        self.num_envs = int(num_envs)
        self.initial = [np.asarray(s) for s in policy.get_initial_state()]
        self.prev_inputs = tuple(getattr(policy, "prev_inputs", ()))
        self.state: list[np.ndarray] = []
        self.prev_actions: Any = None
        self.prev_rewards = np.zeros(self.num_envs, np.float32)
        # Sub-envs whose episode ended at the last step: the next step resets them.
        self._ended = np.zeros(self.num_envs, np.bool_)
        self.reset_all()

    def reset_all(self) -> None:
        """Every sub-env starts a new episode (after a vector reset)."""
        self.state = [np.repeat(s[None], self.num_envs, axis=0) for s in self.initial]
        self.prev_actions = None
        self.prev_rewards = np.zeros(self.num_envs, np.float32)
        self._ended[:] = False

    def restarted(self, rows: list[int]) -> None:
        """Sub-envs recreated after their step's results were rejected (non-finite data).

        Their next observation starts a new episode: they start from the initial state.
        """
        self._ended[rows] = False
        self._reset_rows(np.asarray(rows, np.intp))

    def _reset_rows(self, rows: np.ndarray) -> None:
        # New arrays: the old ones are this step's ``state_out_*`` extras, which the
        # core writes into its buffers only after the step.
        self.state = [s.copy() for s in self.state]
        for leaf, init in zip(self.state, self.initial):
            leaf[rows] = init
        if self.prev_actions is not None:
            self.prev_actions = self.prev_actions.copy()
            self.prev_actions[rows] = 0
        self.prev_rewards[rows] = 0.0

    def act(self, obs: Any, explore: bool, t: int) -> tuple[Any, dict[str, np.ndarray]]:
        """The core's ``act_fn``: actions for all sub-envs from their current states."""
        state_in = self.state
        prev: dict[str, Any] = {}
        if PREV_ACTIONS in self.prev_inputs:
            if self.prev_actions is None:
                space = self.policy.action_space
                self.prev_actions = np.zeros((self.num_envs, *space.shape), space.dtype)
            prev["prev_action_batch"] = self.prev_actions
        if PREV_REWARDS in self.prev_inputs:
            prev["prev_reward_batch"] = self.prev_rewards
        actions, state_out, extras = self.policy.compute_actions(
            obs, state_batches=state_in, explore=explore, **prev
        )
        for i, (s_in, s_out) in enumerate(zip(state_in, state_out)):
            extras[f"state_in_{i}"] = s_in
            extras[f"state_out_{i}"] = s_out
        self.state = list(state_out)
        if PREV_ACTIONS in self.prev_inputs:
            self.prev_actions = np.array(actions, copy=True)
        return actions, extras

    def wrap_step(self, step_fn: Callable[[Any], Any], env: Any) -> Callable[[Any], Any]:
        """``step_fn`` that also resets the state of sub-envs whose episode starts anew."""
        has_errors = hasattr(env, "last_errors") and hasattr(env, "failed")

        def step(actions: Any) -> Any:
            results = step_fn(actions)
            if results is ENV_STEP_FAILURE:
                self.reset_all()
                return results
            rewards, terms, truncs = results[1], results[2], results[3]
            restart = self._ended
            self._ended = np.logical_or(terms, truncs)
            if has_errors and env.last_errors:
                failed = np.asarray(env.failed, dtype=np.bool_)
                restart = restart | failed
                self._ended &= ~failed
            if PREV_REWARDS in self.prev_inputs:
                self.prev_rewards = np.asarray(rewards, np.float32).copy()
            if restart.any():
                self._reset_rows(np.flatnonzero(restart))
            return results

        return step
