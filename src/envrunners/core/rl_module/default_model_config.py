"""``DefaultModelConfig``: the hyper-parameters the default module understands.

A typed alternative to a ``model_config`` dict (``config.rl_module(model_config=...)``
accepts either); unknown dict keys are left to custom modules. Field names and
defaults are RLlib 2.60's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from envrunners.errors import ConfigError, suggest

__all__ = [
    "ACTIVATION_NAMES",
    "DefaultModelConfig",
    "check_model_config_keys",
    "resolve_model_config",
]

Initializer = str | Callable[..., Any] | None


@dataclasses.dataclass
class DefaultModelConfig:
    """Architecture of :class:`DefaultTorchRLModule`.

    The encoder is an MLP for flat (and, flattened, for ``Dict``/``Tuple``)
    observations and a CNN for images (3-D ``Box``, ``H x W x C``), optionally
    followed by an LSTM; policy and value heads sit on top.

    Attributes:
        fcnet_hiddens: Hidden layer sizes of the encoder MLP.
        fcnet_activation: Encoder activation: ``"tanh"``, ``"relu"``, ``"swish"``/``"silu"``,
            ``"elu"`` or ``"linear"``/``None``.
        fcnet_kernel_initializer: ``torch.nn.init`` name (``"xavier_uniform"``) or
            callable for the MLP weights; ``None``: torch's default.
        fcnet_kernel_initializer_kwargs: Keyword arguments for that initializer.
        fcnet_bias_initializer: Initializer of the MLP biases.
        fcnet_bias_initializer_kwargs: Keyword arguments for that initializer.
        fcnet_use_layernorm: A LayerNorm after each encoder layer, before its activation.
        conv_filters: ``[[out_channels, kernel, stride(, "same"|"valid")], ...]`` of the
            CNN encoder; ``None``: RLlib's table for 96x96, 84x84, 64x64, 42x42 and 10x10
            images (an error for other sizes). Padding defaults to ``"same"``.
        conv_activation: Activation after each conv layer.
        conv_kernel_initializer: Initializer of the conv weights.
        conv_kernel_initializer_kwargs: Keyword arguments for that initializer.
        conv_bias_initializer: Initializer of the conv biases.
        conv_bias_initializer_kwargs: Keyword arguments for that initializer.
        head_fcnet_hiddens: Extra hidden layers in the policy and value heads.
        head_fcnet_activation: Activation of those head layers.
        head_fcnet_kernel_initializer: Initializer of the head weights.
        head_fcnet_kernel_initializer_kwargs: Keyword arguments for that initializer.
        head_fcnet_bias_initializer: Initializer of the head biases.
        head_fcnet_bias_initializer_kwargs: Keyword arguments for that initializer.
        head_fcnet_use_layernorm: A LayerNorm after each hidden head layer.
        free_log_std: Gaussian actions: the log-std is a learned vector independent of
            the observation instead of half of the network's output.
        log_std_clip_param: Network-output log-stds are clipped to ``[-c, c]``.
        vf_share_layers: The value head reads the policy encoder's output instead of
            having its own encoder (and LSTM).
        use_lstm: Put an LSTM after the encoder (the module becomes stateful).
        max_seq_len: Length of the sequences a learner trains the LSTM on.
        lstm_cell_size: Size of the LSTM's hidden and cell state.
        lstm_use_prev_action: Feed the previous action (one-hot for discrete parts)
            into the LSTM next to the encoder output; the batch must hold
            ``"prev_actions"``.
        lstm_use_prev_reward: Feed the previous reward into the LSTM; the batch must
            hold ``"prev_rewards"``.
        lstm_kernel_initializer: Initializer of the LSTM weights.
        lstm_kernel_initializer_kwargs: Keyword arguments for that initializer.
        lstm_bias_initializer: Initializer of the LSTM biases.
        lstm_bias_initializer_kwargs: Keyword arguments for that initializer.
        fusionnet_hiddens: RLlib's multi-stream fusion layers; accepted, not used by the
            default module (which flattens ``Dict``/``Tuple`` observations instead).
        fusionnet_activation: Activation of those layers (accepted, not used).
        fusionnet_kernel_initializer: Accepted, not used.
        fusionnet_kernel_initializer_kwargs: Accepted, not used.
        fusionnet_bias_initializer: Accepted, not used.
        fusionnet_bias_initializer_kwargs: Accepted, not used.
    """

    fcnet_hiddens: list[int] = dataclasses.field(default_factory=lambda: [256, 256])
    fcnet_activation: str | None = "tanh"
    fcnet_kernel_initializer: Initializer = None
    fcnet_kernel_initializer_kwargs: dict | None = None
    fcnet_bias_initializer: Initializer = None
    fcnet_bias_initializer_kwargs: dict | None = None
    fcnet_use_layernorm: bool = False

    conv_filters: list | None = None
    conv_activation: str | None = "relu"
    conv_kernel_initializer: Initializer = None
    conv_kernel_initializer_kwargs: dict | None = None
    conv_bias_initializer: Initializer = None
    conv_bias_initializer_kwargs: dict | None = None

    head_fcnet_hiddens: list[int] = dataclasses.field(default_factory=list)
    head_fcnet_activation: str | None = "relu"
    head_fcnet_kernel_initializer: Initializer = None
    head_fcnet_kernel_initializer_kwargs: dict | None = None
    head_fcnet_bias_initializer: Initializer = None
    head_fcnet_bias_initializer_kwargs: dict | None = None
    head_fcnet_use_layernorm: bool = False

    free_log_std: bool = False
    log_std_clip_param: float = 20.0
    vf_share_layers: bool = True

    use_lstm: bool = False
    max_seq_len: int = 20
    lstm_cell_size: int = 256
    lstm_use_prev_action: bool = False
    lstm_use_prev_reward: bool = False
    lstm_kernel_initializer: Initializer = None
    lstm_kernel_initializer_kwargs: dict | None = None
    lstm_bias_initializer: Initializer = None
    lstm_bias_initializer_kwargs: dict | None = None

    fusionnet_hiddens: list[int] = dataclasses.field(default_factory=lambda: [256, 256])
    fusionnet_activation: str | None = "tanh"
    fusionnet_kernel_initializer: Initializer = None
    fusionnet_kernel_initializer_kwargs: dict | None = None
    fusionnet_bias_initializer: Initializer = None
    fusionnet_bias_initializer_kwargs: dict | None = None


#: Activation names the default module knows (``None`` and ``"linear"``: none).
ACTIVATION_NAMES = ("tanh", "relu", "swish", "silu", "elu", "linear", None)
_ACTIVATION_KEYS = ("fcnet_activation", "head_fcnet_activation", "conv_activation")


def resolve_model_config(model_config: Mapping[str, Any]) -> dict[str, Any]:
    """``DefaultModelConfig`` defaults overlaid with the known keys of ``model_config``.

    Raises:
        ConfigError: An activation name the default module does not know.
    """
    known = {f.name for f in dataclasses.fields(DefaultModelConfig)}
    cfg = {**vars(DefaultModelConfig()), **{k: v for k, v in model_config.items() if k in known}}
    for key in _ACTIVATION_KEYS:
        if cfg[key] not in ACTIVATION_NAMES:
            raise ConfigError(
                f"model_config[{key!r}]={cfg[key]!r} is not one of "
                f"{sorted(str(a) for a in ACTIVATION_NAMES)}."
            )
    return cfg


#: Keys of RLlib's old-stack ``MODEL_DEFAULTS`` (``ray.rllib.models.catalog``): RLlib
#: configs carry them, so they are known names even where the default module ignores them.
RLLIB_MODEL_DEFAULTS_KEYS = frozenset(
    {"_disable_action_flattening", "_disable_preprocessor_api", "_time_major",
     "_use_default_native_models", "always_check_shapes", "attention_dim", "attention_head_dim",
     "attention_init_gru_gate_bias", "attention_memory_inference", "attention_memory_training",
     "attention_num_heads", "attention_num_transformer_units", "attention_position_wise_mlp_dim",
     "attention_use_n_prev_actions", "attention_use_n_prev_rewards", "conv_activation",
     "conv_bias_initializer", "conv_bias_initializer_config", "conv_filters",
     "conv_kernel_initializer", "conv_kernel_initializer_config",
     "conv_transpose_bias_initializer", "conv_transpose_bias_initializer_config",
     "conv_transpose_kernel_initializer", "conv_transpose_kernel_initializer_config",
     "custom_action_dist", "custom_model", "custom_model_config", "custom_preprocessor", "dim",
     "encoder_latent_dim", "fcnet_activation", "fcnet_bias_initializer",
     "fcnet_bias_initializer_config", "fcnet_hiddens", "fcnet_weights_initializer",
     "fcnet_weights_initializer_config", "framestack", "free_log_std", "grayscale",
     "log_std_clip_param", "lstm_bias_initializer", "lstm_bias_initializer_config",
     "lstm_cell_size", "lstm_use_prev_action", "lstm_use_prev_action_reward",
     "lstm_use_prev_reward", "lstm_weights_initializer", "lstm_weights_initializer_config",
     "max_seq_len", "no_final_linear", "post_fcnet_activation", "post_fcnet_bias_initializer",
     "post_fcnet_bias_initializer_config", "post_fcnet_hiddens", "post_fcnet_weights_initializer",
     "post_fcnet_weights_initializer_config", "use_attention", "use_lstm", "vf_share_layers",
     "zero_mean"}
)  # fmt: skip


def check_model_config_keys(model_config: Mapping[str, Any]) -> None:
    """Refuse a ``model_config`` key that neither the default module nor RLlib knows.

    Why: the default module would silently ignore a typo (``fcnet_hidden``) and train
    a different network than asked for. Only called where envrunners picks the default
    module itself; custom modules may read any keys of their own.

    Raises:
        ConfigError: Names the unknown key, a close match, and the known keys.
    """
    known = {f.name for f in dataclasses.fields(DefaultModelConfig)} | RLLIB_MODEL_DEFAULTS_KEYS
    unknown = [k for k in model_config if k not in known]
    if unknown:
        key = unknown[0]
        raise ConfigError(
            f"Unknown model_config key {key!r} for the default RLModule.{suggest(key, known)} "
            f"Known keys: {sorted(known)}. A custom RLModule (config.rl_module("
            "rl_module_spec=...)) may read keys of its own."
        )
