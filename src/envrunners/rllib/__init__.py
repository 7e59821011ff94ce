"""envrunners' runners inside RLlib's own algorithms: ``config.env_runners(env_runner_cls=...)``.

The only part of envrunners that imports ``ray.rllib``. ``SingleAgentEnvRunner``
(and ``MultiAgentEnvRunner``, where present) subclass RLlib's runner classes, so
RLlib's Algorithm, EnvRunnerGroup, fault tolerance, evaluation and checkpointing
take them unchanged, while ``sample()`` steps through envrunners' sampling core::

    import envrunners.rllib
    config.env_runners(env_runner_cls=envrunners.rllib.SingleAgentEnvRunner)

Importing this package without a working ``ray[rllib]`` (missing, or installed
without its dependencies) raises ``RLlibExtraMissingError`` naming the extra.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from envrunners.errors import RLlibExtraMissingError

#: Packages ``ray[rllib]`` installs that RLlib imports while training or checkpointing
#: (module names). The ``ray`` wheel alone ships RLlib's source without them, which
#: imports but fails later (e.g. at the first checkpoint): checked up front instead.
RLLIB_RUNTIME_MODULES = ("tree", "lz4", "ormsgpack", "scipy", "yaml")


def _check_rllib() -> None:
    """Raise ``RLlibExtraMissingError`` unless RLlib and its runtime packages import.

    The packages are looked up first (no import), so a Python without them fails
    fast, before loading RLlib.
    """
    missing = [m for m in RLLIB_RUNTIME_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise RLlibExtraMissingError(
            f"envrunners.rllib needs RLlib's dependencies; not installed: {missing} (RLlib's "
            "source can be there without `ray[rllib]`'s packages). Install the extra: "
            "pip install 'envrunners[rllib]'",
            name=missing[0],
        )
    try:  # RLlib's runner base classes and config: everything this package builds on
        import ray.rllib.algorithms.algorithm_config  # noqa: F401
        import ray.rllib.env.single_agent_env_runner  # noqa: F401
    except Exception as err:  # ImportError, or a broken RLlib failing on a missing dependency
        raise RLlibExtraMissingError(
            "envrunners.rllib needs RLlib 2.60 (`ray[rllib]>=2.60,<2.61`); importing it "
            f"failed with {type(err).__name__}: {err}. Install the extra: "
            "pip install 'envrunners[rllib]'",
            name=getattr(err, "name", None) or "ray.rllib",
        ) from err


_check_rllib()

from envrunners.rllib.single_agent_env_runner import SingleAgentEnvRunner  # noqa: E402

__all__ = ["MultiAgentEnvRunner", "SingleAgentEnvRunner"]


def __getattr__(name: str) -> Any:
    """``MultiAgentEnvRunner`` from its own module, imported when first asked for."""
    if name == "MultiAgentEnvRunner":
        from envrunners.rllib.multi_agent_env_runner import MultiAgentEnvRunner

        return MultiAgentEnvRunner
    raise AttributeError(f"module 'envrunners.rllib' has no attribute {name!r}")
