"""``DefaultModelConfig``: the hyper-parameters the default MLP module understands.

A typed alternative to a ``model_config`` dict (``config.rl_module(model_config=...)``
accepts either); unknown dict keys are left to custom modules.
"""

from __future__ import annotations

import dataclasses

__all__ = ["DefaultModelConfig"]


@dataclasses.dataclass
class DefaultModelConfig:
    """Architecture of :class:`DefaultTorchRLModule`.

    Attributes:
        fcnet_hiddens: Hidden layer sizes of the encoder MLP.
        fcnet_activation: Encoder activation: ``"tanh"``, ``"relu"``, ``"swish"``/``"silu"``,
            ``"elu"`` or ``"linear"``/``None``.
        head_fcnet_hiddens: Extra hidden layers in the policy and value heads.
        head_fcnet_activation: Activation of those head layers.
        free_log_std: Gaussian actions: the log-std is a learned vector independent of
            the observation instead of half of the network's output.
        log_std_clip_param: Network-output log-stds are clipped to ``[-c, c]``.
        vf_share_layers: The value head reads the policy encoder's output instead of
            having its own encoder.
    """

    fcnet_hiddens: list[int] = dataclasses.field(default_factory=lambda: [256, 256])
    fcnet_activation: str | None = "tanh"
    head_fcnet_hiddens: list[int] = dataclasses.field(default_factory=list)
    head_fcnet_activation: str | None = "relu"
    free_log_std: bool = False
    log_std_clip_param: float = 20.0
    vf_share_layers: bool = False
