"""PPO (``ray.rllib.algorithms.ppo``): ``PPO``, ``PPOConfig`` and the old-stack ``PPOTorchPolicy``."""

from typing import Any

from envrunners.algorithms.ppo.ppo import PPO, PPOConfig

__all__ = ["PPO", "PPOConfig", "PPOTorchPolicy"]


def __getattr__(name: str) -> Any:  # PPOTorchPolicy imports torch: load it on first use
    if name == "PPOTorchPolicy":
        from envrunners.algorithms.ppo.ppo_torch_policy import PPOTorchPolicy

        return PPOTorchPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
