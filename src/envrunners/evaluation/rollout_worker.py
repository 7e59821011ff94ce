"""``RolloutWorker``: the old API stack's experience collector (``ray.rllib.evaluation``).

Why: old-stack code builds workers that hold a vectorised env, one ``Policy`` per
policy id in a ``PolicyMap``, observation filters, and a ``SyncSampler``; it asks
them for ``SampleBatch``/``MultiAgentBatch`` experience and trains their policies.
Sampling runs through the same core as the new-stack runners; batches are built
(and postprocessed per policy) at the edge. The worker also manages its policies
(add/remove, mapping fn, trainable set), trains them, and gets/sets weights,
filters and state for the driver.

Deliberate differences from RLlib: single-agent setups return a ``SampleBatch``
(as RLlib's docs show; ``convert_ma_batch_to_sample_batch`` accepts both);
unknown policy ids raise ``UnknownPolicyError`` naming the known ids.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import platform
import socket
import threading
from collections import defaultdict
from collections.abc import Callable, Collection
from typing import Any

import gymnasium as gym

from envrunners.core import DEFAULT_POLICY_ID, INPUT_ENV_SPACES
from envrunners.env.env_context import EnvContext
from envrunners.env.env_runner import EnvRunner, update_global_seed
from envrunners.env.registry import check_is_env, is_multi_agent_env, resolve_env_creator
from envrunners.env.runner_setup import close_quietly, make_callbacks
from envrunners.errors import ConfigError, UnknownPolicyToRemoveError
from envrunners.evaluation._parallel_iterator import ParallelIteratorWorker
from envrunners.evaluation._policy_setup import (
    build_policy,
    complete_policy_specs,
    make_is_policy_to_train,
)
from envrunners.evaluation._sampling_hooks import fire
from envrunners.evaluation._sgd import do_minibatch_sgd
from envrunners.evaluation.metrics import RolloutMetrics
from envrunners.evaluation.sampler import SyncSampler
from envrunners.offline.io_context import IOContext
from envrunners.offline.io_selection import input_reader_from_config, output_writer_from_config
from envrunners.policy.policy import Policy
from envrunners.policy.policy_map import PolicyMap
from envrunners.policy.policy_spec import PolicySpec
from envrunners.policy.sample_batch import (
    MultiAgentBatch,
    concat_samples,
    convert_ma_batch_to_sample_batch,
)
from envrunners.policy.torch_policy import TorchPolicy
from envrunners.utils.filter import get_filter

__all__ = ["RolloutWorker", "get_global_worker"]

logger = logging.getLogger("envrunners")

_global_worker: RolloutWorker | None = None


def get_global_worker() -> RolloutWorker:
    """The most recently constructed ``RolloutWorker`` in this process."""
    return _global_worker  # type: ignore[return-value]


def _default_mapping_fn(agent_id: Any, episode: Any = None, worker: Any = None, **kw: Any) -> str:
    return "default_policy"


def _filter_shape(space: Any) -> Any:
    """What a filter normalises: Box shapes; ``None`` (pass through) for discrete parts."""
    if isinstance(space, gym.spaces.Box):
        return space.shape
    if isinstance(space, gym.spaces.Dict):
        return {k: _filter_shape(v) for k, v in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_filter_shape(v) for v in space.spaces)
    return None


def _resolve_refs(weights: dict[str, Any]) -> dict[str, Any]:
    """``weights`` with every Ray ``ObjectRef`` value fetched (one ``ray.get`` for all)."""
    refs = {k: v for k, v in weights.items() if type(v).__name__ == "ObjectRef"}
    if not refs:
        return weights
    import ray

    values = ray.get(list(refs.values()))
    return {**weights, **dict(zip(refs, values))}


class RolloutWorker(ParallelIteratorWorker, EnvRunner):
    """Wraps a vectorised env and a map of policies; samples, syncs and trains them.

    Args:
        env_creator: ``fn(env_context) -> env`` (gymnasium env, ``MultiAgentEnv`` or
            gymnasium ``VectorEnv``); default: resolve ``config.env``.
        validate_env: Called as ``validate_env(env, env_context)`` on every sub-env.
        config: An ``AlgorithmConfig`` (frozen by this call) or a dict of keys.
        worker_index: 0 for the local worker, > 0 for remote ones.
        num_workers: Number of remote workers (default ``config.num_env_runners``).
        recreated_worker: Whether this worker replaces a failed one.
        log_dir: Directory for output files.
        spaces: ``{policy_id: (obs_space, act_space)}`` for workers without env.
        default_policy_class: Class for policies whose spec names none.
        dataset_shards: Accepted for RLlib compatibility (ray.data input is not supported).
    """

    def __init__(
        self,
        *,
        env_creator: Callable[[Any], Any] | None = None,
        validate_env: Callable[[Any, EnvContext], None] | None = None,
        config: Any = None,
        worker_index: int = 0,
        num_workers: int | None = None,
        recreated_worker: bool = False,
        log_dir: str | None = None,
        spaces: dict[str, tuple[gym.Space, gym.Space]] | None = None,
        default_policy_class: type | None = None,
        dataset_shards: list[Any] | None = None,
        **kwargs: Any,
    ):
        global _global_worker
        self._original_kwargs: dict[str, Any] = {
            "env_creator": env_creator,
            "validate_env": validate_env,
            "config": config,
            "worker_index": worker_index,
            "num_workers": num_workers,
            "recreated_worker": recreated_worker,
            "log_dir": log_dir,
            "spaces": spaces,
            "default_policy_class": default_policy_class,
            "dataset_shards": dataset_shards,
            **kwargs,
        }
        _global_worker = self
        if config is None or isinstance(config, dict):
            from envrunners.algorithms.algorithm_config import AlgorithmConfig

            config = AlgorithmConfig().update_from_dict(config or {})
        config.freeze()
        extra_env = (
            config.extra_python_environs_for_driver
            if worker_index == 0
            else config.extra_python_environs_for_worker
        )
        for key, value in (extra_env or {}).items():
            os.environ[key] = str(value)
        ParallelIteratorWorker.__init__(self, self._gen_rollouts, False)
        num_workers = config.num_env_runners if num_workers is None else num_workers
        EnvRunner.__init__(self, config=config, worker_index=worker_index, num_workers=num_workers)
        self.worker_index: int = worker_index
        self.num_workers: int = num_workers
        self._lock = threading.Lock()
        self.env_context = EnvContext(
            dict(config.env_config or {}),
            worker_index=worker_index,
            vector_index=0,
            remote=bool(config.remote_worker_envs),
            num_workers=num_workers,
            recreated_worker=recreated_worker,
        )
        self.callbacks = make_callbacks(self.config)
        self.recreated_worker = recreated_worker
        self.policy_mapping_fn: Callable[..., Any] = _default_mapping_fn
        self.set_policy_mapping_fn(self.config.policy_mapping_fn)
        self.env_creator = env_creator or self._creator_from_config()
        self.validate_env = validate_env
        self.total_rollout_fragment_length = (
            self.config.get_rollout_fragment_length(worker_index)
            * self.config.num_envs_per_env_runner
        )
        self.preprocessing_enabled = not self.config._disable_preprocessor_api
        self.last_batch: Any = None
        self.global_vars: dict[str, Any] = {
            "timestep": 0,
            "num_grad_updates_per_policy": defaultdict(int),
        }
        self.seed: int | None = None
        if self.config.seed is not None:
            self.seed = int(self.config.seed + worker_index + 10000 * self.config.in_evaluation)
            update_global_seed(self.seed)
        self.env: Any = None
        self.async_env: Any = None
        self._env_is_multi_agent = False
        if not (worker_index == 0 and num_workers > 0 and not self.config.create_local_env_runner):
            self.env = self._make_sub_env(0)
            self._env_is_multi_agent = is_multi_agent_env(self.env)
        self.spaces = spaces
        self.default_policy_class = default_policy_class
        self.policy_dict = complete_policy_specs(
            self.config,
            env=self.env,
            spaces=spaces,
            default_policy_class=default_policy_class,
            policy_mapping_fn=self.policy_mapping_fn,
        )
        self.is_policy_to_train = make_is_policy_to_train(self.config.policies_to_train)
        self.filters: dict[str, Any] = {}
        self.policy_map: PolicyMap = PolicyMap(
            capacity=self.config.policy_map_capacity,
            policy_states_are_swappable=self.config.policy_states_are_swappable,
        )
        self._base_policy_config = self.config.to_dict()
        self._update_policy_map(policy_dict=self.policy_dict)
        if self.env is not None and self.config.is_multi_agent and not self._env_is_multi_agent:
            raise ConfigError(
                f"You are running a multi-agent setup (policies {sorted(self.policy_dict)}), "
                f"but the env {self.env} is not a MultiAgentEnv: use a MultiAgentEnv or keep "
                "the single 'default_policy'."
            )
        if self.env is not None:
            self.async_env = self._make_vector_env()
        if self.config.batch_mode == "truncate_episodes":
            fragment, pack = self.total_rollout_fragment_length, True
        elif self.config.batch_mode == "complete_episodes":
            fragment, pack = math.inf, False
        else:  # pragma: no cover - the config check rejects other values
            raise AssertionError(f"Unsupported batch_mode {self.config.batch_mode!r}")
        self.rollout_fragment_length = fragment
        self.io_context = IOContext(log_dir, self.config, worker_index, self)
        self.sampler: SyncSampler | None = None
        if self.async_env is not None:
            self.sampler = SyncSampler(
                worker=self,
                env=self.async_env,
                clip_rewards=self.config.clip_rewards,
                rollout_fragment_length=self.total_rollout_fragment_length,
                count_steps_by=self.config.count_steps_by,
                callbacks=self.callbacks,
                multiple_episodes_in_batch=pack,
                normalize_actions=self.config.normalize_actions,
                clip_actions=self.config.clip_actions,
                render=bool(self.config.render_env and (num_workers == 0 or worker_index == 1)),
            )
        self.input_reader = input_reader_from_config(self.config, self.io_context, self.sampler)
        self.output_writer = output_writer_from_config(self.config, self.io_context)
        self.weights_seq_no: int | None = None

    # -- construction helpers ------------------------------------------------------
    def _creator_from_config(self) -> Callable[[Any], Any]:
        def creator(ctx: EnvContext) -> Any:
            return resolve_env_creator(self.config.env, ctx)()

        return creator

    def _make_sub_env(self, vector_index: int) -> Any:
        ctx = self.env_context.copy_with_overrides(vector_index=vector_index)
        env = self.env_creator(copy.deepcopy(ctx))
        if not isinstance(env, gym.vector.VectorEnv):
            check_is_env(env, self.config.env or self.env_creator, multi_agent=True)
        if self.validate_env is not None:
            self.validate_env(env, ctx)
        fire(self.callbacks, "on_sub_environment_created", worker=self, sub_environment=env,
             env_context=ctx)  # fmt: skip
        return env

    def _make_vector_env(self) -> Any:
        """The vectorised env over ``num_envs_per_env_runner`` sub-envs (env 0 = ``self.env``)."""
        n = int(self.config.num_envs_per_env_runner)
        first = [self.env]

        def make(i: int) -> Any:
            return first.pop() if i == 0 and first else self._make_sub_env(i)

        fns = [lambda i=i: make(i) for i in range(n)]
        if isinstance(self.env, gym.vector.VectorEnv):
            from gymnasium.wrappers.vector import DictInfoToList

            return DictInfoToList(self.env)
        if self._env_is_multi_agent:
            from envrunners.env.vector.sync_vector_multi_agent_env import SyncVectorMultiAgentEnv

            return SyncVectorMultiAgentEnv(fns, copy=False)
        from envrunners.env.vector.fast_sync_vector_env import FastSyncVectorEnv

        return FastSyncVectorEnv(
            fns, restart_failed=bool(self.config.restart_failed_sub_environments), copy=False
        )

    def env_seed(self) -> int | None:
        """Seed for the first reset: sub-env ``i`` gets ``seed + 1000 * worker_index + i``."""
        return None if self.seed is None else self.seed + 1000 * self.worker_index

    def _gen_rollouts(self) -> Any:
        while True:
            yield self.sample()

    # -- sampling ------------------------------------------------------------------
    def make_env(self) -> None:
        """Not supported on the old stack (envs are built in the constructor)."""
        raise NotImplementedError("RolloutWorker builds its env in __init__; make_env() is unused.")

    def assert_healthy(self) -> None:
        """Raise ``AssertionError`` unless policies, input reader and output writer exist."""
        healthy = bool(self.policy_map) and self.input_reader is not None
        assert healthy and self.output_writer is not None, (
            f"RolloutWorker {self} (idx={self.worker_index}; num_workers={self.num_workers}) "
            "not healthy!"
        )

    def sample(self, **kwargs: Any) -> Any:
        """A batch of at least ``total_rollout_fragment_length`` steps (one episode per read
        in ``complete_episodes`` mode, read until the length is reached).

        Raises:
            ValueError: The worker has no input reader (no env on this worker).
        """
        if self.config.fake_sampler and self.last_batch is not None:
            return self.last_batch
        if self.input_reader is None:
            raise ValueError(
                "RolloutWorker has no `input_reader` object! Cannot call `sample()`. You can "
                "try setting `create_local_env_runner` to True."
            )
        by_agent = self.config.count_steps_by == "agent_steps"

        def count(b: Any) -> int:
            return b.agent_steps() if by_agent else b.env_steps()

        batches = [self.input_reader.next()]
        steps = count(batches[0])
        truncate = self.config.batch_mode == "truncate_episodes"
        max_batches = (
            self.config.num_envs_per_env_runner
            if truncate and not self.config.offline_sampling
            else math.inf
        )
        while steps < self.total_rollout_fragment_length and len(batches) < max_batches:
            batch = self.input_reader.next()
            steps += count(batch)
            batches.append(batch)
        batch = batches[0] if len(batches) == 1 else concat_samples(batches)
        fire(self.callbacks, "on_sample_end", worker=self, samples=batch)
        self.output_writer.write(batch)
        if self.config.compress_observations:
            batch.compress(bulk=self.config.compress_observations == "bulk")
        if self.config.fake_sampler:
            self.last_batch = batch
        return batch

    def sample_with_count(self) -> tuple[Any, int]:
        """``(batch, batch.count)``."""
        batch = self.sample()
        return batch, batch.count

    def get_metrics(self) -> list[RolloutMetrics]:
        """``RolloutMetrics`` of the episodes finished since the last call."""
        return [] if self.sampler is None else self.sampler.get_metrics()

    def get_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        """``{policy_id: (obs, act)}`` plus ``"__env__"`` (the first sub-env's spaces)."""
        spaces = {
            pid: (getattr(p.observation_space, "original_space", p.observation_space),
                  p.action_space)
            for pid, p in self.policy_map.items()
        }  # fmt: skip
        if self.env is not None:
            spaces[INPUT_ENV_SPACES] = (self.env.observation_space, self.env.action_space)
        return spaces

    # -- envs ----------------------------------------------------------------------
    def _sub_envs(self) -> list[Any]:
        if self.async_env is None:
            return []
        envs = getattr(self.async_env, "envs", None)
        if envs is None and hasattr(self.async_env, "env"):  # a gymnasium vector wrapper
            envs = getattr(self.async_env.env, "envs", None)
        return list(envs or [])

    def foreach_env(self, func: Callable[[Any], Any]) -> list[Any]:
        """``[func(sub_env) ...]`` (``[func(vector_env)]`` if it exposes no sub-envs)."""
        if self.async_env is None:
            return []
        envs = self._sub_envs()
        return [func(e) for e in envs] if envs else [func(self.async_env)]

    def foreach_env_with_context(self, func: Callable[[Any, EnvContext], Any]) -> list[Any]:
        """``[func(sub_env, env_context_with_vector_index_i) ...]``."""
        if self.async_env is None:
            return []
        envs = self._sub_envs()
        if not envs:
            return [func(self.async_env, self.env_context)]
        return [
            func(e, self.env_context.copy_with_overrides(vector_index=i))
            for i, e in enumerate(envs)
        ]

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
            UnknownPolicyToRemoveError: ``policy_id`` is unknown (a ``ValueError`` and an
                ``UnknownPolicyError``).
        """
        if policy_id not in self.policy_map:
            raise UnknownPolicyToRemoveError(
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

    def stop(self) -> None:
        """Close the envs and the output writer (publishing its last file)."""
        if self.async_env is not None:
            close_quietly(self.async_env)
        elif self.env is not None:
            close_quietly(self.env)
        close = getattr(self.output_writer, "close", None)
        if close is not None:
            close()

    def apply(self, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``func(self, *args, **kwargs)``; ``func`` is positional-only, so kwargs may use any name."""
        return func(self, *args, **kwargs)

    def lock(self) -> None:
        """Acquire this worker's lock."""
        self._lock.acquire()

    def unlock(self) -> None:
        """Release this worker's lock."""
        self._lock.release()

    def __repr__(self) -> str:
        return f"RolloutWorker(worker_index={self.worker_index})"
