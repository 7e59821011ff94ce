"""Recurrent state of one stateful module in the multi-agent loop: one row per acting agent.

Each (sub-env, agent) mapped to a stateful module holds a slot, a row of
batch-first state arrays nested like ``module.get_initial_state()``. One vector
step gathers the rows of all agents that act (one fancy-index per leaf), the
module runs once on them, and the state out is scattered back; agents that do
not act in that step keep their rows untouched (turn-based envs). A slot starts
at the module's initial state and is released when the agent's episode ends,
its sub-env's episode ends or the sub-env is recreated.

When the module's ``model_config`` asks for them (``lstm_use_prev_action`` /
``lstm_use_prev_reward``), a row also holds the agent's previous action and
reward (zeros at its episode start), fed as ``prev_actions`` / ``prev_rewards``
as RLlib's ``PrevActionsPrevRewards`` connector provides them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envrunners.core import _nested

__all__ = ["ModuleStates"]

_MIN_CAPACITY = 16
_STATE = "state"
_PREV_ACTIONS = "prev_actions"
_PREV_REWARDS = "prev_rewards"


class ModuleStates:
    """The state rows of one stateful module (slots reused after release).

    Args:
        module: The module: ``get_initial_state()`` (tensors or numpy, one row
            without a batch axis, e.g. ``{"h": (1, cell), "c": (1, cell)}``),
            ``model_config`` and ``action_space`` (for ``prev_actions``).
    """

    __slots__ = ("module", "initial", "data", "free", "size", "inputs", "prev_rewards")

    def __init__(self, module: Any):
        self.module = module
        initial: dict[str, Any] = {
            _STATE: _nested.map_structure(_to_numpy, module.get_initial_state())
        }
        model_config = getattr(module, "model_config", None) or {}
        if _flag(model_config, "lstm_use_prev_action"):
            example = module.action_space.sample()
            initial[_PREV_ACTIONS] = _nested.map_structure(
                lambda a: np.zeros(np.shape(a), np.asarray(a).dtype), example
            )
        #: Whether rows hold ``prev_rewards`` (the sampler writes them per step).
        self.prev_rewards = _flag(model_config, "lstm_use_prev_reward")
        if self.prev_rewards:
            initial[_PREV_REWARDS] = np.zeros((), np.float32)
        #: The extra input columns fed to the module besides the state (may be empty).
        self.inputs = tuple(k for k in initial if k != _STATE)
        self.initial = initial
        self.data = _nested.map_structure(
            lambda v: np.repeat(v[None], _MIN_CAPACITY, axis=0), initial
        )
        self.free: list[int] = []
        #: Slots handed out so far (free ones included).
        self.size = 0

    def acquire(self) -> int:
        """A slot set to the initial state (and zero previous action and reward)."""
        if self.free:
            slot = self.free.pop()
        else:
            slot = self.size
            self.size += 1
            if slot >= len(_nested.flatten(self.data)[0]):
                self.data = _nested.map_structure(_grown, self.data)
        _nested.map_structure(lambda d, v: d.__setitem__(slot, v), self.data, self.initial)
        return slot

    def release(self, slot: int) -> None:
        """Give a slot back (its agent's episode ended)."""
        self.free.append(slot)

    def clear(self) -> None:
        """Release every slot (all sub-envs were reset)."""
        self.free.clear()
        self.size = 0

    def gather(self, slots: np.ndarray) -> tuple[Any, dict[str, Any] | None]:
        """The rows of ``slots`` as fresh ``(B, ...)`` batches: the state in and the
        extra inputs (``prev_actions`` / ``prev_rewards``; None if the module reads none)."""
        data = self.data
        state = _nested.map_structure(lambda d: d.take(slots, axis=0), data[_STATE])
        if not self.inputs:
            return state, None
        inputs = {
            k: _nested.map_structure(lambda d: d.take(slots, axis=0), data[k]) for k in self.inputs
        }
        return state, inputs

    def after_act(self, slots: np.ndarray, state_out: Any, actions: Any) -> None:
        """Store the module's ``(B, ...)`` state out (and actions, the next previous ones)."""
        data = self.data
        _nested.map_structure(lambda d, v: d.__setitem__(slots, v), data[_STATE], state_out)
        if _PREV_ACTIONS in data:
            _nested.map_structure(
                lambda d, v: d.__setitem__(slots, v), data[_PREV_ACTIONS], actions
            )

    def set_prev_reward(self, slot: int, reward: float) -> None:
        """The reward the agent of ``slot`` got for its last action."""
        self.data[_PREV_REWARDS][slot] = reward

    def fits(self, module: Any) -> bool:
        """Whether these rows belong to ``module`` (a rebuilt module gets new rows)."""
        return module is self.module


def _flag(model_config: Any, key: str) -> bool:
    """``model_config[key]`` of a dict or a ``DefaultModelConfig``."""
    if isinstance(model_config, dict):
        return bool(model_config.get(key))
    return bool(getattr(model_config, key, False))


def _grown(leaf: np.ndarray) -> np.ndarray:
    grown = np.empty((2 * len(leaf), *leaf.shape[1:]), dtype=leaf.dtype)
    grown[: len(leaf)] = leaf
    return grown


def _to_numpy(value: Any) -> np.ndarray:
    detach = getattr(value, "detach", None)
    if detach is not None:
        return detach().cpu().numpy()
    return np.asarray(value)
