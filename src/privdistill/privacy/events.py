"""Privacy events: one small immutable value per use of a noise mechanism, named after the mechanism.

Shaped after dp-accounting's ``DpEvent``s: an event records *what* was released and with which parameters, never
the data, and prices itself (:mod:`privdistill.privacy.pricing`): ``strict_price(delta)`` (its dp-accounting event,
with the corrections of the method notes) and ``paper_claims()`` (its part of its paper's formula). The accountants
compose what the events say; docs/privacy.md ("Events") tabulates what each maps to.

Neighbouring relation: replace-one (substitute one record of the private training set) for every
event, except :class:`RandomizedResponseWithPrior` with ``setting="label-dp"`` (change one record's label).

Every event is JSON round-trippable (ledgers with the older type names, "lnmax", "gnmax", ..., read into the same
classes)::

    event.to_dict() == {"type": "laplace-queries", "scale": 40.0, "count": 1000, "sensitivity": 2.0}
    event_from_dict(event.to_dict()) == event
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar, Hashable, Mapping

from privdistill.errors import PrivacyError
from privdistill.privacy import pate
from privdistill.privacy._checks import check_choice, check_count, check_positive
from privdistill.privacy.pricing import (
    CHANGE_LABEL,
    DP_REPLACE_ONE,
    ORDERS,
    REPLACE_ONE,
    AddedAsPrinted,
    AdvancedComposition,
    PaperClaim,
    PateRdp,
    PerLabel,
    PricedAlone,
    StrictPrice,
    Theorem3,
    pld_poisson_gaussian_replace_one,
    randomized_response_parameter,
    rdp_curve,
    rdp_to_epsilon,
)

if TYPE_CHECKING:
    import dp_accounting
    import numpy as np

#: JSON type name -> event class (the names written)
EVENT_TYPES: dict[str, type["PrivacyEvent"]] = {}
#: the type names of ledgers written before the events were named after their mechanisms (read, never written)
LEGACY_EVENT_TYPES: dict[str, type["PrivacyEvent"]] = {}


def count_of(n: int, word: str, many: str | None = None) -> str:
    """'1 query', '27 queries': a count with its noun in the right number (`many`: the plural, else word + 's')."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def _dp():
    """dp-accounting, imported when an event is priced (the import alone takes seconds on a small CPU)."""
    import dp_accounting

    return dp_accounting


class PrivacyEvent:
    """Base class of all events (subclasses are frozen dataclasses).

    A subclass sets the class variables below in its class statement (``class X(PrivacyEvent, type_name=...,
    count_field=...)``) and is then registered under its type names; one that sets them in its body is not."""

    type_name: ClassVar[str] = ""
    #: the JSON type names this event was written under before (read back into this class)
    legacy_type_names: ClassVar[tuple[str, ...]] = ()
    #: what reports call the event: the mechanism, and in brackets what uses it
    title: ClassVar[str] = ""
    #: the field that counts repetitions (queries, labels, steps); varied by calibration.max_count
    count_field: ClassVar[str | None] = None
    #: the field that sets the noise; varied by calibration.calibrate_noise
    noise_field: ClassVar[str | None] = None
    #: True if a larger value of ``noise_field`` means more privacy (noise scale), False if less (epsilon)
    noise_is_scale: ClassVar[bool] = True

    def __init_subclass__(cls, **class_vars: Any) -> None:
        super().__init_subclass__()
        unknown = set(class_vars) - set(PrivacyEvent.__annotations__)
        if unknown:
            raise TypeError(f"{cls.__name__}: unknown event class variable(s) {', '.join(sorted(unknown))}")
        for name, value in class_vars.items():
            setattr(cls, name, value)
        if class_vars.get("type_name"):
            EVENT_TYPES[cls.type_name] = cls
            for old in cls.legacy_type_names:
                LEGACY_EVENT_TYPES[old] = cls

    def _set(self, **values: Any) -> None:
        """Store checked field values on the frozen dataclass (from ``__post_init__``)."""
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type_name, **{f.name: getattr(self, f.name) for f in fields(self)}}  # type: ignore[arg-type]

    def with_count(self, n: int) -> "PrivacyEvent":
        if self.count_field is None:
            raise PrivacyError(f"{self.type_name} events have no count to vary")
        return replace(self, **{self.count_field: n})  # type: ignore[type-var]

    def with_noise(self, value: float) -> "PrivacyEvent":
        if self.noise_field is None:
            raise PrivacyError(f"{self.type_name} events have no noise parameter to calibrate")
        return replace(self, **{self.noise_field: value})  # type: ignore[type-var]

    def describe(self) -> str:  # pragma: no cover - overridden
        return self.title or self.type_name

    # ------------------------------------------------------------------------------------ merging
    def merge_key(self) -> Hashable:
        """Events with equal keys differ only in their count and are merged by :meth:`merged`."""
        d = self.to_dict()
        d.pop(self.count_field, None)  # type: ignore[arg-type]
        return tuple(sorted((k, repr(v)) for k, v in d.items()))

    def merged(self, other: "PrivacyEvent") -> "PrivacyEvent":
        """One event for this one and ``other`` (same merge key): the counts add."""
        return self.with_count(getattr(self, self.count_field) + getattr(other, self.count_field))  # type: ignore[arg-type]

    # ------------------------------------------------------------------------------------ pricing
    @property
    def relation(self) -> str:
        """The neighbouring relation the event's price holds under."""
        return REPLACE_ONE

    def to_dp_event(self) -> "dp_accounting.DpEvent":
        """The event as dp-accounting's ``DpEvent``, in the units :meth:`strict_price` states."""
        raise PrivacyError(f"{type(self).__name__} events have no dp-accounting event")

    def strict_price(self, delta: float, details: bool = True) -> StrictPrice:
        """The strict price; ``details=False`` skips what only a report shows (some of it is slow)."""
        raise PrivacyError(f"the strict accountant does not know events of type {type(self).__name__}")

    def paper_claims(self) -> tuple[PaperClaim, ...]:
        """The event's part of its paper's printed bound (nothing if it released nothing)."""
        raise PrivacyError(f"the paper accountant does not know events of type {type(self).__name__}")

    def data_dependent_rdp(self, stats: Any) -> "np.ndarray | None":
        """PATE's data-dependent RDP from recorded votes (``accounting.VoteStats``), or None if not applicable."""
        return None


def event_from_dict(data: Mapping[str, Any]) -> PrivacyEvent:
    """Inverse of :meth:`PrivacyEvent.to_dict` (also reads the old type names); unknown types or fields raise
    PrivacyError."""
    if not isinstance(data, Mapping) or "type" not in data:
        raise PrivacyError(f"not a privacy event (no 'type' key): {data!r}")
    kind = data["type"]
    cls = EVENT_TYPES.get(kind) or LEGACY_EVENT_TYPES.get(kind)
    if cls is None:
        raise PrivacyError(f"unknown privacy event type {kind!r}; known: {', '.join(sorted(EVENT_TYPES))}")
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    extra = set(data) - names - {"type"}
    if extra:
        raise PrivacyError(f"{kind} event has unknown field(s) {', '.join(sorted(extra))}")
    return cls(**{k: v for k, v in data.items() if k != "type"})


def checked_sensitivity(declared: float, true_sensitivity: float, mechanism: str) -> float:
    """The sensitivity is fixed by the mechanism (one replaced record moves one teacher's vote), not by whoever
    records the event: a smaller declared value would under-price every answer, so it is refused (a larger one
    only over-prices, and is kept)."""
    declared = check_positive("sensitivity", declared)
    if declared < true_sensitivity * (1 - 1e-12):
        raise PrivacyError(f"{mechanism}: sensitivity {declared:g} is below the mechanism's {true_sensitivity:g} "
                           "(one replaced record moves one teacher's vote); it would under-price the event")
    return declared


def _checked_votes(event: Any, stats: Any) -> "np.ndarray":
    votes = pate.check_votes(stats.votes)
    if votes.shape[0] != event.count:
        raise PrivacyError(f"mismatched votes: {votes.shape[0]} vote rows for an event of {event.count} queries")
    return votes


# ------------------------------------------------------------------------------- noisy vote histograms
@dataclass(frozen=True)
class LaplaceQueries(PrivacyEvent, type_name="laplace-queries", legacy_type_names=("lnmax",),
                     title="Laplace queries (LNMax)", count_field="count", noise_field="scale"):
    """``count`` Laplace noisy-argmax answers, noise ``Lap(scale)`` on every vote count (LNMax; DGD Eq. 3).

    ``sensitivity`` is the L1 change of one query's vote histogram when one private record is
    replaced: the record moves one teacher, whose vote moves from one class to another: 2.
    Each answer is then ``epsilon0 = sensitivity / scale``-DP (DGD: scale = 2/epsilon0 = 40).

    strict: dp-accounting ``LaplaceDpEvent(scale / sensitivity)`` composed ``count`` times, or basic composition
    of the pure ε0 when smaller; paper: DGD's advanced composition.
    """

    scale: float
    count: int
    sensitivity: float = 2.0

    def __post_init__(self) -> None:
        self._set(scale=check_positive("Laplace scale", self.scale), count=check_count("queries", self.count),
                  sensitivity=checked_sensitivity(self.sensitivity, 2.0, "LNMax"))

    @classmethod
    def from_epsilon0(cls, epsilon0: float, count: int) -> "LaplaceQueries":
        """DGD's parametrisation: scale = 2 / epsilon0."""
        return cls(scale=2.0 / check_positive("epsilon0", epsilon0), count=count)

    @property
    def epsilon0(self) -> float:
        return self.sensitivity / self.scale

    @property
    def noise_multiplier(self) -> float:
        """Laplace scale over the L1 distance of the neighbouring histograms: each answer is 1/m pure DP."""
        return self.scale / self.sensitivity

    def describe(self) -> str:
        return (f"{self.title}: {count_of(self.count, 'query', 'queries')}, Laplace scale {self.scale:g} "
                f"(epsilon0 = {self.epsilon0:.4g} each)")

    def to_dp_event(self) -> "dp_accounting.DpEvent":
        dp = _dp()
        return dp.SelfComposedDpEvent(dp.LaplaceDpEvent(self.noise_multiplier), self.count)

    def strict_price(self, delta: float, details: bool = True) -> StrictPrice:
        m = self.noise_multiplier
        price = StrictPrice(self.to_dp_event(), pure=self.count * self.epsilon0, details={"noise_multiplier": m})
        if details and self.sensitivity == 2.0 and self.count > 0:
            # hard one-hot votes move +1 on one class and -1 on another: the noisy histogram's RDP is
            # 2x the RDP of a unit shift at scale b, a smaller (still valid) bound; shown, not used.
            dp = _dp()
            hard = dp.SelfComposedDpEvent(dp.LaplaceDpEvent(self.scale), 2 * self.count)
            price.details["epsilon_if_votes_are_hard_one_hot"] = rdp_to_epsilon(rdp_curve(hard), delta)[0]
        price.notes.append("data-independent RDP of Laplace noisy argmax (L1 sensitivity "
                           f"{self.sensitivity:g}, each answer {self.epsilon0:.4g}-DP), dp-accounting LaplaceDpEvent"
                           f"(noise_multiplier={m:g}) composed {self.count} times")
        return price

    def paper_claims(self) -> tuple[PaperClaim, ...]:
        return (AdvancedComposition(self.epsilon0, self.count),)

    def data_dependent_rdp(self, stats: Any) -> "np.ndarray":
        import numpy as np

        votes = _checked_votes(self, stats)
        dd = pate.rdp_pure_data_dependent(pate.log_q_lnmax(votes, self.scale), self.epsilon0, ORDERS)
        dd = np.minimum(dd, rdp_curve(_dp().LaplaceDpEvent(self.noise_multiplier))[None, :])
        return dd.sum(axis=0)


@dataclass(frozen=True)
class GaussianQueries(PrivacyEvent, type_name="gaussian-queries", legacy_type_names=("gnmax",),
                      title="Gaussian queries (GNMax)", count_field="count", noise_field="sigma"):
    """``count`` Gaussian noisy-argmax answers (GNMax, Papernot et al. 2018), noise N(0, sigma^2).

    One replaced record moves one teacher's vote: the histogram changes by L2 norm sqrt(2).
    strict: dp-accounting ``GaussianDpEvent(sigma / sqrt(2))`` composed ``count`` times; paper: the same RDP,
    λ/σ² per answer, converted by PATE 2018's printed conversion.
    """

    sigma: float
    count: int
    sensitivity: float = math.sqrt(2.0)

    def __post_init__(self) -> None:
        self._set(sigma=check_positive("sigma", self.sigma), count=check_count("queries", self.count),
                  sensitivity=checked_sensitivity(self.sensitivity, math.sqrt(2.0), "GNMax"))

    @property
    def noise_multiplier(self) -> float:
        return self.sigma / self.sensitivity

    def describe(self) -> str:
        return f"{self.title}: {count_of(self.count, 'query', 'queries')}, sigma {self.sigma:g}"

    def to_dp_event(self) -> "dp_accounting.DpEvent":
        dp = _dp()
        return dp.SelfComposedDpEvent(dp.GaussianDpEvent(self.noise_multiplier), self.count)

    def strict_price(self, delta: float, details: bool = True) -> StrictPrice:
        m = self.noise_multiplier
        return StrictPrice(self.to_dp_event(), details={"noise_multiplier": m},
                           notes=[f"data-independent GNMax RDP (L2 sensitivity {self.sensitivity:.4g}): "
                                  f"GaussianDpEvent(noise_multiplier={m:.4g}) x {self.count}"])

    def paper_claims(self) -> tuple[PaperClaim, ...]:
        return (PateRdp((self.count * ORDERS * self.sensitivity**2 / (2.0 * self.sigma**2),)),)

    def data_dependent_rdp(self, stats: Any) -> "np.ndarray | None":
        votes = _checked_votes(self, stats)
        if not math.isclose(self.sensitivity, math.sqrt(2.0)):  # PATE's bounds are derived for sqrt(2)
            return None
        return pate.rdp_gnmax_data_dependent(pate.log_q_gnmax(votes, self.sigma), self.sigma, ORDERS).sum(axis=0)


@dataclass(frozen=True)
class ConfidentGaussianQueries(PrivacyEvent, type_name="confident-gaussian-queries", count_field="count",
                               legacy_type_names=("confident-gnmax",), noise_field="sigma2",
                               title="Confident Gaussian queries (Confident-GNMax)"):
    """Confident-GNMax (Papernot et al. 2018, Alg. 1): ``count`` Gaussian threshold checks
    ``max(votes) + N(0, sigma1^2) >= threshold``, of which ``answered`` went on to a Gaussian noisy-argmax answer
    with noise N(0, sigma2^2). Every check costs budget, answered or not; ``answered=None`` means
    "not known yet" and is priced as if every query were answered (worst case).

    ``filter_budget``: the queries were asked under an RDP privacy filter (Feldman & Zrnic, NeurIPS 2021,
    Thm 3.1) whose budget is the RDP curve of ``filter_budget`` queries all answered: the run kept checking
    queries while the realised cost (every check, and the GNMax step of the answered ones) plus one more
    worst-case query stayed within that curve, so ``count`` may exceed ``filter_budget`` when few are answered.
    The filter makes the budget a guarantee fixed before the run, whatever the realised counts.

    strict: (``GaussianDpEvent(sigma1)`` check + ``GaussianDpEvent(sigma2 / sqrt(2))`` answer) for every query, or
    for the filter's budget; paper: PATE 2018's RDP of every check and of the answered queries only.
    """

    threshold: float
    sigma1: float
    sigma2: float
    count: int
    answered: int | None = None
    filter_budget: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.threshold, (int, float)) or isinstance(self.threshold, bool) \
                or not math.isfinite(self.threshold):
            raise PrivacyError(f"threshold must be a finite number, got {self.threshold!r}")
        self._set(threshold=float(self.threshold), sigma1=check_positive("sigma1", self.sigma1),
                  sigma2=check_positive("sigma2", self.sigma2), count=check_count("queries", self.count))
        if self.answered is not None:
            answered = check_count("answered", self.answered)
            if answered > self.count:
                raise PrivacyError(f"answered ({answered}) cannot exceed the number of queries ({self.count})")
            self._set(answered=answered)
        if self.filter_budget is not None:
            self._set(filter_budget=check_count("filter_budget", self.filter_budget, minimum=1))
            # the filter asks a query only if one more worst-case query fits: with none answered, the last
            # check was asked with room for an answer too
            room = 0.0 if self.answered_or_worst_case or not self.count else self.round_costs[1]
            if self.realised_cost + room > self.filter_budget * sum(self.round_costs) * (1 + 1e-9):
                raise PrivacyError(f"{self.count} checks with {self.answered_or_worst_case} answered cost more than "
                                   f"the filter's budget of {self.filter_budget} answered queries allows")

    @property
    def answered_or_worst_case(self) -> int:
        return self.count if self.answered is None else self.answered

    @property
    def round_costs(self) -> tuple[float, float]:
        """RDP per order λ of one threshold check (max(votes) moves by at most 1: λ/(2σ1²)) and of one GNMax
        answer (the histogram moves by √2: λ/σ2²), as multiples of λ: both are linear in λ, so one number
        compares costs at every order at once (what makes the filter's stopping rule a scalar one)."""
        return 1.0 / (2.0 * self.sigma1 ** 2), 1.0 / self.sigma2 ** 2

    @property
    def realised_cost(self) -> float:
        """The run's RDP / λ: every check, and the answer step of the answered queries (all, if unknown)."""
        check, answer = self.round_costs
        return self.count * check + self.answered_or_worst_case * answer

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if out["filter_budget"] is None:  # a run without the filter records what it recorded before the option
            del out["filter_budget"]
        return out

    def with_count(self, n: int) -> "ConfidentGaussianQueries":
        return replace(self, count=n, answered=None, filter_budget=None)

    def merge_key(self) -> Hashable:
        d = {k: v for k, v in self.to_dict().items() if k not in ("count", "answered", "filter_budget")}
        # filtered runs merge with filtered ones (their budgets add: filters composed in sequence)
        return tuple(sorted((k, repr(v)) for k, v in d.items())) + (("filtered", self.filter_budget is not None),)

    def merged(self, other: PrivacyEvent) -> "ConfidentGaussianQueries":
        assert isinstance(other, ConfidentGaussianQueries)
        out = self.with_count(self.count + other.count)
        if other.filter_budget is not None:  # a filter's realised cost must stay checkable: unknown answers count
            return replace(out, answered=self.answered_or_worst_case + other.answered_or_worst_case,
                           filter_budget=self.filter_budget + other.filter_budget)  # type: ignore[operator]
        unknown = self.answered is None or other.answered is None
        return replace(out, answered=None if unknown else self.answered + other.answered)  # type: ignore[operator]

    def describe(self) -> str:
        ans = "answers not known (all counted)" if self.answered is None else f"{self.answered} answered"
        filtered = "" if self.filter_budget is None else \
            f", under an RDP filter with the budget of {self.filter_budget} answered queries"
        return (f"{self.title}: {count_of(self.count, 'query', 'queries')} ({ans}), threshold {self.threshold:g}, "
                f"sigma1 {self.sigma1:g}, sigma2 {self.sigma2:g}{filtered}")

    def _round(self) -> list["dp_accounting.DpEvent"]:
        """One query in the worst case: the check (sensitivity 1) and the answer (sensitivity √2)."""
        dp = _dp()
        return [dp.GaussianDpEvent(self.sigma1), dp.GaussianDpEvent(self.sigma2 / math.sqrt(2.0))]

    def to_dp_event(self) -> "dp_accounting.DpEvent":
        dp = _dp()
        rounds = self.count if self.filter_budget is None else self.filter_budget
        return dp.SelfComposedDpEvent(dp.ComposedDpEvent(self._round()), rounds)

    def strict_price(self, delta: float, details: bool = True) -> StrictPrice:
        # Whether a query's second step runs depends on the first step's (released) outcome, so the cost of a
        # run is chosen adaptively. Summing only the answered queries' costs is a privacy odometer reading,
        # not a guarantee fixed in advance. Two valid bounds: every query priced as answered (the worst case of
        # a fixed number of checks), or, for a run under an RDP filter (Feldman & Zrnic 2021, Thm 3.1), the
        # filter's budget, fixed before the run, which the realised cost never exceeds (__post_init__).
        price = StrictPrice(self.to_dp_event())
        filtered = self.filter_budget is not None
        if filtered:
            price.notes.append(f"RDP filter (Feldman & Zrnic 2021): the run asked queries while its cost stayed "
                               f"within the RDP of {self.filter_budget} queries all answered (sigma1={self.sigma1:g}, "
                               f"sigma2={self.sigma2:g}); that budget is the bound, whatever was answered")
        else:
            price.notes.append(f"every threshold check costs (sensitivity 1, sigma1={self.sigma1:g}): {self.count} "
                               f"checks; GNMax cost (sigma2={self.sigma2:g}) for all {self.count} queries, answered "
                               "or not (the answered count is chosen by the mechanism itself: a fixed-in-advance "
                               "bound must price the worst case)")
        if details and self.answered is not None:
            dp = _dp()
            check, answer = self._round()
            odometer = dp.ComposedDpEvent([dp.SelfComposedDpEvent(check, self.count),
                                           dp.SelfComposedDpEvent(answer, self.answered)])
            realised, _ = rdp_to_epsilon(rdp_curve(odometer), delta)
            price.details["epsilon_realised_answered_only"] = realised
            price.notes.append(f"{self.answered} of {self.count} checks answered: their own cost is {realised:.4g} "
                               "(an odometer reading, within the budget)" if filtered else
                               f"{self.answered} of {self.count} answered: counting only those gives {realised:.4g} "
                               "(an odometer reading, not a guarantee; PATE 2018 reports this)")
        return price

    def paper_claims(self) -> tuple[PaperClaim, ...]:
        # PATE 2018's practice: the answered queries' GNMax cost only (what strict calls an odometer reading)
        return (PateRdp((self.count * ORDERS / (2.0 * self.sigma1**2),
                         self.answered_or_worst_case * ORDERS / self.sigma2**2)),)

    def data_dependent_rdp(self, stats: Any) -> "np.ndarray":
        import numpy as np

        votes = _checked_votes(self, stats)
        if stats.answered is None:
            raise PrivacyError("Confident-GNMax data-dependent accounting needs the answered mask")
        answered = np.asarray(stats.answered, dtype=bool).reshape(-1)
        if answered.shape[0] != self.count:
            raise PrivacyError(f"mismatched answered mask: {answered.shape[0]} entries for {self.count} queries")
        step1 = pate.rdp_threshold_data_dependent(
            pate.log_pr_answered(votes, self.threshold, self.sigma1), self.sigma1, ORDERS).sum(axis=0)
        if answered.any():
            step2 = pate.rdp_gnmax_data_dependent(
                pate.log_q_gnmax(votes[answered], self.sigma2), self.sigma2, ORDERS).sum(axis=0)
        else:
            step2 = np.zeros_like(ORDERS)
        return step1 + step2


# --------------------------------------------------------------------------------- randomized response
def _label_checks(event: Any) -> None:
    event._set(epsilon=check_positive("epsilon per label", event.epsilon), count=check_count("labels", event.count),
               num_classes=check_count("num_classes", event.num_classes, minimum=2))


def _per_label_claims(event: Any) -> tuple[PaperClaim, ...]:
    """SRR's printed claim, for every label mechanism: ε per label, nothing for no label."""
    return (PerLabel(event.epsilon),) if event.count > 0 else ()


@dataclass(frozen=True)
class RandomizedResponse(PrivacyEvent, type_name="randomized-response", legacy_type_names=("rr",),
                         title="Randomized response (k-RR)", count_field="count", noise_field="epsilon",
                         noise_is_scale=False):
    """``count`` labels released by k-ary randomized response (keep with prob e^eps/(e^eps+K-1), else a uniform
    other class).

    strict: the labels come from one teacher trained on all of D, so one record can change every label: dp-accounting's
    exact k-ary ``RandomizedResponseDpEvent`` (REPLACE_ONE) composed ``count`` times, or basic composition when
    smaller; paper: SRR's ε per label, no composition.
    """

    epsilon: float
    count: int
    num_classes: int

    def __post_init__(self) -> None:
        _label_checks(self)

    def describe(self) -> str:
        return f"{self.title}: {self.count} labels, epsilon {self.epsilon:g} per label, K = {self.num_classes}"

    def to_dp_event(self) -> "dp_accounting.DpEvent":
        dp = _dp()
        k = self.num_classes
        return dp.SelfComposedDpEvent(
            dp.RandomizedResponseDpEvent(noise_parameter=randomized_response_parameter(self.epsilon, k), num_buckets=k),
            self.count)

    def strict_price(self, delta: float, details: bool = True) -> StrictPrice:
        return StrictPrice(self.to_dp_event(), units=DP_REPLACE_ONE, pure=self.count * self.epsilon,
                           notes=[f"k-RR with K={self.num_classes}: each label {self.epsilon:g}-DP; composed over all "
                                  f"{self.count} labels (exact k-RR RDP, dp-accounting RandomizedResponseDpEvent)"])

    def paper_claims(self) -> tuple[PaperClaim, ...]:
        return _per_label_claims(self)


@dataclass(frozen=True)
class RandomizedResponseWithPrior(PrivacyEvent, type_name="randomized-response-with-prior", legacy_type_names=("srr",),
                                  title="Randomized response with a prior (SRR)", count_field="count",
                                  noise_field="epsilon", noise_is_scale=False):
    """``count`` labels released by randomized response on a candidate set I chosen from a prior without looking
    at the label: k-RR on I, uniform on I when the label is not in I. Selective randomized response (the SRR
    paper's Alg. 1, I = the prior's classes above a threshold, at least two) and RRWithPrior (Ghazi et al. 2021,
    I = the prior's top k*) are such mechanisms; plain k-RR is the case I = all K classes.

    Each label is ε-DP in the label it hides whatever I is, but I may have two members and the out-of-I branch is
    not k-RR, so dp-accounting's k-ary event does not describe it: the strict accounting prices each label as
    BINARY randomized response with parameter ε, the worst case of any ε-DP release (Kairouz, Oh & Viswanath
    2015). The paper's price is ε per label, with no composition over labels; the two differ by design.

    ``setting="data-free"`` (the SRR method: the labels are the teacher's answers on synthetic inputs; the teacher
    was trained on all of D, so one private record can change every label: composed ``count`` times) or
    ``setting="label-dp"`` (paper Table II: real private inputs, only labels protected, each record's label
    released once; neighbouring relation "change one label": one release, by parallel composition).
    """

    epsilon: float
    count: int
    num_classes: int
    setting: str = "data-free"

    def __post_init__(self) -> None:
        _label_checks(self)
        check_choice("SRR setting", self.setting, ("data-free", "label-dp"))

    @property
    def relation(self) -> str:
        return CHANGE_LABEL if self.setting == "label-dp" else REPLACE_ONE

    def describe(self) -> str:
        return (f"Randomized response with a prior (SRR, {self.setting}): {self.count} labels, epsilon "
                f"{self.epsilon:g} per label, K = {self.num_classes}")

    def to_dp_event(self) -> "dp_accounting.DpEvent":
        dp = _dp()
        binary = dp.RandomizedResponseDpEvent(noise_parameter=randomized_response_parameter(self.epsilon, 2),
                                              num_buckets=2)
        # label-DP: a changed label is released once, however many labels the event counts
        return binary if self.setting == "label-dp" else dp.SelfComposedDpEvent(binary, self.count)

    def strict_price(self, delta: float, details: bool = True) -> StrictPrice:
        if self.setting == "label-dp":
            return StrictPrice(self.to_dp_event(), units=DP_REPLACE_ONE, pure=self.epsilon, relation=CHANGE_LABEL,
                               notes=["label-DP setting: each record's label is released once, so changing one label "
                                      f"affects one release: {self.epsilon:g}-label-DP (parallel composition)"])
        return StrictPrice(self.to_dp_event(), units=DP_REPLACE_ONE, pure=self.count * self.epsilon,
                           notes=[f"the teacher is trained on all of D, so one record can change all {self.count} "
                                  f"labels; each label is {self.epsilon:g}-DP in the teacher's argmax (whatever the "
                                  "selected set I), priced as binary randomized response, the worst case of any eps-DP "
                                  "release"])

    def paper_claims(self) -> tuple[PaperClaim, ...]:
        return _per_label_claims(self)


# ------------------------------------------------------------------------------ noisy normalised gradients
@dataclass(frozen=True)
class NormalisedGaussian(PrivacyEvent, type_name="normalised-gaussian", legacy_type_names=("dpdfd",),
                         title="Gaussian on normalised gradients (DPDFD)", count_field="steps", noise_field="sigma"):
    """``steps`` uses of DPDFD's A_{C,sigma}: the Gaussian mechanism on normalised gradients (each output gradient
    scaled to norm C, noise N(0, sigma^2 C^2 I) added).

    ``algorithm``: 1 = single teacher (DPDFD Alg. 1), 2 = n disjoint teachers (Alg. 2),
    3 = direct training on private data with Poisson sampling (Alg. 3, needs ``dataset_size``).
    ``granularity``: "per_sample" (one noisy K-vector per synthetic sample, the default) or
    "batch_sum" (the literal Eq. 4: one noisy K-vector per batch).
    ``num_classes`` is only used to state the alternative reading of the paper's Lemma 1.

    strict: ``GaussianDpEvent(noise_multiplier)`` composed ``steps`` times (the multiplier from what one record can
    change, see :attr:`noise_multiplier`); Alg. 3 is not DP as written (``NonPrivateDpEvent``), its noisy channel
    alone a Poisson-subsampled Gaussian priced by dp-accounting's PLD. paper: DPDFD's Theorem 3 as printed.
    """

    clip_norm: float
    sigma: float
    batch_size: int
    steps: int
    num_teachers: int = 1
    granularity: str = "per_sample"
    algorithm: int = 1
    dataset_size: int | None = None
    num_classes: int | None = None

    def __post_init__(self) -> None:
        self._set(clip_norm=check_positive("clip norm C", self.clip_norm), sigma=check_positive("sigma", self.sigma),
                  batch_size=check_count("batch size", self.batch_size, minimum=1),
                  steps=check_count("steps", self.steps),
                  num_teachers=check_count("num_teachers", self.num_teachers, minimum=1))
        check_choice("granularity", self.granularity, ("per_sample", "batch_sum"))
        check_choice("algorithm", self.algorithm, (1, 2, 3))
        if self.algorithm in (1, 3) and self.num_teachers != 1:
            raise PrivacyError(f"DPDFD Alg. {self.algorithm} uses one model; got num_teachers={self.num_teachers} "
                               "(use algorithm=2 for several teachers)")
        if self.algorithm == 3 and self.dataset_size is None:
            raise PrivacyError("DPDFD Alg. 3 (direct training) needs dataset_size for the sampling rate B/N")
        if self.dataset_size is not None:
            self._set(dataset_size=check_count("dataset_size", self.dataset_size, minimum=1))
            if self.algorithm == 3 and self.dataset_size < self.batch_size:
                raise PrivacyError(f"dataset_size ({self.dataset_size}) must be >= batch size ({self.batch_size})")
        if self.num_classes is not None:
            self._set(num_classes=check_count("num_classes", self.num_classes, minimum=2))

    @property
    def sampling_rate(self) -> float | None:
        return None if self.dataset_size is None or self.algorithm != 3 else self.batch_size / self.dataset_size

    @property
    def noise_multiplier(self) -> float:
        """Noise std divided by the L2 sensitivity of one step's release (replace-one; see docs/privacy.md).

        A normalised vector C*g/(||g||+e) has norm < C, so replacing it moves it by at most 2C.
        Alg. 1: one record can change the single teacher, hence every row of every step.
        Alg. 2: one record changes one of the n disjoint teachers, whose normalised gradient enters the
        sum of EVERY row of the batch (the same teachers answer every sample).
        per_sample:  B rows move by <= 2C each -> sensitivity 2C*sqrt(B) vs noise sigma*C per entry.
        batch_sum:   the sum over B rows moves by <= 2CB -> vs noise sigma*C.
        Alg. 3 (one record = one row, when sampled): 2C vs sigma*C, i.e. multiplier sigma/2 in these units.
        """
        if self.algorithm == 3:
            return self.sigma / 2.0
        if self.granularity == "per_sample":
            return self.sigma / (2.0 * math.sqrt(self.batch_size))
        return self.sigma / (2.0 * self.batch_size)

    def describe(self) -> str:
        who = {1: "Alg. 1, one teacher", 2: f"Alg. 2, {self.num_teachers} teachers",
               3: f"Alg. 3, direct training, q = {self.batch_size}/{self.dataset_size}"}[self.algorithm]
        return (f"Gaussian on normalised gradients (DPDFD {who}, {self.granularity}): {self.steps} steps, "
                f"B = {self.batch_size}, C = {self.clip_norm:g}, sigma = {self.sigma:g}")

    def to_dp_event(self) -> "dp_accounting.DpEvent":
        dp = _dp()
        if self.algorithm == 3:
            # the noisy output gradient is back-propagated through the Jacobian at the private input, which is not
            # privatised: nothing bounds what a step reveals
            return dp.NonPrivateDpEvent() if self.steps > 0 else dp.NoOpDpEvent()
        return dp.SelfComposedDpEvent(dp.GaussianDpEvent(self.noise_multiplier), self.steps)

    def strict_price(self, delta: float, details: bool = True) -> StrictPrice:
        m = self.noise_multiplier
        if self.algorithm == 3:
            if self.steps == 0:
                return StrictPrice(self.to_dp_event(), notes=["no steps taken"])
            price = StrictPrice(self.to_dp_event(), infinite=True, notes=[
                "Alg. 3 back-propagates the noisy output gradient through the model's Jacobian at the PRIVATE input, "
                "which is not privatised: not DP as written (student: not covered)"])
            if details:  # the PLD computation is slow for long runs: only for breakdowns
                q = self.sampling_rate
                channel = pld_poisson_gaussian_replace_one(self.sigma, q, self.steps, delta)
                price.details.update(noise_multiplier=m, sampling_rate=q, gradient_channel_epsilon=channel)
                price.notes.append(f"the noisy-gradient channel alone (Poisson rate q={q:.4g}, row sensitivity 2C vs "
                                   f"noise sigma*C, dp-accounting PLD, replace-one) has epsilon {channel:.4g}")
            return price
        who = ("one teacher: a record can change every normalised gradient of every step"
               if self.algorithm == 1 else
               f"{self.num_teachers} disjoint teachers: a record changes one teacher, which answers every row")
        sensitivity = "2C*sqrt(B)" if self.granularity == "per_sample" else "2C*B"
        return StrictPrice(self.to_dp_event(), details={"noise_multiplier_per_step": m}, notes=[
            f"{who}; per step L2 sensitivity {sensitivity} vs noise sigma*C: Gaussian noise multiplier {m:.4g} x "
            f"{self.steps} steps"])

    def paper_claims(self) -> tuple[PaperClaim, ...]:
        # Theorem 3's RDP 2 C^2 n B T lambda / sigma^2, with n read as the number of teachers (1 for Alg. 1 and 3),
        # per the project's decision; Lemma 1's n = K (gradient length) is stated beside it when K is known.
        b, t, sigma2 = self.batch_size, self.steps, self.sigma**2
        coefficient = 2.0 * self.clip_norm**2 * self.num_teachers * b * t / sigma2
        alternative = (None if self.num_classes is None else
                       2.0 * self.clip_norm**2 * self.num_classes * b * t / sigma2)
        remarks = () if self.algorithm != 3 else (
            "DPDFD prices Alg. 3 with the same Theorem 3 (no sampling credit); the paper does not account for the "
            "Jacobian at private inputs",)
        return (Theorem3(coefficient, alternative, remarks=remarks),)


# ------------------------------------------------------------------------------ Poisson-subsampled Gaussian
@dataclass(frozen=True)
class SubsampledGaussian(PrivacyEvent, type_name="subsampled-gaussian", legacy_type_names=("dpsgd",),
                         title="Poisson-subsampled Gaussian (DP-SGD)", count_field="steps",
                         noise_field="noise_multiplier"):
    """A model trained by DP-SGD on the private data inside a run (the DP source of an end-to-end release):
    ``steps`` Poisson-subsampled Gaussian steps at ``sample_rate``, Gaussian noise multiplier ``noise_multiplier``
    (clipped per-example gradients: one replaced record moves the sum by at most 2C, against noise σC).

    It is priced at its own share ``delta`` of the run's δ by dp-accounting's PLD accountant (replace-one, as
    methods/dpsgd.py calibrates it), and composed with the rest of the run by basic composition: the run's ε is
    this ε plus the others' ε at the δ that remains (privacy/accounting.py). Both accountings price it alike:
    no paper has a formula for it."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    delta: float
    what: str = "DP-SGD source model"

    def __post_init__(self) -> None:
        self._set(noise_multiplier=check_positive("noise multiplier", self.noise_multiplier),
                  steps=check_count("steps", self.steps))
        if not 0 < self.sample_rate <= 1:
            raise PrivacyError(f"sample rate must lie in (0, 1], got {self.sample_rate}")
        if not 0 < self.delta < 1:
            raise PrivacyError(f"the DP-SGD event's delta share must lie in (0, 1), got {self.delta}")

    def describe(self) -> str:
        return (f"{self.what}: {self.title}, {self.steps} steps, Poisson rate {self.sample_rate:.4g}, noise "
                f"multiplier {self.noise_multiplier:.4g}, priced at delta {self.delta:g}")

    def to_dp_event(self) -> "dp_accounting.DpEvent":
        dp = _dp()
        return dp.SelfComposedDpEvent(
            dp.PoissonSampledDpEvent(self.sample_rate, dp.GaussianDpEvent(self.noise_multiplier)), self.steps)

    def priced_alone(self) -> tuple[float, float]:
        """(ε, δ) at the event's own δ share: dp-accounting's PLD of :meth:`to_dp_event`, REPLACE_ONE."""
        return pld_poisson_gaussian_replace_one(self.noise_multiplier, self.sample_rate, self.steps,
                                                self.delta), self.delta

    def strict_price(self, delta: float, details: bool = True) -> StrictPrice:
        fixed = self.priced_alone()
        return StrictPrice(
            fixed=fixed,
            notes=[f"{self.what}: every access to the private data is a clipped, noised gradient; dp-accounting PLD "
                   f"(replace-one) gives ({fixed[0]:.4g}, {self.delta:g}); added to the rest by basic composition, "
                   "which is then priced at the remaining delta"])

    def paper_claims(self) -> tuple[PaperClaim, ...]:
        e, d = self.priced_alone()  # no paper prices it: as the strict accountant does
        return (PricedAlone(e, d, remarks=(f"{self.what}: ({e:.4g}, {d:g}) by dp-accounting PLD (replace-one), "
                                           "as strict",)),)


# ------------------------------------------------------------------------------ noise on synthetic samples
@dataclass(frozen=True)
class LaplaceOnSyntheticCodes(PrivacyEvent, type_name="laplace-on-synthetic-codes", noise_field="epsilon1",
                              legacy_type_names=("latent-laplace",), noise_is_scale=False,
                              title="Laplace noise on synthetic latent codes (DGD)"):
    """DGD's Laplace noise (scale 2c/epsilon1) on the clipped VAE latent codes of SYNTHETIC samples.

    The paper counts ``epsilon1`` in its total; these codes are not private records, so the strict
    accounting gives this event no cost and no credit (dp-accounting's ``NoOpDpEvent``; see docs/privacy.md).
    """

    epsilon1: float
    dim: int | None = None
    clip: float = 1.0

    def __post_init__(self) -> None:
        self._set(epsilon1=check_positive("epsilon1", self.epsilon1))
        if self.dim is not None:
            self._set(dim=check_count("latent dimension", self.dim, minimum=1))
        self._set(clip=check_positive("latent clip", self.clip))

    def describe(self) -> str:
        return f"{self.title}, epsilon1 = {self.epsilon1:g}"

    def to_dp_event(self) -> "dp_accounting.DpEvent":
        return _dp().NoOpDpEvent()  # it reads no private record

    def strict_price(self, delta: float, details: bool = True) -> StrictPrice:
        # pure 0: an event of no cost keeps basic composition available to the pure events it is composed with
        return StrictPrice(self.to_dp_event(), pure=0.0, notes=[
            "no cost and no credit: the noise perturbs latent codes of SYNTHETIC samples, not private records; the "
            "private data reach these samples through the non-private baseline and generator, a pathway no epsilon "
            "covers"])

    def paper_claims(self) -> tuple[PaperClaim, ...]:
        return (AddedAsPrinted(self.epsilon1),)


def as_events(items: Any) -> list[PrivacyEvent]:
    """Accept events or their dicts; a single event is wrapped in a list."""
    if isinstance(items, (PrivacyEvent, Mapping)):
        items = [items]
    out = []
    for item in items:
        if isinstance(item, Mapping):
            item = event_from_dict(item)
        elif not isinstance(item, PrivacyEvent):
            raise PrivacyError(f"not a privacy event: {item!r}")
        out.append(item)
    return out
