"""The calls old-stack sampling makes around the core: callbacks, policy actions, batch edits.

Why: ``SyncSampler`` (single-agent), ``PolicyMultiAgentSampler`` and ``RolloutWorker``
all fire old-stack callbacks, ask a ``Policy`` for actions (its fast sampling path
when it has one), map Box actions for the env, and clip rewards in the batches they
build; these pure functions are that shared part, so each caller imports them
without importing another caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from envrunners.policy.sample_batch import SampleBatch

__all__ = [
    "box_action_transform",
    "clip_batch_rewards",
    "fire",
    "policy_action_fn",
    "wants_prev",
]


def fire(callbacks: list[Any], event: str, **kwargs: Any) -> None:
    """Call ``event(**kwargs)`` on every callback object that defines it."""
    for cb in callbacks:
        method = getattr(cb, event, None)
        if method is not None:
            method(**kwargs)


def policy_action_fn(policy: Any) -> Callable[[Any, bool], tuple[Any, dict]]:
    """``fn(obs, explore) -> (actions, extra outputs)`` for ``policy``.

    The policy's ``compute_actions_for_sampling`` when it has one (one batched
    forward, no state outs), else ``compute_actions`` without its state outputs.
    """
    fast = getattr(policy, "compute_actions_for_sampling", None)
    if fast is not None:
        return fast

    def compute(obs: Any, explore: bool) -> tuple[Any, dict]:
        actions, _, extras = policy.compute_actions(obs, explore=explore)
        return actions, extras

    return compute


def wants_prev(policy: Any) -> bool:
    """Whether ``policy`` asks for ``prev_actions``/``prev_rewards`` (its view requirements)."""
    view = getattr(policy, "view_requirements", None)
    return view is None or "prev_actions" in view or "prev_rewards" in view


def clip_batch_rewards(batch: SampleBatch, reward_fn: Any) -> None:
    """Apply ``clip_rewards`` to a trajectory's ``rewards`` and ``prev_rewards`` (in place)."""
    if reward_fn is None:
        return
    for key in (SampleBatch.REWARDS, SampleBatch.PREV_REWARDS):
        if key in batch:
            batch[key] = reward_fn(batch[key]).astype(batch[key].dtype, copy=False)


def box_action_transform(space: Any, normalize_actions: bool, clip_actions: bool) -> Any:
    """Module-to-env action mapping for Box spaces (unsquash and/or clip), else None."""
    if not isinstance(space, gym.spaces.Box) or not (normalize_actions or clip_actions):
        return None
    from envrunners.connectors.module_to_env import NormalizeAndClipActions

    step = NormalizeAndClipActions(
        None, space, normalize_actions=normalize_actions, clip_actions=clip_actions
    )
    return lambda actions: step(batch={"actions": actions})["actions_for_env"]
