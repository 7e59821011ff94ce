"""Action distributions: math against torch.distributions, sampling frequencies, determinism."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import distributions as td

from envrunners.core.distributions import (
    TorchCategorical,
    TorchDeterministic,
    TorchDiagGaussian,
    TorchMultiCategorical,
)


@pytest.fixture
def logits() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(6, 4)


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# ---------------------------------------------------------------------------- categorical
def test_categorical_logp_entropy_kl_match_torch(logits):
    dist = TorchCategorical.from_logits(logits)
    ref = td.Categorical(logits=logits)
    actions = torch.tensor([0, 1, 2, 3, 0, 1])
    torch.testing.assert_close(dist.logp(actions), ref.log_prob(actions))
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    other = TorchCategorical.from_logits(logits.flip(-1))
    ref_other = td.Categorical(logits=logits.flip(-1))
    torch.testing.assert_close(dist.kl(other), td.kl_divergence(ref, ref_other))
    torch.testing.assert_close(dist.probs, ref.probs)


def test_categorical_logp_by_hand():
    dist = TorchCategorical(probs=torch.tensor([[0.2, 0.8]]))
    assert dist.logp(torch.tensor([1])).item() == pytest.approx(np.log(0.8), abs=1e-6)


def test_categorical_gumbel_sampling_matches_softmax():
    torch.manual_seed(123)
    row = torch.tensor([1.0, 0.0, -1.0, 2.0])
    dist = TorchCategorical.from_logits(row.expand(50_000, 4))
    samples = dist.sample()
    assert samples.dtype == torch.int64 and samples.shape == (50_000,)
    counts = np.bincount(samples.numpy(), minlength=4)
    probs = torch.softmax(row, -1).numpy()
    # 3 degrees of freedom: P(chi2 > 16.3) ~ 0.001.
    assert _chi_square(counts, probs) < 16.3


def test_categorical_sample_shape_and_logp_broadcast(logits):
    dist = TorchCategorical.from_logits(logits)
    samples = dist.sample(sample_shape=(3,))
    assert samples.shape == (3, 6)
    assert dist.logp(samples).shape == (3, 6)


def test_categorical_masked_logits_never_sampled_and_entropy_finite():
    torch.manual_seed(0)
    masked = torch.tensor([[0.0, float("-inf"), 0.0]]).expand(10_000, 3)
    dist = TorchCategorical.from_logits(masked)
    assert not (dist.sample() == 1).any()
    assert torch.isfinite(dist.entropy()).all()
    torch.testing.assert_close(dist.entropy()[0], torch.tensor(np.log(2.0), dtype=torch.float32))


def test_categorical_deterministic_is_argmax_with_zero_logp(logits):
    det = TorchCategorical.from_logits(logits).to_deterministic()
    assert isinstance(det, TorchDeterministic)
    actions = det.sample()
    assert torch.equal(actions, logits.argmax(-1))
    assert torch.equal(det.logp(actions), torch.zeros(6))
    assert torch.equal(det.entropy(), torch.zeros(6))


def test_categorical_rsample_is_refused(logits):
    with pytest.raises(NotImplementedError, match="no reparameterised sample"):
        TorchCategorical.from_logits(logits).rsample()


def test_categorical_needs_exactly_one_parameterisation():
    with pytest.raises(ValueError, match="exactly one"):
        TorchCategorical()


def test_sampling_is_reproducible_with_seed_and_generator(logits):
    dist = TorchCategorical.from_logits(logits.repeat(100, 1))
    torch.manual_seed(7)
    first = dist.sample()
    torch.manual_seed(7)
    assert torch.equal(first, dist.sample())
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(dist.sample(generator=g1), dist.sample(generator=g2))


# ---------------------------------------------------------------------------- multi-categorical
def test_multi_categorical_matches_independent_categoricals():
    torch.manual_seed(1)
    logits = torch.randn(5, 2 + 3)
    dist = TorchMultiCategorical.from_logits(logits, input_lens=[2, 3])
    actions = dist.sample()
    assert actions.shape == (5, 2) and actions.dtype == torch.int64
    ref_a = td.Categorical(logits=logits[:, :2])
    ref_b = td.Categorical(logits=logits[:, 2:])
    expected = ref_a.log_prob(actions[:, 0]) + ref_b.log_prob(actions[:, 1])
    torch.testing.assert_close(dist.logp(actions), expected)
    torch.testing.assert_close(dist.entropy(), ref_a.entropy() + ref_b.entropy())
    other = TorchMultiCategorical.from_logits(torch.zeros(5, 5), input_lens=[2, 3])
    assert dist.kl(other).shape == (5,) and (dist.kl(other) >= 0).all()
    det = dist.to_deterministic().sample()
    assert torch.equal(det, torch.stack([logits[:, :2].argmax(-1), logits[:, 2:].argmax(-1)], -1))


def test_multi_categorical_partial_class_and_input_dim():
    space = gym.spaces.MultiDiscrete([2, 3])
    assert TorchMultiCategorical.required_input_dim(space) == 5
    cls = TorchMultiCategorical.get_partial_dist_cls(input_lens=[2, 3])
    assert issubclass(cls, TorchMultiCategorical)
    assert cls.from_logits(torch.zeros(4, 5)).sample().shape == (4, 2)
    assert TorchMultiCategorical.get_partial_dist_cls(input_lens=[2, 3]) is cls
    assert pickle.loads(pickle.dumps(cls)) is cls
    with pytest.raises(ValueError, match="input_lens"):
        TorchMultiCategorical.from_logits(torch.zeros(4, 5))
    with pytest.raises(ValueError, match="sum to 4"):
        TorchMultiCategorical.from_logits(torch.zeros(4, 5), input_lens=[2, 2])


# ---------------------------------------------------------------------------- gaussian
def test_gaussian_logp_entropy_kl_match_torch():
    torch.manual_seed(2)
    mean, log_std = torch.randn(7, 3), torch.randn(7, 3) * 0.3
    dist = TorchDiagGaussian.from_logits(torch.cat([mean, log_std], -1))
    ref = td.Independent(td.Normal(mean, log_std.exp()), 1)
    value = torch.randn(7, 3)
    torch.testing.assert_close(dist.logp(value), ref.log_prob(value))
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    other_mean, other_log_std = torch.randn(7, 3), torch.randn(7, 3) * 0.3
    other = TorchDiagGaussian(other_mean, other_log_std.exp())
    ref_other = td.Independent(td.Normal(other_mean, other_log_std.exp()), 1)
    torch.testing.assert_close(dist.kl(other), td.kl_divergence(ref, ref_other))


def test_gaussian_sampling_statistics_and_gradients():
    torch.manual_seed(3)
    inputs = torch.tensor([[1.0, -2.0, np.log(0.5), np.log(2.0)]]).expand(40_000, 4)
    dist = TorchDiagGaussian.from_logits(inputs)
    samples = dist.sample()
    assert samples.shape == (40_000, 2) and not samples.requires_grad
    np.testing.assert_allclose(samples.mean(0).numpy(), [1.0, -2.0], atol=0.03)
    np.testing.assert_allclose(samples.std(0).numpy(), [0.5, 2.0], rtol=0.03)
    leaf = torch.zeros(1, 4, requires_grad=True)
    TorchDiagGaussian.from_logits(leaf).rsample().sum().backward()
    assert leaf.grad is not None and leaf.grad[0, 0] == 1.0


def test_gaussian_deterministic_is_mean_and_input_dim():
    dist = TorchDiagGaussian.from_logits(torch.tensor([[0.5, -0.5, 0.0, 0.0]]))
    det = dist.to_deterministic()
    assert torch.equal(det.sample(), torch.tensor([[0.5, -0.5]]))
    assert det.logp(det.sample()).shape == (1,)
    assert TorchDiagGaussian.required_input_dim(gym.spaces.Box(-1, 1, (3,))) == 6
    with pytest.raises(ValueError, match="even last dim"):
        TorchDiagGaussian.from_logits(torch.zeros(1, 3))


def test_kl_rejects_other_families(logits):
    with pytest.raises(TypeError, match="TorchCategorical"):
        TorchCategorical.from_logits(logits).kl(TorchDiagGaussian.from_logits(torch.zeros(6, 4)))
