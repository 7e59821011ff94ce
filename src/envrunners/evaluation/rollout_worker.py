"""``RolloutWorker``: the old API stack's experience collector (``ray.rllib.evaluation``).

Why: old-stack code builds workers that hold a vectorised env, one ``Policy`` per
policy id in a ``PolicyMap``, observation filters, and a ``SyncSampler``; it asks
them for ``SampleBatch``/``MultiAgentBatch`` experience and trains their policies.
Sampling runs through the same core as the new-stack runners; batches are built
(and postprocessed per policy) at the edge. Policy management, weights, state and
distributed-training methods live in ``_worker_api.WorkerAPIMixin``.

Deliberate differences from RLlib: single-agent setups return a ``SampleBatch``
(as RLlib's docs show; ``convert_ma_batch_to_sample_batch`` accepts both);
unknown policy ids raise ``UnknownPolicyError`` naming the known ids.
"""

from __future__ import annotations

import copy
import math
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from envrunners.core import INPUT_ENV_SPACES
from envrunners.env.env_context import EnvContext
from envrunners.env.env_runner import EnvRunner, update_global_seed
from envrunners.env.registry import check_is_env, is_multi_agent_env, resolve_env_creator
from envrunners.env.runner_setup import close_quietly, make_callbacks
from envrunners.errors import ConfigError
from envrunners.evaluation._parallel_iterator import ParallelIteratorWorker
from envrunners.evaluation._policy_setup import complete_policy_specs, make_is_policy_to_train
from envrunners.evaluation._worker_api import WorkerAPIMixin
from envrunners.evaluation.metrics import RolloutMetrics
from envrunners.evaluation.sampler import SyncSampler, fire
from envrunners.offline.io_context import IOContext
from envrunners.offline.io_selection import input_reader_from_config, output_writer_from_config
from envrunners.policy.policy_map import PolicyMap
from envrunners.policy.sample_batch import concat_samples

__all__ = ["RolloutWorker", "get_global_worker"]

_global_worker: RolloutWorker | None = None


def get_global_worker() -> RolloutWorker:
    """The most recently constructed ``RolloutWorker`` in this process."""
    return _global_worker  # type: ignore[return-value]


def _default_mapping_fn(agent_id: Any, episode: Any = None, worker: Any = None, **kw: Any) -> str:
    return "default_policy"


class RolloutWorker(WorkerAPIMixin, ParallelIteratorWorker, EnvRunner):
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
