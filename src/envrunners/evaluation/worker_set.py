"""``WorkerSet`` (``ray.rllib.evaluation.worker_set``): the ``EnvRunnerGroup`` under its old name.

RLlib renamed ``WorkerSet`` to ``EnvRunnerGroup`` without changes; here it is the
same class, so ``local_worker()``, ``remote_workers()``, ``foreach_worker`` and the
other legacy names work on either.
"""

from __future__ import annotations

from envrunners.env.env_runner_group import EnvRunnerGroup

__all__ = ["WorkerSet"]

#: The same class as ``EnvRunnerGroup`` (``WorkerSet is EnvRunnerGroup``).
WorkerSet = EnvRunnerGroup
