"""PPO (``ray.rllib.algorithms.ppo``): ``PPOConfig``."""

from envrunners.algorithms.ppo.ppo import PPOConfig

__all__ = ["PPOConfig"]
