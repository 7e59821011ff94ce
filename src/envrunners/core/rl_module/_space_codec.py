"""Plain-data (JSON-able) encoding of gymnasium spaces, for module specs and checkpoints.

Specs travel in JSON next to saved weights; pickling a space would tie a checkpoint
to the exact classes of the process that wrote it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["space_from_dict", "space_to_dict"]


def space_to_dict(space: gym.Space | None) -> dict[str, Any] | None:
    """Encode ``space`` as nested dicts, lists and scalars (``None`` stays ``None``).

    Raises:
        TypeError: The space is of a kind this codec does not know.
    """
    if space is None:
        return None
    if isinstance(space, gym.spaces.Box):
        return {
            "space": "box",
            "low": space.low.tolist(),
            "high": space.high.tolist(),
            "shape": list(space.shape),
            "dtype": str(space.dtype),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"space": "discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {
            "space": "multi-discrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": str(space.dtype),
        }
    if isinstance(space, gym.spaces.MultiBinary):
        return {"space": "multi-binary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Tuple):
        return {"space": "tuple", "spaces": [space_to_dict(s) for s in space.spaces]}
    if isinstance(space, gym.spaces.Dict):
        return {"space": "dict", "spaces": {k: space_to_dict(s) for k, s in space.spaces.items()}}
    raise TypeError(
        f"Cannot encode space {space!r} as plain data; supported: Box, Discrete, "
        "MultiDiscrete, MultiBinary, Tuple and Dict."
    )


def space_from_dict(data: dict[str, Any] | None) -> gym.Space | None:
    """Decode what :func:`space_to_dict` produced."""
    if data is None:
        return None
    kind = data["space"]
    if kind == "box":
        dtype = np.dtype(data["dtype"])
        low = np.asarray(data["low"], dtype=dtype).reshape(data["shape"])
        high = np.asarray(data["high"], dtype=dtype).reshape(data["shape"])
        return gym.spaces.Box(low=low, high=high, shape=tuple(data["shape"]), dtype=dtype)
    if kind == "discrete":
        return gym.spaces.Discrete(int(data["n"]), start=int(data.get("start", 0)))
    if kind == "multi-discrete":
        return gym.spaces.MultiDiscrete(
            np.asarray(data["nvec"]), dtype=np.dtype(data["dtype"]), start=np.asarray(data["start"])
        )
    if kind == "multi-binary":
        return gym.spaces.MultiBinary(data["n"])
    if kind == "tuple":
        return gym.spaces.Tuple([space_from_dict(s) for s in data["spaces"]])
    if kind == "dict":
        return gym.spaces.Dict({k: space_from_dict(s) for k, s in data["spaces"].items()})
    raise ValueError(f"Unknown encoded space kind {kind!r}.")
