"""``PPO`` and ``PPOConfig``: the algorithm and its config with PPO's keys and RLlib's defaults.

Why: PPO is the on-policy algorithm the runners are benchmarked and tested
with (old-stack ``PPOTorchPolicy`` postprocessing reads ``gamma``, ``lambda_``,
``use_gae``, ``use_critic``). ``PPOConfig().build_algo()`` builds ``PPO``, an
``Algorithm`` that trains with the single-file ``PPOLearner``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envrunners.algorithms import _config_checks as c
from envrunners.algorithms._config_fields import TRAIN, config_field
from envrunners.algorithms.algorithm import Algorithm
from envrunners.algorithms.algorithm_config import AlgorithmConfig

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["PPO", "PPOConfig"]

_unit = c.number(0.0)


class PPOConfig(AlgorithmConfig):
    """Config of Proximal Policy Optimization: clipped surrogate loss with GAE.

    Why: gives runner tests and benchmarks RLlib's PPO setup; ``training()``
    accepts the PPO keys below besides the common ones, and ``validate()`` adds
    PPO's consistency checks (``use_gae`` needs ``use_critic``).

    Defaults differing from ``AlgorithmConfig`` (RLlib's PPO's): ``lr=5e-5``,
    ``train_batch_size=4000``, ``num_epochs=30``, ``minibatch_size=128``,
    ``shuffle_batch_per_epoch=True``, ``num_env_runners=2`` (an algorithm samples in
    two remote runner actors; ``env_runners(num_env_runners=0)`` samples in the
    driver's own runner), and ``rollout_fragment_length="auto"`` (the runners'
    fragments add up to the train batch, so a ``train()`` samples
    ``train_batch_size`` steps, not a multiple of 200 per env).

    Example:
        >>> config = PPOConfig().environment("CartPole-v1").training(lambda_=0.95, clip_param=0.2)
        >>> config.num_epochs, config.lambda_
        (30, 0.95)
    """

    # Inherited keys with PPO's defaults.
    lr: float | list = 5e-5
    train_batch_size: int = 4000
    rollout_fragment_length: int | str = "auto"
    num_env_runners: int = 2
    num_epochs: int = 30
    minibatch_size: int | None = 128
    shuffle_batch_per_epoch: bool = True
    # PPO's own keys, set by training().
    lambda_: float = config_field(1.0, TRAIN, _unit)
    use_critic: bool = config_field(True, TRAIN, c.boolean)
    use_gae: bool = config_field(True, TRAIN, c.boolean)
    use_kl_loss: bool = config_field(True, TRAIN, c.boolean)
    kl_coeff: float = config_field(0.2, TRAIN, c.number(0.0))
    kl_target: float = config_field(0.01, TRAIN, c.number(0.0))
    vf_loss_coeff: float = config_field(1.0, TRAIN, c.number(0.0))
    entropy_coeff: float | list = config_field(0.0, TRAIN, c.learning_rate)
    clip_param: float = config_field(0.3, TRAIN, c.number(0.0, strict=True))
    vf_clip_param: float = config_field(10.0, TRAIN, c.number(0.0, strict=True))

    def __init__(self, algo_class: type | None = None) -> None:
        super().__init__(algo_class=algo_class or PPO)

    def training(self, **kwargs: Any) -> Self:
        """Set the common training keys and PPO's.

        Args:
            **kwargs: Every key of ``AlgorithmConfig.training()``, plus
                ``lambda_`` (GAE lambda), ``use_critic``, ``use_gae``,
                ``use_kl_loss``, ``kl_coeff``, ``kl_target``, ``vf_loss_coeff``,
                ``entropy_coeff``, ``clip_param``, ``vf_clip_param``. Old names
                ``num_sgd_iter`` and ``sgd_minibatch_size`` warn and map to
                ``num_epochs`` and ``minibatch_size``.
        """
        return super().training(**kwargs)

    def _cross_field_problems(self) -> list[str]:
        problems = super()._cross_field_problems()
        if self.use_gae and not self.use_critic:
            problems.append(
                "use_gae=True needs use_critic=True (GAE is computed from the value "
                "function); set use_critic=True or use_gae=False."
            )
        if not 0.0 <= self.lambda_ <= 1.0:
            problems.append(f"lambda_ must be in [0, 1], got {self.lambda_!r}.")
        return problems


class PPO(Algorithm):
    """Proximal Policy Optimization: ``Algorithm`` with ``PPOLearner`` (RLlib's ``PPO``).

    Example:
        >>> algo = PPOConfig().environment("CartPole-v1").build_algo()  # doctest: +SKIP
        >>> result = algo.train()  # doctest: +SKIP
        >>> result["env_runners"]["episode_return_mean"]  # doctest: +SKIP
    """

    @classmethod
    def get_default_config(cls) -> PPOConfig:
        """A fresh ``PPOConfig`` that builds this class."""
        return PPOConfig(algo_class=cls)
