"""``RolloutWorker`` methods for policies, learning, weights, filters, state and DDP.

Why: keeps ``rollout_worker.py`` to construction and sampling. Everything here
reads the worker's ``policy_map``, ``policy_dict``, ``filters``,
``is_policy_to_train``, ``policy_mapping_fn``, ``global_vars`` and ``config``.
"""

from __future__ import annotations

import logging
import platform
import socket
from collections.abc import Callable, Collection
from typing import Any

from envrunners.core import DEFAULT_POLICY_ID
from envrunners.errors import UnknownPolicyError
from envrunners.evaluation._policy_setup import (
    build_policy,
    complete_policy_specs,
    make_is_policy_to_train,
)
from envrunners.evaluation._sampling_hooks import fire
from envrunners.evaluation._sgd import do_minibatch_sgd
from envrunners.policy.policy import Policy
from envrunners.policy.policy_spec import PolicySpec
from envrunners.policy.sample_batch import (
    MultiAgentBatch,
    convert_ma_batch_to_sample_batch,
)
from envrunners.policy.torch_policy import TorchPolicy
from envrunners.utils.filter import get_filter

__all__ = ["WorkerAPIMixin"]

logger = logging.getLogger("envrunners")


class _UnknownPolicyValueError(UnknownPolicyError, ValueError):
    """An unknown policy id where RLlib raises ``ValueError``."""


def _filter_shape(space: Any) -> Any:
    """What a filter normalises: Box shapes; ``None`` (pass through) for discrete parts."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Box):
        return space.shape
    if isinstance(space, gym.spaces.Dict):
        return {k: _filter_shape(v) for k, v in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_filter_shape(v) for v in space.spaces)
    return None


def _resolve_refs(weights: dict[str, Any]) -> dict[str, Any]:
    refs = {k: v for k, v in weights.items() if type(v).__name__ == "ObjectRef"}
    if not refs:
        return weights
    import ray

    values = ray.get(list(refs.values()))
    return {**weights, **dict(zip(refs, values))}


class WorkerAPIMixin:
    """Policy, learning, weight, filter, state and distributed methods of ``RolloutWorker``."""

    # -- policies ------------------------------------------------------------------
    def _update_policy_map(
        self,
        *,
        policy_dict: dict[str, PolicySpec],
        policy: Policy | None = None,
        policy_states: dict[str, Any] | None = None,
    ) -> None:
        """Build (or insert ``policy`` for) every policy of ``policy_dict`` not yet in the map."""
        for pid, spec in policy_dict.items():
            if pid in self.policy_map:
                continue
            new = (
                policy
                if policy is not None
                else build_policy(pid, spec, self._base_policy_config, self.worker_index)
            )
            self.policy_map[pid] = new
            shape = _filter_shape(spec.observation_space)
            self.filters[pid] = get_filter(self.config.observation_filter, shape)
            state = (policy_states or {}).get(pid)
            if state is not None:
                new.set_state(state)
            fire(self.callbacks, "on_create_policy", policy_id=pid, policy=new)

    def get_policy(self, policy_id: str = DEFAULT_POLICY_ID) -> Policy | None:
        """The policy for ``policy_id``, or None."""
        return self.policy_map.get(policy_id)

    def add_policy(
        self,
        policy_id: str,
        policy_cls: type | None = None,
        policy: Policy | None = None,
        *,
        observation_space: Any = None,
        action_space: Any = None,
        config: Any = None,
        policy_state: dict | None = None,
        policy_mapping_fn: Callable[..., Any] | None = None,
        policies_to_train: Collection[str] | Callable[..., bool] | None = None,
        module_spec: Any = None,
    ) -> Policy:
        """Add a policy (built from ``policy_cls`` or given as ``policy``) and return it.

        Raises:
            ValueError: ``module_spec`` given, or not exactly one of class and instance.
            KeyError: ``policy_id`` already exists.
        """
        if not isinstance(policy_id, str) or not policy_id:
            raise ValueError(f"policy_id must be a non-empty str, got {policy_id!r}")
        if module_spec is not None:
            raise ValueError(
                "add_policy(module_spec=...) needs the RLModule API (new stack); on the old "
                "stack give policy_cls or a Policy instance."
            )
        if policy_id in self.policy_map:
            raise KeyError(
                f"Policy ID '{policy_id}' already exists in policy map! Make sure you use a "
                "Policy ID that has not been taken yet. Policy IDs that are already in your "
                f"policy map: {sorted(self.policy_map.keys())}"
            )
        if (policy_cls is None) == (policy is None):
            raise ValueError(
                "Only one of `policy_cls` or `policy` must be provided to "
                "RolloutWorker.add_policy()!"
            )
        if policy is None:
            spec = PolicySpec(policy_cls, observation_space, action_space, config)
            specs = complete_policy_specs(
                self.config,
                env=self.env,
                spaces=self.spaces,
                policies={policy_id: spec},
                policy_mapping_fn=policy_mapping_fn or self.policy_mapping_fn,
            )
        else:
            specs = {
                policy_id: PolicySpec(
                    type(policy), policy.observation_space, policy.action_space, policy.config
                )
            }
        self.policy_dict.update(specs)
        self._update_policy_map(
            policy_dict=specs,
            policy=policy,
            policy_states={policy_id: policy_state} if policy_state else None,
        )
        self.set_policy_mapping_fn(policy_mapping_fn)
        if policies_to_train is not None:
            self.set_is_policy_to_train(policies_to_train)
        return self.policy_map[policy_id]

    def remove_policy(
        self,
        *,
        policy_id: str = DEFAULT_POLICY_ID,
        policy_mapping_fn: Callable[..., Any] | None = None,
        policies_to_train: Collection[str] | Callable[..., bool] | None = None,
    ) -> None:
        """Remove a policy; optionally set a new mapping fn and trainable set.

        Raises:
            ValueError: ``policy_id`` is unknown (an ``UnknownPolicyError`` too).
        """
        if policy_id not in self.policy_map:
            raise _UnknownPolicyValueError(
                f"Policy ID '{policy_id}' not in policy map! Known policy IDs: "
                f"{sorted(self.policy_map.keys())}"
            )
        del self.policy_map[policy_id]
        self.policy_dict.pop(policy_id, None)
        self.filters.pop(policy_id, None)
        self.set_policy_mapping_fn(policy_mapping_fn)
        if policies_to_train is not None:
            self.set_is_policy_to_train(policies_to_train)

    def set_policy_mapping_fn(self, policy_mapping_fn: Callable[..., Any] | None = None) -> None:
        """Use ``policy_mapping_fn(agent_id, episode, worker, **kw)`` (None keeps the current).

        Raises:
            ValueError: It is not callable.
        """
        if policy_mapping_fn is not None:
            if not callable(policy_mapping_fn):
                raise ValueError("`policy_mapping_fn` must be a callable!")
            self.policy_mapping_fn = policy_mapping_fn

    def set_is_policy_to_train(
        self, is_policy_to_train: Collection[str] | Callable[..., bool]
    ) -> None:
        """Set the trainable policies: a list/set/tuple of ids or ``fn(policy_id, batch)``."""
        self.is_policy_to_train = make_is_policy_to_train(is_policy_to_train)

    def get_policies_to_train(self, batch: Any = None) -> set[str]:
        """The ids of the policies to train (given an optional batch)."""
        return {
            pid
            for pid in self.policy_map.keys()
            if self.is_policy_to_train is None or self.is_policy_to_train(pid, batch)
        }

    def for_policy(
        self, func: Callable[..., Any], policy_id: str = DEFAULT_POLICY_ID, **kwargs: Any
    ) -> Any:
        """``func(policy, **kwargs)`` for ``policy_id``."""
        return func(self.policy_map[policy_id], **kwargs)

    def foreach_policy(self, func: Callable[..., Any], **kwargs: Any) -> list[Any]:
        """``[func(policy, policy_id, **kwargs) ...]`` over every policy."""
        return [func(policy, pid, **kwargs) for pid, policy in self.policy_map.items()]

    def foreach_policy_to_train(self, func: Callable[..., Any], **kwargs: Any) -> list[Any]:
        """``[func(policy, policy_id, **kwargs) ...]`` over the trainable policies."""
        trainable = self.get_policies_to_train(None)
        return [func(self.policy_map[pid], pid, **kwargs) for pid in sorted(trainable)]

    # -- learning ------------------------------------------------------------------
    def learn_on_batch(self, samples: Any) -> dict[str, Any]:
        """Train each trainable policy on its part of ``samples``; ``{policy_id: info}``."""
        info: dict[str, Any] = {}
        if isinstance(samples, MultiAgentBatch):
            for pid, batch in samples.policy_batches.items():
                if self.is_policy_to_train is not None and not self.is_policy_to_train(
                    pid, samples
                ):
                    continue
                batch.decompress_if_needed()
                info[pid] = self.policy_map[pid].learn_on_batch(batch)
        elif self.is_policy_to_train is None or self.is_policy_to_train(DEFAULT_POLICY_ID, samples):
            info[DEFAULT_POLICY_ID] = self.policy_map[DEFAULT_POLICY_ID].learn_on_batch(samples)
        return info

    def sample_and_learn(
        self,
        expected_batch_size: int,
        num_sgd_iter: int,
        sgd_minibatch_size: int,
        standardize_fields: list[str],
    ) -> tuple[dict[str, Any], int]:
        """Sample, check the size, then minibatch SGD; ``(info, batch.count)``."""
        batch = self.sample()
        assert batch.count == expected_batch_size, (
            "Batch size possibly out of sync between workers, expected: "
            f"{expected_batch_size} != actual {batch.count}"
        )
        info = do_minibatch_sgd(
            batch, self.policy_map, self, num_sgd_iter, sgd_minibatch_size, standardize_fields
        )
        return info, batch.count

    def compute_gradients(
        self, samples: Any, single_agent: bool | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Gradients per trainable policy (``single_agent=True``: the default policy only)."""
        if single_agent is True:
            samples = convert_ma_batch_to_sample_batch(samples)
            grads, info = self.policy_map[DEFAULT_POLICY_ID].compute_gradients(samples)
            info["batch_count"] = samples.count
            return grads, info
        ma = samples.as_multi_agent()
        grads_out: dict[str, Any] = {}
        info_out: dict[str, Any] = {}
        for pid, batch in ma.policy_batches.items():
            if self.is_policy_to_train is not None and not self.is_policy_to_train(pid, ma):
                continue
            grads_out[pid], info_out[pid] = self.policy_map[pid].compute_gradients(batch)
        info_out["batch_count"] = ma.count
        return grads_out, info_out

    def apply_gradients(self, grads: Any) -> None:
        """Apply gradients (a ``{policy_id: grads}`` dict, or the default policy's)."""
        if isinstance(grads, dict):
            for pid, g in grads.items():
                if self.is_policy_to_train is None or self.is_policy_to_train(pid, None):
                    self.policy_map[pid].apply_gradients(g)
        elif self.is_policy_to_train is None or self.is_policy_to_train(DEFAULT_POLICY_ID, None):
            self.policy_map[DEFAULT_POLICY_ID].apply_gradients(grads)

    # -- weights and global vars ---------------------------------------------------
    def get_weights(
        self, policies: Collection[str] | None = None, inference_only: bool = False
    ) -> dict[str, Any]:
        """``{policy_id: weights}`` for ``policies`` (all if None).

        Raises:
            UnknownPolicyError: A requested id is not a policy of this worker.
        """
        ids = list(self.policy_map.keys()) if policies is None else list(policies)
        return {pid: self.policy_map[pid].get_weights() for pid in ids}

    def set_weights(
        self,
        weights: dict[str, Any],
        global_vars: dict | None = None,
        weights_seq_no: int | None = None,
    ) -> None:
        """Load ``{policy_id: weights}`` (skipped if ``weights_seq_no`` equals the last one)."""
        if weights_seq_no is None or weights_seq_no != self.weights_seq_no:
            weights = _resolve_refs(dict(weights))
            for pid, w in weights.items():
                if pid not in self.policy_map:
                    logger.warning(
                        "set_weights: policy %r is not on this worker (known: %s); skipped.",
                        pid,
                        sorted(self.policy_map.keys()),
                    )
                    continue
                self.policy_map[pid].set_weights(w)
        self.weights_seq_no = weights_seq_no
        if global_vars:
            self.set_global_vars(global_vars)

    def get_global_vars(self) -> dict[str, Any]:
        """The worker's global vars (``timestep``, ``num_grad_updates_per_policy``...)."""
        return self.global_vars

    def set_global_vars(self, global_vars: dict, policy_ids: list[str] | None = None) -> None:
        """Update the global vars and tell the (trainable or given) policies about them."""
        rest = dict(global_vars)
        per_policy = rest.pop("num_grad_updates_per_policy", None) or {}
        self.global_vars["num_grad_updates_per_policy"].update(per_policy)
        ids = policy_ids if policy_ids is not None else self.get_policies_to_train()
        for pid in ids:
            self.policy_map[pid].on_global_var_update(
                {**rest, "num_grad_updates": per_policy.get(pid)}
            )
        self.global_vars.update(rest)

    # -- filters -------------------------------------------------------------------
    def get_filters(self, flush_after: bool = False) -> dict[str, Any]:
        """Serializable snapshots of the observation filters (buffers reset if ``flush_after``)."""
        out = {}
        for pid, f in self.filters.items():
            out[pid] = f.as_serializable()
            if flush_after:
                f.reset_buffer()
        return out

    def sync_filters(self, new_filters: dict[str, Any]) -> None:
        """Replace each filter's state with the given one (same keys as ours)."""
        missing = [k for k in self.filters if k not in new_filters]
        assert not missing, f"sync_filters: no filter given for policies {missing}"
        for pid in self.filters:
            self.filters[pid].sync(new_filters[pid])

    # -- state ---------------------------------------------------------------------
    def get_state(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Policy states, mapping fn, trainable set and filters (filter buffers flushed)."""
        filters = self.get_filters(flush_after=True)
        trainable = self.get_policies_to_train()
        only_trainable = bool(self.config.checkpoint_trainable_policies_only)
        ids = list(self.policy_map.keys())
        return {
            "policy_ids": ids,
            "policy_states": {
                pid: self.policy_map[pid].get_state()
                for pid in ids
                if not only_trainable or pid in trainable
            },
            "policy_mapping_fn": self.policy_mapping_fn,
            "is_policy_to_train": self.is_policy_to_train,
            "filters": filters,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore ``get_state`` output; unknown policies with a ``policy_spec`` are added."""
        if not isinstance(state, dict):
            raise TypeError(f"RolloutWorker.set_state expects a dict, got {type(state).__name__}")
        if "filters" in state:
            self.sync_filters({**self.get_filters(), **state["filters"]})
        policy_states = state.get("policy_states") or state.get("state") or {}
        for pid, pstate in policy_states.items():
            if pid not in self.policy_map:
                spec = pstate.get("policy_spec")
                if not spec:
                    logger.warning("set_state: unknown policy %r without policy_spec; skipped", pid)
                    continue
                self.add_policy(pid, policy=Policy.from_state(pstate))
                continue
            self.policy_map[pid].set_state(pstate)
        if state.get("policy_mapping_fn") is not None:
            self.set_policy_mapping_fn(state["policy_mapping_fn"])
        if "is_policy_to_train" in state:
            self.is_policy_to_train = state["is_policy_to_train"]

    # -- distributed and misc ------------------------------------------------------
    def setup_torch_data_parallel(
        self, url: str, world_rank: int, world_size: int, backend: str = "gloo"
    ) -> None:
        """Join a torch process group and wrap every policy's model in DDP.

        All ``world_size`` workers must call this concurrently (it is a collective).

        Raises:
            ValueError: A policy is not a ``TorchPolicy``.
        """
        import torch.distributed as dist

        for pid, policy in self.policy_map.items():
            if not isinstance(policy, TorchPolicy):
                raise ValueError(
                    f"setup_torch_data_parallel: policy {pid!r} is a {type(policy).__name__}, "
                    "not a TorchPolicy; only torch policies support distributed training."
                )
        if not dist.is_initialized():
            dist.init_process_group(
                backend=backend, init_method=url, rank=world_rank, world_size=world_size
            )
        for _pid, policy in self.policy_map.items():
            policy.enable_data_parallel(world_size)

    def creation_args(self) -> dict[str, Any]:
        """The keyword arguments this worker was created with."""
        return self._original_kwargs

    def get_host(self) -> str:
        """The hostname of this process."""
        return platform.node()

    def get_node_ip(self) -> str:
        """The IP address of the node this worker runs on."""
        try:
            import ray.util

            return ray.util.get_node_ip_address()
        except Exception:  # noqa: BLE001 - fall back to the socket view
            return socket.gethostbyname(socket.gethostname())

    def find_free_port(self) -> int:
        """A free TCP port on this node."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            return int(s.getsockname()[1])
