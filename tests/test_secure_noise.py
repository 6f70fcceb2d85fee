"""Secure noise (privacy/secure.py): ChaCha20 from OS entropy and vectorised CKS20 samplers behind every mechanism.
The distributions must be the ones the accountants price (checked by χ² against the exact pmf and against OpenDP's
exact samplers, the reference), integer counts must get discrete noise, real values a grid whose reachable set does
not depend on the value, and OpenDP's own privacy map must agree with ours."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from privdistill.errors import PrivacyError
from privdistill.privacy import mechanisms as M
from privdistill.privacy import secure as S
from privdistill.privacy.secure import TALLY, SecureNoise, grid_step, opendp_integers

scipy_stats = pytest.importorskip("scipy.stats")


def privacy_map_check(distribution: str, scale: float, size: int, sensitivity: float) -> float:
    """OpenDP's own privacy figure for its discrete mechanism on integers at `sensitivity` (L1 for Laplace: ε; L2
    for Gaussian: zCDP ρ), to compare with Δ/b and Δ²/(2σ²), the figures the accountants use."""
    return float(S._opendp_measurement(distribution, scale, size).map(int(sensitivity)))


def draw_bounds(distribution: str, scale: float) -> tuple[float, float]:
    """(rho, tail) of one draw of the integer sampler at this scale (privacy/secure.py's module docstring)."""
    draw = S.sampler(distribution, scale)
    return draw.rho, draw.tail


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
    step = grid_step(sigma)
    assert bool(((out.double() / step).round() * step).float().eq(out).all()), "every output lies on the grid"


def test_opendp_privacy_map_agrees_with_the_accountants():
    # Laplace on counts: ε = Δ/b exactly; Gaussian: ρ = Δ²/(2σ²) (discrete on the integers; on the grid the
    # rounding adds at most sqrt(d)·2^k to the sensitivity, invisible at this precision)
    assert privacy_map_check("laplace", 40.0, 10, 2) == pytest.approx(2 / 40, rel=1e-9)
    assert privacy_map_check("gaussian", 40.0, 10, 2) == pytest.approx(4 / (2 * 1600), rel=1e-9)


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


def _exact_pmf(distribution: str, scale: float, support: np.ndarray) -> np.ndarray:
    logw = -np.abs(support) / scale if distribution == "laplace" else -(support ** 2) / (2 * scale * scale)
    w = np.exp(logw - logw.max())
    return w / w.sum()


@pytest.mark.parametrize("distribution,scale", [("gaussian", 0.6), ("gaussian", 3.0), ("gaussian", 40.0),
                                                ("laplace", 0.5), ("laplace", 7.3), ("laplace", 40.0)])
def test_integer_samplers_follow_the_exact_law(distribution, scale):
    """χ² of 200,000 draws against the exact discrete pmf (support truncated far in the tails), and the same test
    passed by OpenDP's exact sampler, the reference: the samplers draw the law the accountants price."""
    n = 200_000
    draws = SecureNoise().integers(n, distribution=distribution, scale=scale)
    reference = opendp_integers(4_000, distribution=distribution, scale=scale)
    half = int((25 if distribution == "laplace" else 8) * scale) + 3
    support = np.arange(-half, half + 1)
    pmf = _exact_pmf(distribution, scale, support)
    for sample in (draws, reference):
        assert np.abs(sample).max() <= half
        counts = np.bincount(sample + half, minlength=support.size)
        expected = pmf * sample.size
        # the thin tails (expected < 5) pooled into the outermost cells on their side: pooled into a cell of their
        # own, whose expectation is far below 1 for the reference's 4,000 draws, one tail draw (about one run in 50
        # at scale 0.6) made the χ² explode
        big = np.flatnonzero(expected >= 5)
        lo, hi = big[0], big[-1]
        observed, wanted = counts[lo:hi + 1].astype(float), expected[lo:hi + 1].copy()
        observed[[0, -1]] += [counts[:lo].sum(), counts[hi + 1:].sum()]
        wanted[[0, -1]] += [expected[:lo].sum(), expected[hi + 1:].sum()]
        _, p = scipy_stats.chisquare(observed, wanted * observed.sum() / wanted.sum())
        assert p > 1e-4, f"{distribution}({scale}): χ² p = {p:.2e} ({'ours' if sample is draws else 'OpenDP'})"
    variance = float((pmf * support ** 2).sum())
    assert abs(draws.var() / variance - 1) < 0.02


def test_grid_outputs_do_not_depend_on_the_value_and_the_scale_sets_the_grid():
    """The floating-point attack needs outputs whose set depends on x: here every output is a multiple of the
    scale's grid step (a power of two), for any x, and the noise has the priced variance on that grid."""
    noise = SecureNoise()
    step = grid_step(0.37)
    assert step == 0.37 * 2.0 ** -S.GRID_BITS
    for x in (0.0, 1e-3, math.pi, -123.456789):
        out = noise.add(torch.full((5000,), x, dtype=torch.float64), distribution="laplace", scale=0.37)
        points = (out / step).round() * step  # the grid's points, as float64 writes them
        assert bool((points == out).all())
        assert abs(float((out - x).abs().mean()) / 0.37 - 1) < 0.06  # Laplace: E|noise| = b
    with pytest.raises(PrivacyError, match="too large"):
        noise.add(torch.tensor([1e30]), distribution="gaussian", scale=1.0)


def test_the_tally_sums_each_draws_bounds_and_they_are_small():
    TALLY.reset()
    SecureNoise().add(torch.zeros(1000, dtype=torch.int64), distribution="gaussian", scale=40.0)
    SecureNoise().add(torch.zeros(500), distribution="laplace", scale=1.0)
    assert TALLY.draws == 1500
    g, lap = draw_bounds("gaussian", 40.0), draw_bounds("laplace", 1.0 / grid_step(1.0))
    assert TALLY.rho == pytest.approx(1000 * g[0] + 500 * lap[0])
    assert TALLY.tail == pytest.approx(1000 * g[1] + 500 * lap[1])
    for distribution in ("gaussian", "laplace"):
        for scale in (0.3, 1.0, 40.0, 1.3 / grid_step(1.3)):
            rho, tail = draw_bounds(distribution, scale)
            assert 0 < rho < 1e-12 and 0 <= tail < 1e-25, (distribution, scale, rho, tail)


def test_exp_is_as_accurate_as_the_bounds_assume():
    """The bounds take exp (numba's, libm's) to be within EXP_ULPS ulps; check it against mpmath on the range the
    samplers use."""
    import mpmath
    import numba

    @numba.njit
    def exps(xs):
        out = np.empty_like(xs)
        for i in range(xs.size):
            out[i] = math.exp(xs[i])
        return out

    xs = -np.random.default_rng(0).uniform(0, 80, 2000)
    got = exps(xs)
    with mpmath.workprec(120):
        exact = [mpmath.exp(mpmath.mpf(float(x))) for x in xs]
        worst = max(abs(float((mpmath.mpf(float(g)) - e) / e)) for g, e in zip(got, exact))
    assert worst <= S.EXP_ULPS * S.ULP


def test_a_uniform_of_unbounded_precision_is_below_p_with_probability_p():
    """The Bernoulli trial reads more words only on ties: force ties to check the exact comparison."""
    p = 0.5 + 2.0 ** -40  # bits past the first word
    words = np.array([1 << 31, 0, 0], dtype=np.uint32)  # u = 0.5 exactly so far: a tie on the first word
    assert S._below(words, 0, p) == (True, 2)  # u = 0.5 + 0 < p: the second word decides
    words = np.array([1 << 31, 1 << 24, 0], dtype=np.uint32)  # u = 0.5 + 2^-40 + ...: ties twice, so u >= p
    assert S._below(words, 0, p) == (False, 2)
    words = np.array([1 << 31, (1 << 24) - 1, 0], dtype=np.uint32)  # just below p on the second word
    assert S._below(words, 0, p) == (True, 2)
    assert S._below(np.array([5], dtype=np.uint32), 0, 0.0) == (False, 1)


def test_the_stream_is_fresh_every_call():
    stream = S.SecureStream()
    a, b = stream.words(4), stream.words(4)
    assert not np.array_equal(a, b)


def test_a_seed_makes_noise_reproducible_unless_every_secure_flag_is_set():
    """methods/common.apply_noise_policy: --seed alone makes the privacy noise reproducible (and warns); a run
    whose secure flags are all set (a nested end-to-end DP source: its parent's seed and flag) is secure."""
    import warnings as w

    from privdistill.config import RunOptions
    from privdistill.methods.common import ReproducibleNoiseWarning, apply_noise_policy
    from privdistill.methods.dpsgd import DPSGDConfig

    def policy(secure_mode, chosen):
        resolved = {"run": RunOptions(), "dpsgd": DPSGDConfig(secure_mode=secure_mode)}
        with w.catch_warnings(record=True) as seen:
            w.simplefilter("always")
            secure = apply_noise_policy(resolved, chosen)
        return secure, resolved["dpsgd"].secure_mode, any(s.category is ReproducibleNoiseWarning for s in seen)

    assert policy(None, set()) == (True, True, False)
    assert policy(None, {"run.seed"}) == (False, False, True)
    assert policy(True, {"run.seed", "dpsgd.secure_mode"}) == (True, True, False)
    assert policy(False, {"dpsgd.secure_mode"}) == (False, False, True)
