"""``JsonReader``: read recorded batches from JSON-lines files, safely and losslessly.

Why: offline RL and replays read what ``JsonWriter`` (or RLlib's writer)
recorded. ``next()`` returns at least ``train_batch_size`` (divided over the env
runners) steps, cycling through the files forever: a worker starts at "its" file
(spread by ``worker_index``), then picks files at random (seeded). ``read_all_files()``
yields every line once, in file order.

Safety: reading never unpickles unless ``allow_pickle=True`` (for RLlib files with
cloudpickle-packed columns; it warns that this runs code from the file). A
corrupt line raises ``OfflineDataError`` naming the file and line, unless
``skip_corrupt=True``, which skips and counts it (``num_corrupt_skipped``).

Deliberate differences from RLlib: corrupt lines are errors by default (RLlib logs
and skips them); blank lines are skipped everywhere (RLlib's ``read_all_files``
stops a file at its first blank line); a missing or empty input fails at
construction; files are listed in sorted order.
"""

from __future__ import annotations

import logging
import math
import random
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from envrunners.errors import OfflineDataError, OfflineInputNotFoundError, PickleNotAllowedError
from envrunners.offline._input_files import iter_lines, parse_line, resolve_inputs
from envrunners.offline.input_reader import InputReader
from envrunners.offline.io_context import IOContext, _get
from envrunners.policy.sample_batch import MultiAgentBatch, SampleBatch, concat_samples

__all__ = ["JsonReader", "OfflineInputNotFoundError", "postprocess_actions"]

logger = logging.getLogger("envrunners")

PICKLE_WARNING = (
    "allow_pickle=True: columns that RLlib packed with cloudpickle will be unpickled, and "
    "unpickling runs code stored in the file. Only read files you trust."
)


class JsonReader(InputReader):
    """Read ``SampleBatch``/``MultiAgentBatch`` lines from JSON files.

    Args:
        inputs: A directory (its ``*.json``/``*.zip`` files), a glob, a file, or a
            list of these (lists may also hold remote URIs, read with smart_open).
            If None, ``ioctx.input_config["inputs"]``.
        ioctx: The worker's ``IOContext`` (batch size from its config; policies and
            action spaces from its worker).
        allow_pickle: Read RLlib's cloudpickle-packed columns (runs code from the
            file!). Default: ``ioctx.input_config.get("allow_pickle", False)``.
        skip_corrupt: Skip and count corrupt lines instead of raising.
            Default: ``ioctx.input_config.get("skip_corrupt", False)``.
        seed: Seed of the file choice after the first file. Default: the config's
            ``seed`` plus ``worker_index`` (unseeded if the config has none).

    Raises:
        OfflineInputNotFoundError: if an input is empty or matches no file.
        ValueError: for inputs of another type or a remote glob.
    """

    def __init__(
        self,
        inputs: str | list[str] | None = None,
        ioctx: IOContext | None = None,
        *,
        allow_pickle: bool | None = None,
        skip_corrupt: bool | None = None,
        seed: int | None = None,
    ) -> None:
        self.ioctx = ioctx or IOContext()
        options = self.ioctx.input_config
        if inputs is None:
            inputs = options.get("inputs")
        self.allow_pickle = bool(
            options.get("allow_pickle", False) if allow_pickle is None else allow_pickle
        )
        self.skip_corrupt = bool(
            options.get("skip_corrupt", False) if skip_corrupt is None else skip_corrupt
        )
        if self.allow_pickle:
            warnings.warn(PICKLE_WARNING, UserWarning, stacklevel=2)
        self.files = resolve_inputs(inputs, "JsonReader")
        config = self.ioctx.config
        self.batch_size = int(_get(config, "train_batch_size", 1) or 1)
        num_workers = _get(config, "num_env_runners", None) or _get(config, "num_workers", 0) or 0
        if num_workers > 0:
            self.batch_size = max(math.ceil(self.batch_size / num_workers), 1)
        self.policy_map = None
        self.default_policy = None
        worker = self.ioctx.worker
        if worker is not None and getattr(worker, "policy_map", None) is not None:
            self.policy_map = worker.policy_map
            self.default_policy = self.policy_map.get("default_policy")
            if self.default_policy is None and len(self.policy_map) == 1:
                self.default_policy = next(iter(self.policy_map.values()))
        if seed is None and _get(config, "seed", None) is not None:
            seed = int(_get(config, "seed", None)) + int(self.ioctx.worker_index or 0)
        self._rng = random.Random(seed)
        self._num_workers = num_workers
        self.num_corrupt_skipped = 0
        self.cur_file: str | None = None
        self._lines: Iterator[tuple[str, int, bytes]] | None = None
        self._had_record = False
        self._empty: set[str] = set()
        self._opened_any = False

    # ------------------------------------------------------------------ reading
    def next(self) -> SampleBatch | MultiAgentBatch:
        """Return the next batch: at least ``batch_size`` steps from one or more lines.

        Raises:
            OfflineDataError: for a corrupt line (without ``skip_corrupt``), or if no
                file holds a single valid record.
        """
        batches = []
        count = 0
        while count < self.batch_size:
            batch = self._postprocess_if_needed(self._next_record())
            batches.append(batch)
            count += batch.count
        return batches[0] if len(batches) == 1 else concat_samples(batches)

    def read_all_files(self) -> Iterator[SampleBatch | MultiAgentBatch]:
        """Yield one batch per line of every file, in file order, then stop.

        Raises:
            OfflineDataError: for a corrupt line (without ``skip_corrupt``).
        """
        for path in self.files:
            for where, lineno, line in iter_lines(path):
                batch = self._parse(line, where, lineno)
                if batch is not None:
                    yield batch

    def close(self) -> None:
        """Close the file being read (reading again reopens files)."""
        if self._lines is not None:
            self._lines.close()  # type: ignore[attr-defined]
            self._lines = None

    # ---------------------------------------------------------------- internals
    def _parse(self, line: bytes, where: str, lineno: int) -> Any:
        try:
            batch = parse_line(line, where, lineno, allow_pickle=self.allow_pickle)
        except OfflineDataError as e:
            if not self.skip_corrupt or isinstance(e, PickleNotAllowedError):
                raise
            self.num_corrupt_skipped += 1
            logger.warning("JsonReader skipped a corrupt record: %s", e)
            return None
        if batch is None:
            return None
        return postprocess_actions(batch, self.ioctx, self.policy_map, self.default_policy)

    def _next_file(self) -> str:
        candidates = [f for f in self.files if f not in self._empty]
        if not self._opened_any and self.ioctx.worker is not None:
            idx = round((len(self.files) - 1) * self.ioctx.worker_index / (self._num_workers or 1))
            first = self.files[min(max(idx, 0), len(self.files) - 1)]
            if first in candidates:
                return first
        return self._rng.choice(candidates)

    def _next_record(self) -> Any:
        while True:
            if self._lines is None:
                self.cur_file = self._next_file()
                self._opened_any = True
                self._lines = iter_lines(self.cur_file)
                self._had_record = False
            for where, lineno, line in self._lines:
                batch = self._parse(line, where, lineno)
                if batch is not None and (batch.count > 0 or batch.agent_steps() > 0):
                    self._had_record = True  # empty batches add nothing (and could loop forever)
                    return batch
            self._lines = None
            if not self._had_record:
                self._empty.add(self.cur_file)
                if len(self._empty) == len(self.files):
                    shown = ", ".join(self.files[:3]) + (" ..." if len(self.files) > 3 else "")
                    raise OfflineDataError(
                        "Failed to read valid experience batch from file: none of the "
                        f"{len(self.files)} input file(s) holds a valid record ({shown})"
                        + (
                            f"; {self.num_corrupt_skipped} corrupt line(s) were skipped"
                            if self.num_corrupt_skipped
                            else ""
                        )  # fmt: skip
                    )

    def _postprocess_if_needed(self, batch: Any) -> Any:
        if not _get(self.ioctx.config, "postprocess_inputs", False):
            return batch
        if isinstance(batch, MultiAgentBatch):
            raise NotImplementedError(
                "postprocess_inputs=True is only supported for single-agent (SampleBatch) input"
            )
        if self.default_policy is None:
            raise ValueError(
                "postprocess_inputs=True needs a worker with exactly one (or a 'default_policy') "
                "policy in ioctx.worker.policy_map"
            )
        parts = [self.default_policy.postprocess_trajectory(p) for p in batch.split_by_episode()]
        return concat_samples(parts)

    def __repr__(self) -> str:
        return f"JsonReader({len(self.files)} file(s), batch_size={self.batch_size})"


# ----------------------------------------------------------------- actions


def postprocess_actions(
    batch: Any, ioctx: IOContext, policy_map: Any = None, default_policy: Any = None
) -> Any:
    """Clip and/or normalise read actions to the policy's action space, as the config says.

    ``clip_actions=True`` clips to the space bounds; ``normalize_actions=True`` with
    ``actions_in_input_normalized=False`` maps Box actions from their bounds to [-1, 1].
    Without a worker there is no action space: actions are then returned as stored
    (RLlib raises, which makes a plain ``AlgorithmConfig`` unusable for reading).

    Raises:
        ValueError: if ``clip_actions`` is set but the context has no worker/policy.
    """
    config = ioctx.config
    clip = bool(_get(config, "clip_actions", False))
    normalize = (
        _get(config, "actions_in_input_normalized", None) is False
        and _get(config, "normalize_actions", None) is True
    )
    if not (clip or normalize):
        return batch
    if policy_map is None:
        if not clip:  # reading without a worker (e.g. for analysis): actions as stored
            return batch
        raise ValueError(
            "clip_actions=True needs the policy's action space, but this reader has no "
            "worker with a policy_map; build it with IOContext(worker=...) or set "
            "clip_actions=False."
        )
    if isinstance(batch, MultiAgentBatch):
        pairs = [(policy_map[pid], b) for pid, b in batch.policy_batches.items()]
    else:
        pairs = [(default_policy, batch)]
    for policy, b in pairs:
        if policy is None or SampleBatch.ACTIONS not in b:
            continue
        actions = b[SampleBatch.ACTIONS]
        space = policy.action_space
        if normalize:
            actions = _map_box(space, actions, _normalize)
        if clip:
            actions = _map_box(space, actions, _clip)
        b[SampleBatch.ACTIONS] = actions
    return batch


def _normalize(space: Any, a: np.ndarray) -> np.ndarray:
    low, high = space.low, space.high
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        return a
    return ((np.asarray(a, dtype=np.float64) - low) * 2.0 / (high - low) - 1.0).astype(a.dtype)


def _clip(space: Any, a: np.ndarray) -> np.ndarray:
    return np.clip(a, space.low, space.high)


def _map_box(space: Any, actions: Any, fn: Any) -> Any:
    """Apply ``fn(box, array)`` to every Box leaf of ``actions`` (Dict/Tuple spaces recurse)."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Box):
        return fn(space, np.asarray(actions))
    if isinstance(space, gym.spaces.Dict):
        return {k: _map_box(space[k], actions[k], fn) for k in actions}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_map_box(s, a, fn) for s, a in zip(space.spaces, actions))
    return actions
