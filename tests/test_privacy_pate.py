"""PATE data-dependent bounds (Papernot et al. 2017, 2018): checks from the original analysis code's unit
test, exact two-class Renyi divergences, and the accountant's use of recorded votes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import log_ndtr, logsumexp
from scipy.stats import norm

from privdistill.errors import PrivacyError
from privdistill.privacy import accounting as acc
from privdistill.privacy import pate
from privdistill.privacy.events import ConfidentGaussianQueries, GaussianQueries, LaplaceQueries

# (sigma, order, -log q0): from the unit test of the PATE 2018 analysis code (tensorflow/privacy,
# research/pate_2018/core_test.py, "hand calculated -log(q0)s"): at q0 + 0.1 ... 0.4 the bound equals
# the data-independent value; halving q below q0 lowers it strictly. (sigma=1.5, order=250 has no q0.)
Q0_TABLE = [
    (1.5, 1.1, 2.8), (1.5, 2.5, 2.6), (1.5, 32, 427),
    (15, 1.1, 4.8), (15, 2.5, 4.0), (15, 32, 4.7), (15, 250, 275),
    (1500, 1.1, 9.6), (1500, 2.5, 8.8), (1500, 32, 6.0), (1500, 250, 4),
    (15000, 1.1, 12), (15000, 2.5, 11.2), (15000, 32, 8.6), (15000, 250, 6.4),
]


@pytest.mark.parametrize("sigma,order,neglogq0", Q0_TABLE)
def test_gnmax_bound_regions_match_original_code(sigma, order, neglogq0):
    at_q0 = pate.rdp_gnmax_data_dependent([-neglogq0], sigma, [order])[0, 0]
    assert at_q0 == pytest.approx(order / sigma**2)
    halved = pate.rdp_gnmax_data_dependent(-neglogq0 - np.log([1, 2, 4, 8]), sigma, [order])[:, 0]
    assert np.all(np.diff(halved) < 0)
    above = np.log(math.exp(-neglogq0) + np.array([0.1, 0.2, 0.3, 0.4]))
    assert np.all(pate.rdp_gnmax_data_dependent(above, sigma, [order])[:, 0] == at_q0)


def _renyi(logp: np.ndarray, logq: np.ndarray, lam: float) -> float:
    """Renyi divergence of order lam between two distributions given by their log-probabilities."""
    return float(logsumexp(lam * logp + (1 - lam) * logq) / (lam - 1))


ORD = np.array([1.5, 2, 3, 5, 8, 13, 21, 34, 55, 89])


@pytest.mark.parametrize("sigma", [2.0, 5.0, 10.0])
@pytest.mark.parametrize("n,a", [(100, 100), (100, 90), (100, 70), (100, 55), (50, 40)])
def test_gnmax_bound_upper_bounds_the_exact_two_class_divergence(sigma, n, a):
    """Two classes, votes (a, n - a): the outcome probabilities are exact Gaussian tails; a neighbour
    moves one vote. Theorem 6 (data-dependent) must bound the true Renyi divergence."""
    def probs(top):  # log Pr[class 0], log Pr[class 1]
        x = (2 * top - n) / (math.sqrt(2) * sigma)
        return np.array([log_ndtr(x), log_ndtr(-x)])

    votes = np.array([[a, n - a]], dtype=float)
    bound = pate.rdp_gnmax_data_dependent(pate.log_q_gnmax(votes, sigma), sigma, ORD)[0]
    for nb in (a - 1, a + 1):
        if 0 <= nb <= n:
            exact = np.array([_renyi(probs(a), probs(nb), lam) for lam in ORD])
            assert np.all(exact <= bound + 1e-12)
    assert np.all(bound <= ORD / sigma**2 + 1e-15)


@pytest.mark.parametrize("scale", [2.0, 5.0, 20.0])
@pytest.mark.parametrize("n,a", [(100, 100), (100, 90), (100, 70), (100, 52)])
def test_lnmax_bounds_upper_bound_the_exact_two_class_divergence(scale, n, a):
    """Two classes with Laplace noise: Pr[class 1 wins] = (2 + g/b)/4 exp(-g/b) for a gap g >= 0."""
    def probs(top):  # log Pr[class 0], log Pr[class 1]
        g = abs(2 * top - n) / scale
        log_tail = math.log(2 + g) - math.log(4) - g
        log_rest = math.log1p(-math.exp(log_tail))
        return np.array([log_rest, log_tail]) if 2 * top >= n else np.array([log_tail, log_rest])

    votes = np.array([[a, n - a]], dtype=float)
    eps0 = 2.0 / scale
    dd = pate.rdp_pure_data_dependent(pate.log_q_lnmax(votes, scale), eps0, ORD)[0]
    for nb in (a - 1, a + 1):
        if 0 <= nb <= n:
            exact = np.array([_renyi(probs(a), probs(nb), lam) for lam in ORD])
            assert np.all(exact <= dd + 1e-12)
            assert np.all(exact <= np.minimum(0.5 * eps0**2 * ORD, eps0) + 1e-12)


def test_log_q_is_exact_for_two_classes_and_capped():
    v = np.array([[90, 10], [50, 50]])
    lq = pate.log_q_gnmax(v, 20.0)
    assert lq[0] == pytest.approx(norm.logsf(80 / (math.sqrt(2) * 20)))
    assert lq[1] == pytest.approx(math.log(0.5))  # capped at 1 - 1/K
    ll = pate.log_q_lnmax(v, 10.0)
    assert ll[0] == pytest.approx(math.log((2 + 8) / 4 * math.exp(-8)))


def test_threshold_probability():
    v = np.array([[180, 20, 0], [90, 60, 50]])
    lp = pate.log_pr_answered(v, 150, 30)
    assert np.exp(lp) == pytest.approx(norm.sf((150 - np.array([180, 90])) / 30))


def test_unanimous_votes_cost_less_than_data_independent():
    votes = np.tile([250, 0, 0, 0, 0, 0, 0, 0, 0, 0], (500, 1))
    r = acc.epsilon([GaussianQueries(sigma=40, count=500)], delta=1e-5, stats=[acc.VoteStats(votes)])
    assert r.data_dependent < 0.2 * r.value
    assert any("smooth-sensitivity" in n for n in r.notes)
    r = acc.epsilon([LaplaceQueries(scale=20, count=500)], delta=1e-5, stats=[acc.VoteStats(votes)])
    assert r.data_dependent < r.value


def test_data_dependent_never_exceeds_data_independent():
    rng = np.random.default_rng(0)
    votes = rng.multinomial(250, rng.dirichlet(np.ones(10) * 0.3, size=300)).astype(float)
    for ev in (GaussianQueries(40, 300), LaplaceQueries(40, 300)):
        r = acc.epsilon([ev], delta=1e-5, stats=[acc.VoteStats(votes)])
        assert r.data_dependent <= r.value + 1e-9
    answered = votes.max(axis=1) > 150
    ev = ConfidentGaussianQueries(threshold=150, sigma1=100, sigma2=40, count=300, answered=int(answered.sum()))
    r = acc.epsilon([ev], delta=1e-5, stats=[acc.VoteStats(votes, answered)])
    assert r.data_dependent <= r.value + 1e-9


def test_confident_gnmax_data_dependent_with_confident_ensemble():
    # 250 teachers almost unanimous: threshold 200 with sigma1 150, sigma2 40 (PATE 2018's MNIST setting)
    votes = np.tile([240, 5, 5, 0, 0, 0, 0, 0, 0, 0], (1000, 1)).astype(float)
    ev = ConfidentGaussianQueries(threshold=200, sigma1=150, sigma2=40, count=1000, answered=1000)
    r = acc.epsilon([ev], delta=1e-5, stats=[acc.VoteStats(votes, np.ones(1000, bool))])
    assert r.data_dependent < r.value


def test_mismatched_or_empty_votes_raise():
    with pytest.raises(PrivacyError, match="mismatched votes"):
        acc.epsilon([GaussianQueries(40, 10)], delta=1e-5, stats=[acc.VoteStats(np.ones((9, 10)))])
    with pytest.raises(PrivacyError, match="empty"):
        pate.log_q_gnmax(np.zeros((0, 10)), 10.0)
    with pytest.raises(PrivacyError, match="negative"):
        pate.log_q_lnmax(np.array([[3, -1]]), 10.0)
    with pytest.raises(PrivacyError, match="stats has"):
        acc.epsilon([GaussianQueries(40, 10)], delta=1e-5, stats=[])
    with pytest.raises(PrivacyError, match="answered mask"):
        acc.epsilon([ConfidentGaussianQueries(1, 1, 1, 2)], delta=1e-5, stats=[acc.VoteStats(np.ones((2, 3)))])
    with pytest.raises(PrivacyError, match="orders"):
        pate.rdp_gnmax_data_dependent([-1.0], 1.0, [1.0])
