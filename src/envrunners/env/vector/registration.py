"""``make_vec`` for multi-agent envs (``ray.rllib.env.vector.registration``).

Why: gymnasium's ``make_vec`` only knows single-agent vector envs; this builds a
``SyncVectorMultiAgentEnv`` or an ``AsyncVectorMultiAgentEnv`` from a gymnasium
id, an env class or a creator function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from envrunners.env.vector.async_vector_multi_agent_env import AsyncVectorMultiAgentEnv
from envrunners.env.vector.sync_vector_multi_agent_env import SyncVectorMultiAgentEnv
from envrunners.env.vector.vector_multi_agent_env import VectorMultiAgentEnv

__all__ = ["make_vec"]


def _mode_name(mode: Any) -> str:
    if mode is None:
        return "sync"
    return str(getattr(mode, "value", mode)).lower()


def make_vec(
    id: str | Callable[..., Any],  # noqa: A002 - RLlib's and gymnasium's name
    num_envs: int = 1,
    vectorization_mode: str | gym.VectorizeMode | None = None,
    vector_kwargs: dict | None = None,
    **kwargs: Any,
) -> VectorMultiAgentEnv:
    """Build ``num_envs`` copies of a multi-agent env as one vector env.

    Args:
        id: A registered gymnasium id (built with ``gym.make(id, **kwargs)``,
            env checker off), or a class / callable called with ``**kwargs``.
        num_envs: How many sub-envs.
        vectorization_mode: ``"sync"`` (default) or ``"async"`` (worker processes).
        vector_kwargs: Extra keyword arguments for the vector env class.
        **kwargs: Passed to every sub-env's constructor.

    Raises:
        ValueError: ``vectorization_mode="vector_entry_point"`` or another unknown mode.
    """
    if num_envs < 1:
        raise ValueError(f"make_vec: num_envs must be >= 1, got {num_envs}")
    if isinstance(id, str):
        make_kwargs = {"disable_env_checker": True, **kwargs}

        def build() -> Any:
            return gym.make(id, **make_kwargs)

    elif callable(id):

        def build() -> Any:
            return id(**kwargs)

    else:
        raise TypeError(f"make_vec: id must be a gymnasium id or a callable, got {id!r}")
    mode = _mode_name(vectorization_mode)
    fns = [build] * num_envs
    if mode == "sync":
        return SyncVectorMultiAgentEnv(fns, **(vector_kwargs or {}))
    if mode == "async":
        return AsyncVectorMultiAgentEnv(fns, **(vector_kwargs or {}))
    raise ValueError(
        f"For `MultiAgentEnv` only 'sync' and 'async' vectorization are implemented, got "
        f"vectorization_mode={vectorization_mode!r}."
    )
