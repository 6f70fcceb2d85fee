"""Calibration: the most queries / steps, or the least noise, that fit a target (epsilon, delta).

Every function takes a template event and an accounting, and relies on epsilon being non-decreasing in the count and
non-increasing in the noise (tests/test_privacy_accounting.py); everything privacy-relevant is keyword-only::

    max_count(LaplaceQueries(scale=40, count=1), target_epsilon=10, delta=1e-5, accounting="strict")
    calibrate_noise(GaussianQueries(sigma=1, count=1000), target_epsilon=2, delta=1e-5, accounting="strict")

A count of 0 is a valid answer: even one query / step would exceed the target.
"""

from __future__ import annotations

import math
from typing import Sequence

from privdistill.errors import ConfigError, PrivacyError
from privdistill.privacy._checks import check_accounting, check_delta, check_positive
from privdistill.privacy.accounting import epsilon
from privdistill.privacy.events import PrivacyEvent

#: the largest count max_count searches; a template that fits even there returns this value
COUNT_LIMIT = 10**12


def _eps(events: Sequence[PrivacyEvent], delta: float, accounting: str) -> float:
    return epsilon(list(events), delta=delta, accounting=accounting, breakdown=False).value


def _checked(event: PrivacyEvent, target_epsilon: float, delta: float, accounting: str, field: str,
             what: str) -> tuple[float, float]:
    """(target, delta) checked, and the event has the `field` (count_field / noise_field) to calibrate."""
    target, delta = check_positive("target epsilon", target_epsilon), check_delta(delta)
    check_accounting(accounting)
    if getattr(event, field) is None:
        raise PrivacyError(f"{event.type_name} events have no {what} to calibrate")
    return target, delta


def max_count(event: PrivacyEvent, *, target_epsilon: float, delta: float, accounting: str = "strict",
              fixed: Sequence[PrivacyEvent] = (), limit: int = COUNT_LIMIT) -> int:
    """The largest n such that ``fixed + [event.with_count(n)]`` has epsilon <= target (0 if none).

    ``fixed``: events already spent (e.g. read from a ledger) that count against the same target.
    Returns ``limit`` when the template never exceeds the target (e.g. an event with no strict cost).
    """
    target, delta = _checked(event, target_epsilon, delta, accounting, "count_field", "count")
    fixed = list(fixed)

    def fits(n: int) -> bool:
        return _eps(fixed + [event.with_count(n)], delta, accounting) <= target

    # epsilon is non-decreasing in the count, so if one does not fit, none does (whatever `fixed` spent already)
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo = hi
        if hi >= limit:
            return limit
        hi = min(hi * 2, limit)
    # invariant: fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def vote_queries(event: PrivacyEvent, budget, aggregation: str, fixed: Sequence[PrivacyEvent] = ()) -> int:
    """The most queries of a vote plan that fit the budget (``event``: one query; ``budget``: epsilon, delta and
    accounting), or ConfigError saying the ε one query costs and the ways out when not even one fits."""
    n = max_count(event, target_epsilon=budget.epsilon, delta=budget.delta, accounting=budget.accounting, fixed=fixed)
    if n > 0:
        return n
    one = _eps(list(fixed) + [event.with_count(1)], budget.delta, budget.accounting)
    noise = getattr(event, event.noise_field)
    raise ConfigError(f"ε = {budget.epsilon:g} at δ = {budget.delta:g} allows no {aggregation} query under the "
                      f"{budget.accounting} accounting: one query with noise {noise:g} costs ε = {one:.3g}. Raise "
                      f"--epsilon to at least {one:.3g}, raise the vote noise (each label is then wrong more often: "
                      "--dry-run prints by how much), or bring more data (more teachers outvote more noise)")


def calibrate_noise(event: PrivacyEvent, *, target_epsilon: float, delta: float, accounting: str = "strict",
                    fixed: Sequence[PrivacyEvent] = (), rel_tol: float = 1e-6) -> float:
    """The least noise (Laplace scale, sigma, sigma2) -- or, for randomized response and
    epsilon-parametrised events, the largest epsilon per use -- such that the composition fits.

    The returned value is on the safe side of the target (never above it) to ``rel_tol``.
    Raises PrivacyError when no value fits (e.g. strict DPDFD Alg. 3, which is not DP as written).
    """
    target, delta = _checked(event, target_epsilon, delta, accounting, "noise_field", "noise parameter")
    fixed = list(fixed)

    def fits(value: float) -> bool:
        return _eps(fixed + [event.with_noise(value)], delta, accounting) <= target

    # one search for both kinds: a noise scale is more private the larger it is, an epsilon the smaller.
    # `good` fits and `bad` does not; `more_private` is the factor that steps from `bad` towards `good`.
    scale = event.noise_is_scale
    more_private = 2.0 if scale else 0.5
    good = bad = float(getattr(event, event.noise_field))
    if fits(good):
        while fits(bad) and (bad > 1e-12 if scale else bad < 700):
            good = bad
            bad /= more_private
        if fits(bad):
            return bad
    else:
        while not fits(good):
            bad = good
            good *= more_private
            if good > 1e15 if scale else good < 1e-12:
                raise PrivacyError(f"no {event.noise_field} fits epsilon <= {target:g} under {accounting} accounting"
                                   + (" (the release is not DP at any noise level as written)" if scale else ""))
    while abs(good - bad) > rel_tol * max(good, bad):
        mid = math.sqrt(good * bad) if bad > 0 else good / 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good
