"""The rule behind ``overlap_inference="auto"``: overlap when env step and forward cost alike.

Overlapping splits the sub-envs into two halves: the policy infers for one half
while the other half steps on the backend's threads or processes. At best that
hides the cheaper of the two costs, and it pays for it with twice as many
(half-sized) forwards, receives and sends per vector step. So it is chosen only
when both costs are large against that fixed per-call overhead, comparable to
each other, and there is a second core to step on. The runner measures the two
costs briefly at start (``runner_setup.time_step_and_forward``); this module only
decides, so the rule is tested without timing anything.
"""

from __future__ import annotations

import logging
import math
import os

__all__ = ["MIN_COST_S", "MIN_RATIO", "available_cpus", "choose_overlap", "decide_overlap"]

logger = logging.getLogger("envrunners")

#: The cheaper of the two costs must be at least this share of the dearer one. Measured
#: on 2 cores (benchmarks/peers, 2026-11-26): overlap won for Pong x 8 on EnvPool at a
#: ratio of 0.16 (482 vs 421 steps/s) and on shared memory at 0.44 (524 vs 509), and
#: for CartPole x 16 on shared memory at 0.6 (69k vs 44k); on EnvPool it was even at 0.76.
#: Whether overlapping pays also depends on the load, which this rule cannot see:
#: CartPole x 16 on shared memory (PPO's MLP, runner ``sample()`` calls of each way
#: interleaved in one process, 2026-11-26) ran 79k steps/s overlapped against 51-54k in
#: the samples where other processes used under 0.15 of a core, but 45k against 58k
#: where they kept about one of the two cores busy.
MIN_RATIO = 1 / 8

#: Both costs (seconds per vector step of all sub-envs) must be at least this: below it
#: the extra half-batch calls (tens of microseconds each) eat what overlapping hides.
#: CartPole x 16 measured 65-69 us per forward, 85-115 us per step.
MIN_COST_S = 5e-5


def choose_overlap(env_step_s: float, forward_s: float, *, num_envs: int, num_cpus: int) -> bool:
    """Whether to infer for one half of the sub-envs while the other half steps.

    Args:
        env_step_s: Seconds one synchronous step of all ``num_envs`` sub-envs takes.
        forward_s: Seconds one forward pass for all ``num_envs`` observations takes.
        num_envs: Sub-envs of the runner (two halves need at least 2).
        num_cpus: CPUs this process may run on (stepping overlaps only on a second).
    """
    if num_envs < 2 or num_cpus < 2:
        return False
    if not all(math.isfinite(x) and x > 0 for x in (env_step_s, forward_s)):
        return False
    cheap, dear = sorted((env_step_s, forward_s))
    return cheap >= MIN_COST_S and cheap / dear >= MIN_RATIO


def decide_overlap(env_step_s: float, forward_s: float, num_envs: int) -> bool:
    """``choose_overlap`` on the CPUs this process may run on, logged (at debug level)."""
    overlap = choose_overlap(env_step_s, forward_s, num_envs=num_envs, num_cpus=available_cpus())
    logger.debug(
        "overlap_inference='auto': env step %.1f us, forward %.1f us for %d sub-envs -> %s",
        env_step_s * 1e6,
        forward_s * 1e6,
        num_envs,
        "overlap" if overlap else "step together",
    )
    return overlap


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - macOS / Windows
        return os.cpu_count() or 1
