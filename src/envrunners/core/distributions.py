"""Old location of the action distributions; they live at RLlib's paths.

``envrunners.core.distribution.distribution`` (``Distribution``) and
``envrunners.core.distribution.torch.torch_distribution`` (the torch classes).
"""

from __future__ import annotations

from envrunners.core.distribution.distribution import Distribution
from envrunners.core.distribution.torch.torch_distribution import (
    TorchCategorical,
    TorchDeterministic,
    TorchDiagGaussian,
    TorchMultiCategorical,
    TorchMultiDistribution,
)

__all__ = [
    "Distribution",
    "TorchCategorical",
    "TorchDeterministic",
    "TorchDiagGaussian",
    "TorchMultiCategorical",
    "TorchMultiDistribution",
]
