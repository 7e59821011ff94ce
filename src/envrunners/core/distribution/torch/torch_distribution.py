"""The torch action distributions: categorical, multi-categorical, Gaussian, nested, point mass.

They are written with plain tensor math rather than ``torch.distributions`` because
argument validation and broadcasting there cost more than the math itself on the
small batches a runner sees each step.

Randomness comes from torch's RNG (the global one, or the ``generator`` passed to
``sample``), so ``torch.manual_seed`` makes sampling reproducible. Categorical
sampling uses the Gumbel-max trick: ``argmax(logits - log(E))`` with ``E ~ Exp(1)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from envrunners.core import _nested
from envrunners.core.distribution.distribution import Distribution

__all__ = [
    "TorchCategorical",
    "TorchDeterministic",
    "TorchDiagGaussian",
    "TorchMultiCategorical",
    "TorchMultiDistribution",
]

_LOG_2PI = math.log(2.0 * math.pi)
_TINY = float(np.finfo(np.float32).tiny)


def _gumbel_argmax(
    logits: torch.Tensor, sample_shape: Sequence[int], generator: torch.Generator | None
) -> torch.Tensor:
    """Sample category indices from unnormalised ``logits`` with the Gumbel-max trick."""
    shape = tuple(sample_shape) + tuple(logits.shape)
    noise = torch.empty(shape, dtype=logits.dtype, device=logits.device)
    noise.exponential_(generator=generator).clamp_(min=_TINY)
    return (logits - noise.log_()).argmax(dim=-1)


def _xlogy_sum(p: torch.Tensor, log_term: torch.Tensor) -> torch.Tensor:
    """``sum(p * log_term)`` over the last dim, counting ``0 * -inf`` (masked actions) as 0."""
    return torch.where(p > 0, p * log_term, torch.zeros_like(p)).sum(dim=-1)


class TorchDeterministic(Distribution):
    """A point mass at ``loc``: what ``to_deterministic()`` returns for greedy acting.

    ``logp`` is 0 (the action has probability one under the greedy policy) and the
    entropy is 0, so columns keep their shapes when exploration is off.
    """

    def __init__(self, loc: torch.Tensor, *, event_ndims: int = 1):
        self.loc = loc
        self.event_ndims = event_ndims

    @classmethod
    def from_logits(cls, logits: torch.Tensor, **kwargs: Any) -> TorchDeterministic:
        """Treat the module's outputs themselves as the action."""
        return cls(logits, **{**cls._partial_kwargs, **kwargs})

    @staticmethod
    def required_input_dim(space: gym.Space, **kwargs: Any) -> int:
        """One input per action element."""
        return int(np.prod(space.shape)) if space.shape else 1

    def _batch_shape(self) -> tuple[int, ...]:
        return tuple(self.loc.shape[: self.loc.dim() - self.event_ndims])

    def sample(
        self, *, sample_shape: Sequence[int] = (), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Return ``loc`` (repeated over ``sample_shape``)."""
        loc = self.loc.detach()
        return loc.expand(tuple(sample_shape) + tuple(loc.shape)) if sample_shape else loc

    def rsample(
        self, *, sample_shape: Sequence[int] = (), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Return ``loc`` with its gradient."""
        loc = self.loc
        return loc.expand(tuple(sample_shape) + tuple(loc.shape)) if sample_shape else loc

    def logp(self, value: torch.Tensor) -> torch.Tensor:
        """Zeros: the greedy action has probability one."""
        shape = tuple(value.shape[: value.dim() - self.event_ndims])
        return torch.zeros(shape, dtype=torch.float32, device=self.loc.device)

    def entropy(self) -> torch.Tensor:
        """Zeros: a point mass has no entropy."""
        return torch.zeros(self._batch_shape(), dtype=torch.float32, device=self.loc.device)

    def kl(self, other: Distribution) -> torch.Tensor:
        """Undefined for point masses."""
        raise NotImplementedError("KL divergence is not defined for a deterministic distribution.")

    def to_deterministic(self) -> TorchDeterministic:
        """Already deterministic."""
        return self


class TorchCategorical(Distribution):
    """A categorical distribution over ``n`` actions given by (unnormalised) logits."""

    def __init__(self, probs: torch.Tensor | None = None, logits: torch.Tensor | None = None):
        if (probs is None) == (logits is None):
            raise ValueError("TorchCategorical needs exactly one of `probs` or `logits`.")
        if logits is None:
            logits = torch.log(probs)  # type: ignore[arg-type]
        self.logits = logits
        self._log_probs: torch.Tensor | None = None

    @classmethod
    def from_logits(cls, logits: torch.Tensor, **kwargs: Any) -> TorchCategorical:
        """Build from ``(..., n)`` logits."""
        return cls(logits=logits)

    @staticmethod
    def required_input_dim(space: gym.Space, **kwargs: Any) -> int:
        """``n`` logits for ``Discrete(n)``."""
        return int(space.n)  # type: ignore[attr-defined]

    @property
    def log_probs(self) -> torch.Tensor:
        """Normalised log-probabilities (``log_softmax`` of the logits), computed once."""
        if self._log_probs is None:
            self._log_probs = torch.log_softmax(self.logits, dim=-1)
        return self._log_probs

    @property
    def probs(self) -> torch.Tensor:
        """Probabilities (softmax of the logits)."""
        return self.log_probs.exp()

    def sample(
        self, *, sample_shape: Sequence[int] = (), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Draw int64 indices by Gumbel-max from torch's RNG (or ``generator``)."""
        with torch.no_grad():
            return _gumbel_argmax(self.logits.detach(), sample_shape, generator)

    def logp(self, value: torch.Tensor) -> torch.Tensor:
        """``log_softmax(logits)[value]``; ``value`` may carry leading sample dims."""
        log_probs = self.log_probs
        index = value.long().unsqueeze(-1)
        if index.shape[:-1] != log_probs.shape[:-1]:
            log_probs = log_probs.expand(tuple(index.shape[:-1]) + (log_probs.shape[-1],))
        return log_probs.gather(-1, index).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        """``-sum(p log p)``; masked (``-inf``) logits contribute 0."""
        log_probs = self.log_probs
        return -_xlogy_sum(log_probs.exp(), log_probs)

    def kl(self, other: Distribution) -> torch.Tensor:
        """``sum(p (log p - log q))`` against another categorical over the same actions."""
        if not isinstance(other, TorchCategorical):
            raise TypeError(f"kl: expected a TorchCategorical, got {type(other).__name__}.")
        log_p = self.log_probs
        return _xlogy_sum(log_p.exp(), log_p - other.log_probs)

    def to_deterministic(self) -> TorchDeterministic:
        """The most likely action."""
        return TorchDeterministic(self.logits.argmax(dim=-1), event_ndims=0)


class TorchMultiCategorical(Distribution):
    """Independent categoricals, one per ``MultiDiscrete`` component; actions stack on the last dim."""

    def __init__(self, categoricals: Sequence[TorchCategorical]):
        if not categoricals:
            raise ValueError("TorchMultiCategorical needs at least one categorical.")
        self.cats = list(categoricals)

    @classmethod
    def from_logits(
        cls, logits: torch.Tensor, input_lens: Sequence[int] | None = None, **kwargs: Any
    ) -> TorchMultiCategorical:
        """Split ``(..., sum(input_lens))`` logits into one categorical per component.

        Args:
            logits: The module's action distribution inputs.
            input_lens: Number of categories per component (``space.nvec``); bind it
                once with ``get_partial_dist_cls(input_lens=...)``.
        """
        if input_lens is None:
            input_lens = cls._partial_kwargs.get("input_lens")
        if input_lens is None:
            raise ValueError(
                "TorchMultiCategorical.from_logits needs `input_lens` (the space's nvec); "
                "use TorchMultiCategorical.get_partial_dist_cls(input_lens=...)."
            )
        lens = [int(n) for n in input_lens]
        if sum(lens) != logits.shape[-1]:
            raise ValueError(
                f"TorchMultiCategorical: logits have {logits.shape[-1]} entries on the last dim "
                f"but input_lens {lens} sum to {sum(lens)}."
            )
        return cls([TorchCategorical(logits=chunk) for chunk in torch.split(logits, lens, dim=-1)])

    @staticmethod
    def required_input_dim(space: gym.Space, **kwargs: Any) -> int:
        """``sum(nvec)`` logits for ``MultiDiscrete(nvec)``."""
        return int(np.sum(space.nvec))  # type: ignore[attr-defined]

    def sample(
        self, *, sample_shape: Sequence[int] = (), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Draw one index per component; returns ``(..., num_components)`` int64."""
        parts = [c.sample(sample_shape=sample_shape, generator=generator) for c in self.cats]
        return torch.stack(parts, dim=-1)

    def logp(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of the components' log-probabilities."""
        return sum(c.logp(value[..., i]) for i, c in enumerate(self.cats))  # type: ignore[return-value]

    def entropy(self) -> torch.Tensor:
        """Sum of the components' entropies."""
        return sum(c.entropy() for c in self.cats)  # type: ignore[return-value]

    def kl(self, other: Distribution) -> torch.Tensor:
        """Sum of the components' KL divergences."""
        if not isinstance(other, TorchMultiCategorical) or len(other.cats) != len(self.cats):
            raise TypeError("kl: expected a TorchMultiCategorical with the same components.")
        return sum(c.kl(o) for c, o in zip(self.cats, other.cats))  # type: ignore[return-value]

    def to_deterministic(self) -> TorchDeterministic:
        """The most likely index of every component."""
        return TorchDeterministic(torch.stack([c.logits.argmax(-1) for c in self.cats], dim=-1))


class TorchDiagGaussian(Distribution):
    """A Gaussian with diagonal covariance over a flat ``Box`` action.

    ``from_logits`` reads the first half of the inputs as the mean and the second
    half as the log standard deviation.
    """

    def __init__(
        self, loc: torch.Tensor, scale: torch.Tensor, *, log_std: torch.Tensor | None = None
    ):
        self.loc = loc
        self.scale = scale
        self.log_std = torch.log(scale) if log_std is None else log_std

    @classmethod
    def from_logits(cls, logits: torch.Tensor, **kwargs: Any) -> TorchDiagGaussian:
        """Split ``(..., 2k)`` inputs into mean and log-std of a k-dim Gaussian."""
        if logits.shape[-1] % 2:
            raise ValueError(
                f"TorchDiagGaussian.from_logits needs an even last dim (mean, log_std), "
                f"got {logits.shape[-1]}."
            )
        loc, log_std = logits.chunk(2, dim=-1)
        return cls(loc, log_std.exp(), log_std=log_std)

    @staticmethod
    def required_input_dim(space: gym.Space, **kwargs: Any) -> int:
        """``2 * k`` inputs (mean and log-std) for a k-dim ``Box``."""
        return 2 * int(np.prod(space.shape))

    def _draw(self, sample_shape: Sequence[int], generator: torch.Generator | None) -> torch.Tensor:
        shape = tuple(sample_shape) + tuple(self.loc.shape)
        return torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device, generator=generator)

    def sample(
        self, *, sample_shape: Sequence[int] = (), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """``loc + scale * N(0, 1)`` without gradient."""
        with torch.no_grad():
            return self.loc + self.scale * self._draw(sample_shape, generator)

    def rsample(
        self, *, sample_shape: Sequence[int] = (), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """``loc + scale * N(0, 1)`` with gradient through ``loc`` and ``scale``."""
        return self.loc + self.scale * self._draw(sample_shape, generator)

    def logp(self, value: torch.Tensor) -> torch.Tensor:
        """Log-density summed over the action dims."""
        z = (value - self.loc) / self.scale
        return -0.5 * (z * z).sum(-1) - self.log_std.sum(-1) - 0.5 * self.loc.shape[-1] * _LOG_2PI

    def entropy(self) -> torch.Tensor:
        """``sum(log_std) + k/2 * (1 + log 2pi)``."""
        return self.log_std.sum(-1) + 0.5 * self.loc.shape[-1] * (1.0 + _LOG_2PI)

    def kl(self, other: Distribution) -> torch.Tensor:
        """Closed-form KL between two diagonal Gaussians."""
        if not isinstance(other, TorchDiagGaussian):
            raise TypeError(f"kl: expected a TorchDiagGaussian, got {type(other).__name__}.")
        var_ratio_num = self.scale.pow(2) + (self.loc - other.loc).pow(2)
        terms = other.log_std - self.log_std + var_ratio_num / (2.0 * other.scale.pow(2)) - 0.5
        return terms.sum(-1)

    def to_deterministic(self) -> TorchDeterministic:
        """The mean."""
        return TorchDeterministic(self.loc)


class TorchMultiDistribution(Distribution):
    """Independent child distributions in a nested structure: ``Tuple`` / ``Dict`` actions.

    Samples, like the action space, are nested (tuples and dicts of tensors);
    ``logp``, ``entropy`` and ``kl`` are the sums over the children.
    """

    def __init__(self, child_distribution_struct: Any):
        self._original_struct = child_distribution_struct
        self._flat_child_distributions = _nested.flatten(child_distribution_struct)
        if not self._flat_child_distributions:
            raise ValueError("TorchMultiDistribution needs at least one child distribution.")

    @classmethod
    def from_logits(
        cls,
        logits: torch.Tensor,
        child_distribution_cls_struct: Any = None,
        input_lens: Any = None,
        **kwargs: Any,
    ) -> TorchMultiDistribution:
        """Split ``(..., sum(input_lens))`` inputs into one child per leaf of the structure.

        Args:
            logits: The module's action distribution inputs.
            child_distribution_cls_struct: Nested (dict / tuple) distribution classes,
                one per action leaf; bind it with ``get_partial_dist_cls``.
            input_lens: Nested (same structure) or flat list of each child's input width.
        """
        kwargs = {**cls._partial_kwargs, **kwargs}
        struct = child_distribution_cls_struct or kwargs.get("child_distribution_cls_struct")
        lens = input_lens if input_lens is not None else kwargs.get("input_lens")
        if struct is None or lens is None:
            raise ValueError(
                "TorchMultiDistribution.from_logits needs `child_distribution_cls_struct` and "
                "`input_lens`; bind them with TorchMultiDistribution.get_partial_dist_cls(...)."
            )
        flat_lens = [int(n) for n in _nested.flatten(lens)]
        if sum(flat_lens) != logits.shape[-1]:
            raise ValueError(
                f"TorchMultiDistribution: logits have {logits.shape[-1]} entries on the last "
                f"dim but input_lens {flat_lens} sum to {sum(flat_lens)}."
            )
        chunks = torch.split(logits, flat_lens, dim=-1)
        children = [c.from_logits(x) for c, x in zip(_nested.flatten(struct), chunks)]
        return cls(_nested.unflatten_as(struct, children))

    @staticmethod
    def required_input_dim(space: gym.Space, input_lens: Any = None, **kwargs: Any) -> int:
        """The sum of the children's input widths."""
        if input_lens is None:
            raise ValueError("TorchMultiDistribution.required_input_dim needs `input_lens`.")
        return int(sum(_nested.flatten(input_lens)))

    def _children(self) -> Any:
        return _nested.unflatten_as(self._original_struct, self._flat_child_distributions)

    def sample(
        self, *, sample_shape: Sequence[int] = (), generator: torch.Generator | None = None
    ) -> Any:
        """One sample per child, nested like the action space."""
        return _nested.map_structure(
            lambda d: d.sample(sample_shape=sample_shape, generator=generator), self._children()
        )

    def rsample(
        self, *, sample_shape: Sequence[int] = (), generator: torch.Generator | None = None
    ) -> Any:
        """Reparameterised samples of every child (each child must support it)."""
        return _nested.map_structure(
            lambda d: d.rsample(sample_shape=sample_shape, generator=generator), self._children()
        )

    def logp(self, value: Any) -> torch.Tensor:
        """Sum of the children's log-probabilities of the matching parts of ``value``."""
        parts = _nested.flatten(value)
        if len(parts) != len(self._flat_child_distributions):
            raise ValueError(
                f"TorchMultiDistribution.logp: value has {len(parts)} leaves, the "
                f"distribution {len(self._flat_child_distributions)} children."
            )
        return sum(d.logp(v) for d, v in zip(self._flat_child_distributions, parts))  # type: ignore[return-value]

    def entropy(self) -> torch.Tensor:
        """Sum of the children's entropies."""
        return sum(d.entropy() for d in self._flat_child_distributions)  # type: ignore[return-value]

    def kl(self, other: Distribution) -> torch.Tensor:
        """Sum of the children's KL divergences against ``other``'s matching children."""
        if not isinstance(other, TorchMultiDistribution) or len(
            other._flat_child_distributions
        ) != len(self._flat_child_distributions):
            raise TypeError("kl: expected a TorchMultiDistribution with the same children.")
        pairs = zip(self._flat_child_distributions, other._flat_child_distributions)
        return sum(d.kl(o) for d, o in pairs)  # type: ignore[return-value]

    def to_deterministic(self) -> TorchMultiDistribution:
        """Each child's greedy counterpart, in the same structure."""
        return TorchMultiDistribution(
            _nested.map_structure(lambda d: d.to_deterministic(), self._children())
        )
