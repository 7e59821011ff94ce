"""The CLI's argparse value types (checked numbers and lists) and the flags two commands share.

Why: every command rejects bad numbers while parsing, as a one-line argparse
error with exit code 2, before anything expensive starts; ``train`` and
``sample`` describe their runner layout with the same two flags.
"""

from __future__ import annotations

import argparse
import math

__all__ = [
    "add_runner_arguments",
    "finite_float",
    "int_list",
    "non_negative_int",
    "positive_float",
    "positive_int",
]


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


def add_runner_arguments(
    parser: argparse.ArgumentParser,
    num_env_runners: int,
    num_envs_per_env_runner: int,
    *,
    store_defaults: bool = True,
) -> None:
    """Add ``--num-env-runners`` and ``--num-envs-per-env-runner`` (the runners' layout).

    Args:
        parser: The command's parser.
        num_env_runners: Default remote runners (0: sample in-process, no Ray).
        num_envs_per_env_runner: Default vector envs per runner.
        store_defaults: False leaves a flag that is not given ``None`` (``train``
            merges flags with a resumed run's settings); the help shows the
            defaults either way.
    """
    parser.add_argument(
        "--num-env-runners",
        type=non_negative_int,
        default=num_env_runners if store_defaults else None,
        help="remote env runners on an embedded local Ray; 0 samples in-process without Ray "
        f"(default: {num_env_runners})",
    )
    parser.add_argument(
        "--num-envs-per-env-runner",
        type=positive_int,
        default=num_envs_per_env_runner if store_defaults else None,
        help=f"vector envs per runner (default: {num_envs_per_env_runner})",
    )
