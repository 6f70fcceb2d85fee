"""Secure noise (privacy/secure.py): OpenDP's samplers behind every mechanism. The distributions must be the ones
the accountants price, integer counts must get exact discrete noise, real values a grid, and OpenDP's own
privacy map must agree with ours."""

from __future__ import annotations

import math

import pytest
import torch

from privdistill.errors import PrivacyError
from privdistill.privacy import mechanisms as M
from privdistill.privacy.secure import GRID_EXPONENT, SecureNoise, privacy_map_check


def test_integer_counts_get_discrete_laplace_with_the_priced_variance():
    b = 5.0
    out = SecureNoise().add(torch.zeros(20000, dtype=torch.int64), distribution="laplace", scale=b)
    assert out.dtype == torch.int64
    q = math.exp(-1 / b)  # discrete Laplace: P(x) ∝ q^|x|, variance 2q/(1-q)^2
    expected = 2 * q / (1 - q) ** 2
    assert abs(float(out.double().mean())) < 0.15
    assert abs(float(out.double().var()) / expected - 1) < 0.06


def test_real_values_get_gaussian_noise_on_the_grid_and_a_float_tensor_is_never_treated_as_counts():
    sigma = 0.25
    values = torch.zeros(20000, dtype=torch.float32)  # whole numbers, but real-valued: grid noise, not integers
    out = SecureNoise().add(values, distribution="gaussian", scale=sigma)
    assert out.dtype == torch.float32 and out.shape == values.shape
    assert abs(float(out.double().std()) / sigma - 1) < 0.03
    assert bool((out.double() != out.double().round()).any()), "real-valued noise, not discrete counts"
    grid = out.double() * 2.0 ** -GRID_EXPONENT
    assert bool((grid == grid.round()).all()), "every output lies on the 2^k grid"


def test_opendp_privacy_map_agrees_with_the_accountants():
    # Laplace on counts: ε = Δ/b exactly; Gaussian: ρ = Δ²/(2σ²) (discrete on the integers; on the grid the
    # rounding adds at most sqrt(d)·2^k to the sensitivity, invisible at this precision)
    assert privacy_map_check("laplace", 40.0, 10, 2, integer=True) == pytest.approx(2 / 40, rel=1e-9)
    assert privacy_map_check("gaussian", 40.0, 10, 2, integer=True) == pytest.approx(4 / (2 * 1600), rel=1e-9)
    assert privacy_map_check("gaussian", 0.002, 2560, 0.001, integer=False) == pytest.approx(1e-6 / 8e-6, rel=1e-6)


def test_noisy_argmax_and_confident_gnmax_take_secure_noise():
    votes = torch.tensor([[0, 250, 0], [240, 5, 5], [3, 3, 244]])
    secure = M.noise_source(secure=True)
    assert M.lnmax(votes, scale=2.0, generator=secure).tolist() == [1, 0, 2]
    assert M.gnmax(votes.double(), sigma=2.0, generator=secure).tolist() == [1, 0, 2]
    labels, answered = M.confident_gnmax(votes, threshold=200, sigma1=1.0, sigma2=1.0, generator=secure)
    assert labels.tolist() == [1, 0, 2] and bool(answered.all())
    _, refused = M.confident_gnmax(votes, threshold=10_000, sigma1=1.0, sigma2=1.0, generator=secure)
    assert not bool(refused.any())


def test_randomized_response_on_sets_has_the_rr_distribution():
    eps, n = 1.0, 6000
    secure = SecureNoise()
    in_set = torch.zeros(n, 5, dtype=torch.bool)
    in_set[:, [1, 2, 3]] = True
    inside = M.rr_on_sets(in_set, torch.full((n,), 2), epsilon=eps, generator=secure)
    keep = math.exp(eps) / (math.exp(eps) + 2)
    assert abs(float((inside == 2).double().mean()) - keep) < 0.025
    assert set(inside.tolist()) == {1, 2, 3}
    outside = M.rr_on_sets(in_set, torch.zeros(n, dtype=torch.long), epsilon=eps, generator=secure)
    for c in (1, 2, 3):  # a label outside I: a uniform member of I
        assert abs(float((outside == c).double().mean()) - 1 / 3) < 0.025
    single = torch.zeros(4, 5, dtype=torch.bool)
    single[:, 4] = True
    assert M.rr_on_sets(single, torch.tensor([4, 0, 1, 4]), epsilon=eps, generator=secure).tolist() == [4, 4, 4, 4]
    plain = M.randomized_response(torch.full((n,), 0), num_classes=4, epsilon=eps, generator=secure)
    assert abs(float((plain == 0).double().mean()) - math.exp(eps) / (math.exp(eps) + 3)) < 0.025


def test_gradient_and_latent_mechanisms_take_secure_noise():
    grads = torch.randn(64, 10)
    noisy = M.normalize_and_noise(grads, clip_norm=1.0, sigma=0.5, generator=SecureNoise())
    assert noisy.shape == (64, 10) and noisy.dtype == grads.dtype
    rows = grads / (grads.norm(dim=1, keepdim=True) + 1e-4)  # C g/(||g|| + e), C = 1
    assert abs(float((noisy * 64 - rows).std()) - 0.5) < 0.05  # the noise: N(0, (σC)²) per coordinate
    codes = M.laplace_latent_perturbation(torch.zeros(500, 4), clip=1.0, epsilon1=80.0, generator=SecureNoise())
    assert abs(float(codes.abs().mean()) - 2 * 4 / 80) < 0.02  # Laplace scale 2c/ε1: mean |x| = scale


def test_bad_scales_are_refused():
    with pytest.raises(PrivacyError, match="scale"):
        SecureNoise().add(torch.zeros(3), distribution="gaussian", scale=0.0)
    with pytest.raises(PrivacyError, match="distribution"):
        SecureNoise().add(torch.zeros(3), distribution="cauchy", scale=1.0)
