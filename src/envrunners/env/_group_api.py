"""``EnvRunnerGroup``'s older names (``WorkerSet`` API) and old-stack pass-throughs.

The legacy names keep their old defaults where they differ (``foreach_worker``
marks answering runners healthy). The policy and env helpers work with any
runner: old-stack runners provide ``foreach_env``/``foreach_policy``/...
themselves; for new-stack runners the sub-envs of their vector env are visited.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from envrunners.env import _runner_side as sync
from envrunners.errors import ConfigError

__all__ = ["GroupLegacyAPI"]

_DEPRECATED = -1


class GroupLegacyAPI:
    """Legacy and old-stack methods of ``EnvRunnerGroup`` (a private mixin)."""

    _worker_manager: Any
    _local_env_runner: Any
    foreach_env_runner: Callable[..., list]
    foreach_env_runner_async: Callable[..., int]
    probe_unhealthy_env_runners: Callable[..., list]

    # ------------------------------------------------------------------ WorkerSet names
    def local_worker(self) -> Any:
        """The local runner (old name of ``local_env_runner``)."""
        return self._local_env_runner

    def remote_workers(self) -> list[Any]:
        """The actor handles of all remote runners, in id order."""
        return list(self._worker_manager.actors().values())

    def foreach_worker(
        self,
        func: Callable[[Any], Any],
        *,
        local_env_runner: bool = True,
        healthy_only: bool = True,
        remote_worker_ids: list[int] | None = None,
        timeout_seconds: float | None = None,
        return_obj_refs: bool = False,
        mark_healthy: bool = True,
        local_worker: Any = _DEPRECATED,
    ) -> list[Any]:
        """``foreach_env_runner`` under its old name (``mark_healthy`` defaults to True)."""
        if local_worker != _DEPRECATED:
            raise ConfigError(
                "foreach_worker(local_worker=...) is deprecated; use local_env_runner"
            )
        return self.foreach_env_runner(
            func,
            local_env_runner=local_env_runner,
            healthy_only=healthy_only,
            remote_worker_ids=remote_worker_ids,
            timeout_seconds=timeout_seconds,
            return_obj_refs=return_obj_refs,
            mark_healthy=mark_healthy,
        )

    def foreach_worker_with_id(
        self,
        func: Callable[[int, Any], Any],
        *,
        local_env_runner: bool = True,
        healthy_only: bool = True,
        remote_worker_ids: list[int] | None = None,
        timeout_seconds: float | None = None,
    ) -> list[Any]:
        """Call ``func(id, runner)`` on every runner (the local one has id 0)."""
        local = []
        if local_env_runner and self._local_env_runner is not None:
            local = [func(0, self._local_env_runner)]
        ids = list(remote_worker_ids or self._worker_manager.actor_ids())
        if not ids:
            return local
        return local + self.foreach_env_runner(
            [functools.partial(func, i) for i in ids],
            local_env_runner=False,
            healthy_only=healthy_only,
            remote_worker_ids=ids,
            timeout_seconds=timeout_seconds,
        )

    def foreach_worker_async(
        self,
        func: Callable[[Any], Any],
        *,
        healthy_only: bool = True,
        remote_worker_ids: list[int] | None = None,
    ) -> int:
        """``foreach_env_runner_async`` without a tag (old name)."""
        return self.foreach_env_runner_async(
            func, healthy_only=healthy_only, remote_worker_ids=remote_worker_ids
        )

    def probe_unhealthy_workers(self, timeout_seconds: float | None = None) -> list[int]:
        """``probe_unhealthy_env_runners`` (old name)."""
        return self.probe_unhealthy_env_runners(timeout_seconds)

    # ------------------------------------------------------------------ envs
    def foreach_env(self, func: Callable[[Any], Any]) -> list[list[Any]]:
        """``[[func(sub_env) for each sub-env] for each runner]``, local runner first."""
        return self.foreach_env_runner(sync.visit_sub_envs, kwargs={"env_func": func})

    def foreach_env_with_context(self, func: Callable[[Any, Any], Any]) -> list[list[Any]]:
        """Like ``foreach_env`` with ``func(sub_env, env_context)``."""
        return self.foreach_env_runner(
            sync.visit_sub_envs, kwargs={"env_func": func, "with_context": True}
        )

    # ------------------------------------------------------------------ policies
    def foreach_policy(self, func: Callable[..., Any]) -> list[Any]:
        """``func(policy, policy_id)`` for every policy of every runner, flattened."""
        results = self.foreach_env_runner(_foreach_policy, kwargs={"policy_func": func})
        return [r for per_runner in results for r in per_runner]

    def foreach_policy_to_train(self, func: Callable[..., Any]) -> list[Any]:
        """Like ``foreach_policy``, only for the policies being trained."""
        results = self.foreach_env_runner(_foreach_policy_to_train, kwargs={"policy_func": func})
        return [r for per_runner in results for r in per_runner]

    def foreach_trainable_policy(self, func: Callable[..., Any]) -> list[Any]:
        """Removed name; raises (use ``foreach_policy_to_train``)."""
        raise ConfigError("foreach_trainable_policy() is deprecated; use foreach_policy_to_train()")

    def is_policy_to_train(self, policy_id: str, batch: Any = None) -> bool:
        """Whether the local runner trains ``policy_id`` (True if it has no rule).

        Raises:
            NotImplementedError: The group has no local runner.
        """
        local = self._local_env_runner
        if local is None:
            raise NotImplementedError(
                "is_policy_to_train() needs a local env runner; this group has none."
            )
        rule = getattr(local, "is_policy_to_train", None)
        return True if rule is None else bool(rule(policy_id, batch))

    def add_policy(
        self,
        policy_id: str,
        policy_cls: type | None = None,
        policy: Any = None,
        *,
        observation_space: Any = None,
        action_space: Any = None,
        config: Any = None,
        policy_state: Any = None,
        policy_mapping_fn: Callable[..., Any] | None = None,
        policies_to_train: Any = None,
        module_spec: Any = None,
        workers: Any = _DEPRECATED,
    ) -> None:
        """Add a policy to the local runner and every remote runner (old stack).

        Exactly one of ``policy_cls`` and ``policy`` is needed; with an instance,
        the remote runners build clones from its class, spaces, config and state.

        Raises:
            KeyError: ``policy_id`` exists already.
            ValueError: Not exactly one of ``policy_cls``/``policy`` was given.
        """
        local = self._local_env_runner
        if local is not None and policy_id in getattr(local, "policy_map", {}):
            raise KeyError(
                f"Policy ID '{policy_id}' already exists in policy map! Make sure you use "
                "a Policy ID that has not been taken yet. Policy IDs that are already in "
                f"your policy map: {list(local.policy_map.keys())}"
            )
        if workers != _DEPRECATED:
            raise ConfigError("add_policy(workers=...) is deprecated; it adds to all runners")
        if (policy_cls is None) == (policy is None):
            raise ValueError(
                "Only one of `policy_cls` or `policy` must be provided to staticmethod: "
                "`EnvRunnerGroup.add_policy()`!"
            )
        if policy is not None:
            remote_kwargs = {
                "policy_cls": type(policy),
                "observation_space": policy.observation_space,
                "action_space": policy.action_space,
                "config": policy.config,
                "policy_state": policy.get_state(),
            }
        else:
            remote_kwargs = {
                "policy_cls": policy_cls,
                "observation_space": observation_space,
                "action_space": action_space,
                "config": config,
                "policy_state": policy_state,
            }
        common = {
            "policy_mapping_fn": policy_mapping_fn,
            "policies_to_train": (
                list(policies_to_train)
                if policies_to_train is not None and not callable(policies_to_train)
                else policies_to_train
            ),
            "module_spec": module_spec,
        }
        if local is not None:
            if policy is not None:
                local.add_policy(policy_id=policy_id, policy=policy, **common)
            else:
                local.add_policy(policy_id=policy_id, **remote_kwargs, **common)
        if self._worker_manager.num_actors():
            self.foreach_env_runner(
                _add_policy,
                kwargs={"policy_id": policy_id, **remote_kwargs, **common},
                local_env_runner=False,
            )


def _foreach_policy(runner: Any, policy_func: Callable[..., Any]) -> list[Any]:
    return runner.foreach_policy(policy_func)


def _foreach_policy_to_train(runner: Any, policy_func: Callable[..., Any]) -> list[Any]:
    return runner.foreach_policy_to_train(policy_func)


def _add_policy(runner: Any, **kwargs: Any) -> None:
    runner.add_policy(**kwargs)
