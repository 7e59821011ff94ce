"""``MixedInput``: draw each batch from one of several inputs, by given probabilities.

Why: offline RL often mixes recorded data with fresh env samples
(``config.offline_data(input_={"/data/expert": 0.3, "sampler": 0.7})``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from envrunners.offline.input_reader import InputReader
from envrunners.offline.input_registry import registry_contains_input, registry_get_input
from envrunners.offline.io_context import IOContext, _get

__all__ = ["MixedInput"]


class MixedInput(InputReader):
    """Mix input sources: each ``next()`` picks a source at random and returns its ``next()``.

    Args:
        dist: ``{source: probability}``; probabilities must sum to 1 (within 1e-9:
            RLlib compares floats exactly, so ``0.7 + 0.2 + 0.1`` fails there).
            A source is ``"sampler"`` (the worker's live sampler), a callable
            ``(ioctx) -> InputReader``, a registered input name, or a path/glob/
            directory for a ``JsonReader``.
        ioctx: The worker's ``IOContext``.
        seed: Seed of the choices. Default: the config's ``seed`` plus ``worker_index``
            (unseeded if the config has none).

    Raises:
        ValueError: if the probabilities do not sum to 1 or one is negative, or the
            "sampler" is asked for but the worker has none.
    """

    def __init__(
        self,
        dist: dict[str | Callable[[IOContext], Any], float],
        ioctx: IOContext | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        from envrunners.offline.json_reader import JsonReader

        self.ioctx = ioctx or IOContext()
        if not isinstance(dist, dict) or not dist:
            raise ValueError(f"MixedInput: dist must be a non-empty dict, got {dist!r}")
        probs = [float(p) for p in dist.values()]
        if any(p < 0 for p in probs) or not math.isclose(sum(probs), 1.0, abs_tol=1e-9):
            raise ValueError(f"Values must sum to 1.0: {dist}")
        self.choices: list[Any] = []
        self.sources: list[Any] = []
        for source in dist:
            if source == "sampler":
                reader = self.ioctx.default_sampler_input()
                if reader is None:
                    raise ValueError(
                        "MixedInput: 'sampler' was asked for, but the worker has no sampler "
                        "(it has no env); remove 'sampler' from the input dict or give it an env"
                    )
            elif callable(source):
                reader = source(self.ioctx)
            elif isinstance(source, str) and registry_contains_input(source):
                reader = registry_get_input(source)(self.ioctx)
            else:
                reader = JsonReader(source, self.ioctx)
            self.choices.append(reader)
            self.sources.append(source)
        total = sum(probs)
        self.p = np.asarray(probs, dtype=np.float64) / total
        self.counts = [0] * len(self.choices)
        if seed is None and _get(self.ioctx.config, "seed", None) is not None:
            seed = int(_get(self.ioctx.config, "seed", None)) + int(self.ioctx.worker_index or 0)
        self._rng = np.random.default_rng(seed)

    def next(self) -> Any:
        """Return ``next()`` of a source drawn by the probabilities (counted in ``counts``)."""
        i = int(self._rng.choice(len(self.choices), p=self.p))
        self.counts[i] += 1
        return self.choices[i].next()

    def __repr__(self) -> str:
        parts = ", ".join(f"{s!r}: {p:g}" for s, p in zip(self.sources, self.p))
        return f"MixedInput({{{parts}}})"
