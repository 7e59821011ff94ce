"""The local Ray a CLI command starts and stops, kept quiet unless ``--debug``.

Why: commands with remote runners start a local Ray for themselves and shut it
down again whatever happens (Ctrl-C included); its log lines and envrunners'
own records would otherwise scroll through the progress display. A command
that joined a cluster through ``RAY_ADDRESS`` says so in its summary
(``cluster_summary``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from collections.abc import Iterable, Iterator

__all__ = ["cluster_summary", "embedded_ray", "quiet_loggers", "ray_errors_logged"]

#: Where Ray's error lines for the driver ("(raylet) A worker died ...", "Raylet is
#: terminated ...") go without ``--debug``: Ray prints them to stdout even with
#: ``log_to_driver=False``; here they become DEBUG records of this logger.
RAY_ERRORS_LOGGER = "envrunners.ray"

_joined: dict[str, str | None] = {"address": None}


@contextlib.contextmanager
def ray_errors_logged() -> Iterator[None]:
    """While Ray is up: its driver error lines go to ``RAY_ERRORS_LOGGER`` (DEBUG), not stdout.

    Ray's error listener thread prints through ``ray._private.worker.print_to_stdstream``
    (looked up at each call), which ``log_to_driver=False`` leaves on; the worker
    log printer, its other caller, is off without ``--debug``.
    """
    from ray._private import worker

    original = getattr(worker, "print_to_stdstream", None)
    if original is None:  # pragma: no cover - another Ray version: leave it as it is
        yield
        return
    log = logging.getLogger(RAY_ERRORS_LOGGER)

    def to_log(data: dict, ignore_prefix: bool = False) -> None:
        for line in data.get("lines", ()):
            log.debug("(%s) %s", data.get("pid", "ray"), line)

    worker.print_to_stdstream = to_log
    try:
        yield
    finally:
        worker.print_to_stdstream = original


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """Point file descriptor 2 at /dev/null (C++ log lines bypass Python's sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def embedded_ray(num_cpus_needed: float, *, debug: bool = False) -> Iterator[bool]:
    """Start a local Ray for one command and shut it down afterwards (Ctrl-C included).

    Joins an already initialised Ray (left running) or ``RAY_ADDRESS`` (disconnected
    at the end). Without ``debug`` Ray is quiet: no worker log forwarding, only
    errors from its Python loggers, no C++ log lines, and its error lines for the
    driver (a worker or raylet died) as DEBUG records of ``RAY_ERRORS_LOGGER``.
    Yields whether this call connected to Ray (and therefore disconnects or shuts
    it down).
    """
    import ray

    from envrunners.env._ray_setup import (
        EMBEDDED_SYSTEM_CONFIG,
        init_local_ray,
        join_ray,
        warn_if_auth_disabled,
    )

    if ray.is_initialized():
        yield False
        return
    level = logging.INFO if debug else logging.ERROR
    quiet = contextlib.nullcontext() if debug else _stderr_silenced()
    if not debug:
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    address = os.environ.get("RAY_ADDRESS")
    warn_if_auth_disabled()  # before stderr is silenced: this one must be seen
    errors = contextlib.nullcontext() if debug else ray_errors_logged()
    with errors:  # from ray.init (which starts Ray's error listener) to after shutdown
        try:
            with quiet:
                if address:
                    join_ray(address, logging_level=level, log_to_driver=debug)
                else:
                    init_local_ray(
                        max(2, os.cpu_count() or 2, math.ceil(num_cpus_needed)),
                        logging_level=level,
                        log_to_driver=debug,
                        _system_config=dict(EMBEDDED_SYSTEM_CONFIG),
                    )
            _joined["address"] = address or None
            yield True
        finally:  # also after a Ctrl-C in the middle of ray.init: no half-started Ray is left
            _joined["address"] = None
            with contextlib.suppress(Exception):
                ray.shutdown()


def cluster_summary(
    lost_runners: Iterable[int] = (), replaced_runners: Iterable[int] = ()
) -> str | None:
    """One summary line about the cluster joined through ``RAY_ADDRESS``, else None.

    Names the cluster and its nodes (alive of all known), and the runners that
    were lost and replaced (indices as the caller tracked them), e.g.
    ``Ray cluster 10.0.0.5:6379: 3 of 4 nodes alive; runners lost: 2; replaced: 2``.
    Call it while the ``embedded_ray`` context is still open.
    """
    address = _joined["address"]
    if not address:
        return None
    import ray

    if not ray.is_initialized():
        return None
    try:
        nodes = ray.nodes()
    except Exception:  # pragma: no cover - the cluster went away under us
        return f"Ray cluster {address}: node count unavailable"
    alive = sum(1 for node in nodes if node.get("Alive"))
    line = f"Ray cluster {address}: {alive} of {len(nodes)} nodes alive"
    lost = sorted(set(lost_runners))
    replaced = sorted(set(replaced_runners))
    if lost or replaced:
        line += f"; runners lost: {_ids(lost)}; replaced: {_ids(replaced)}"
    return line


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids) if ids else "none"


@contextlib.contextmanager
def quiet_loggers(enabled: bool) -> Iterator[None]:
    """Silence envrunners' own log records (e.g. while stopping after Ctrl-C)."""
    if not enabled:
        yield
        return
    logger = logging.getLogger("envrunners")
    old = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(old)
