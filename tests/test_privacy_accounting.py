"""Accounting: golden values (papers, dp-accounting), monotonicity, calibration, bad input."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.special import gammaln, logsumexp

from privdistill.errors import PrivacyError
from privdistill.privacy import accounting as acc
from privdistill.privacy.calibration import calibrate_noise, max_count
from privdistill.privacy.events import (
    ConfidentGaussianQueries,
    GaussianQueries,
    LaplaceOnSyntheticCodes,
    LaplaceQueries,
    NormalisedGaussian,
    RandomizedResponse,
    RandomizedResponseWithPrior,
    event_from_dict,
)
from privdistill.privacy.pricing import rdp_curve

DELTA = 1e-5
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def eps(events, accounting="strict", delta=DELTA):
    return acc.epsilon(events, delta=delta, accounting=accounting, breakdown=False).value


# ================================================================================ golden: DGD
class TestDGDGolden:
    def test_paper_1000_queries_gives_10_1_with_and_without_eps1(self):
        # DGD Sec. IV-C: "a privacy budget of 10.1 with advanced composition ... under 1000 queries"
        without = eps([LaplaceQueries(scale=40, count=1000)], "paper")
        with_eps1 = eps([LaplaceQueries(scale=40, count=1000), LaplaceOnSyntheticCodes(epsilon1=0.01)], "paper")
        assert without == pytest.approx(10.0871, abs=1e-4)
        assert with_eps1 == pytest.approx(10.0971, abs=1e-4)
        assert round(without, 1) == 10.1 and round(with_eps1, 1) == 10.1

    def test_paper_400_queries_gives_5_80_without_eps1(self):
        # DGD: "a much higher privacy budget of 5.80 under eps0 = 1/20, delta = 1e-5 over 400 queries"
        # (the discriminative part alone; with eps1 = 0.01 it would round to 5.81)
        assert round(eps([LaplaceQueries.from_epsilon0(0.05, 400)], "paper"), 2) == 5.80
        assert round(eps([LaplaceQueries.from_epsilon0(0.05, 400), LaplaceOnSyntheticCodes(0.01)], "paper"), 2) == 5.81

    def test_paper_formula_is_the_printed_expression(self):
        k, e0 = 1300, 0.05
        expected = k * e0**2 + e0 * math.sqrt(-2 * k * math.log(DELTA))
        assert eps([LaplaceQueries(40, k)], "paper") == pytest.approx(expected, rel=1e-12)

    @pytest.mark.parametrize("queries,expected", [(27, 0.98), (1000, 7.98), (1300, 9.34)])
    def test_strict_vote_channel_matches_method_notes(self, queries, expected):
        assert round(eps([LaplaceQueries(40, queries)]), 2) == expected

    def test_strict_equals_dp_accounting_laplace_composition(self):
        a = rdp_privacy_accountant.RdpAccountant(orders=acc.ORDERS)
        a.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(20.0), 1000))
        assert eps([LaplaceQueries(40, 1000)]) == pytest.approx(a.get_epsilon(DELTA), rel=1e-12)

    def test_latent_noise_gets_no_strict_credit_or_cost(self):
        base = eps([LaplaceQueries(40, 1000)])
        assert eps([LaplaceQueries(40, 1000), LaplaceOnSyntheticCodes(0.01)]) == pytest.approx(base)
        r = acc.epsilon([LaplaceOnSyntheticCodes(0.01)], delta=DELTA)
        assert r.value == 0.0 and "SYNTHETIC" in r.events[0].notes[0]

    def test_hard_vote_bound_is_smaller_and_reported(self):
        r = acc.epsilon([LaplaceQueries(40, 1000)], delta=DELTA)
        hard = r.events[0].details["epsilon_if_votes_are_hard_one_hot"]
        assert hard < r.value
        assert hard == pytest.approx(5.3455, abs=1e-3)

    def test_laplace_rdp_superadditivity_justifies_both_bounds(self):
        # a +1/-1 vote move at scale b costs 2*RDP_Lap(1/b) <= RDP_Lap(2/b) (what the headline uses)
        for b in (2.0, 10.0, 40.0):
            assert np.all(2 * rdp_curve(dp_accounting.LaplaceDpEvent(b))
                          <= rdp_curve(dp_accounting.LaplaceDpEvent(b / 2)) + 1e-12)


# ============================================================================== golden: DPDFD
class TestDPDFDGolden:
    def test_paper_theorem3_as_printed(self):
        ev = NormalisedGaussian(clip_norm=1e-3, sigma=100, batch_size=256, steps=1000)
        a = 2 * 1e-6 * 1 * 256 * 1000 / 100**2
        lam = np.exp(np.linspace(-5, 25, 200001)) + 1
        direct = np.min(a * lam + np.log((lam - 1) / lam) - (np.log(DELTA) + np.log(lam)) / (lam - 1))
        assert eps([ev], "paper") == pytest.approx(direct, rel=1e-6)

    def test_paper_multi_teacher_scales_with_n(self):
        one = acc.dpdfd_theorem3(2 * 1e-6 * 100 * 256 * 10 / 100**2, DELTA)[0]
        ev = NormalisedGaussian(clip_norm=1e-3, sigma=100, batch_size=256, steps=10, num_teachers=100, algorithm=2)
        assert eps([ev], "paper") == pytest.approx(one)

    def test_strict_single_teacher_per_sample_is_BT_queries_of_multiplier_sigma_over_2(self):
        ev = NormalisedGaussian(clip_norm=5e-3, sigma=100, batch_size=256, steps=20)
        a = rdp_privacy_accountant.RdpAccountant(orders=acc.ORDERS)
        a.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(50.0), 256 * 20))
        b = rdp_privacy_accountant.RdpAccountant(orders=acc.ORDERS)
        b.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(100 / (2 * 16)), 20))
        assert eps([ev]) == pytest.approx(a.get_epsilon(DELTA), rel=1e-9)
        assert eps([ev]) == pytest.approx(b.get_epsilon(DELTA), rel=1e-9)

    def test_strict_batch_sum_multiplier(self):
        ev = NormalisedGaussian(clip_norm=1e-3, sigma=100, batch_size=4, steps=3, granularity="batch_sum")
        a = rdp_privacy_accountant.RdpAccountant(orders=acc.ORDERS)
        a.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(100 / 8), 3))
        assert eps([ev]) == pytest.approx(a.get_epsilon(DELTA), rel=1e-9)

    def test_strict_does_not_depend_on_C_and_paper_does(self):
        e1 = NormalisedGaussian(clip_norm=1e-3, sigma=100, batch_size=256, steps=30)
        e2 = NormalisedGaussian(clip_norm=5e-3, sigma=100, batch_size=256, steps=30)
        assert eps([e1]) == pytest.approx(eps([e2]))
        assert eps([e1], "paper") < eps([e2], "paper")

    def test_strict_multi_teacher_per_sample_same_as_single(self):
        single = NormalisedGaussian(clip_norm=1e-3, sigma=100, batch_size=64, steps=10)
        multi = NormalisedGaussian(clip_norm=1e-3, sigma=100, batch_size=64, steps=10, num_teachers=100, algorithm=2)
        assert eps([multi]) == pytest.approx(eps([single]))

    def test_paper_calibration_lets_a_smaller_C_buy_less_noise(self):
        # Theorem 3 prices C^2 B T / sigma^2 while the noise std is sigma*C: at a fixed paper epsilon the
        # calibrated sigma scales with C, so the release's signal-to-noise ratio (1/sigma) grows as C shrinks.
        # These are the sigmas of docs/research-log.md's Fashion-MNIST eps 10 cells (2,000 steps of B = 256).
        sigmas = {C: calibrate_noise(NormalisedGaussian(clip_norm=C, sigma=1.0, batch_size=256, steps=2000),
                                     target_epsilon=10, delta=DELTA, accounting="paper") for C in (5e-3, 1e-4)}
        assert sigmas[5e-3] == pytest.approx(3.7895, rel=1e-4)
        assert sigmas[5e-3] / sigmas[1e-4] == pytest.approx(50, rel=1e-5)
        strict = {C: eps([NormalisedGaussian(clip_norm=C, sigma=s, batch_size=256, steps=2000)])
                  for C, s in sigmas.items()}
        assert strict[1e-4] > 1000 * strict[5e-3]  # the strict accounting sees the 50x less noise

    @pytest.mark.parametrize("C,target,paper_T", [(1e-3, 1, 596808), (1e-3, 10, 34818273),
                                                   (5e-3, 1, 23872), (5e-3, 10, 1392730)])
    def test_standard_settings_max_steps(self, C, target, paper_T):
        template = NormalisedGaussian(clip_norm=C, sigma=100, batch_size=256, steps=1)
        assert max_count(template, target_epsilon=target, delta=DELTA, accounting="paper") == paper_T
        strict_T = max_count(template, target_epsilon=target, delta=DELTA, accounting="strict")
        assert strict_T == (0 if target == 1 else 34)

    def test_alg3_is_not_dp_but_reports_the_channel(self):
        ev = NormalisedGaussian(clip_norm=1e-3, sigma=100, batch_size=256, steps=10, algorithm=3, dataset_size=60000)
        r = acc.epsilon([ev], delta=DELTA)
        assert math.isinf(r.value)
        channel = r.events[0].details["gradient_channel_epsilon"]
        assert 0 < channel < 0.01
        assert math.isfinite(eps([ev], "paper"))
        assert max_count(ev, target_epsilon=10, delta=DELTA, accounting="strict") == 0
        with pytest.raises(PrivacyError, match="not DP"):
            calibrate_noise(ev, target_epsilon=10, delta=DELTA, accounting="strict")

    def test_alg3_channel_matches_pld_poisson_replace_one(self):
        from dp_accounting.pld import pld_privacy_accountant

        ev = NormalisedGaussian(clip_norm=1e-3, sigma=4.0, batch_size=100, steps=50, algorithm=3, dataset_size=10000)
        a = pld_privacy_accountant.PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        a.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(4.0)), 50)
        r = acc.epsilon([ev], delta=DELTA)
        assert r.events[0].details["gradient_channel_epsilon"] == pytest.approx(a.get_epsilon(DELTA))

    def test_lemma1_alternative_reading_reported(self):
        r = acc.epsilon([NormalisedGaussian(1e-3, 100, 256, 1000, num_classes=10)], delta=DELTA, accounting="paper")
        alt = r.events[0].details["theorem3_epsilon_if_n_is_gradient_length"]
        assert alt > r.value


# ================================================================================ golden: SRR / RR
def kov_optimal_epsilon(e: float, k: int, delta: float) -> float:
    """Exact epsilon of k-fold composition of binary RR_e (Kairouz-Oh-Viswanath 2015): the smallest
    valid epsilon for k labels when every selected set has two elements."""
    ls = np.arange(k + 1)
    logc = gammaln(k + 1) - gammaln(ls + 1) - gammaln(k - ls + 1)

    def d(et):
        a = e * (k - ls)
        b = et + e * ls
        m = a > b
        if not m.any():
            return 0.0
        t = logc[m] + a[m] + np.log1p(-np.exp(b[m] - a[m])) - k * np.log1p(np.exp(e))
        return float(np.exp(logsumexp(t)))

    lo, hi = 0.0, e * k
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return hi


class TestSRRGolden:
    def test_paper_is_epsilon_per_label(self):
        assert eps([RandomizedResponseWithPrior(1.0, 60000, 10)], "paper") == 1.0
        assert eps([RandomizedResponseWithPrior(10.0, 60000, 10)], "paper") == 10.0

    @pytest.mark.parametrize("e,expected", [(1.0, 28767), (10.0, 600000)])
    def test_strict_composes_over_every_label(self, e, expected):
        value = eps([RandomizedResponseWithPrior(e, 60000, 10)])
        assert value == pytest.approx(expected, rel=2e-3)
        assert value <= 60000 * e + 1e-6  # never above basic composition
        assert value >= kov_optimal_epsilon(e, 60000, DELTA) - 1e-6  # never below the optimum

    def test_small_composition_close_to_optimal(self):
        value = eps([RandomizedResponseWithPrior(0.5, 200, 10)])
        opt = kov_optimal_epsilon(0.5, 200, DELTA)
        assert opt <= value <= 1.15 * opt

    def test_label_dp_setting_is_per_record(self):
        r = acc.epsilon([RandomizedResponseWithPrior(1.0, 50000, 10, setting="label-dp")], delta=DELTA)
        assert r.value == pytest.approx(1.0, abs=1e-4)  # (RDP at delta gives 0.99999 < 1 = pure)
        assert "label" in r.relation

    def test_krr_matches_dp_accounting(self):
        p = 10 / (math.exp(2.0) + 9)
        a = rdp_privacy_accountant.RdpAccountant(
            orders=acc.ORDERS, neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
        a.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.RandomizedResponseDpEvent(p, 10), 50))
        assert eps([RandomizedResponse(2.0, 50, 10)]) == pytest.approx(min(a.get_epsilon(DELTA), 100.0), rel=1e-9)

    def test_single_label_is_pure_epsilon(self):
        assert eps([RandomizedResponseWithPrior(1.0, 1, 10)]) == pytest.approx(1.0, abs=1e-4)


# ====================================================================================== GNMax
class TestGNMax:
    def test_data_independent_rdp_is_lambda_over_sigma_squared(self):
        term = GaussianQueries(sigma=40, count=1).strict_price(DELTA)
        assert np.allclose(term.rdp, acc.ORDERS / 40**2)

    def test_confident_strict_prices_every_query_as_answered(self):
        """The answered count is chosen adaptively by the mechanism: strict bounds the worst case, fixed in
        advance (an RDP filter), and shows the answered-only (odometer) figure beside it; paper counts the
        answered queries only, as PATE 2018 does."""
        ev = ConfidentGaussianQueries(threshold=200, sigma1=150, sigma2=40, count=1000, answered=300)
        term = ev.strict_price(DELTA)
        assert np.allclose(term.rdp, 1000 * acc.ORDERS / (2 * 150**2) + 1000 * acc.ORDERS / 40**2)
        worst = ConfidentGaussianQueries(threshold=200, sigma1=150, sigma2=40, count=1000)
        assert eps([worst]) == pytest.approx(eps([ev]))
        realised = term.details["epsilon_realised_answered_only"]
        direct, _ = acc.rdp_to_epsilon(1000 * acc.ORDERS / (2 * 150**2) + 300 * acc.ORDERS / 40**2, DELTA)
        assert realised == pytest.approx(direct) and realised < eps([ev])
        assert eps([ev], "paper") < eps([worst], "paper")

    def test_confident_under_a_filter_is_priced_at_its_budget(self):
        """Under an RDP filter (Feldman & Zrnic 2021) the bound is the budget fixed before the run, whatever was
        asked and answered; the event refuses realised counts the filter could not have allowed."""
        filtered = ConfidentGaussianQueries(threshold=200, sigma1=150, sigma2=40, count=1800, answered=900,
                                         filter_budget=1000)
        worst = ConfidentGaussianQueries(threshold=200, sigma1=150, sigma2=40, count=1000)
        assert eps([filtered]) == pytest.approx(eps([worst]))
        check, answer = filtered.round_costs  # the strict accountant's own curves, divided by the order
        assert np.allclose(worst.strict_price(DELTA).rdp, 1000 * acc.ORDERS * (check + answer))
        realised = filtered.strict_price(DELTA).details["epsilon_realised_answered_only"]
        assert realised < eps([filtered])
        with pytest.raises(PrivacyError, match="filter's budget"):
            ConfidentGaussianQueries(threshold=200, sigma1=150, sigma2=40, count=1800, answered=1000,
                                  filter_budget=1000)
        with pytest.raises(PrivacyError, match="filter's budget"):  # answers unknown: all counted
            ConfidentGaussianQueries(threshold=200, sigma1=150, sigma2=40, count=1001, filter_budget=1000)
        # none answered: the last check was asked with room for an answer, so fewer checks fit than cost alone says
        limit = int((1000 * (check + answer) - answer) / check)
        ConfidentGaussianQueries(threshold=200, sigma1=150, sigma2=40, count=limit, answered=0, filter_budget=1000)
        with pytest.raises(PrivacyError, match="filter's budget"):
            ConfidentGaussianQueries(threshold=200, sigma1=150, sigma2=40, count=limit + 1, answered=0,
                                     filter_budget=1000)
        assert "filter_budget" in filtered.to_dict() and "filter_budget" not in worst.to_dict(), \
            "a run without the filter records the event as before the option"

    def test_paper_is_pate_basic_conversion(self):
        r = eps([GaussianQueries(sigma=40, count=1000)], "paper")
        direct = np.min(1000 * acc.ORDERS / 1600 + math.log(1 / DELTA) / (acc.ORDERS - 1))
        assert r == pytest.approx(direct)


# ================================================================================ monotonicity
COUNT = st.integers(min_value=0, max_value=5000)


def _lnmax(n, noise):
    return LaplaceQueries(scale=noise, count=n)


def _gnmax(n, noise):
    return GaussianQueries(sigma=noise, count=n)


def _conf(n, noise):
    return ConfidentGaussianQueries(threshold=100, sigma1=noise * 2, sigma2=noise, count=n)


def _dpdfd(n, noise):
    return NormalisedGaussian(clip_norm=1e-3, sigma=noise * 10, batch_size=64, steps=n)


def _dpdfd2(n, noise):
    return NormalisedGaussian(clip_norm=5e-3, sigma=noise * 10, batch_size=16, steps=n, num_teachers=10, algorithm=2,
                      granularity="batch_sum")


FAMILIES = [_lnmax, _gnmax, _conf, _dpdfd, _dpdfd2]


@pytest.mark.parametrize("accounting", ["paper", "strict"])
@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
@FAST
@given(n=COUNT, extra=st.integers(1, 3000), noise=st.floats(0.5, 200))
def test_more_queries_never_lower_epsilon(accounting, family, n, extra, noise):
    assert eps([family(n, noise)], accounting) <= eps([family(n + extra, noise)], accounting) + 1e-9


@pytest.mark.parametrize("accounting", ["paper", "strict"])
@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.__name__)
@FAST
@given(n=st.integers(1, 3000), noise=st.floats(0.5, 200), factor=st.floats(1.0, 5.0))
def test_less_noise_never_lowers_epsilon(accounting, family, n, noise, factor):
    assert eps([family(n, noise / factor)], accounting) >= eps([family(n, noise)], accounting) - 1e-9


@pytest.mark.parametrize("accounting", ["paper", "strict"])
@FAST
@given(n=st.integers(0, 100000), e=st.floats(0.05, 8), extra=st.integers(1, 10000), factor=st.floats(1, 3))
def test_labels_monotone(accounting, n, e, extra, factor):
    a = eps([RandomizedResponseWithPrior(e, n, 10)], accounting)
    assert a <= eps([RandomizedResponseWithPrior(e, n + extra, 10)], accounting) + 1e-9
    assert a <= eps([RandomizedResponseWithPrior(e * factor, n, 10)], accounting) + 1e-9


@FAST
@given(n=st.integers(0, 2000), scale=st.floats(1, 100))
def test_composition_never_lowers_epsilon(n, scale):
    one = eps([LaplaceQueries(scale, n)])
    assert eps([LaplaceQueries(scale, n), GaussianQueries(30.0, 10)]) >= one - 1e-9


# ================================================================================ calibration
class TestCalibration:
    def test_max_queries_is_tight(self):
        n = max_count(LaplaceQueries(40, 1), target_epsilon=10, delta=DELTA, accounting="strict")
        assert eps([LaplaceQueries(40, n)]) <= 10 < eps([LaplaceQueries(40, n + 1)])
        p = max_count(LaplaceQueries(40, 1), target_epsilon=10, delta=DELTA, accounting="paper")
        assert eps([LaplaceQueries(40, p)], "paper") <= 10 < eps([LaplaceQueries(40, p + 1)], "paper")

    def test_dgd_27_queries_fit_epsilon_1_strict(self):
        assert max_count(LaplaceQueries(40, 1), target_epsilon=1, delta=DELTA, accounting="strict") >= 27

    def test_zero_when_one_step_exceeds(self):
        t = NormalisedGaussian(clip_norm=1e-3, sigma=100, batch_size=256, steps=1)
        assert max_count(t, target_epsilon=1, delta=DELTA, accounting="strict") == 0

    def test_fixed_events_count_against_target(self):
        free = max_count(LaplaceQueries(40, 1), target_epsilon=5, delta=DELTA)
        used = max_count(LaplaceQueries(40, 1), target_epsilon=5, delta=DELTA, fixed=[GaussianQueries(20, 100)])
        assert used < free

    @pytest.mark.parametrize("accounting", ["paper", "strict"])
    def test_calibrate_noise_hits_target(self, accounting):
        for ev in (LaplaceQueries(40, 1300), GaussianQueries(10, 1000), NormalisedGaussian(1e-3, 100, 256, 50)):
            x = calibrate_noise(ev, target_epsilon=3, delta=DELTA, accounting=accounting)
            assert eps([ev.with_noise(x)], accounting) <= 3
            assert eps([ev.with_noise(x * 0.999)], accounting) > 3

    def test_calibrate_epsilon_per_label(self):
        srr = RandomizedResponseWithPrior
        e = calibrate_noise(srr(1.0, 1000, 10), target_epsilon=10, delta=DELTA, accounting="strict")
        assert eps([srr(e, 1000, 10)]) <= 10 < eps([srr(e * 1.01, 1000, 10)])
        assert calibrate_noise(srr(1.0, 1000, 10), target_epsilon=3, delta=DELTA, accounting="paper") \
            == pytest.approx(3.0, rel=1e-5)

    def test_latent_has_no_count_to_calibrate(self):
        with pytest.raises(PrivacyError):
            max_count(LaplaceOnSyntheticCodes(0.01), target_epsilon=1, delta=DELTA)


# ================================================================================ structure
class TestStructure:
    def test_registry(self):
        assert set(acc.available_accountants()) == {"paper", "strict"}
        assert acc.get_accountant("paper").name == "paper"
        with pytest.raises(PrivacyError, match="unknown accounting"):
            acc.get_accountant("moments")

    def test_result_is_json_serialisable(self):
        import json

        r = acc.epsilon([LaplaceQueries(40, 10), NormalisedGaussian(1e-3, 100, 8, 2, algorithm=3, dataset_size=100)],
                        delta=DELTA)
        doc = json.loads(json.dumps(r.to_dict()))
        assert doc["epsilon"] == "inf" and doc["relation"].startswith("replace-one")

    def test_merge_events_keeps_epsilon(self):
        evs = [LaplaceQueries(40, 100)] * 13 + [GaussianQueries(30, 5), LaplaceQueries(20, 7)]
        merged = acc.merge_events(evs)
        assert merged[0] == LaplaceQueries(40, 1300) and len(merged) == 3
        for a in ("paper", "strict"):
            assert eps(merged, a) == pytest.approx(eps(evs, a), rel=1e-9)

    def test_both_accountings_given_together(self):
        r = acc.both([LaplaceQueries(40, 1000)], delta=DELTA)
        assert set(r) == {"paper", "strict"}


EVENT_STRATEGY = st.one_of(
    st.builds(LaplaceQueries, scale=st.floats(0.1, 1e3), count=st.integers(0, 10**6)),
    st.builds(GaussianQueries, sigma=st.floats(0.1, 1e3), count=st.integers(0, 10**6)),
    st.builds(RandomizedResponseWithPrior, epsilon=st.floats(0.01, 20), count=st.integers(0, 10**6),
              num_classes=st.integers(2, 1000), setting=st.sampled_from(["data-free", "label-dp"])),
    st.builds(RandomizedResponse, epsilon=st.floats(0.01, 20), count=st.integers(0, 10**6),
              num_classes=st.integers(2, 100)),
    st.builds(NormalisedGaussian, clip_norm=st.floats(1e-5, 1), sigma=st.floats(0.1, 1e3),
              batch_size=st.integers(1, 1024), steps=st.integers(0, 10**6),
              granularity=st.sampled_from(["per_sample", "batch_sum"])),
    st.builds(LaplaceOnSyntheticCodes, epsilon1=st.floats(1e-3, 10), dim=st.integers(1, 128)),
)


@settings(max_examples=60, deadline=None)
@given(ev=EVENT_STRATEGY)
def test_events_round_trip_through_json(ev):
    import json

    assert event_from_dict(json.loads(json.dumps(ev.to_dict()))) == ev


# ================================================================================== bad input
class TestBadInput:
    @pytest.mark.parametrize("delta", [0, 1, -0.1, 1.5, float("nan")])
    def test_delta_outside_unit_interval(self, delta):
        with pytest.raises(PrivacyError, match="delta"):
            acc.epsilon([LaplaceQueries(40, 10)], delta=delta)

    @pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
    def test_nonpositive_noise(self, bad):
        with pytest.raises(PrivacyError, match="must be"):
            LaplaceQueries(scale=bad, count=10)
        with pytest.raises(PrivacyError, match="sigma"):
            GaussianQueries(sigma=bad, count=10)
        with pytest.raises(PrivacyError, match="sigma"):
            NormalisedGaussian(clip_norm=1e-3, sigma=bad, batch_size=8, steps=1)

    @pytest.mark.parametrize("bad", [0, -0.5])
    def test_nonpositive_epsilon(self, bad):
        with pytest.raises(PrivacyError, match="epsilon"):
            RandomizedResponseWithPrior(epsilon=bad, count=10, num_classes=10)
        with pytest.raises(PrivacyError, match="epsilon"):
            LaplaceQueries.from_epsilon0(bad, 10)
        with pytest.raises(PrivacyError, match="target epsilon"):
            max_count(LaplaceQueries(40, 1), target_epsilon=bad, delta=DELTA)

    def test_bad_counts_and_choices(self):
        with pytest.raises(PrivacyError, match="queries"):
            LaplaceQueries(40, -1)
        with pytest.raises(PrivacyError, match="integer"):
            LaplaceQueries(40, 2.5)
        with pytest.raises(PrivacyError, match="granularity"):
            NormalisedGaussian(1e-3, 100, 8, 1, granularity="per_batch")
        with pytest.raises(PrivacyError, match="dataset_size"):
            NormalisedGaussian(1e-3, 100, 8, 1, algorithm=3)
        with pytest.raises(PrivacyError, match="algorithm=2"):
            NormalisedGaussian(1e-3, 100, 8, 1, num_teachers=5)
        with pytest.raises(PrivacyError, match="answered"):
            ConfidentGaussianQueries(100, 10, 10, count=5, answered=6)
        with pytest.raises(PrivacyError, match="accounting"):
            acc.epsilon([LaplaceQueries(40, 1)], delta=DELTA, accounting="moments")

    def test_bad_event_dicts(self):
        with pytest.raises(PrivacyError, match="unknown privacy event type"):
            event_from_dict({"type": "nope"})
        with pytest.raises(PrivacyError, match="unknown field"):
            event_from_dict({"type": "lnmax", "scale": 1, "count": 1, "extra": 2})
        with pytest.raises(PrivacyError, match="no 'type'"):
            event_from_dict({"scale": 1})


def test_merge_confident_events_keeps_answered_counts():
    a = ConfidentGaussianQueries(200, 150, 40, 10, answered=3)
    b = ConfidentGaussianQueries(200, 150, 40, 5, answered=2)
    assert acc.merge_events([a, b]) == [ConfidentGaussianQueries(200, 150, 40, 15, answered=5)]
    unknown = ConfidentGaussianQueries(200, 150, 40, 5)
    assert acc.merge_events([a, unknown])[0].answered is None  # worst case once any is unknown
    for name in ("paper", "strict"):
        assert eps(acc.merge_events([a, b]), name) == pytest.approx(eps([a, b], name))
    fa = ConfidentGaussianQueries(200, 150, 40, 18, answered=9, filter_budget=10)
    fb = ConfidentGaussianQueries(200, 150, 40, 9, answered=4, filter_budget=5)
    merged = acc.merge_events([fa, fb, a])  # filters in sequence: their budgets add; never merged with a plain run
    assert merged[0] == ConfidentGaussianQueries(200, 150, 40, 27, answered=13, filter_budget=15) and merged[1] == a
    assert eps(merged) == pytest.approx(eps([fa, fb, a]))
    # `privacy estimate` without --answered
    unknown_answers = ConfidentGaussianQueries(200, 150, 40, 5, filter_budget=5)
    assert acc.merge_events([fa, unknown_answers]) == [ConfidentGaussianQueries(200, 150, 40, 23, answered=14,
                                                                             filter_budget=15)]


@pytest.mark.parametrize("q,steps,epsilon", [(0.05, 50, 1.0), (0.3, 20, 0.5), (1.0, 1, 2.0)])
def test_strict_calibration_guided_by_the_coarse_pld_finds_the_fine_search_s_sigma(monkeypatch, q, steps, epsilon):
    """The coarse PLD only guides the bisection where it decides a step as the fine one would: the σ is the one a
    search on the fine PLD alone finds, its fine ε is within the target, and the coarse ε is never below the fine."""
    from privdistill.privacy import pricing

    guided = acc.strict_noise_multiplier(target_epsilon=epsilon, delta=1e-5, sample_rate=q, steps=steps)
    for sigma in (guided * 0.8, guided, guided * 1.25):
        fine = pricing.pld_poisson_gaussian_replace_one(sigma, q, steps, 1e-5)
        assert fine <= pricing.pld_poisson_gaussian_coarse(sigma, q, steps, 1e-5) <= fine + acc.COARSE_MARGIN / 10
    assert epsilon - 0.005 <= pricing.pld_poisson_gaussian_replace_one(guided, q, steps, 1e-5) <= epsilon
    monkeypatch.setattr(acc, "pld_poisson_gaussian_coarse", pricing.pld_poisson_gaussian_replace_one)
    assert acc.strict_noise_multiplier(target_epsilon=epsilon, delta=1e-5, sample_rate=q, steps=steps) == guided


def test_strict_calibration_stops_at_its_noise_floor_for_a_target_no_noise_needs():
    """ε 1e6 searched for minutes towards σ 0.01 (the PLD's grid widens as σ shrinks, and each read slows): the search
    returns the floor σ without reading below it; a target the floor overshoots still gets its calibrated σ."""
    read = []

    def eps(sigma):  # decreasing in σ, as a PLD ε is
        read.append(sigma)
        return 10 / sigma ** 2

    assert acc._bisect_noise(eps, 1e6, 0.005, 1e-5) == acc.MIN_NOISE_MULTIPLIER
    assert min(read) == acc.MIN_NOISE_MULTIPLIER
    read.clear()
    sigma = acc._bisect_noise(eps, 100.0, 0.005, 1e-5)
    assert eps(sigma) <= 100 and sigma == pytest.approx(0.1 ** 0.5, abs=1e-3) and min(read) >= acc.MIN_NOISE_MULTIPLIER


def test_an_end_to_end_event_at_the_noise_floor_is_named_in_the_plan():
    """An end-to-end share whose σ stopped at the floor spends less than its share: the plan says which; a calibrated
    one gets no note."""
    from privdistill.methods.end_to_end import floor_notes
    from privdistill.privacy.events import SubsampledGaussian

    floor = SubsampledGaussian(noise_multiplier=acc.MIN_NOISE_MULTIPLIER, sample_rate=1.0, steps=1, delta=1e-6,
                               what="DP feature statistics")
    calibrated = SubsampledGaussian(noise_multiplier=1.3, sample_rate=0.01, steps=300, delta=1e-6, what="DP source")
    notes = floor_notes({"statistics": floor, "source": calibrated})
    assert len(notes) == 1 and notes[0].startswith("DP feature statistics: the noise multiplier is at its floor")
