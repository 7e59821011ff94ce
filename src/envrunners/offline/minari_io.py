"""Read and write local Minari datasets as episode chunks and ``SampleBatch`` es.

Why: Minari (Farama) is the maintained successor of D4RL; its datasets hold whole
episodes (``observations`` with one more row than ``actions``, ``rewards``,
``terminations``, ``truncations``). A Minari episode maps one-to-one onto a
``SingleAgentEpisode`` chunk. Only local datasets are read (``minari.load_dataset``
without download, or the path of a dataset directory); nothing is unpickled.
Needs the ``minari`` package (``pip install 'envrunners[minari]'``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from envrunners.core import _nested
from envrunners.env.single_agent_episode import SingleAgentEpisode
from envrunners.errors import OfflineDataError, OfflineInputNotFoundError
from envrunners.policy.sample_batch import SampleBatch

__all__ = ["load_minari_dataset", "read_minari_batches", "read_minari_episodes", "write_minari"]


def _minari() -> Any:
    try:
        import minari
    except ImportError:
        raise ImportError(
            "reading Minari datasets needs the minari package: pip install 'envrunners[minari]'"
        ) from None
    return minari


def load_minari_dataset(dataset: str) -> Any:
    """A ``minari.MinariDataset`` from a local dataset directory or a locally stored dataset id.

    Raises:
        OfflineInputNotFoundError: if neither a directory nor a local dataset id matches.
    """
    minari = _minari()
    path = os.path.expanduser(str(dataset))
    if os.path.isdir(path):
        data = os.path.join(path, "data") if os.path.isdir(os.path.join(path, "data")) else path
        if not os.path.isfile(os.path.join(data, "metadata.json")):
            raise OfflineInputNotFoundError(
                "not a Minari dataset directory (no metadata.json in it or in its data/)",
                path=path,
            )
        return minari.MinariDataset(data)
    try:
        return minari.load_dataset(str(dataset), download=False)
    except (FileNotFoundError, ValueError) as e:
        raise OfflineInputNotFoundError(
            f"no local Minari dataset {dataset!r} ({e}); give a dataset directory or the id "
            "of a dataset under MINARI_DATASETS_PATH"
        ) from None


def read_minari_episodes(dataset: str | Any) -> Iterator[SingleAgentEpisode]:
    """Yield each episode of a Minari dataset as a numpy'd ``SingleAgentEpisode`` chunk.

    Args:
        dataset: A dataset directory, a local dataset id, or a ``MinariDataset``.
    """
    ds = load_minari_dataset(dataset) if isinstance(dataset, str | os.PathLike) else dataset
    obs_space, act_space = ds.observation_space, ds.action_space
    for ep in ds.iterate_episodes():
        n = len(ep.rewards)
        if len(ep.terminations) != n or len(ep.truncations) != n:
            raise OfflineDataError(
                f"Minari episode {ep.id}: {n} rewards but {len(ep.terminations)} terminations "
                f"and {len(ep.truncations)} truncations"
            )
        yield SingleAgentEpisode.from_columns(
            observations=ep.observations,
            actions=ep.actions,
            rewards=np.asarray(ep.rewards),
            terminated=bool(n and ep.terminations[-1]),
            truncated=bool(n and ep.truncations[-1]),
            observation_space=obs_space,
            action_space=act_space,
            id_=f"minari-{ep.id}",
            copy=False,
        )


def read_minari_batches(dataset: str | Any) -> Iterator[SampleBatch]:
    """Yield one ``SampleBatch`` per Minari episode (``get_sample_batch`` of the chunk)."""
    for ep in read_minari_episodes(dataset):
        yield ep.get_sample_batch()


@contextlib.contextmanager
def _datasets_root(root: str) -> Iterator[None]:
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = root
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old


def _infer_space(values: np.ndarray) -> Any:
    import gymnasium as gym

    if values.dtype.kind in "iu" and values.ndim == 1:
        return gym.spaces.Discrete(int(values.max()) + 1 if len(values) else 1)
    return gym.spaces.Box(-np.inf, np.inf, shape=values.shape[1:], dtype=values.dtype)


def write_minari(
    episodes: Iterable[SingleAgentEpisode],
    root: str,
    dataset_id: str = "envrunners/converted-v0",
    *,
    observation_space: Any = None,
    action_space: Any = None,
) -> str:
    """Write episode chunks as the Minari dataset ``dataset_id`` under ``root``.

    Spaces come from the arguments, else from the first chunk, else are inferred
    (integer actions: ``Discrete``; others: an unbounded ``Box``).

    Returns:
        The dataset directory (``<root>/<dataset_id>``).

    Raises:
        OfflineDataError: if there is no episode to write.
    """
    minari = _minari()
    from minari.data_collector import EpisodeBuffer

    buffers, first = [], None
    for i, ep in enumerate(episodes):
        if len(ep) == 0:
            continue
        first = first or ep
        n = len(ep)
        terms, truncs = np.zeros(n, bool), np.zeros(n, bool)
        terms[-1], truncs[-1] = ep.is_terminated, ep.is_truncated
        buffers.append(
            EpisodeBuffer(
                id=i,
                # (Dict / Tuple spaces: nested, one array per leaf, as Minari keeps them)
                observations=_nested.as_arrays(ep.get_observations(slice(0, n + 1))),
                actions=_nested.as_arrays(ep.get_actions()),
                rewards=list(np.asarray(ep.get_rewards(), dtype=np.float64)),
                terminations=list(terms),
                truncations=list(truncs),
            )
        )
    if first is None:
        raise OfflineDataError(f"no episode to write to the Minari dataset {dataset_id!r}")
    obs_space = observation_space or first.observation_space
    act_space = action_space or first.action_space
    if obs_space is None:
        obs_space = _infer_space(np.concatenate([b.observations for b in buffers]))
    if act_space is None:
        act_space = _infer_space(np.concatenate([b.actions for b in buffers]))
    root = os.path.abspath(os.path.expanduser(root))
    os.makedirs(root, exist_ok=True)
    with _datasets_root(root):
        minari.create_dataset_from_buffers(
            dataset_id,
            buffers,
            observation_space=obs_space,
            action_space=act_space,
            algorithm_name="envrunners offline convert",
            eval_env=None,
        )
    return os.path.join(root, dataset_id)
