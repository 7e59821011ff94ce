"""``Policy``: the old API stack's unit of acting and learning (``ray.rllib.policy.policy``).

Why: a ``RolloutWorker`` holds one ``Policy`` per policy id (in a ``PolicyMap``);
it asks each for actions, lets it postprocess its sampled trajectories and, on the
learner side, trains it on batches. This base class fixes the interface and the
parts every policy shares: config handling, timestep and grad-update counters,
single-observation convenience, and state / checkpoint round trips (plain files:
JSON and ``.npz``, never pickle). Framework code lives in ``TorchPolicy``.
"""

from __future__ import annotations

import importlib
import os
import platform
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.core.rl_module._space_codec import space_from_dict, space_to_dict
from envrunners.errors import ConfigError, EnvRunnersError
from envrunners.policy.policy_spec import PolicySpec
from envrunners.utils.checkpoints import load_state, save_state

__all__ = ["Policy", "PolicySpec", "PolicyState"]

PolicyState = dict[str, Any]
_CHECKPOINT_TYPE = "Policy"
_PLAIN = (bool, int, float, str, type(None))


def class_path(cls: type) -> str:
    """``module.QualName`` of ``cls`` (what a policy state stores to rebuild it)."""
    return f"{cls.__module__}.{cls.__qualname__}"


def import_class(path: str | type) -> type:
    """Import a class from ``module.QualName`` (a class is returned as is)."""
    if isinstance(path, type):
        return path
    module_name, _, name = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigError(f"cannot import policy class {path!r}: {err}") from err


def plain_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-able part of a config dict (callables, classes and objects left out)."""

    def plain(value: Any) -> Any:
        if isinstance(value, _PLAIN):
            return value
        if isinstance(value, list | tuple):
            items = [plain(v) for v in value]
            return _SKIP if any(i is _SKIP for i in items) else items
        if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            return {k: v for k, v in ((k, plain(v)) for k, v in value.items()) if v is not _SKIP}
        return _SKIP

    return {k: v for k, v in ((k, plain(v)) for k, v in config.items()) if v is not _SKIP}


_SKIP = object()


def merge_config(base: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """``base`` updated by ``overrides``; the ``model``/``model_config`` dicts merge key-wise."""
    out = dict(base)
    for key, value in (overrides or {}).items():
        if key in ("model", "model_config") and isinstance(value, Mapping):
            merged = {**dict(out.get("model") or {}), **dict(out.get("model_config") or {})}
            merged.update(value)
            out["model"] = merged
            out["model_config"] = dict(merged)
        elif key == "lambda_":
            out["lambda"] = value
        else:
            out[key] = value
    return out


def _as_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if hasattr(config, "to_dict") and not isinstance(config, Mapping):
        return config.to_dict()
    return dict(config)


class Policy:
    """Acts for (and learns from) the agents mapped to one policy id.

    Args:
        observation_space: The observation space of the agents using this policy.
        action_space: Their action space.
        config: The policy's config: a dict (an ``AlgorithmConfig`` is turned
            into one) merged over :meth:`get_default_config`.
    """

    framework = "torch"

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: Any):
        self.observation_space = observation_space
        self.action_space = action_space
        self.config: dict[str, Any] = merge_config(self.get_default_config(), _as_dict(config))
        self.global_timestep = 0
        self.num_grad_updates = 0
        self.dist_class: type | None = None
        self.distributed_world_size: int | None = None
        #: Columns this policy wants in its sample batches (keys matter).
        self.view_requirements: dict[str, dict[str, Any]] = {
            "obs": {},
            "new_obs": {"data_col": "obs", "shift": 1},
            "actions": {},
            "rewards": {},
            "terminateds": {},
            "truncateds": {},
            "infos": {},
            "eps_id": {},
            "unroll_id": {},
            "agent_index": {},
            "t": {},
            "prev_actions": {"data_col": "actions", "shift": -1},
            "prev_rewards": {"data_col": "rewards", "shift": -1},
        }

    @classmethod
    def get_default_config(cls) -> dict[str, Any]:
        """Defaults merged under the config given to the constructor (none here)."""
        return {}

    # -- acting --------------------------------------------------------------------
    def compute_actions(
        self,
        obs_batch: Any,
        state_batches: list[Any] | None = None,
        prev_action_batch: Any = None,
        prev_reward_batch: Any = None,
        info_batch: Any = None,
        episodes: list[Any] | None = None,
        explore: bool | None = None,
        timestep: int | None = None,
        **kwargs: Any,
    ) -> tuple[Any, list[Any], dict[str, Any]]:
        """Actions for a batch of observations.

        Returns:
            ``(actions, state_outs, extra_fetches)``: batched actions, the recurrent
            state outputs (``[]`` for stateless policies) and extra per-row columns
            (``action_logp``, ``action_dist_inputs``, ``vf_preds`` ...).
        """
        raise NotImplementedError(f"{type(self).__name__} must implement compute_actions()")

    def compute_actions_from_input_dict(
        self,
        input_dict: Mapping[str, Any],
        explore: bool | None = None,
        timestep: int | None = None,
        episodes: list[Any] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, list[Any], dict[str, Any]]:
        """``compute_actions`` on the columns of ``input_dict`` (``obs``, ``state_in_*``...)."""
        keys = [k for k in input_dict if str(k).startswith("state_in_")]
        states = [input_dict[k] for k in sorted(keys, key=lambda k: int(str(k)[9:]))]
        return self.compute_actions(
            input_dict["obs"],
            states or None,
            prev_action_batch=input_dict.get("prev_actions"),
            prev_reward_batch=input_dict.get("prev_rewards"),
            info_batch=input_dict.get("infos"),
            episodes=episodes,
            explore=explore,
            timestep=timestep,
            **kwargs,
        )

    def compute_single_action(
        self,
        obs: Any = None,
        state: list[Any] | None = None,
        *,
        prev_action: Any = None,
        prev_reward: Any = None,
        info: dict | None = None,
        input_dict: Mapping[str, Any] | None = None,
        episode: Any = None,
        explore: bool | None = None,
        timestep: int | None = None,
        **kwargs: Any,
    ) -> tuple[Any, list[Any], dict[str, Any]]:
        """The action for one observation: ``(action, state_out, extra_fetches)``, unbatched.

        Raises:
            ValueError: Neither ``obs`` nor ``input_dict`` is given.
        """
        if input_dict is not None:
            obs = input_dict["obs"]
            prev_action = input_dict.get("prev_actions", prev_action)
            prev_reward = input_dict.get("prev_rewards", prev_reward)
        if obs is None:
            raise ValueError("compute_single_action needs `obs` or `input_dict` with 'obs'.")
        batch_obs = batch_of_one(obs)
        actions, states, extras = self.compute_actions(
            batch_obs,
            [np.asarray(s)[None] for s in state] if state else None,
            prev_action_batch=None if prev_action is None else batch_of_one(prev_action),
            prev_reward_batch=None if prev_reward is None else np.asarray([prev_reward]),
            info_batch=None if info is None else [info],
            episodes=None if episode is None else [episode],
            explore=explore,
            timestep=timestep,
            **kwargs,
        )
        first = _first_row(actions)
        return first, [s[0] for s in states], {k: _first_row(v) for k, v in extras.items()}

    def compute_log_likelihoods(
        self,
        actions: Any,
        obs_batch: Any,
        state_batches: list[Any] | None = None,
        prev_action_batch: Any = None,
        prev_reward_batch: Any = None,
        actions_normalized: bool = True,
        in_training: bool = True,
    ) -> Any:
        """Log-likelihoods of ``actions`` given ``obs_batch`` under this policy."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute_log_likelihoods()")

    # -- learning ------------------------------------------------------------------
    def postprocess_trajectory(
        self,
        sample_batch: Any,
        other_agent_batches: dict[Any, Any] | None = None,
        episode: Any = None,
    ) -> Any:
        """Add learning targets to one sampled trajectory (identity here)."""
        return sample_batch

    def loss(self, model: Any, dist_class: type, train_batch: Any) -> Any:
        """The loss to minimise on ``train_batch`` (framework policies implement it)."""
        raise NotImplementedError(f"{type(self).__name__} has no loss()")

    def learn_on_batch(self, samples: Any) -> dict[str, Any]:
        """One learning update on ``samples``: ``compute_gradients`` then ``apply_gradients``."""
        grads, info = self.compute_gradients(samples)
        self.apply_gradients(grads)
        self.num_grad_updates += 1
        return info

    def compute_gradients(self, postprocessed_batch: Any) -> tuple[Any, dict[str, Any]]:
        """Gradients of the loss on ``postprocessed_batch``: ``(grads, info)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute_gradients()")

    def apply_gradients(self, gradients: Any) -> None:
        """Apply gradients (as returned by ``compute_gradients``) to the model."""
        raise NotImplementedError(f"{type(self).__name__} must implement apply_gradients()")

    def on_global_var_update(self, global_vars: Mapping[str, Any]) -> None:
        """Take the global ``timestep`` (and ``num_grad_updates``) from the driver."""
        if "timestep" in global_vars:
            self.global_timestep = int(global_vars["timestep"])
        if global_vars.get("num_grad_updates") is not None:
            self.num_grad_updates = int(global_vars["num_grad_updates"])

    # -- weights and state ---------------------------------------------------------
    def get_weights(self) -> dict[str, np.ndarray]:
        """The model weights as a dict of numpy arrays."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_weights()")

    def set_weights(self, weights: Mapping[str, Any]) -> None:
        """Load weights returned by ``get_weights`` (of this or an equal policy)."""
        raise NotImplementedError(f"{type(self).__name__} must implement set_weights()")

    def get_exploration_state(self) -> dict[str, Any]:
        """State of the exploration component (none: sampling from the action distribution)."""
        return {}

    def get_initial_state(self) -> list[Any]:
        """Recurrent state for a new episode: one array per state tensor (``[]`` if none)."""
        return []

    def is_recurrent(self) -> bool:
        """Whether the policy keeps recurrent state between steps."""
        return len(self.get_initial_state()) > 0

    def num_state_tensors(self) -> int:
        """The number of recurrent state tensors."""
        return len(self.get_initial_state())

    def get_state(self) -> PolicyState:
        """Everything that rebuilds this policy: its spec, weights and counters."""
        return {
            "policy_spec": {
                "policy_class": class_path(type(self)),
                "observation_space": space_to_dict(self.observation_space),
                "action_space": space_to_dict(self.action_space),
                "config": self.config,
            },
            "weights": self.get_weights(),
            "global_timestep": self.global_timestep,
            "num_grad_updates": self.num_grad_updates,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore weights and counters from ``get_state`` output."""
        if "weights" in state:
            self.set_weights(state["weights"])
        self.global_timestep = int(state.get("global_timestep", self.global_timestep))
        self.num_grad_updates = int(state.get("num_grad_updates", self.num_grad_updates))

    @staticmethod
    def from_state(state: Mapping[str, Any]) -> Policy:
        """Build a new policy of the class named in ``state`` and restore ``state`` into it.

        Raises:
            ConfigError: The state has no ``policy_spec``, or its class cannot be imported.
        """
        spec = state.get("policy_spec")
        if not spec:
            raise ConfigError(
                "Policy.from_state: the state has no 'policy_spec' (class, spaces, config); "
                "use Policy.get_state() output."
            )
        cls = import_class(spec["policy_class"])
        policy = cls(
            _space(spec["observation_space"]), _space(spec["action_space"]), spec["config"]
        )
        policy.set_state(state)
        return policy

    # -- checkpoints ---------------------------------------------------------------
    def export_checkpoint(
        self,
        export_dir: str | os.PathLike,
        filename_prefix: Any = None,
        *,
        policy_state: PolicyState | None = None,
        checkpoint_format: str = "cloudpickle",
    ) -> None:
        """Write this policy's state to ``export_dir`` as JSON + ``.npz`` (never pickle).

        ``checkpoint_format`` is accepted for RLlib compatibility; the files are the
        same for every value. Config entries that are not plain data (callables,
        classes) are left out; ``from_checkpoint`` rebuilds them from defaults.
        """
        state = dict(policy_state if policy_state is not None else self.get_state())
        spec = dict(state["policy_spec"])
        spec["config"] = plain_config(spec.get("config") or {})
        state["policy_spec"] = spec
        meta = {"type": _CHECKPOINT_TYPE, "checkpoint_version": "1.1", "format": "envrunners"}
        save_state(export_dir, state, meta)

    @staticmethod
    def from_checkpoint(
        checkpoint: str | os.PathLike, policy_ids: list[str] | None = None
    ) -> Policy | dict[str, Policy]:
        """Load a policy written by ``export_checkpoint``.

        A directory with a ``policies/<policy_id>`` sub-directory per policy loads
        all of them (or those in ``policy_ids``) and returns ``{policy_id: Policy}``.

        Raises:
            EnvRunnersError: ``checkpoint`` is neither kind of checkpoint directory.
        """
        root = Path(checkpoint)
        if (root / "policies").is_dir():
            out = {}
            for sub in sorted((root / "policies").iterdir()):
                if sub.is_dir() and (policy_ids is None or sub.name in policy_ids):
                    out[sub.name] = Policy.from_checkpoint(sub)
            return out
        state, meta = load_state(root)
        if meta.get("type") not in (None, _CHECKPOINT_TYPE):
            raise EnvRunnersError(f"{root} is a {meta.get('type')} checkpoint, not a Policy one")
        return Policy.from_state(state)

    def export_model(self, export_dir: str | os.PathLike, onnx: int | None = None) -> None:
        """Write the model's weights to ``export_dir`` (framework policies implement it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot export its model")

    # -- misc ----------------------------------------------------------------------
    def apply(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``func(self, *args, **kwargs)``."""
        return func(self, *args, **kwargs)

    def get_host(self) -> str:
        """The hostname of the process holding this policy."""
        return platform.node()

    def get_session(self) -> None:
        """No TensorFlow session (torch only)."""
        return None

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(observation_space={self.observation_space}, "
            f"action_space={self.action_space})"
        )


def _space(value: Any) -> gym.Space | None:
    return value if value is None or isinstance(value, gym.Space) else space_from_dict(value)


def batch_of_one(x: Any) -> Any:
    """One observation (possibly a dict/tuple of arrays) as a batch of one row."""
    if isinstance(x, dict):
        return {k: batch_of_one(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(batch_of_one(v) for v in x)
    return np.asarray(x)[None]


def _first_row(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _first_row(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_first_row(v) for v in x)
    if isinstance(x, list):
        return x[0]
    return np.asarray(x)[0]
