"""Ray plumbing for ``EnvRunnerGroup``: start or join Ray, pick the runner class, make actors.

Why a module of its own: the group must work without Ray (``num_env_runners=0``),
join a cluster when there is one (``RAY_ADDRESS`` or an initialised Ray), and
otherwise start an embedded local Ray that it shuts down again when the last
group that needed it stops.

A Ray that envrunners starts is reachable from this machine only: its node IP is
127.0.0.1, so every Ray process (GCS, raylet, workers, agents) listens on
loopback, and Ray's token authentication (on by default for a new local Ray since
Ray 2.60) stays on; ``RAY_AUTH_MODE=disabled`` gets one warning per process.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
from collections.abc import Iterator
from typing import Any

from envrunners.errors import ConfigError

__all__ = [
    "acquire_ray",
    "default_runner_class",
    "init_local_ray",
    "join_ray",
    "make_remote_class",
    "release_ray",
]

logger = logging.getLogger("envrunners")

_lock = threading.Lock()
_owned = {"refs": 0, "started": False}

#: System config of the embedded Ray: a task to a killed actor fails after 0.1 s
#: (Ray's default waits 1 s for the death details), so faults are seen sooner;
#: results up to 1 MiB (a runner's sample of a few thousand steps) come back
#: inline with the reply instead of through the object store (~3 ms less each).
EMBEDDED_SYSTEM_CONFIG = {
    "timeout_ms_task_wait_for_death_info": 100,
    "max_direct_call_object_size": 1 << 20,
}


_auth_warned = threading.Event()


def warn_if_auth_disabled() -> None:
    """Warn once per process when ``RAY_AUTH_MODE=disabled`` turns Ray's token auth off.

    Why: without the token anyone who can reach a Ray port can run code in it.
    """
    if os.environ.get("RAY_AUTH_MODE", "").strip().lower() != "disabled":
        return
    if _auth_warned.is_set():
        return
    _auth_warned.set()
    logger.warning(
        "RAY_AUTH_MODE=disabled: Ray's token authentication is off, so any process that "
        "can reach a Ray port can run code in it. Unset RAY_AUTH_MODE (or set it to "
        "'token') to keep it on; see docs/security.md."
    )


def is_loopback_address(address: str) -> bool:
    """Whether a Ray address (``host:port``, ``ray://host:port``, a bare host or ``auto``,
    the cluster recorded on this machine) is on this machine's loopback."""
    if address.strip().lower() == "auto":
        return True
    host = address.split("://", 1)[-1]
    if host.startswith("["):  # [::1]:6379
        host = host[1 : host.find("]")]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    return host in ("localhost", "::1") or host.startswith("127.")


@contextlib.contextmanager
def loopback_node_ip() -> Iterator[None]:
    """While Ray starts or joins here: this node's IP is the loopback address.

    Why: on Linux Ray replaces 127.0.0.1 by the machine's outward IP (its
    ``get_node_ip_address`` only keeps loopback where ``ENABLE_RAY_CLUSTER`` is off,
    as on Windows/macOS), and its gRPC servers listen on all interfaces unless the
    node IP is loopback. With it, GCS, raylet, workers and the runtime-env agent
    all listen on 127.0.0.1. Restored afterwards: a started node keeps its IP.
    """
    from ray._private import ray_constants

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):  # pragma: no cover - another Ray
        yield  # (tests/test_ray_security.py then reports what listens where)
        return
    old = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old


def init_local_ray(num_cpus: int, **options: Any) -> None:
    """Start a local Ray that listens on 127.0.0.1 only, with token auth (Ray's default).

    ``options`` go to ``ray.init`` (e.g. ``_system_config``, ``logging_level``);
    the dashboard is off (it would be one more HTTP port). ``address="local"``: a
    new Ray even where ``ray start`` left one running (or a stale
    ``/tmp/ray/ray_current_cluster`` names a dead one); joining is the user's choice.
    """
    import ray

    warn_if_auth_disabled()
    options.setdefault("include_dashboard", False)
    options.setdefault("address", "local")
    with loopback_node_ip():
        ray.init(num_cpus=num_cpus, **options)


def join_ray(address: str, **options: Any) -> None:
    """Connect to the Ray cluster at ``address`` (the user's choice, e.g. ``RAY_ADDRESS``).

    A loopback address is joined over loopback (Ray would otherwise swap it for
    the machine's outward IP, which a loopback-only cluster does not listen on).
    """
    import ray

    warn_if_auth_disabled()
    joined = loopback_node_ip() if is_loopback_address(address) else contextlib.nullcontext()
    with joined:
        ray.init(address=address, **options)


def acquire_ray(num_cpus_needed: float) -> bool:
    """Make sure Ray is up; return True if this call took a reference on a Ray we manage.

    Reuses an initialised Ray, joins ``RAY_ADDRESS`` if set, else starts a local
    Ray bound to 127.0.0.1 with enough CPUs for the runners. Each True return
    must be paired with one ``release_ray()``.
    """
    import ray

    with _lock:
        if ray.is_initialized():
            if _owned["refs"] > 0:
                _owned["refs"] += 1
                return True
            return False
        address = os.environ.get("RAY_ADDRESS")
        if address:
            logger.info("Joining the Ray cluster at RAY_ADDRESS=%s.", address)
            join_ray(address, ignore_reinit_error=True)
        else:
            num_cpus = max(2, os.cpu_count() or 2, math.ceil(num_cpus_needed))
            logger.info("Starting a local Ray with num_cpus=%d for the env runners.", num_cpus)
            init_local_ray(
                num_cpus,
                ignore_reinit_error=True,
                _system_config=dict(EMBEDDED_SYSTEM_CONFIG),
            )
        _owned["refs"] = 1
        _owned["started"] = True
        return True


def release_ray() -> None:
    """Drop one reference taken by ``acquire_ray``; shut Ray down at the last one."""
    import ray

    with _lock:
        if _owned["refs"] <= 0:
            return
        _owned["refs"] -= 1
        if _owned["refs"] == 0 and _owned["started"]:
            _owned["started"] = False
            if ray.is_initialized():
                ray.shutdown()


def default_runner_class(config: Any) -> type:
    """RLlib's choice of runner class when ``config.env_runner_cls`` is None."""
    if config.env_runner_cls is not None:
        return config.env_runner_cls
    multi_agent = bool(config.is_multi_agent)
    if config.enable_env_runner_and_connector_v2:
        if getattr(config, "output", None):
            if multi_agent:
                raise ValueError("Multi-agent recording is not supported, yet.")
            raise ConfigError(
                "config.output is set, but envrunners has no OfflineSingleAgentEnvRunner; "
                "record with the old stack (api_stack(enable_env_runner_and_connector_v2="
                "False)) or unset output."
            )
        if multi_agent:
            from envrunners.env.multi_agent_env_runner import MultiAgentEnvRunner

            return MultiAgentEnvRunner
        from envrunners.env.single_agent_env_runner import SingleAgentEnvRunner

        return SingleAgentEnvRunner
    from envrunners.evaluation.rollout_worker import RolloutWorker

    return RolloutWorker


def remote_options(config: Any) -> dict[str, Any]:
    """``ray.remote`` options of one runner actor, from the config."""
    restarts = int(config.max_num_env_runner_restarts) if config.restart_failed_env_runners else 0
    options: dict[str, Any] = {
        "num_cpus": config.num_cpus_per_env_runner,
        "num_gpus": config.num_gpus_per_env_runner,
        "max_restarts": restarts,
        "max_task_retries": 0,
    }
    if config.custom_resources_per_env_runner:
        options["resources"] = dict(config.custom_resources_per_env_runner)
    return options


def make_remote_class(runner_cls: type, config: Any) -> Any:
    """The Ray actor class of ``runner_cls`` with the config's resources and restarts."""
    import ray

    return ray.remote(**remote_options(config))(runner_cls)


def placement_options(pg_offset: int, worker_index: int) -> dict[str, Any]:
    """Schedule into the current placement group (e.g. a Tune trial's), if there is one."""
    from ray.util import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = get_current_placement_group()
    if group is None:
        return {}
    return {
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=group,
            placement_group_bundle_index=pg_offset + worker_index,
            placement_group_capture_child_tasks=True,
        )
    }


def check_resources(config: Any, num_new: int) -> None:
    """Warn when the cluster is too small to place ``num_new`` more runners."""
    import ray

    try:
        total = ray.available_resources().get("CPU", 0.0)
    except Exception:  # pragma: no cover - best effort only
        return
    need = num_new * float(config.num_cpus_per_env_runner)
    if need > total:
        logger.warning(
            "%d env runners x num_cpus_per_env_runner=%s need %.1f CPUs, but the Ray "
            "cluster has %.1f free: some runners will wait for CPUs. Lower "
            "num_cpus_per_env_runner (fractions are fine) or num_env_runners.",
            num_new,
            config.num_cpus_per_env_runner,
            need,
            total,
        )


_STANDBY_CLASSES: dict[type, type] = {}


def standby_class(runner_cls: type) -> type:
    """A subclass of ``runner_cls`` whose constructor only pays the imports.

    Why: restarting a killed runner means a new process that imports torch and
    builds everything again (seconds). A standby actor of this class waits with
    the imports done; taking a dead runner's place it runs the real constructor
    (``_runner_init``) with that runner's arguments, which takes milliseconds.
    """
    cls = _STANDBY_CLASSES.get(runner_cls)
    if cls is not None:
        return cls

    def __init__(self: Any, **kwargs: Any) -> None:
        import gymnasium  # noqa: F401
        import torch  # noqa: F401

        self.worker_index = None
        self.num_envs = 0
        self.env = None
        self._standby = True

    def __repr__(self: Any) -> str:
        if self.__dict__.get("_standby", False):
            return f"Standby({runner_cls.__name__})"
        return runner_cls.__repr__(self)

    cls = type(
        f"Standby{runner_cls.__name__}",
        (runner_cls,),
        {
            "__init__": __init__,
            "__repr__": __repr__,
            "_runner_init": runner_cls.__init__,
            "__module__": __name__,
        },
    )
    _STANDBY_CLASSES[runner_cls] = cls
    return cls


def standby_enabled(config: Any, wanted: bool | None) -> bool:
    """Whether a group keeps a standby runner (default: when failed runners restart).

    Not with GPUs or custom resources per runner: a standby does not hold them.
    """
    if wanted is not None:
        return bool(wanted)
    return bool(
        config.restart_failed_env_runners
        and not config.num_gpus_per_env_runner
        and not config.custom_resources_per_env_runner
    )
