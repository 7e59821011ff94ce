"""Torch modules (``ray.rllib.core.rl_module.torch``)."""

from __future__ import annotations

from envrunners.core.rl_module.torch.torch_rl_module import TorchRLModule

__all__ = ["TorchRLModule"]
