"""What one run of a sampling loop returns, and the whole-episode stats in it.

Both loops (``SingleAgentSampler``, ``MultiAgentSampler``) fill the same
``SampleResult``; the multi-agent loop also fills the per-agent fields. A
runner turns it into metrics; the old-stack samplers turn it into batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["EpisodeStats", "MultiAgentEpisodeStats", "SampleResult"]


@dataclass
class EpisodeStats:
    """Whole-episode numbers of one finished episode (all of its chunks together)."""

    length: int
    ret: float
    duration_s: float


@dataclass
class MultiAgentEpisodeStats(EpisodeStats):
    """``EpisodeStats`` plus steps and returns per agent and returns per module."""

    agent_steps: dict[str, int]
    agent_returns: dict[str, float]
    module_returns: dict[str, float]


EpisodeT = TypeVar("EpisodeT")
StatsT = TypeVar("StatsT", bound=EpisodeStats)


@dataclass
class SampleResult(Generic[EpisodeT, StatsT]):
    """What one ``run()`` of a sampling loop produced.

    Typed by the loop's episode class and stats class:
    ``SampleResult[SingleAgentEpisode, EpisodeStats]`` or
    ``SampleResult[MultiAgentEpisode, MultiAgentEpisodeStats]``.
    """

    #: Finished episodes (the last chunk of each), in the order they finished.
    done: list[EpisodeT] = field(default_factory=list)
    #: In-progress chunks, one per sub-env that stepped (timestep mode only).
    ongoing: list[EpisodeT] = field(default_factory=list)
    done_env_index: list[int] = field(default_factory=list)
    ongoing_env_index: list[int] = field(default_factory=list)
    env_steps: int = 0
    agent_steps: int = 0
    #: Multi-agent loop only: ``{(agent_id, module_id): observations received}``
    #: (reset observations excluded).
    agent_counts: dict[tuple[Any, Any], int] = field(default_factory=dict)
    #: One per episode in ``done``, same order.
    episode_stats: list[StatsT] = field(default_factory=list)
    #: Whole vector-env failures (``step_fn`` returned ``ENV_STEP_FAILURE``).
    num_env_failures: int = 0
    #: Sub-envs the vector env recreated on its own (``restart_failed``).
    num_sub_env_failures: int = 0
    #: In-progress episodes lost to failures.
    num_dropped_episodes: int = 0

    @property
    def episodes(self) -> list[EpisodeT]:
        """Finished episodes first, then ongoing chunks in sub-env order (RLlib's order)."""
        return self.done + self.ongoing
