"""The state an ``EnvRunnerGroup`` pushes to its runners: read, merged, and remembered.

Weights are read from a source (a local runner, a runner actor, a learner group);
the connector states of several runners are merged into one. ``BroadcastRecord``
remembers what the group last broadcast, so a restored runner can be given the
same state. The keys are those of ``EnvRunner.get_state``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "E2M",
    "INTERNAL_TAGS",
    "M2E",
    "NUM_STEPS",
    "RL_MODULE",
    "SEQ_NO",
    "STATES_TAG",
    "WEIGHTS_TAG",
    "BroadcastRecord",
    "is_object_ref",
    "merge_connector_states",
    "old_stack_weights",
    "pipelines_of",
    "source_state",
]

E2M = "env_to_module_connector"
M2E = "module_to_env_connector"
NUM_STEPS = "num_env_steps_sampled_lifetime"
RL_MODULE = "rl_module"
SEQ_NO = "weights_seq_no"

#: Tags of the group's own async calls (weight and state pushes).
WEIGHTS_TAG = "__sync_weights__"
STATES_TAG = "__sync_states__"
INTERNAL_TAGS = (WEIGHTS_TAG, STATES_TAG)


def is_object_ref(value: Any) -> bool:
    """Whether ``value`` is a Ray ``ObjectRef`` (checked by name: Ray is not imported)."""
    return type(value).__name__ == "ObjectRef"


# ---------------------------------------------------------------------- reading weights
def source_state(src: Any, policies: Sequence[str] | None, inference_only: bool) -> dict:
    """``{"rl_module": weights, "weights_seq_no": n}`` from a runner, actor or learner group."""
    modules = [f"{RL_MODULE}/{p}" for p in policies] if policies else [RL_MODULE]
    if type(src).__name__ == "ActorHandle":
        import ray

        state = ray.get(src.get_state.remote(components=modules, inference_only=inference_only))
    elif "LearnerGroup" in type(src).__name__:
        full = src.get_state(
            components=[f"learner/{m}" for m in modules], inference_only=inference_only
        )
        state = full.get("learner", full)
    else:
        state = _views_of_runner_weights(src, policies, inference_only)
        if state is None:
            state = src.get_state(components=modules, inference_only=inference_only)
    if RL_MODULE not in state:
        raise ValueError(
            f"{type(src).__name__}.get_state(components={modules}) returned no 'rl_module' "
            f"entry (keys: {sorted(state)}); cannot sync weights from it."
        )
    return {RL_MODULE: state[RL_MODULE], SEQ_NO: int(state.get(SEQ_NO, 0) or 0)}


def _views_of_runner_weights(
    src: Any, policies: Sequence[str] | None, inference_only: bool
) -> dict | None:
    """A local runner's (or PPO learner's) weights as views (no copy).

    They go into ``ray.put`` (and the local runner's ``set_state``) right away, in
    this thread, so nothing trains them in between. Saves one copy of the weights
    per sync (about 8 ms at 10M parameters here).

    Only for runners whose module's ``get_state`` takes ``copy``, and learners
    whose ``get_state`` is ``PPOLearner``'s own (it reads just the module); else None.
    """
    module = getattr(src, "module", None)
    get_state = getattr(module, "get_state", None)
    if policies or get_state is None:
        return None
    if hasattr(src, "_weights_seq_no"):
        seq_no = src._weights_seq_no
    elif _is_plain_ppo_learner(src):
        seq_no = src.weights_seq_no
    else:
        return None
    try:
        takes_copy = _takes_copy(getattr(get_state, "__func__", get_state))
    except TypeError:  # an unhashable callable: not cached
        takes_copy = _takes_copy.__wrapped__(get_state)
    if not takes_copy:
        return None
    weights = get_state(inference_only=inference_only, copy=False)
    return {RL_MODULE: weights, SEQ_NO: int(seq_no or 0)}


@functools.lru_cache(maxsize=64)
def _takes_copy(get_state: Callable[..., Any]) -> bool:
    """Whether ``get_state`` has a ``copy`` parameter (cached: ``inspect.signature`` cost
    about 0.1 ms, 2% of a whole weight sync of the default module)."""
    try:
        return "copy" in inspect.signature(get_state).parameters
    except (TypeError, ValueError):
        return False


def _is_plain_ppo_learner(src: Any) -> bool:
    if "Learner" not in type(src).__name__:
        return False
    from envrunners.algorithms.ppo.ppo_learner import PPOLearner

    return isinstance(src, PPOLearner) and type(src).get_state is PPOLearner.get_state


def old_stack_weights(src: Any, policies: Sequence[str] | None, inference_only: bool) -> Any:
    """The policy weights of an old-stack runner (or runner actor)."""
    if type(src).__name__ == "ActorHandle":
        import ray

        return ray.get(src.get_weights.remote(policies))
    return src.get_weights(policies, inference_only)


# ---------------------------------------------------------------------- merging
def _merge_with(pipeline: Any, states: list[Any]) -> Any:
    """Merge states with ``pipeline.merge_states`` (a dict of pipelines merges per key)."""
    if isinstance(pipeline, dict):
        merged = {}
        for key, sub in pipeline.items():
            parts = [s[key] for s in states if isinstance(s, dict) and key in s]
            if parts:
                merged[key] = sub.merge_states(parts)
        return merged
    return pipeline.merge_states(states)


def merge_connector_states(
    states: list[dict],
    *,
    base: dict | None,
    env_to_module: Any,
    module_to_env: Any,
) -> dict:
    """Merge the connector states of several runners into one.

    ``base`` (the local runner's state, or the last broadcast) goes first: the
    filter merge takes the first state's statistics as the common ground and adds
    what every other runner saw since the last sync.
    """
    merged: dict[str, Any] = {}
    ordered = ([base] if base else []) + [s for s in states if s]
    for key, pipeline in ((E2M, env_to_module), (M2E, module_to_env)):
        parts = [s[key] for s in ordered if key in s]
        if parts and pipeline is not None:
            merged[key] = _merge_with(pipeline, parts)
    return merged


def pipelines_of(runner: Any, env_to_module: Any, module_to_env: Any) -> tuple[Any, Any]:
    """The connector pipelines to merge with: the given ones, else the runner's."""
    e2m = env_to_module if env_to_module is not None else getattr(runner, "_env_to_module", None)
    m2e = module_to_env if module_to_env is not None else getattr(runner, "_module_to_env", None)
    return e2m, m2e


# ---------------------------------------------------------------------- memory
class BroadcastRecord:
    """What the group last broadcast to its runners, to give a restored runner the same.

    Attributes:
        version: Bumped by every broadcast; a restore sent with an older version
            is redone.
        weights: ``{"rl_module": ObjectRef, "weights_seq_no": n}`` of the last
            weight broadcast, or None.
        runner_state: Connector states and lifetime steps of the last state broadcast.
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget every broadcast (the group stopped)."""
        self.version = 0
        self.weights: dict | None = None
        self.runner_state: dict = {}
        self._restore_cache: tuple[int, dict] | None = None

    def drop_weights(self) -> tuple[dict | None, tuple[int, dict] | None]:
        """Forget the last weights; returns what held them, for the caller to let go of
        when it suits it (freeing an object nobody else keeps costs time)."""
        previous = (self.weights, self._restore_cache)
        self.weights = None
        self._restore_cache = None
        return previous

    def restore_state(self, local_runner: Any, peer_weights: Callable[[], dict | None]) -> dict:
        """The state a restored runner gets (cached per broadcast version).

        The last broadcast, completed by the local runner's state where nothing was
        broadcast, or without a local runner by ``peer_weights()`` (a healthy
        remote runner's weights). Weights go into the object store once.
        """
        if self._restore_cache is not None and self._restore_cache[0] == self.version:
            return self._restore_cache[1]
        import ray

        state: dict[str, Any] = dict(self.runner_state)
        if self.weights is not None:
            state.update(self.weights)
        elif local_runner is not None:
            try:
                local_state = local_runner.get_state()
            except AttributeError:  # a local runner without module
                local_state = local_runner.get_state(not_components=RL_MODULE)
            for key, value in local_state.items():
                state.setdefault(key, value)
        else:
            peer = peer_weights()
            if peer is not None:
                state.update(peer)
        if RL_MODULE in state and not is_object_ref(state[RL_MODULE]):
            state[RL_MODULE] = ray.put(state[RL_MODULE])
        self._restore_cache = (self.version, state)
        return state
