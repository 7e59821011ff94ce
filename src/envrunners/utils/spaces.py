"""Gymnasium spaces as plain data, and space-aware helpers for nested values.

Why: episode and runner state must travel as plain data (JSON-able dicts,
lists, numbers, strings), never as pickles. ``gym_space_to_dict`` and
``gym_space_from_dict`` encode the space types the sampling layer uses (Box,
Discrete, MultiDiscrete, MultiBinary, Dict, Tuple) losslessly.

Encoding (the ``"space"`` key names the type)::

    Box           {"space": "box", "low": x, "high": x, "shape": [...], "dtype": "float32"}
                  (``x`` is one number when all bounds are equal, else a nested list;
                  infinite bounds are the floats ``inf``/``-inf``)
    Discrete      {"space": "discrete", "n": 4, "start": 0, "dtype": "int64"}
    MultiDiscrete {"space": "multi-discrete", "nvec": [...], "start": [...], "dtype": "int64"}
    MultiBinary   {"space": "multi-binary", "n": 5 | [2, 3]}
    Dict          {"space": "dict", "spaces": {key: encoded, ...}}   (key order kept)
    Tuple         {"space": "tuple", "spaces": [encoded, ...]}
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.env.utils._structs import batch, unbatch

__all__ = [
    "batch",
    "get_base_struct_from_space",
    "gym_space_from_dict",
    "gym_space_to_dict",
    "one_hot_encode",
    "one_hot_size",
    "unbatch",
]

_SUPPORTED = "Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple"


def _bounds_to_data(bounds: np.ndarray) -> Any:
    """Encode Box bounds: one number if uniform, else a nested list."""
    flat = bounds.ravel()
    if flat.size > 0 and np.all(flat == flat[0]):
        return flat[0].item()
    return bounds.tolist()


def gym_space_to_dict(space: gym.Space) -> dict[str, Any]:
    """Encode a gymnasium space as a plain-data dict.

    Why: spaces are part of episode and runner state, which must be portable
    plain data (no pickle).

    Args:
        space: A Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple space
            (nested freely).

    Returns:
        A dict of plain Python values that ``gym_space_from_dict`` turns back into
        an equal space.

    Raises:
        TypeError: For any other space type.
    """
    if isinstance(space, gym.spaces.Box):
        return {
            "space": "box",
            "low": _bounds_to_data(space.low),
            "high": _bounds_to_data(space.high),
            "shape": list(space.shape),
            "dtype": np.dtype(space.dtype).name,
        }
    if isinstance(space, gym.spaces.Discrete):
        return {
            "space": "discrete",
            "n": int(space.n),
            "start": int(space.start),
            "dtype": np.dtype(space.dtype).name,
        }
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {
            "space": "multi-discrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": np.dtype(space.dtype).name,
        }
    if isinstance(space, gym.spaces.MultiBinary):
        n = space.n
        return {
            "space": "multi-binary",
            "n": int(n) if np.ndim(n) == 0 else [int(x) for x in np.ravel(n)],
        }
    if isinstance(space, gym.spaces.Dict):
        return {
            "space": "dict",
            "spaces": {k: gym_space_to_dict(s) for k, s in space.spaces.items()},
        }
    if isinstance(space, gym.spaces.Tuple):
        return {"space": "tuple", "spaces": [gym_space_to_dict(s) for s in space.spaces]}
    raise TypeError(
        f"Cannot encode a {type(space).__name__} space as plain data; supported: {_SUPPORTED}."
    )


def _bounds_from_data(value: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Decode Box bounds written by ``_bounds_to_data``."""
    arr = np.asarray(value, dtype=np.float64 if np.issubdtype(dtype, np.floating) else None)
    return np.broadcast_to(arr, shape).astype(dtype)


def gym_space_from_dict(d: dict[str, Any]) -> gym.Space:
    """Decode a space written by ``gym_space_to_dict``.

    Why: the mirror of the encoder, used when restoring episode or runner state.

    Args:
        d: The encoded space.

    Returns:
        The gymnasium space.

    Raises:
        ValueError: If ``d`` is not an encoded space (no or an unknown ``"space"`` key).
    """
    if not isinstance(d, dict) or "space" not in d:
        raise ValueError(f"Not an encoded space (expected a dict with a 'space' key): {d!r}.")
    kind = d["space"]
    if kind == "box":
        shape = tuple(int(x) for x in d["shape"])
        dtype = np.dtype(d["dtype"])
        low = _bounds_from_data(d["low"], shape, dtype)
        high = _bounds_from_data(d["high"], shape, dtype)
        return gym.spaces.Box(low=low, high=high, shape=shape, dtype=dtype)
    if kind == "discrete":
        return gym.spaces.Discrete(
            int(d["n"]), start=int(d.get("start", 0)), dtype=np.dtype(d.get("dtype", "int64"))
        )
    if kind == "multi-discrete":
        nvec = np.asarray(d["nvec"])
        start = d.get("start")
        return gym.spaces.MultiDiscrete(
            nvec,
            dtype=np.dtype(d.get("dtype", "int64")),
            start=None if start is None else np.asarray(start),
        )
    if kind == "multi-binary":
        n = d["n"]
        return gym.spaces.MultiBinary(n if isinstance(n, int) else list(n))
    if kind == "dict":
        return gym.spaces.Dict({k: gym_space_from_dict(v) for k, v in d["spaces"].items()})
    if kind == "tuple":
        return gym.spaces.Tuple([gym_space_from_dict(v) for v in d["spaces"]])
    raise ValueError(f"Unknown encoded space type {kind!r}; supported: {_SUPPORTED}.")


def get_base_struct_from_space(space: gym.Space | None) -> Any:
    """Return the nested (dict/tuple) structure of leaf spaces inside ``space``.

    Why: buffers walk data and its space side by side; a ``Dict`` space becomes
    a dict of sub-structures, a ``Tuple`` a tuple, any other space is a leaf.
    """
    if isinstance(space, gym.spaces.Dict):
        return {k: get_base_struct_from_space(s) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(get_base_struct_from_space(s) for s in space.spaces)
    return space


def one_hot_size(space: Any) -> int | None:
    """Return the one-hot width of a Discrete/MultiDiscrete space (sum of ``nvec``), else None."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    return None


def one_hot_encode(space: Any, value: Any, batched: bool = False) -> Any:
    """One-hot encode a value (or a batch, ``batched=True``) of a Discrete/MultiDiscrete space.

    Why: models take discrete observations/actions as float32 one-hot vectors;
    MultiDiscrete components are concatenated. Other spaces pass ``value`` through.
    """
    if isinstance(space, gym.spaces.Discrete):
        v = np.asarray(value, dtype=np.int64) - int(space.start)
        return np.eye(int(space.n), dtype=np.float32)[v]
    if isinstance(space, gym.spaces.MultiDiscrete):
        v = np.asarray(value, dtype=np.int64) - np.asarray(space.start, dtype=np.int64)
        v = v.reshape((v.shape[0], -1) if batched else (-1,))
        nvec = np.asarray(space.nvec).ravel()
        parts = [np.eye(int(k), dtype=np.float32)[v[..., j]] for j, k in enumerate(nvec)]
        return np.concatenate(parts, axis=-1)
    return value
