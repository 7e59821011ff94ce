"""``TorchRLModule``: the base class users subclass for their own torch modules.

Every ``RLModule`` here is a ``torch.nn.Module`` already; this is the class at
RLlib's torch path, where the torch-specific behaviour lives: inputs the runner
hands over as numpy become tensors on the module's device before a forward pass.

A subclass builds its layers in ``setup()`` and overrides ``_forward`` (or
``_forward_inference`` / ``_forward_exploration`` / ``_forward_train``). Outputs
hold ``Columns.ACTION_DIST_INPUTS`` (the runner samples from
``get_exploration_action_dist_cls()`` / ``get_inference_action_dist_cls()``) or
``Columns.ACTIONS`` (plus ``Columns.ACTION_LOGP``). A recurrent module returns its
initial state from ``get_initial_state()`` and reads ``Columns.STATE_IN`` /
writes ``Columns.STATE_OUT``, on time-ranked ``(B, T, ...)`` batches.
"""

from __future__ import annotations

from typing import Any

import torch

from envrunners.core.rl_module.rl_module import RLModule
from envrunners.utils.torch_utils import convert_to_torch_tensor

__all__ = ["TorchRLModule"]


class TorchRLModule(RLModule):
    """An ``RLModule`` whose forward passes take torch tensors (numpy inputs are converted)."""

    framework: str = "torch"

    @property
    def device(self) -> torch.device:
        """Where the module's parameters live (CPU for a module without parameters)."""
        for param in self.parameters():
            return param.device
        return torch.device("cpu")

    def _convert_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``batch`` with numpy arrays (also nested ones) as tensors on :attr:`device`.

        float64 becomes float32 (``convert_to_torch_tensor``); other dtypes are kept.
        """
        return convert_to_torch_tensor(batch, device=self.device)

    def forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Outputs for greedy acting (``explore=False``); no gradients needed."""
        return self._forward_inference(self._convert_batch(batch), **kwargs)

    def forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Outputs for exploratory acting; runners pass the global timestep as ``t``."""
        return self._forward_exploration(self._convert_batch(batch), **kwargs)

    def forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        """Outputs a learner's loss needs (with gradients)."""
        return self._forward_train(self._convert_batch(batch), **kwargs)
