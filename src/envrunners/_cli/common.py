"""Shared pieces of the CLI: input checks with one-line errors, output dirs, embedded Ray.

Why: every command validates the same kinds of input (env ids, numbers, output
directories) before it starts anything expensive, and reports a problem as one
line with exit code 2. Commands that need Ray start a quiet local instance and
shut it down again, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import logging
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "CliError",
    "check_env_id",
    "embedded_ray",
    "finite_float",
    "non_negative_int",
    "positive_int",
    "prepare_output_dir",
]

#: Exit code of bad input (argparse's convention).
EXIT_USAGE = 2
#: Exit code after Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A problem to report as one line; ``code`` 2 is bad input, 1 a failure."""

    def __init__(self, message: str, code: int = EXIT_USAGE):
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------- argparse types
def _integer(text: str, minimum: int, what: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (``1_000`` allowed)."""
    return _integer(text, 1, "an integer >= 1")


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _integer(text, 0, "an integer >= 0")


def finite_float(text: str) -> float:
    """argparse type: a finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    """argparse type: comma-separated positive integers, e.g. ``64,64``."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return values


# ---------------------------------------------------------------------- envs
def check_env_id(env_id: str) -> None:
    """Fail with close gymnasium ids when ``env_id`` is neither registered nor importable.

    Accepts gymnasium ids (``CartPole-v1``), gymnasium's ``module:Id`` form and names
    given to ``envrunners.register_env``.

    Raises:
        CliError: Unknown id (exit code 2), with up to three close ids suggested.
    """
    import gymnasium as gym

    from envrunners.env import registry

    if env_id in gym.registry or env_id in getattr(registry, "_REGISTRY", {}):
        return
    if ":" in env_id:
        module = env_id.split(":", 1)[0]
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise CliError(
                f"unknown env {env_id!r}: cannot import module {module!r} ({err})"
            ) from None
        if env_id.split(":", 1)[1] in gym.registry or env_id in gym.registry:
            return
    close = difflib.get_close_matches(env_id, list(gym.registry.keys()), n=3, cutoff=0.6)
    if not close:  # case slips ("cartpole-v1") are common
        lowered = {k.lower(): k for k in gym.registry.keys()}
        close = [lowered[m] for m in difflib.get_close_matches(env_id.lower(), list(lowered), 3)]
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise CliError(f"unknown env {env_id!r}{hint} (see gymnasium.pprint_registry())")


def probe_env(env_id: str) -> Any:
    """Build one env to fail early (missing extras) and read its spec; returns the spec.

    Raises:
        CliError: The env cannot be built (exit code 1, the reason in the message).
    """
    import gymnasium as gym

    try:
        env = gym.make(env_id, disable_env_checker=True)
    except gym.error.DependencyNotInstalled as err:
        raise CliError(f"env {env_id!r} needs extra packages: {err}") from None
    except Exception as err:
        raise CliError(f"cannot create env {env_id!r}: {type(err).__name__}: {err}", 1) from None
    spec = env.spec
    env.close()
    return spec


# ---------------------------------------------------------------------- files
def prepare_output_dir(path: str | os.PathLike, what: str = "output dir") -> Path:
    """Create ``path`` (and parents) and prove it is writable by writing a temp file.

    Raises:
        CliError: It cannot be created or written (exit code 2).
    """
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise CliError(f"cannot write to {what} {str(target)!r}: it is a file, not a directory")
    try:
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target, prefix=".write-test-"):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise CliError(f"cannot write to {what} {str(target)!r}: {reason}") from None
    return target


# ---------------------------------------------------------------------- Ray
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

    from envrunners.env._ray_setup import EMBEDDED_SYSTEM_CONFIG

    if ray.is_initialized():
        yield False
        return
    level = logging.INFO if debug else logging.ERROR
    quiet = contextlib.nullcontext() if debug else _stderr_silenced()
    if not debug:
        os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "fatal")
    address = os.environ.get("RAY_ADDRESS")
    try:
        with quiet:
            if address:
                ray.init(address=address, logging_level=level, log_to_driver=debug)
            else:
                ray.init(
                    num_cpus=max(2, os.cpu_count() or 2, math.ceil(num_cpus_needed)),
                    include_dashboard=False,
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
