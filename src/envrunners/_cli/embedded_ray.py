"""The local Ray a CLI command starts and stops, kept quiet unless ``--debug``.

Why: commands with remote runners start a local Ray for themselves and shut it
down again whatever happens (Ctrl-C included); its log lines and envrunners'
own records would otherwise scroll through the progress display.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from collections.abc import Iterator

__all__ = ["embedded_ray", "quiet_loggers"]


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
    errors from its Python loggers, no C++ log lines. Yields whether this call
    connected to Ray (and therefore disconnects or shuts it down).
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
        yield True
    finally:  # also after a Ctrl-C in the middle of ray.init: no half-started Ray is left
        with contextlib.suppress(Exception):
            ray.shutdown()


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
