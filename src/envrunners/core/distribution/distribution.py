"""``Distribution``: the interface of the action distributions modules parameterise.

A module outputs flat ``action_dist_inputs``; the runner and the learner turn them
into a distribution with ``from_logits`` to sample actions, score them (``logp``)
and regularise (``entropy``, ``kl``). The torch implementations are in
``envrunners.core.distribution.torch.torch_distribution``.
"""

from __future__ import annotations

import copyreg
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import torch

__all__ = ["Distribution"]


class _PartialDistMeta(type):
    """Metaclass of ``get_partial_dist_cls`` classes, so ``copyreg`` can pickle them.

    Its ``repr`` shows the bound arguments: partial classes nested in another's
    arguments (a ``TorchMultiDistribution``'s children) then key the class cache apart.
    """

    def __repr__(cls) -> str:
        return f"<partial {cls._partial_base.__qualname__} {cls._partial_kwargs!r}>"


def _rebuild_partial(base: type[Distribution], kwargs: dict[str, Any]) -> type[Distribution]:
    return base.get_partial_dist_cls(**kwargs)


copyreg.pickle(_PartialDistMeta, lambda c: (_rebuild_partial, (c._partial_base, c._partial_kwargs)))
_PARTIAL_CLASSES: dict[tuple[type, str], type] = {}


class Distribution:
    """Base of the action distributions: the methods every one of them offers.

    Subclasses are built from a module's flat outputs with :meth:`from_logits`; the
    runner samples from them and the learner scores and regularises with them.
    """

    _partial_kwargs: dict[str, Any] = {}

    @classmethod
    def from_logits(cls, logits: torch.Tensor, **kwargs: Any) -> Distribution:
        """Build the distribution from a module's ``action_dist_inputs``."""
        raise NotImplementedError

    @classmethod
    def get_partial_dist_cls(cls, **kwargs: Any) -> type[Distribution]:
        """Return a subclass whose ``from_logits`` always receives ``kwargs``.

        Lets a module hand out "a multi-categorical with these input lengths" as a
        class, the same way it hands out ``TorchCategorical``. Equal arguments give
        the same class, and the class pickles (by recipe) with plain ``pickle``.
        """
        base = getattr(cls, "_partial_base", cls)
        merged = {**cls._partial_kwargs, **kwargs}
        key = (base, repr(sorted(merged.items())))
        made = _PARTIAL_CLASSES.get(key)
        if made is None:
            namespace = {"_partial_kwargs": merged, "_partial_base": base}
            namespace["__module__"] = base.__module__
            made = _PartialDistMeta(base.__name__, (base,), namespace)
            _PARTIAL_CLASSES[key] = made
        return made

    @staticmethod
    def required_input_dim(space: gym.Space, **kwargs: Any) -> int:
        """Width of ``action_dist_inputs`` a module must output for ``space``."""
        raise NotImplementedError

    def sample(
        self, *, sample_shape: Sequence[int] = (), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Draw actions (no gradient)."""
        raise NotImplementedError

    def rsample(
        self, *, sample_shape: Sequence[int] = (), generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Draw actions through the reparameterisation trick (differentiable)."""
        raise NotImplementedError(
            f"{type(self).__name__} has no reparameterised sample; use sample()."
        )

    def logp(self, value: torch.Tensor) -> torch.Tensor:
        """Log-probability (density) of ``value`` per batch row."""
        raise NotImplementedError

    def entropy(self) -> torch.Tensor:
        """Entropy per batch row."""
        raise NotImplementedError

    def kl(self, other: Distribution) -> torch.Tensor:
        """KL divergence ``KL(self || other)`` per batch row."""
        raise NotImplementedError

    def to_deterministic(self) -> Distribution:
        """The greedy counterpart (mode) used when ``explore=False``."""
        raise NotImplementedError
