"""Shared benchmark helpers: target-neutral imports, timing, JSON lines.

A workload is written once against the public API; ``api(target, "envrunners.x")``
imports ``envrunners.x`` or ``ray.rllib.x`` so the same code runs on both.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

TARGETS = ("envrunners", "ray.rllib")


def api(target: str, path: str) -> Any:
    """Import ``path`` (written with the ``envrunners`` prefix) for ``target``."""
    if target not in TARGETS:
        raise SystemExit(f"unknown --target {target!r}; expected one of {TARGETS}")
    return importlib.import_module(path.replace("envrunners", target, 1))


def target_available(target: str) -> bool:
    """Whether ``target`` can be imported in this interpreter."""
    try:
        importlib.import_module(target)
        return True
    except Exception:
        return False


def median_rate(fn: Callable[[], int], repeats: int, warmup: int = 1) -> dict[str, float]:
    """Run ``fn`` (returns units done) ``warmup + repeats`` times; median units/s."""
    for _ in range(warmup):
        fn()
    rates, secs = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        units = fn()
        dt = time.perf_counter() - start
        rates.append(units / dt)
        secs.append(dt)
    return {
        "per_s_median": statistics.median(rates),
        "per_s_min": min(rates),
        "per_s_max": max(rates),
        "seconds_median": statistics.median(secs),
        "repeats": repeats,
    }


def emit(record: dict[str, Any]) -> None:
    """Print one JSON line (the only output format of the benchmarks)."""
    record.setdefault("python", sys.version.split()[0])
    record.setdefault("cpus", os.cpu_count())
    print(json.dumps(record), flush=True)


def rss_mb() -> float:
    """This process's resident memory in MiB."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:  # pragma: no cover
        return float("nan")
