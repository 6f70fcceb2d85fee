"""Accountants: the ``paper`` and the ``strict`` price of a list of privacy events.

Both are always computed and shown together (see docs/privacy.md for the derivations):

``paper``
    The formula each paper prints, reproduced as printed (including its errors), so that the
    papers' numbers can be checked: DGD's advanced-composition expression plus epsilon1; PATE 2018's
    data-independent GNMax RDP; DPDFD's Theorem 3; SRR's epsilon per label (no composition).
``strict``
    A correct (epsilon, delta) for the private training set under the replace-one neighbouring
    relation, built on dp-accounting's RDP accountant (Gaussian, Laplace and randomized-response
    events, RDP-to-(eps, delta) conversion of Canonne-Kamath-Steinke / Asoodeh et al.), with the
    corrections of the method notes. Optionally, PATE's data-dependent bounds from recorded votes
    (never the headline: releasing them needs smooth sensitivity).

Accountants live behind a tiny registry (Opacus-style)::

    get_accountant("strict").epsilon(events, delta=1e-5)
    epsilon(events, delta=1e-5, accounting="paper")
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import numpy as np

from privdistill.errors import PrivacyError
from privdistill.privacy import pate
from privdistill.privacy._checks import check_accounting, check_delta
from privdistill.privacy.events import (
    ConfidentGNMaxQueries,
    DPDFDSteps,
    DPSGDTraining,
    GNMaxQueries,
    LatentLaplace,
    LNMaxQueries,
    PrivacyEvent,
    RRLabels,
    SRRLabels,
    as_events,
)

if TYPE_CHECKING:
    import dp_accounting

# dp-accounting (and through it scipy.stats) is imported where an ε is computed, not here: the command line imports
# this module to print its help, and that import alone took 2.5 s on the 2-core AMD EPYC.

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


# ======================================================================================= results
@dataclass(frozen=True)
class EventEpsilon:
    """One event priced alone (at the same delta) under one accounting."""

    index: int
    type: str
    description: str
    epsilon: float
    notes: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "type": self.type, "description": self.description,
                "epsilon": _json_float(self.epsilon), "notes": list(self.notes),
                "details": {k: _json_float(v) for k, v in self.details.items()}}


@dataclass(frozen=True)
class EpsilonResult:
    """The epsilon of a composition of events at ``delta`` under one accounting."""

    value: float
    delta: float
    accounting: str
    relation: str
    method: str
    optimal_order: float | None
    events: tuple[EventEpsilon, ...]
    notes: tuple[str, ...] = ()
    #: strict only, when vote histograms were supplied: PATE data-dependent epsilon (NOT releasable
    #: without the smooth-sensitivity step, see notes)
    data_dependent: float | None = None

    def __float__(self) -> float:
        return float(self.value)

    def to_dict(self) -> dict[str, Any]:
        return {"accounting": self.accounting, "epsilon": _json_float(self.value), "delta": self.delta,
                "relation": self.relation, "method": self.method,
                "optimal_order": _json_float(self.optimal_order),
                "data_dependent_epsilon": _json_float(self.data_dependent),
                "events": [e.to_dict() for e in self.events], "notes": list(self.notes)}


def _json_float(x: Any) -> Any:
    """JSON has no infinity: write it as the string "inf" (read back by float("inf"))."""
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        if math.isnan(x):
            return None
    return x


@dataclass(frozen=True)
class VoteStats:
    """Data-dependent statistics of one PATE event, as recorded in the ledger.

    ``votes``: array [count, K] of vote histograms (one row per query, in order);
    ``answered``: bool array [count] for Confident-GNMax (which queries passed the threshold).
    These are functions of the private data: they stay in the run directory, never in a report.
    """

    votes: Any
    answered: Any = None


# =================================================================================== accountants
class Accountant(ABC):
    """Prices a list of events; subclasses register under a name."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @abstractmethod
    def epsilon(self, events: Sequence[PrivacyEvent] | PrivacyEvent, *, delta: float,
                stats: Sequence[VoteStats | None] | None = None, breakdown: bool = True) -> EpsilonResult:
        """Epsilon at ``delta`` of the composition of ``events``; ``breakdown=False`` skips pricing
        each event alone (faster, for budget checks)."""


_ACCOUNTANTS: dict[str, type[Accountant]] = {}


def register_accountant(cls: type[Accountant]) -> type[Accountant]:
    _ACCOUNTANTS[cls.name] = cls
    return cls


def available_accountants() -> tuple[str, ...]:
    return tuple(_ACCOUNTANTS)


def get_accountant(name: str) -> Accountant:
    """The accountant registered under ``name`` ("paper" or "strict")."""
    if name not in _ACCOUNTANTS:
        raise PrivacyError(f"unknown accounting {name!r}; choose one of {', '.join(_ACCOUNTANTS)}")
    return _ACCOUNTANTS[name]()


def epsilon(events: Sequence[PrivacyEvent] | PrivacyEvent, *, delta: float, accounting: str = "strict",
            stats: Sequence[VoteStats | None] | None = None, breakdown: bool = True) -> EpsilonResult:
    """Epsilon at ``delta`` of ``events`` under ``accounting`` ("paper" or "strict")."""
    check_accounting(accounting)
    return get_accountant(accounting).epsilon(events, delta=delta, stats=stats, breakdown=breakdown)


def both(events: Sequence[PrivacyEvent] | PrivacyEvent, *, delta: float,
         stats: Sequence[VoteStats | None] | None = None, breakdown: bool = True) -> dict[str, EpsilonResult]:
    """Both accountings, which are always shown together."""
    return {name: epsilon(events, delta=delta, accounting=name, stats=stats, breakdown=breakdown)
            for name in ("paper", "strict")}


def merge_events(events: Sequence[PrivacyEvent] | PrivacyEvent) -> list[PrivacyEvent]:
    """Merge events that differ only in their count (e.g. one ledger record per batch of queries)
    into one event per mechanism setting, keeping first-appearance order. For composed mechanisms
    epsilon is unchanged (the accountings depend on same-setting events only through their total count).
    One exception, by design: label-DP SRR events are priced once per event (each record's label is released
    once), so merging one run's stage events is what applies parallel composition across its stages; do not
    merge label-DP events of runs that may have released the same records' labels."""
    out: list[PrivacyEvent] = []
    index: dict[tuple, int] = {}
    for ev in as_events(events):
        if ev.count_field is None:
            out.append(ev)
            continue
        d = ev.to_dict()
        d.pop(ev.count_field)
        answered = d.pop("answered", None) if isinstance(ev, ConfidentGNMaxQueries) else None
        budget = d.pop("filter_budget", None) if isinstance(ev, ConfidentGNMaxQueries) else None
        # filtered runs merge with filtered ones (their budgets add: filters composed in sequence)
        sig = tuple(sorted((k, repr(v)) for k, v in d.items())) + (("filtered", budget is not None),)
        if sig not in index:
            index[sig] = len(out)
            out.append(ev)
            continue
        prev = out[index[sig]]
        merged = prev.with_count(prev.repetitions + ev.repetitions)
        if isinstance(ev, ConfidentGNMaxQueries):
            pa = prev.answered  # type: ignore[attr-defined]
            if budget is not None:  # a filter's realised cost must stay checkable: unknown answers count as all
                merged = replace(merged, answered=prev.answered_or_worst_case + ev.answered_or_worst_case,
                                 filter_budget=prev.filter_budget + budget)
            else:
                merged = replace(merged, answered=None if pa is None or answered is None else pa + answered)
        out[index[sig]] = merged
    return out


# ===================================================================================== RDP tools
def _rdp_of(dp_event: dp_accounting.DpEvent, relation: str = "add-remove") -> np.ndarray:
    """RDP curve at ORDERS of one dp-accounting event.

    ``relation`` selects dp-accounting's neighbouring relation. Gaussian and Laplace events are
    given in *normalised* units (noise multiplier = noise std / the full L2 or L1 distance between the
    two neighbouring outputs), for which dp-accounting's add/remove formulas are exactly the RDP of a
    shift by one unit; randomized response needs dp-accounting's REPLACE_ONE relation.
    """
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as _rdp

    rel = (dp_accounting.NeighboringRelation.REPLACE_ONE if relation == "replace-one"
           else dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc = _rdp.RdpAccountant(orders=ORDERS, neighboring_relation=rel)
    acc.compose(dp_event)
    out = acc.rdp
    out.setflags(write=False)  # cached: callers must not modify
    return out


@functools.lru_cache(maxsize=4096)
def _laplace_unit(noise_multiplier: float) -> np.ndarray:
    import dp_accounting

    return _rdp_of(dp_accounting.LaplaceDpEvent(noise_multiplier))


@functools.lru_cache(maxsize=4096)
def _gaussian_unit(noise_multiplier: float) -> np.ndarray:
    import dp_accounting

    return _rdp_of(dp_accounting.GaussianDpEvent(noise_multiplier))


@functools.lru_cache(maxsize=4096)
def _rr_unit(epsilon: float, buckets: int) -> np.ndarray:
    import dp_accounting

    # dp-accounting's RR: keep the input with prob 1-p, else uniform over the k buckets; the
    # likelihood ratio is k/p - k + 1 = e^eps  <=>  p = k / (e^eps + k - 1).
    p = buckets / (math.exp(epsilon) + buckets - 1.0) if epsilon < 700 else 0.0
    return _rdp_of(dp_accounting.RandomizedResponseDpEvent(noise_parameter=p, num_buckets=buckets),
                   "replace-one")


def rdp_to_epsilon(rdp: np.ndarray, delta: float) -> tuple[float, float | None]:
    """(epsilon, optimal order) from an RDP curve at ORDERS (dp-accounting's conversion)."""
    from dp_accounting.rdp import rdp_privacy_accountant as _rdp

    if np.all(rdp == 0):
        return 0.0, None
    if np.any(np.isinf(rdp)) and np.all(np.isinf(rdp)):
        return math.inf, None
    eps, order = _rdp.compute_epsilon(ORDERS, rdp, delta)
    return float(eps), float(order)


@functools.lru_cache(maxsize=256)
def pld_poisson_gaussian_replace_one(noise_multiplier: float, q: float, steps: int, delta: float) -> float:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    if steps == 0:
        return 0.0
    acc = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(noise_multiplier)), steps)
    return float(acc.get_epsilon(delta))


def strict_noise_multiplier(*, target_epsilon: float, delta: float, sample_rate: float, steps: int,
                            tolerance: float = 0.005) -> float:
    """Least σ (to `tolerance` in ε, on the safe side) whose replace-one PLD ε of `steps` Poisson-sampled Gaussian
    steps is <= target: how DP-SGD and the end-to-end DP sources calibrate under the strict accounting."""
    def eps(sigma: float) -> float:
        return pld_poisson_gaussian_replace_one(float(sigma), float(sample_rate), int(steps), float(delta))

    lo, hi = 0.0, 1.0
    while eps(hi) > target_epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            raise PrivacyError(f"no noise multiplier reaches epsilon {target_epsilon} at delta {delta}")
    while True:
        mid = (lo + hi) / 2
        e = eps(mid)
        if e <= target_epsilon:
            hi = mid
            if target_epsilon - e <= tolerance:
                return hi
        else:
            lo = mid
        if hi - lo < 1e-4:
            return hi


def dpdfd_strict_noise_multiplier(event: DPDFDSteps) -> float:
    """Noise std divided by the L2 sensitivity of one step's release (replace-one; see docs/privacy.md).

    A normalised vector C*g/(||g||+e) has norm < C, so replacing it moves it by at most 2C.
    Alg. 1: one record can change the single teacher, hence every row of every step.
    Alg. 2: one record changes one of the n disjoint teachers, whose normalised gradient enters the
    sum of EVERY row of the batch (the same teachers answer every sample).
    per_sample:  B rows move by <= 2C each -> sensitivity 2C*sqrt(B) vs noise sigma*C per entry.
    batch_sum:   the sum over B rows moves by <= 2CB -> vs noise sigma*C.
    Alg. 3 (one record = one row, when sampled): 2C vs sigma*C, i.e. multiplier sigma/2 in these units.
    """
    if event.algorithm == 3:
        return event.sigma / 2.0
    if event.granularity == "per_sample":
        return event.sigma / (2.0 * math.sqrt(event.batch_size))
    return event.sigma / (2.0 * event.batch_size)


# ================================================================================ strict accountant
@dataclass
class _Term:
    rdp: np.ndarray
    pure: float | None = None  # total pure-DP epsilon (basic composition), if the event is pure
    infinite: bool = False
    relation: str = REPLACE_ONE
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    fixed: tuple[float, float] | None = None  # an (epsilon, delta) priced on its own, added by basic composition


def dpsgd_fixed(ev: DPSGDTraining) -> tuple[float, float]:
    """A DP-SGD source's (epsilon, delta): dp-accounting PLD, replace-one, at the event's own delta share."""
    return pld_poisson_gaussian_replace_one(ev.noise_multiplier, ev.sample_rate, ev.steps, ev.delta), ev.delta


def _strict_term(ev: PrivacyEvent, delta: float, details: bool = True) -> _Term:
    zero = np.zeros_like(ORDERS)
    if isinstance(ev, LNMaxQueries):
        m = ev.scale / ev.sensitivity  # each answer is epsilon0 = 1/m pure DP
        t = _Term(rdp=ev.count * _laplace_unit(m), pure=ev.count * ev.epsilon0)
        t.details["noise_multiplier"] = m
        if details and ev.sensitivity == 2.0 and ev.count > 0:
            # hard one-hot votes move +1 on one class and -1 on another: the noisy histogram's RDP is
            # 2x the RDP of a unit shift at scale b, a smaller (still valid) bound; shown, not used.
            hv, _ = rdp_to_epsilon(2 * ev.count * _laplace_unit(ev.scale), delta)
            t.details["epsilon_if_votes_are_hard_one_hot"] = hv
        t.notes.append("data-independent RDP of Laplace noisy argmax (L1 sensitivity "
                       f"{ev.sensitivity:g}, each answer {ev.epsilon0:.4g}-DP), dp-accounting LaplaceDpEvent"
                       f"(noise_multiplier={m:g}) composed {ev.count} times")
        return t
    if isinstance(ev, GNMaxQueries):
        m = ev.sigma / ev.sensitivity
        t = _Term(rdp=ev.count * _gaussian_unit(m))
        t.details["noise_multiplier"] = m
        t.notes.append(f"data-independent GNMax RDP (L2 sensitivity {ev.sensitivity:.4g}): "
                       f"GaussianDpEvent(noise_multiplier={m:.4g}) x {ev.count}")
        return t
    if isinstance(ev, ConfidentGNMaxQueries):
        # Whether a query's second step runs depends on the first step's (released) outcome, so the cost of a
        # run is chosen adaptively. Summing only the answered queries' costs is a privacy odometer reading,
        # not a guarantee fixed in advance. Two valid bounds: every query priced as answered (the worst case of
        # a fixed number of checks), or, for a run under an RDP filter (Feldman & Zrnic 2021, Thm 3.1), the
        # filter's budget, fixed before the run, which the realised cost never exceeds (events.py).
        check = _gaussian_unit(ev.sigma1)
        answer = _gaussian_unit(ev.sigma2 / math.sqrt(2.0))
        filtered = ev.filter_budget is not None
        t = _Term(rdp=(ev.filter_budget if filtered else ev.count) * (check + answer))
        if filtered:
            t.notes.append(f"RDP filter (Feldman & Zrnic 2021): the run asked queries while its cost stayed within "
                           f"the RDP of {ev.filter_budget} queries all answered (sigma1={ev.sigma1:g}, "
                           f"sigma2={ev.sigma2:g}); that budget is the bound, whatever was answered")
        else:
            t.notes.append(f"every threshold check costs (sensitivity 1, sigma1={ev.sigma1:g}): {ev.count} checks; "
                           f"GNMax cost (sigma2={ev.sigma2:g}) for all {ev.count} queries, answered or not (the "
                           "answered count is chosen by the mechanism itself: a fixed-in-advance bound must price "
                           "the worst case)")
        if details and ev.answered is not None:
            realised, _ = rdp_to_epsilon(ev.count * check + ev.answered * answer, delta)
            t.details["epsilon_realised_answered_only"] = realised
            t.notes.append(f"{ev.answered} of {ev.count} checks answered: their own cost is {realised:.4g} "
                           "(an odometer reading, within the budget)" if filtered else
                           f"{ev.answered} of {ev.count} answered: counting only those gives {realised:.4g} (an "
                           "odometer reading, not a guarantee; PATE 2018 reports this)")
        return t
    if isinstance(ev, RRLabels):
        t = _Term(rdp=ev.count * _rr_unit(ev.epsilon, ev.num_classes), pure=ev.count * ev.epsilon)
        t.notes.append(f"k-RR with K={ev.num_classes}: each label {ev.epsilon:g}-DP; composed over all "
                       f"{ev.count} labels (exact k-RR RDP, dp-accounting RandomizedResponseDpEvent)")
        return t
    if isinstance(ev, SRRLabels):
        if ev.setting == "label-dp":
            t = _Term(rdp=_rr_unit(ev.epsilon, 2), pure=ev.epsilon, relation=CHANGE_LABEL)
            t.notes.append("label-DP setting: each record's label is released once, so changing one label "
                           f"affects one release: {ev.epsilon:g}-label-DP (parallel composition)")
            return t
        t = _Term(rdp=ev.count * _rr_unit(ev.epsilon, 2), pure=ev.count * ev.epsilon)
        t.notes.append(f"the teacher is trained on all of D, so one record can change all {ev.count} labels; "
                       f"each label is {ev.epsilon:g}-DP in the teacher's argmax (whatever the selected set I), "
                       "priced as binary randomized response, the worst case of any eps-DP release")
        return t
    if isinstance(ev, DPDFDSteps):
        m = dpdfd_strict_noise_multiplier(ev)
        if ev.algorithm == 3 and ev.steps > 0:
            q = ev.batch_size / ev.dataset_size
            t = _Term(rdp=zero.copy(), infinite=True)
            t.notes.append("Alg. 3 back-propagates the noisy output gradient through the model's Jacobian at "
                           "the PRIVATE input, which is not privatised: not DP as written (student: not covered)")
            if details:  # the PLD computation is slow for long runs: only for breakdowns
                channel = pld_poisson_gaussian_replace_one(ev.sigma, q, ev.steps, delta)
                t.details.update(noise_multiplier=m, sampling_rate=q, gradient_channel_epsilon=channel)
                t.notes.append(f"the noisy-gradient channel alone (Poisson rate q={q:.4g}, row sensitivity 2C vs "
                               f"noise sigma*C, dp-accounting PLD, replace-one) has epsilon {channel:.4g}")
            return t
        if ev.algorithm == 3:
            return _Term(rdp=zero.copy(), notes=["no steps taken"])
        t = _Term(rdp=ev.steps * _gaussian_unit(m))
        t.details["noise_multiplier_per_step"] = m
        who = ("one teacher: a record can change every normalised gradient of every step"
               if ev.algorithm == 1 else
               f"{ev.num_teachers} disjoint teachers: a record changes one teacher, which answers every row")
        t.notes.append(f"{who}; per step L2 sensitivity "
                       + ("2C*sqrt(B)" if ev.granularity == "per_sample" else "2C*B")
                       + f" vs noise sigma*C: Gaussian noise multiplier {m:.4g} x {ev.steps} steps")
        return t
    if isinstance(ev, DPSGDTraining):
        t = _Term(rdp=zero.copy(), fixed=dpsgd_fixed(ev))
        t.notes.append(f"{ev.what}: every access to the private data is a clipped, noised gradient; dp-accounting PLD "
                       f"(replace-one) gives ({t.fixed[0]:.4g}, {ev.delta:g}); added to the rest by basic composition, "
                       "which is then priced at the remaining delta")
        return t
    if isinstance(ev, LatentLaplace):
        t = _Term(rdp=zero.copy(), pure=0.0)
        t.notes.append("no cost and no credit: the noise perturbs latent codes of SYNTHETIC samples, not private "
                       "records; the private data reach these samples through the non-private baseline and "
                       "generator, a pathway no epsilon covers")
        return t
    raise PrivacyError(f"the strict accountant does not know events of type {type(ev).__name__}")


def _data_dependent_rdp(ev: PrivacyEvent, st: VoteStats) -> np.ndarray | None:
    """Sum over queries of PATE's data-dependent RDP curves, or None if not applicable."""
    votes = pate.check_votes(st.votes)
    if isinstance(ev, (LNMaxQueries, GNMaxQueries, ConfidentGNMaxQueries)):
        if votes.shape[0] != ev.count:
            raise PrivacyError(f"mismatched votes: {votes.shape[0]} vote rows for an event of {ev.count} queries")
    if isinstance(ev, LNMaxQueries):
        logq = pate.log_q_lnmax(votes, ev.scale)
        dd = pate.rdp_pure_data_dependent(logq, ev.epsilon0, ORDERS)
        dd = np.minimum(dd, _laplace_unit(ev.scale / ev.sensitivity)[None, :])
        return dd.sum(axis=0)
    if isinstance(ev, GNMaxQueries):
        if not math.isclose(ev.sensitivity, math.sqrt(2.0)):
            return None
        return pate.rdp_gnmax_data_dependent(pate.log_q_gnmax(votes, ev.sigma), ev.sigma, ORDERS).sum(axis=0)
    if isinstance(ev, ConfidentGNMaxQueries):
        if st.answered is None:
            raise PrivacyError("Confident-GNMax data-dependent accounting needs the answered mask")
        answered = np.asarray(st.answered, dtype=bool).reshape(-1)
        if answered.shape[0] != ev.count:
            raise PrivacyError(f"mismatched answered mask: {answered.shape[0]} entries for {ev.count} queries")
        step1 = pate.rdp_threshold_data_dependent(
            pate.log_pr_answered(votes, ev.threshold, ev.sigma1), ev.sigma1, ORDERS).sum(axis=0)
        if answered.any():
            step2 = pate.rdp_gnmax_data_dependent(
                pate.log_q_gnmax(votes[answered], ev.sigma2), ev.sigma2, ORDERS).sum(axis=0)
        else:
            step2 = np.zeros_like(ORDERS)
        return step1 + step2
    return None


@register_accountant
class StrictAccountant(Accountant):
    name = "strict"
    description = ("correct (eps, delta) for the private training set, replace-one; dp-accounting RDP "
                   "composition and conversion, with the method notes' corrections")

    def epsilon(self, events, *, delta, stats=None, breakdown=True) -> EpsilonResult:
        delta = check_delta(delta)
        events = as_events(events)
        if stats is not None and len(stats) != len(events):
            raise PrivacyError(f"stats has {len(stats)} entries for {len(events)} events")
        terms = [_strict_term(ev, delta, details=breakdown) for ev in events]
        per_event = []
        for i, (ev, t) in enumerate(zip(events, terms)):
            if not breakdown:
                break
            eps_i = self._combine([t], delta)[0]
            per_event.append(EventEpsilon(i, ev.type_name, ev.describe(), eps_i, tuple(t.notes), dict(t.details)))
        value, order = self._combine(terms, delta)
        relations = {t.relation for t in terms} or {REPLACE_ONE}
        notes = []
        if len(relations) > 1:
            notes.append("events use different neighbouring relations (label-DP and replace-one): the total "
                         "is stated for the weaker of them only if they protect the same thing; read per event")
        if any(t.infinite for t in terms):
            notes.append("at least one pathway is not differentially private as written: epsilon = inf")
        data_dependent = None
        if stats is not None and any(s is not None for s in stats):
            total = np.zeros_like(ORDERS)
            used = False
            for ev, t, st in zip(events, terms, stats):
                dd = _data_dependent_rdp(ev, st) if st is not None else None
                if dd is not None:
                    used = True
                    total += np.minimum(dd, t.rdp)
                else:
                    total += t.rdp
            if used and not any(t.infinite for t in terms):
                data_dependent = rdp_to_epsilon(total, delta)[0]
                notes.append("data-dependent epsilon (PATE 2018 Thm 6 / PATE 2017 Thm 3) is itself a function "
                             "of the private votes: do not publish it without the smooth-sensitivity step; "
                             "the headline is the data-independent bound")
        return EpsilonResult(value=value, delta=delta, accounting=self.name,
                             relation=" / ".join(sorted(relations)),
                             method="dp-accounting RDP composition + conversion (PLD for Poisson-sampled Alg. 3)",
                             optimal_order=order, events=tuple(per_event), notes=tuple(notes),
                             data_dependent=data_dependent)

    @staticmethod
    def _combine(terms: list[_Term], delta: float) -> tuple[float, float | None]:
        if any(t.infinite for t in terms):
            return math.inf, None
        fixed = [t.fixed for t in terms if t.fixed is not None]
        terms = [t for t in terms if t.fixed is None]
        fixed_eps, fixed_delta = sum(f[0] for f in fixed), sum(f[1] for f in fixed)
        if fixed and not terms:
            return (fixed_eps if fixed_delta <= delta else math.inf), None
        delta -= fixed_delta  # what is left of delta for the RDP-composed rest
        if delta <= 0:
            return math.inf, None
        total = np.sum([t.rdp for t in terms], axis=0) if terms else np.zeros_like(ORDERS)
        value, order = rdp_to_epsilon(total, delta)
        if terms and all(t.pure is not None for t in terms):
            basic = float(sum(t.pure for t in terms))  # basic composition of pure-DP events
            if basic < value:
                value, order = basic, None
        return value + fixed_eps, order


# ================================================================================= paper accountant
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


@register_accountant
class PaperAccountant(Accountant):
    name = "paper"
    description = ("the formula each paper prints: DGD advanced composition + eps1; PATE 2018 data-independent "
                   "RDP; DPDFD Theorem 3; SRR epsilon per label")

    def epsilon(self, events, *, delta, stats=None, breakdown=True) -> EpsilonResult:
        delta = check_delta(delta)
        events = as_events(events)
        per_event = []
        for i, ev in enumerate(events if breakdown else []):
            value, _, notes, details = self._price([ev], delta)
            per_event.append(EventEpsilon(i, ev.type_name, ev.describe(), value, tuple(notes), details))
        value, order, notes, _ = self._price(events, delta)
        if stats is not None:
            notes = list(notes) + ["paper accounting ignores vote histograms (data-independent formulas only)"]
        relation = CHANGE_LABEL if events and all(
            isinstance(e, SRRLabels) and e.setting == "label-dp" for e in events) else REPLACE_ONE
        return EpsilonResult(value=value, delta=delta, accounting=self.name, relation=relation,
                             method="formulas as printed in DGD / PATE 2018 / DPDFD / SRR",
                             optimal_order=order, events=tuple(per_event), notes=tuple(notes))

    @staticmethod
    def _price(events: list[PrivacyEvent], delta: float):
        notes: list[str] = []
        details: dict[str, Any] = {}
        lnmax: dict[float, int] = {}
        pate_rdp = np.zeros_like(ORDERS)
        has_pate = False
        dpdfd_coeff = 0.0
        dpdfd_alt = 0.0
        dpdfd_alt_known = True
        has_dpdfd = False
        label_eps = 0.0
        latent = 0.0
        fixed_eps, fixed_delta = 0.0, 0.0
        for ev in events:
            if isinstance(ev, LNMaxQueries):
                lnmax[ev.epsilon0] = lnmax.get(ev.epsilon0, 0) + ev.count
            elif isinstance(ev, GNMaxQueries):
                has_pate = True
                pate_rdp += ev.count * ORDERS * ev.sensitivity**2 / (2.0 * ev.sigma**2)
            elif isinstance(ev, ConfidentGNMaxQueries):
                has_pate = True
                pate_rdp += ev.count * ORDERS / (2.0 * ev.sigma1**2)
                pate_rdp += ev.answered_or_worst_case * ORDERS / ev.sigma2**2
            elif isinstance(ev, DPDFDSteps):
                has_dpdfd = True
                # Theorem 3's RDP 2 C^2 n B T lambda / sigma^2, with n read as the number of teachers
                # (1 for Alg. 1 and 3), per the project's decision; see the note on Lemma 1 below.
                dpdfd_coeff += 2.0 * ev.clip_norm**2 * ev.num_teachers * ev.batch_size * ev.steps / ev.sigma**2
                if ev.num_classes is not None:
                    dpdfd_alt += 2.0 * ev.clip_norm**2 * ev.num_classes * ev.batch_size * ev.steps / ev.sigma**2
                else:
                    dpdfd_alt_known = False
                if ev.algorithm == 3:
                    notes.append("DPDFD prices Alg. 3 with the same Theorem 3 (no sampling credit); the paper "
                                 "does not account for the Jacobian at private inputs")
            elif isinstance(ev, (RRLabels, SRRLabels)):
                if ev.count > 0:
                    label_eps = max(label_eps, ev.epsilon)
            elif isinstance(ev, LatentLaplace):
                latent += ev.epsilon1
            elif isinstance(ev, DPSGDTraining):  # no paper prices it: as the strict accountant does
                e, dlt = dpsgd_fixed(ev)
                fixed_eps, fixed_delta = fixed_eps + e, fixed_delta + dlt
                notes.append(f"{ev.what}: ({e:.4g}, {dlt:g}) by dp-accounting PLD (replace-one), as strict")
            else:
                raise PrivacyError(f"the paper accountant does not know events of type {type(ev).__name__}")
        delta -= fixed_delta
        # delta is shared among the families whose bound consumes it (one family in every paper)
        n_delta = len(lnmax) + int(has_pate) + int(has_dpdfd)
        if delta < 0 or (delta == 0 and n_delta):  # no delta left for a family whose bound needs one
            return math.inf, None, notes + ["the DP-SGD source's delta share leaves no delta"], details
        d = delta / n_delta if n_delta else delta
        if n_delta > 1:
            notes.append(f"{n_delta} mechanism families each consume delta: each gets delta/{n_delta}, "
                         "epsilons add up (basic composition across families)")
        total = 0.0
        order = None
        for eps0, k in lnmax.items():
            e = dgd_advanced_composition(eps0, k, d)
            total += e
            notes.append(f"DGD advanced composition: {k} queries at eps0={eps0:.4g}: "
                         f"k*eps0^2 + eps0*sqrt(2k ln(1/delta)) = {e:.4f}")
        if has_pate:
            e, order = pate_basic_conversion(pate_rdp, d)
            total += e
            notes.append("PATE 2018 data-independent RDP (lambda/sigma^2 per answer, lambda/(2 sigma1^2) per "
                         f"threshold check), converted by eps = rdp + log(1/delta)/(lambda-1): {e:.4f}")
        if has_dpdfd:
            e, order = dpdfd_theorem3(dpdfd_coeff, d)
            total += e
            details["theorem3_coefficient"] = dpdfd_coeff
            notes.append(f"DPDFD Theorem 3 as printed (RDP 2C^2 nBT lambda/sigma^2, n = number of teachers): {e:.4f}")
            if dpdfd_alt_known and dpdfd_alt > 0:
                alt, _ = dpdfd_theorem3(dpdfd_alt, d)
                details["theorem3_epsilon_if_n_is_gradient_length"] = alt
                notes.append("Lemma 1 defines n as the length of the gradient vector (K classes); with that "
                             f"reading Theorem 3 gives {alt:.4f}")
        if label_eps > 0:
            total += label_eps
            notes.append(f"SRR/RR: epsilon {label_eps:g} per label, labels drawn once and reused, no composition "
                         "over labels (the paper's epsilon-label-DP claim)")
        if latent > 0:
            total += latent
            notes.append(f"DGD epsilon1 = {latent:g} for the latent-code noise, added as printed")
        return total + fixed_eps, order, notes, details
