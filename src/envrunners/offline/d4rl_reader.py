"""``D4RLReader``: read a D4RL dataset (local HDF5 file or ``d4rl`` env id) one row at a time.

Why: D4RL is the standard offline-RL benchmark format. Its HDF5 files hold
``observations``, ``actions``, ``rewards``, ``terminals`` and (newer files)
``timeouts``, one row per step. The reader turns them into transitions with
``d4rl.qlearning_dataset`` semantics (:func:`qlearning_dataset`) and reads local
files with ``h5py`` only: nothing is downloaded and nothing is unpickled.

Deliberate difference from RLlib: ``next()`` starts at row 0 (RLlib's reader skips
row 0 on its first pass).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from envrunners.errors import OfflineDataError
from envrunners.offline.input_reader import InputReader
from envrunners.offline.io_context import IOContext
from envrunners.policy.sample_batch import SampleBatch

__all__ = ["D4RLReader", "load_d4rl_hdf5", "qlearning_dataset"]

REQUIRED_KEYS = ("observations", "actions", "rewards", "terminals")
_HDF5_EXTENSIONS = (".hdf5", ".h5", ".he5")


def qlearning_dataset(data: Mapping[str, Any], terminate_on_end: bool = False) -> dict[str, Any]:
    """Transitions from D4RL rows, like ``d4rl.qlearning_dataset`` (vectorised).

    Row ``i`` becomes ``(observations[i], actions[i], rewards[i], terminals[i])``
    with ``next_observations = observations[i + 1]``. The last row has no
    successor and is dropped. Rows flagged in ``timeouts`` end an episode by time
    limit; their successor belongs to the next episode, so they are dropped too
    (unless ``terminate_on_end``). Without ``timeouts``, every row but the last is kept.

    Returns:
        ``{"observations", "actions", "next_observations", "rewards", "terminals"}``
        (terminals as bool).
    """
    obs = np.asarray(data["observations"])
    n = len(np.asarray(data["rewards"]))
    idx = np.arange(max(n - 1, 0))
    timeouts = data.get("timeouts")
    if timeouts is not None and not terminate_on_end:
        idx = idx[~np.asarray(timeouts)[: len(idx)].astype(bool)]
    return {
        "observations": obs[idx],
        "actions": np.asarray(data["actions"])[idx],
        "next_observations": obs[idx + 1],
        "rewards": np.asarray(data["rewards"])[idx],
        "terminals": np.asarray(data["terminals"])[idx].astype(bool),
    }


def load_d4rl_hdf5(path: str) -> dict[str, np.ndarray]:
    """Read the D4RL columns of a local HDF5 file with h5py (``timeouts`` if present).

    Raises:
        OfflineDataError: if the file is not HDF5, lacks a required dataset, or the
            columns differ in length.
        ImportError: if h5py is not installed.
    """
    try:
        import h5py
    except ImportError:
        raise ImportError(
            "D4RLReader needs h5py to read HDF5 files: pip install 'envrunners[offline]' "
            "(or pip install h5py)"
        ) from None
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in REQUIRED_KEYS if k not in f]
            if missing:
                raise OfflineDataError(
                    f"not a D4RL dataset: missing {missing} (it holds {sorted(f.keys())}; "
                    f"needs {list(REQUIRED_KEYS)} and optionally 'timeouts')",
                    path=path,
                )
            keys = [*REQUIRED_KEYS, *(["timeouts"] if "timeouts" in f else [])]
            data = {k: f[k][()] for k in keys}
    except OSError as e:
        raise OfflineDataError(f"cannot read it as HDF5: {e}", path=path) from None
    lengths = {k: len(v) for k, v in data.items()}
    if len(set(lengths.values())) != 1:
        raise OfflineDataError(f"D4RL columns differ in length: {lengths}", path=path)
    return data


def _from_d4rl_package(env_id: str) -> dict[str, Any]:
    try:
        import d4rl
    except ImportError:
        raise OfflineDataError(
            f"D4RLReader({env_id!r}): this is not a local file, and reading a D4RL env id "
            "needs the `d4rl` package, which is not installed. Pass the path of a D4RL "
            "HDF5 file instead (observations, actions, rewards, terminals, timeouts)."
        ) from None
    try:
        import gym
    except ImportError:  # pragma: no cover - d4rl depends on gym
        import gymnasium as gym
    return dict(d4rl.qlearning_dataset(gym.make(env_id)))


def _is_local_file(inputs: str) -> bool:
    path = os.path.expanduser(inputs)
    return os.path.isfile(path) or path.lower().endswith(_HDF5_EXTENSIONS)


class D4RLReader(InputReader):
    """Read D4RL transitions; each ``next()`` returns one row, cycling through all rows.

    Args:
        inputs: The path of a local D4RL-layout HDF5 file, or a D4RL env id such as
            ``"hopper-medium-v0"`` (needs the ``d4rl`` package).
        ioctx: The worker's ``IOContext`` (unused; kept for RLlib's signature).

    Raises:
        OfflineDataError: if the file is missing or malformed, the dataset is empty,
            or an env id is given without ``d4rl`` installed.
    """

    def __init__(self, inputs: str, ioctx: IOContext | None = None) -> None:
        self.ioctx = ioctx
        if not isinstance(inputs, str) or not inputs:
            raise OfflineDataError(
                f"D4RLReader: inputs must be a file path or env id, got {inputs!r}"
            )
        self.inputs = inputs
        if _is_local_file(inputs):
            path = os.path.abspath(os.path.expanduser(inputs))
            if not os.path.isfile(path):
                raise OfflineDataError("D4RL file not found", path=path)
            data = qlearning_dataset(load_d4rl_hdf5(path))
        else:
            data = _from_d4rl_package(inputs)
        self.dataset = SampleBatch(
            {
                SampleBatch.OBS: np.asarray(data["observations"]),
                SampleBatch.ACTIONS: np.asarray(data["actions"]),
                SampleBatch.NEXT_OBS: np.asarray(data["next_observations"]),
                SampleBatch.REWARDS: np.asarray(data["rewards"]),
                SampleBatch.TERMINATEDS: np.asarray(data["terminals"]).astype(bool),
            }
        )
        if self.dataset.count < 1:
            raise OfflineDataError(
                f"D4RLReader({inputs!r}): the dataset has no transitions (a D4RL file needs "
                "at least two rows; timeout rows and the last row are dropped)"
            )
        self.counter = 0

    def next(self) -> SampleBatch:
        """Return the next one-row batch (row 0 first; wraps around after the last row)."""
        if self.counter >= self.dataset.count:
            self.counter = 0
        row = self.dataset.slice(self.counter, self.counter + 1)
        self.counter += 1
        return row

    def __repr__(self) -> str:
        return f"D4RLReader({self.inputs!r}, {self.dataset.count} transitions)"
