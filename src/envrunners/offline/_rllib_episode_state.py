"""Episode state in RLlib 2.60's layout (what its offline Parquet ``item`` column holds).

Why: RLlib stores ``SingleAgentEpisode.get_state()`` with its own space encoding
(``ray.rllib.utils.serialization.gym_space_to_dict``: Box bounds as base64 of a
zlib-compressed ``.npy`` file) and the keys ``_observation_space``/``_action_space``;
ours uses plain-number bounds and ``observation_space``/``action_space``. These pure
functions translate both ways, so episode files pass between the two libraries.
``.npy`` bounds are loaded with ``allow_pickle=False``.
"""

from __future__ import annotations

import base64
import io
import json
import zlib
from typing import Any

import gymnasium as gym
import numpy as np

from envrunners.env.single_agent_episode import SingleAgentEpisode
from envrunners.errors import OfflineDataError
from envrunners.utils.spaces import gym_space_to_dict

__all__ = ["episode_from_rllib_state", "episode_to_rllib_state", "space_from_rllib"]

_BUFFERS = ("observations", "actions", "rewards", "infos")


def _npy_b64(array: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, np.asarray(array), allow_pickle=False)
    return base64.b64encode(zlib.compress(buf.getvalue())).decode("ascii")


def _npy_from_b64(text: str) -> np.ndarray:
    raw = zlib.decompress(base64.b64decode(text))
    return np.load(io.BytesIO(raw), allow_pickle=False)


def space_to_rllib(space: gym.Space | None) -> dict[str, Any] | None:
    """Encode ``space`` as RLlib's ``gym_space_to_dict`` does (Box, Discrete, Multi*, Tuple, Dict)."""
    if space is None:
        return None
    if isinstance(space, gym.spaces.Box):
        return {
            "space": "box",
            "low": _npy_b64(space.low),
            "high": _npy_b64(space.high),
            "shape": list(space.shape),
            "dtype": np.dtype(space.dtype).str,
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"space": "discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"space": "multi-binary", "n": space.n}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {
            "space": "multi-discrete",
            "nvec": _npy_b64(space.nvec),
            "dtype": np.dtype(space.dtype).str,
        }
    if isinstance(space, gym.spaces.Tuple):
        return {"space": "tuple", "spaces": [space_to_rllib(s) for s in space.spaces]}
    if isinstance(space, gym.spaces.Dict):
        return {"space": "dict", "spaces": {k: space_to_rllib(s) for k, s in space.spaces.items()}}
    raise OfflineDataError(
        f"cannot store a {type(space).__name__} space in RLlib's episode layout "
        "(Box, Discrete, MultiBinary, MultiDiscrete, Tuple and Dict are supported)"
    )


def space_from_rllib(d: dict[str, Any] | None) -> gym.Space | None:
    """Decode a space written by RLlib's ``gym_space_to_dict`` (never unpickles)."""
    if d is None:
        return None
    kind = d.get("space")
    dtype = np.dtype(d["dtype"]) if "dtype" in d else None
    if kind == "box":
        return gym.spaces.Box(
            low=_npy_from_b64(d["low"]),
            high=_npy_from_b64(d["high"]),
            shape=tuple(d["shape"]),
            dtype=dtype,
        )
    if kind == "discrete":
        return gym.spaces.Discrete(int(d["n"]), start=int(d.get("start", 0)))
    if kind == "multi-binary":
        return gym.spaces.MultiBinary(d["n"])
    if kind == "multi-discrete":
        return gym.spaces.MultiDiscrete(_npy_from_b64(d["nvec"]), dtype=dtype or np.int64)
    if kind == "tuple":
        return gym.spaces.Tuple([space_from_rllib(s) for s in d["spaces"]])
    if kind == "dict":
        return gym.spaces.Dict({k: space_from_rllib(s) for k, s in d["spaces"].items()})
    raise OfflineDataError(f"unknown space type {kind!r} in an RLlib episode state")


class _SpaceCache:
    """Encode each distinct space once (a runner's episodes share their space objects)."""

    def __init__(self) -> None:
        self._to: dict[int, tuple[Any, Any]] = {}
        self._from: dict[str, tuple[Any, Any]] = {}

    def to_rllib(self, space: Any) -> Any:
        hit = self._to.get(id(space))
        if hit is None or hit[0] is not space:
            hit = (space, space_to_rllib(space))
            self._to[id(space)] = hit
        return hit[1]

    def from_rllib(self, d: Any) -> tuple[Any, Any]:
        """``(gym space, our space dict)`` for an RLlib space dict."""
        if d is None:
            return None, None
        key = json.dumps(d, sort_keys=True)
        hit = self._from.get(key)
        if hit is None:
            space = space_from_rllib(d)
            hit = (space, gym_space_to_dict(space))
            self._from[key] = hit
        return hit


_CACHE = _SpaceCache()


def _buffer_state(buf: Any) -> dict[str, Any]:
    return {
        "data": buf.data if buf.finalized else list(buf.data),
        "lookback": buf.lookback,
        "finalized": buf.finalized,
        "space": _CACHE.to_rllib(buf.space),
    }


def episode_to_rllib_state(episode: SingleAgentEpisode) -> dict[str, Any]:
    """The state RLlib's ``SingleAgentEpisode.get_state()`` returns, for our episode.

    Built from the episode's buffers directly (each distinct space encoded once),
    with RLlib's keys and key order.
    """
    extras = episode.extra_model_outputs
    return {
        "id_": episode.id_,
        "agent_id": episode.agent_id,
        "module_id": episode.module_id,
        "multi_agent_episode_id": episode.multi_agent_episode_id,
        "observations": _buffer_state(episode.observations),
        "actions": _buffer_state(episode.actions),
        "rewards": _buffer_state(episode.rewards),
        "infos": _buffer_state(episode.infos),
        "extra_model_outputs": {k: _buffer_state(b) for k, b in extras.items()} if extras else None,
        "is_terminated": bool(episode.is_terminated),
        "is_truncated": bool(episode.is_truncated),
        "t_started": int(episode.t_started),
        "t": int(episode.t),
        "_observation_space": _CACHE.to_rllib(episode.observation_space),
        "_action_space": _CACHE.to_rllib(episode.action_space),
        "_start_time": episode._start_time,
        "_last_step_time": episode._last_step_time,
        "custom_data": dict(episode.custom_data),
    }


def _stacked(data: Any) -> np.ndarray | None:
    """A buffer's data as one array, or None if it is not a list of same-shape arrays."""
    if isinstance(data, np.ndarray):
        return data
    if isinstance(data, list) and all(isinstance(x, np.ndarray | np.generic | int | float | bool)
                                      for x in data):  # fmt: skip
        try:
            return np.stack([np.asarray(x) for x in data]) if data else None
        except ValueError:
            return None
    return None


def _from_columns(state: dict[str, Any]) -> SingleAgentEpisode | None:
    """The fast path: flat array data, one lookback for all buffers (else None)."""
    names = [*_BUFFERS[:3], *((state.get("extra_model_outputs") or {}).keys())]
    bufs = [state[b] for b in _BUFFERS[:3]] + list(
        (state.get("extra_model_outputs") or {}).values()
    )
    if len({b["lookback"] for b in [*bufs, state["infos"]]}) != 1:
        return None
    arrays = dict(zip(names, map(_stacked, (b["data"] for b in bufs)), strict=True))
    if any(a is None for a in arrays.values()):
        return None
    obs_space, _ = _CACHE.from_rllib(state.get("_observation_space"))
    act_space, _ = _CACHE.from_rllib(state.get("_action_space"))
    infos = state["infos"]["data"]
    episode = SingleAgentEpisode.from_columns(
        observations=arrays.pop("observations"),
        actions=arrays.pop("actions"),
        rewards=arrays.pop("rewards"),
        infos=[i if isinstance(i, dict) else {} for i in infos] if len(infos) else None,
        extra_model_outputs=arrays,
        terminated=bool(state["is_terminated"]),
        truncated=bool(state["is_truncated"]),
        t_started=int(state["t_started"]),
        len_lookback_buffer=int(state["observations"]["lookback"]),
        observation_space=obs_space,
        action_space=act_space,
        id_=state["id_"],
        agent_id=state.get("agent_id"),
        module_id=state.get("module_id"),
        multi_agent_episode_id=state.get("multi_agent_episode_id"),
        copy=True,  # decoded arrays are read-only views of the msgpack bytes
        start_time=state.get("_start_time"),
        last_step_time=state.get("_last_step_time"),
    )
    episode.custom_data.update(state.get("custom_data") or {})
    return episode


def episode_from_rllib_state(state: dict[str, Any], where: str = "") -> SingleAgentEpisode:
    """Rebuild a (numpy'd) episode from an RLlib episode state.

    Raises:
        OfflineDataError: if a key is missing or the data is inconsistent; names ``where``.
    """
    try:
        episode = _from_columns(state)
        if episode is not None:
            return episode
        ours = dict(state)
        obs_space, _ = _CACHE.from_rllib(ours.pop("_observation_space", None))
        act_space, _ = _CACHE.from_rllib(ours.pop("_action_space", None))
        ours["observation_space"] = gym_space_to_dict(obs_space) if obs_space else None
        ours["action_space"] = gym_space_to_dict(act_space) if act_space else None
        for name in _BUFFERS:
            ours[name] = dict(ours[name], space=_CACHE.from_rllib(ours[name].get("space"))[1])
        extras = ours.get("extra_model_outputs") or {}
        ours["extra_model_outputs"] = {
            k: dict(v, space=_CACHE.from_rllib(v.get("space"))[1]) for k, v in extras.items()
        }
        episode = SingleAgentEpisode.from_state(ours)
    except OfflineDataError:
        raise
    except (KeyError, TypeError, ValueError, AssertionError) as e:
        raise OfflineDataError(
            f"not an RLlib episode state: {type(e).__name__}: {e}", path=where or None
        ) from None
    return episode if episode.is_numpy else episode.to_numpy()
