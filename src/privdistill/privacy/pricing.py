"""The arithmetic privacy events price themselves with, and the two kinds of price the accountants compose.

``strict``: :class:`StrictPrice`, the event's dp-accounting ``DpEvent`` (RDP curves added and converted once),
optionally a pure ε for basic composition or an (ε, δ) priced alone (a Poisson-subsampled Gaussian by PLD under
replace-one, which dp-accounting's RDP accountant does not support). ``paper``: :class:`PaperClaim`, the event's
part of a paper's printed bound, pooled by family and priced by its formula; the families that consume δ share it.

dp-accounting is imported where a number is computed: the command line imports the events to print its help.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Hashable

import numpy as np

REPLACE_ONE = "replace-one: substitute one record of the private training set"
CHANGE_LABEL = "change one record's label (label-DP; inputs are not protected)"

#: Renyi orders used by the strict accountant: dp-accounting's defaults, refined near 1 (for very
#: long compositions) and extended upwards (for very small per-step costs).
ORDERS = np.array(sorted(set(
    [1.0 + x / 100.0 for x in range(2, 10)]
    + [1.0 + x / 10.0 for x in range(1, 100)]
    + list(range(11, 64))
    + [64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 768, 1024, 1536, 2048,
       3072, 4096, 6144, 8192, 16384, 32768, 65536]
)), dtype=float)

#: dp-accounting's neighbouring relations, as an event states the one its DpEvent is written in.
#: "unit-shift": Gaussian and Laplace events are given in normalised units (noise multiplier = noise std / the
#: full L2 or L1 distance between the two neighbouring outputs), for which dp-accounting's add/remove formulas
#: are exactly the RDP of a shift by one unit, i.e. the replace-one RDP we need. "replace-one": randomized
#: response, which dp-accounting prices under REPLACE_ONE only.
UNIT_SHIFT, DP_REPLACE_ONE = "unit-shift", "replace-one"


# ======================================================================================= RDP curves
def rdp_curve(dp_event: Any, relation: str = UNIT_SHIFT) -> np.ndarray:
    """RDP at ORDERS of a dp-accounting event, composed as dp-accounting's RdpAccountant composes it (a
    self-composition multiplies its event's curve by the count, a composition adds its events' curves in
    order). The curve of each elementary mechanism comes from dp-accounting's RdpAccountant and is cached:
    calibration prices the same mechanism at hundreds of counts. The result must not be modified."""
    import dp_accounting

    if isinstance(dp_event, dp_accounting.SelfComposedDpEvent):
        return dp_event.count * rdp_curve(dp_event.event, relation)
    if isinstance(dp_event, dp_accounting.ComposedDpEvent):
        return sum((rdp_curve(e, relation) for e in dp_event.events), np.zeros_like(ORDERS))
    return _elementary_rdp(dp_event, relation)


@functools.lru_cache(maxsize=4096)
def _elementary_rdp(dp_event: Any, relation: str) -> np.ndarray:
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as _rdp

    rel = (dp_accounting.NeighboringRelation.REPLACE_ONE if relation == DP_REPLACE_ONE
           else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc = _rdp.RdpAccountant(orders=ORDERS, neighboring_relation=rel)
    acc.compose(dp_event)
    out = acc.rdp
    out.setflags(write=False)  # cached: callers must not modify
    return out


def rdp_to_epsilon(rdp: np.ndarray, delta: float) -> tuple[float, float | None]:
    """(epsilon, optimal order) from an RDP curve at ORDERS (dp-accounting's conversion)."""
    from dp_accounting.rdp import rdp_privacy_accountant as _rdp

    if np.all(rdp == 0):
        return 0.0, None
    if np.any(np.isinf(rdp)) and np.all(np.isinf(rdp)):
        return math.inf, None
    eps, order = _rdp.compute_epsilon(ORDERS, rdp, delta)
    return float(eps), float(order)


def randomized_response_parameter(epsilon: float, buckets: int) -> float:
    """dp-accounting's RR keeps the input with prob 1-p, else draws uniformly over the k buckets; the
    likelihood ratio is k/p - k + 1 = e^eps  <=>  p = k / (e^eps + k - 1) (0 where e^eps overflows)."""
    return buckets / (math.exp(epsilon) + buckets - 1.0) if epsilon < 700 else 0.0


FINE_INTERVAL, COARSE_INTERVAL = 1e-4, 1e-3  # dp-accounting's default grid of privacy losses, and ten times it


@functools.lru_cache(maxsize=1024)
def pld_poisson_gaussian_replace_one(noise_multiplier: float, q: float, steps: int, delta: float,
                                     interval: float = FINE_INTERVAL) -> float:
    """ε at δ of ``steps`` Poisson-subsampled Gaussian steps (rate q), dp-accounting's PLD accountant, REPLACE_ONE
    (the RDP accountant supports Poisson subsampling under add/remove only), on a grid of `interval`."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    if steps == 0:
        return 0.0
    acc = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE, value_discretization_interval=interval)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise_multiplier)), steps)
    return float(acc.get_epsilon(delta))


def pld_poisson_gaussian_coarse(noise_multiplier: float, q: float, steps: int, delta: float) -> float:
    """`pld_poisson_gaussian_replace_one` on a grid ten times coarser: about ten times cheaper, and at most 1.7e-3
    above it where measured (accounting.COARSE_MARGIN). A guide for a search; never an ε to report."""
    return pld_poisson_gaussian_replace_one(noise_multiplier, q, steps, delta, COARSE_INTERVAL)


# ==================================================================================== strict prices
@dataclass
class StrictPrice:
    """One event's price under the strict accounting, in the form the strict accountant composes.

    ``dp_event``: the dp-accounting event whose RDP curve (in ``units``, see UNIT_SHIFT) is added to the others';
    ``pure``: the event's pure-DP ε by basic composition, if it is pure (the accountant takes the smaller of the
    RDP bound and basic composition when every event is pure); ``fixed``: an (ε, δ) the event priced on its own,
    added to the rest by basic composition; ``infinite``: the event is not DP as written.
    """

    dp_event: Any = None
    units: str = UNIT_SHIFT
    pure: float | None = None
    fixed: tuple[float, float] | None = None
    infinite: bool = False
    relation: str = REPLACE_ONE
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def rdp(self) -> np.ndarray:
        """The RDP curve at ORDERS of ``dp_event`` (zero where it has none)."""
        return np.zeros_like(ORDERS) if self.dp_event is None else rdp_curve(self.dp_event, self.units)


# ===================================================================================== paper claims
@dataclass(frozen=True)
class PaperPrice:
    epsilon: float
    order: float | None = None
    notes: tuple[str, ...] = ()
    details: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class PaperClaim:
    """One event's part of a paper's printed bound. The paper accountant pools the claims of one family
    (``key``), prices each pool by its formula in the order of ``rank`` (the order the printed bounds are added
    in), shares δ equally among the pools that consume it (``uses_delta``) and adds their ε's."""

    #: pools are priced in this order
    rank: ClassVar[int] = 0
    #: the formula consumes a share of δ
    uses_delta: ClassVar[bool] = True
    #: the optimal order of the result is this family's (the last such family priced)
    gives_order: ClassVar[bool] = False
    #: an (ε, δ) priced on its own (fields ``epsilon``, ``delta``): its δ is set aside before the formulas
    #: share the rest, and its ε is added to their total
    priced_alone: ClassVar[bool] = False
    #: notes made when the claim is made (kept once per claim, in event order)
    remarks: tuple[str, ...] = field(default=(), kw_only=True)

    @property
    def key(self) -> Hashable:
        return type(self)

    def pooled(self, other: "PaperClaim") -> "PaperClaim":  # pragma: no cover - overridden
        raise NotImplementedError

    def price(self, delta: float) -> PaperPrice:  # pragma: no cover - overridden
        raise NotImplementedError


def dgd_advanced_composition(epsilon0: float, queries: int, delta: float) -> float:
    """DGD's printed bound: |Ds| eps0^2 + eps0 sqrt(2 |Ds| ln(1/delta)) (Sec. III-E, Dwork & Roth 2014).

    (Dwork & Roth's Thm 3.20 has k eps (e^eps - 1) where DGD prints k eps^2; reproduced as printed.)
    """
    return queries * epsilon0**2 + epsilon0 * math.sqrt(2.0 * queries * math.log(1.0 / delta))


def dpdfd_theorem3(coefficient: float, delta: float) -> tuple[float, float | None]:
    """DPDFD Theorem 3 as printed: min over lambda > 1 of
    a*lambda + log((lambda-1)/lambda) - (log delta + log lambda)/(lambda-1), with a = 2 C^2 n B T / sigma^2.

    Returns (epsilon, optimal lambda). The minimum is taken over a dense grid of log(lambda - 1)
    refined by a bounded scalar search.
    """
    from scipy.optimize import minimize_scalar

    if coefficient <= 0:
        return 0.0, None
    log_delta = math.log(delta)

    def f(x: float) -> float:  # x = log(lambda - 1)
        lam = 1.0 + math.exp(x)
        return coefficient * lam + math.log((lam - 1.0) / lam) - (log_delta + math.log(lam)) / (lam - 1.0)

    grid = np.linspace(-12.0, 45.0, 2281)
    lam = 1.0 + np.exp(grid)
    vals = coefficient * lam + np.log1p(-1.0 / lam) - (log_delta + np.log(lam)) / (lam - 1.0)
    i = int(np.argmin(vals))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    res = minimize_scalar(f, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10})
    best_x = res.x if res.fun < vals[i] else grid[i]
    return max(0.0, float(min(res.fun, vals[i]))), 1.0 + math.exp(best_x)


def pate_basic_conversion(rdp: np.ndarray, delta: float) -> tuple[float, float | None]:
    """PATE 2018's printed conversion: eps = min over lambda of rdp(lambda) + log(1/delta)/(lambda - 1)."""
    if np.all(rdp == 0):
        return 0.0, None
    eps = rdp + math.log(1.0 / delta) / (ORDERS - 1.0)
    i = int(np.argmin(eps))
    return float(eps[i]), float(ORDERS[i])


@dataclass(frozen=True)
class AdvancedComposition(PaperClaim):
    """DGD (Sec. III-E): ``queries`` pure ``epsilon0``-DP answers, priced together by its advanced composition."""

    epsilon0: float
    queries: int
    rank: ClassVar[int] = 0

    @property
    def key(self) -> Hashable:
        return (type(self), self.epsilon0)  # one bound per epsilon0

    def pooled(self, other: "AdvancedComposition") -> "AdvancedComposition":
        return AdvancedComposition(self.epsilon0, self.queries + other.queries,
                                   remarks=self.remarks + other.remarks)

    def price(self, delta: float) -> PaperPrice:
        e = dgd_advanced_composition(self.epsilon0, self.queries, delta)
        return PaperPrice(e, notes=(f"DGD advanced composition: {self.queries} queries at eps0={self.epsilon0:.4g}: "
                                    f"k*eps0^2 + eps0*sqrt(2k ln(1/delta)) = {e:.4f}",))


@dataclass(frozen=True)
class PateRdp(PaperClaim):
    """PATE 2018's data-independent RDP curves at ORDERS, added and converted by its printed conversion."""

    curves: tuple[np.ndarray, ...]
    rank: ClassVar[int] = 1
    gives_order: ClassVar[bool] = True

    def pooled(self, other: "PateRdp") -> "PateRdp":
        return PateRdp(self.curves + other.curves, remarks=self.remarks + other.remarks)

    def price(self, delta: float) -> PaperPrice:
        e, order = pate_basic_conversion(sum(self.curves, np.zeros_like(ORDERS)), delta)
        return PaperPrice(e, order, ("PATE 2018 data-independent RDP (lambda/sigma^2 per answer, lambda/(2 sigma1^2) "
                                     "per threshold check), converted by eps = rdp + log(1/delta)/(lambda-1): "
                                     f"{e:.4f}",))


@dataclass(frozen=True)
class Theorem3(PaperClaim):
    """DPDFD's Theorem 3: the coefficients a = 2 C^2 n B T / sigma^2 of every DPDFD event added, then one bound.
    ``alternative``: the same with n read as the gradient length K (Lemma 1), None where K is not known."""

    coefficient: float
    alternative: float | None
    rank: ClassVar[int] = 2
    gives_order: ClassVar[bool] = True

    def pooled(self, other: "Theorem3") -> "Theorem3":
        alt = None if self.alternative is None or other.alternative is None else self.alternative + other.alternative
        return Theorem3(self.coefficient + other.coefficient, alt, remarks=self.remarks + other.remarks)

    def price(self, delta: float) -> PaperPrice:
        e, order = dpdfd_theorem3(self.coefficient, delta)
        notes = [f"DPDFD Theorem 3 as printed (RDP 2C^2 nBT lambda/sigma^2, n = number of teachers): {e:.4f}"]
        details: list[tuple[str, Any]] = [("theorem3_coefficient", self.coefficient)]
        if self.alternative is not None and self.alternative > 0:
            alt, _ = dpdfd_theorem3(self.alternative, delta)
            details.append(("theorem3_epsilon_if_n_is_gradient_length", alt))
            notes.append("Lemma 1 defines n as the length of the gradient vector (K classes); with that "
                         f"reading Theorem 3 gives {alt:.4f}")
        return PaperPrice(e, order, tuple(notes), tuple(details))


@dataclass(frozen=True)
class PerLabel(PaperClaim):
    """SRR's claim: ε per label, labels drawn once and reused, no composition over labels (the largest ε)."""

    epsilon: float
    rank: ClassVar[int] = 3
    uses_delta: ClassVar[bool] = False

    def pooled(self, other: "PerLabel") -> "PerLabel":
        return PerLabel(max(self.epsilon, other.epsilon), remarks=self.remarks + other.remarks)

    def price(self, delta: float) -> PaperPrice:
        return PaperPrice(self.epsilon, notes=(f"SRR/RR: epsilon {self.epsilon:g} per label, labels drawn once and "
                                               "reused, no composition over labels (the paper's epsilon-label-DP "
                                               "claim)",))


@dataclass(frozen=True)
class AddedAsPrinted(PaperClaim):
    """DGD's ε1 for the latent-code noise, added to its total as printed."""

    epsilon: float
    rank: ClassVar[int] = 4
    uses_delta: ClassVar[bool] = False

    def pooled(self, other: "AddedAsPrinted") -> "AddedAsPrinted":
        return AddedAsPrinted(self.epsilon + other.epsilon, remarks=self.remarks + other.remarks)

    def price(self, delta: float) -> PaperPrice:
        return PaperPrice(self.epsilon, notes=(f"DGD epsilon1 = {self.epsilon:g} for the latent-code noise, added "
                                               "as printed",))


@dataclass(frozen=True)
class PricedAlone(PaperClaim):
    """An (ε, δ) priced on its own (no paper has a formula for it): its δ is set aside before the families share
    the rest, and its ε is added to their total (basic composition)."""

    epsilon: float
    delta: float
    rank: ClassVar[int] = 5
    uses_delta: ClassVar[bool] = False
    priced_alone: ClassVar[bool] = True

    def pooled(self, other: "PricedAlone") -> "PricedAlone":
        return PricedAlone(self.epsilon + other.epsilon, self.delta + other.delta, remarks=self.remarks + other.remarks)

    def price(self, delta: float) -> PaperPrice:
        return PaperPrice(self.epsilon)
