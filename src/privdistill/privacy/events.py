"""Privacy events: one small immutable value per use of a noise mechanism.

Shaped after dp-accounting's ``DpEvent``s: an event records *what* was released and with which
parameters, never the data. Accountants (:mod:`privdistill.privacy.accounting`) price a list of
events under the ``paper`` or the ``strict`` accounting; the ledger stores them as JSON.

Neighbouring relation: replace-one (substitute one record of the private training set) for every
event, except :class:`SRRLabels` with ``setting="label-dp"`` (change one record's label).

Every event is JSON round-trippable::

    event.to_dict() == {"type": "lnmax", "scale": 40.0, "count": 1000, "sensitivity": 2.0}
    event_from_dict(event.to_dict()) == event
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar, Mapping

from privdistill.errors import PrivacyError
from privdistill.privacy._checks import (
    check_choice,
    check_count,
    check_epsilon,
    check_positive,
)

EVENT_TYPES: dict[str, type["PrivacyEvent"]] = {}


def count_of(n: int, word: str, many: str | None = None) -> str:
    """'1 query', '27 queries': a count with its noun in the right number (`many`: the plural, else word + 's')."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def _register(cls: type["PrivacyEvent"]) -> type["PrivacyEvent"]:
    EVENT_TYPES[cls.type_name] = cls
    return cls


class PrivacyEvent:
    """Base class of all events (subclasses are frozen dataclasses)."""

    type_name: ClassVar[str] = ""
    #: the field that counts repetitions (queries, labels, steps); varied by calibration.max_count
    count_field: ClassVar[str | None] = None
    #: the field that sets the noise; varied by calibration.calibrate_noise
    noise_field: ClassVar[str | None] = None
    #: True if a larger value of ``noise_field`` means more privacy (noise scale), False if less (epsilon)
    noise_is_scale: ClassVar[bool] = True

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type_name}
        for f in fields(self):  # type: ignore[arg-type]
            out[f.name] = getattr(self, f.name)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PrivacyEvent":
        return event_from_dict(data)

    @property
    def repetitions(self) -> int:
        """How many times the mechanism ran (the value of ``count_field``; 1 if none)."""
        return int(getattr(self, self.count_field)) if self.count_field else 1

    def with_count(self, n: int) -> "PrivacyEvent":
        if self.count_field is None:
            raise PrivacyError(f"{self.type_name} events have no count to vary")
        return replace(self, **{self.count_field: n})  # type: ignore[type-var]

    def with_noise(self, value: float) -> "PrivacyEvent":
        if self.noise_field is None:
            raise PrivacyError(f"{self.type_name} events have no noise parameter to calibrate")
        return replace(self, **{self.noise_field: value})  # type: ignore[type-var]

    def describe(self) -> str:  # pragma: no cover - overridden
        return self.type_name


def event_from_dict(data: Mapping[str, Any]) -> PrivacyEvent:
    """Inverse of :meth:`PrivacyEvent.to_dict`; unknown types or fields raise PrivacyError."""
    if not isinstance(data, Mapping) or "type" not in data:
        raise PrivacyError(f"not a privacy event (no 'type' key): {data!r}")
    kind = data["type"]
    cls = EVENT_TYPES.get(kind)
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


# ------------------------------------------------------------------------------------------ PATE family
@_register
@dataclass(frozen=True)
class LNMaxQueries(PrivacyEvent):
    """``count`` Laplace noisy-argmax answers, noise ``Lap(scale)`` on every vote count (DGD Eq. 3).

    ``sensitivity`` is the L1 change of one query's vote histogram when one private record is
    replaced: the record moves one teacher, whose vote moves from one class to another: 2.
    Each answer is then ``epsilon0 = sensitivity / scale``-DP (DGD: scale = 2/epsilon0 = 40).
    """

    scale: float
    count: int
    sensitivity: float = 2.0

    type_name: ClassVar[str] = "lnmax"
    count_field: ClassVar[str | None] = "count"
    noise_field: ClassVar[str | None] = "scale"

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", check_positive("Laplace scale", self.scale))
        object.__setattr__(self, "count", check_count("queries", self.count))
        object.__setattr__(self, "sensitivity", checked_sensitivity(self.sensitivity, 2.0, "LNMax"))

    @classmethod
    def from_epsilon0(cls, epsilon0: float, count: int) -> "LNMaxQueries":
        """DGD's parametrisation: scale = 2 / epsilon0."""
        return cls(scale=2.0 / check_epsilon(epsilon0, "epsilon0"), count=count)

    @property
    def epsilon0(self) -> float:
        return self.sensitivity / self.scale

    def describe(self) -> str:
        return (f"LNMax: {count_of(self.count, 'query', 'queries')}, Laplace scale {self.scale:g} "
                f"(epsilon0 = {self.epsilon0:.4g} each)")


@_register
@dataclass(frozen=True)
class GNMaxQueries(PrivacyEvent):
    """``count`` Gaussian noisy-argmax answers (GNMax, Papernot et al. 2018), noise N(0, sigma^2).

    One replaced record moves one teacher's vote: the histogram changes by L2 norm sqrt(2).
    """

    sigma: float
    count: int
    sensitivity: float = math.sqrt(2.0)

    type_name: ClassVar[str] = "gnmax"
    count_field: ClassVar[str | None] = "count"
    noise_field: ClassVar[str | None] = "sigma"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", check_positive("sigma", self.sigma))
        object.__setattr__(self, "count", check_count("queries", self.count))
        object.__setattr__(self, "sensitivity", checked_sensitivity(self.sensitivity, math.sqrt(2.0), "GNMax"))

    def describe(self) -> str:
        return f"GNMax: {count_of(self.count, 'query', 'queries')}, sigma {self.sigma:g}"


@_register
@dataclass(frozen=True)
class ConfidentGNMaxQueries(PrivacyEvent):
    """Confident-GNMax (Papernot et al. 2018, Alg. 1): ``count`` threshold checks
    ``max(votes) + N(0, sigma1^2) >= threshold``, of which ``answered`` went on to a GNMax answer
    with noise N(0, sigma2^2). Every check costs budget, answered or not; ``answered=None`` means
    "not known yet" and is priced as if every query were answered (worst case).

    ``filter_budget``: the queries were asked under an RDP privacy filter (Feldman & Zrnic, NeurIPS 2021,
    Thm 3.1) whose budget is the RDP curve of ``filter_budget`` queries all answered: the run kept checking
    queries while the realised cost (every check, and the GNMax step of the answered ones) plus one more
    worst-case query stayed within that curve, so ``count`` may exceed ``filter_budget`` when few are answered.
    The filter makes the budget a guarantee fixed before the run, whatever the realised counts.
    """

    threshold: float
    sigma1: float
    sigma2: float
    count: int
    answered: int | None = None
    filter_budget: int | None = None

    type_name: ClassVar[str] = "confident-gnmax"
    count_field: ClassVar[str | None] = "count"
    noise_field: ClassVar[str | None] = "sigma2"

    def __post_init__(self) -> None:
        if not isinstance(self.threshold, (int, float)) or isinstance(self.threshold, bool) \
                or not math.isfinite(self.threshold):
            raise PrivacyError(f"threshold must be a finite number, got {self.threshold!r}")
        object.__setattr__(self, "threshold", float(self.threshold))
        object.__setattr__(self, "sigma1", check_positive("sigma1", self.sigma1))
        object.__setattr__(self, "sigma2", check_positive("sigma2", self.sigma2))
        object.__setattr__(self, "count", check_count("queries", self.count))
        if self.answered is not None:
            answered = check_count("answered", self.answered)
            if answered > self.count:
                raise PrivacyError(f"answered ({answered}) cannot exceed the number of queries ({self.count})")
            object.__setattr__(self, "answered", answered)
        if self.filter_budget is not None:
            object.__setattr__(self, "filter_budget", check_count("filter_budget", self.filter_budget, minimum=1))
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

    def with_count(self, n: int) -> "ConfidentGNMaxQueries":
        return replace(self, count=n, answered=None, filter_budget=None)

    def describe(self) -> str:
        ans = "answers not known (all counted)" if self.answered is None else f"{self.answered} answered"
        filtered = "" if self.filter_budget is None else \
            f", under an RDP filter with the budget of {self.filter_budget} answered queries"
        return (f"Confident-GNMax: {count_of(self.count, 'query', 'queries')} ({ans}), threshold {self.threshold:g}, "
                f"sigma1 {self.sigma1:g}, sigma2 {self.sigma2:g}{filtered}")


# --------------------------------------------------------------------------------- randomized response
@_register
@dataclass(frozen=True)
class RRLabels(PrivacyEvent):
    """``count`` labels released by k-ary randomized response (keep with prob e^eps/(e^eps+K-1))."""

    epsilon: float
    count: int
    num_classes: int

    type_name: ClassVar[str] = "rr"
    count_field: ClassVar[str | None] = "count"
    noise_field: ClassVar[str | None] = "epsilon"
    noise_is_scale: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, "epsilon per label"))
        object.__setattr__(self, "count", check_count("labels", self.count))
        object.__setattr__(self, "num_classes", check_count("num_classes", self.num_classes, minimum=2))

    def describe(self) -> str:
        return f"k-RR: {self.count} labels, epsilon {self.epsilon:g} per label, K = {self.num_classes}"


@_register
@dataclass(frozen=True)
class SRRLabels(PrivacyEvent):
    """``count`` labels released by selective randomized response (SRR paper, Alg. 1).

    ``setting="data-free"`` (the SRR method: the labels are the teacher's answers on synthetic
    inputs; the teacher was trained on all of D, so one private record can change every label) or
    ``setting="label-dp"`` (paper Table II: real private inputs, only labels protected, each record's
    label released once; neighbouring relation "change one label").
    """

    epsilon: float
    count: int
    num_classes: int
    setting: str = "data-free"

    type_name: ClassVar[str] = "srr"
    count_field: ClassVar[str | None] = "count"
    noise_field: ClassVar[str | None] = "epsilon"
    noise_is_scale: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, "epsilon per label"))
        object.__setattr__(self, "count", check_count("labels", self.count))
        object.__setattr__(self, "num_classes", check_count("num_classes", self.num_classes, minimum=2))
        check_choice("SRR setting", self.setting, ("data-free", "label-dp"))

    def describe(self) -> str:
        return (f"SRR ({self.setting}): {self.count} labels, epsilon {self.epsilon:g} per label, "
                f"K = {self.num_classes}")


# ----------------------------------------------------------------------------------------------- DPDFD
@_register
@dataclass(frozen=True)
class DPDFDSteps(PrivacyEvent):
    """``steps`` uses of DPDFD's A_{C,sigma} (normalise each output gradient to norm C, add N(0, sigma^2 C^2 I)).

    ``algorithm``: 1 = single teacher (DPDFD Alg. 1), 2 = n disjoint teachers (Alg. 2),
    3 = direct training on private data with Poisson sampling (Alg. 3, needs ``dataset_size``).
    ``granularity``: "per_sample" (one noisy K-vector per synthetic sample, the default) or
    "batch_sum" (the literal Eq. 4: one noisy K-vector per batch).
    ``num_classes`` is only used to state the alternative reading of the paper's Lemma 1.
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

    type_name: ClassVar[str] = "dpdfd"
    count_field: ClassVar[str | None] = "steps"
    noise_field: ClassVar[str | None] = "sigma"

    def __post_init__(self) -> None:
        object.__setattr__(self, "clip_norm", check_positive("clip norm C", self.clip_norm))
        object.__setattr__(self, "sigma", check_positive("sigma", self.sigma))
        object.__setattr__(self, "batch_size", check_count("batch size", self.batch_size, minimum=1))
        object.__setattr__(self, "steps", check_count("steps", self.steps))
        object.__setattr__(self, "num_teachers", check_count("num_teachers", self.num_teachers, minimum=1))
        check_choice("granularity", self.granularity, ("per_sample", "batch_sum"))
        check_choice("algorithm", self.algorithm, (1, 2, 3))
        if self.algorithm in (1, 3) and self.num_teachers != 1:
            raise PrivacyError(f"DPDFD Alg. {self.algorithm} uses one model; got num_teachers={self.num_teachers} "
                               "(use algorithm=2 for several teachers)")
        if self.algorithm == 3:
            if self.dataset_size is None:
                raise PrivacyError("DPDFD Alg. 3 (direct training) needs dataset_size for the sampling rate B/N")
            size = check_count("dataset_size", self.dataset_size, minimum=1)
            if size < self.batch_size:
                raise PrivacyError(f"dataset_size ({size}) must be >= batch size ({self.batch_size})")
            object.__setattr__(self, "dataset_size", size)
        elif self.dataset_size is not None:
            object.__setattr__(self, "dataset_size", check_count("dataset_size", self.dataset_size, minimum=1))
        if self.num_classes is not None:
            object.__setattr__(self, "num_classes", check_count("num_classes", self.num_classes, minimum=2))

    @property
    def sampling_rate(self) -> float | None:
        return None if self.dataset_size is None or self.algorithm != 3 else self.batch_size / self.dataset_size

    def describe(self) -> str:
        who = {1: "Alg. 1, one teacher", 2: f"Alg. 2, {self.num_teachers} teachers",
               3: f"Alg. 3, direct training, q = {self.batch_size}/{self.dataset_size}"}[self.algorithm]
        return (f"DPDFD ({who}, {self.granularity}): {self.steps} steps, B = {self.batch_size}, "
                f"C = {self.clip_norm:g}, sigma = {self.sigma:g}")


# ------------------------------------------------------------------------------------ DP-SGD as a source
@_register
@dataclass(frozen=True)
class DPSGDTraining(PrivacyEvent):
    """A model trained by DP-SGD on the private data inside a run (the DP source of an end-to-end release):
    ``steps`` steps, Poisson sampling at ``sample_rate``, Gaussian noise multiplier ``noise_multiplier``.

    It is priced at its own share ``delta`` of the run's δ by dp-accounting's PLD accountant (replace-one, as
    methods/dpsgd.py calibrates it), and composed with the rest of the run by basic composition: the run's ε is
    this ε plus the others' ε at the δ that remains (privacy/accounting.py). Both accountings price it alike:
    no paper has a formula for it."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    delta: float
    what: str = "DP-SGD source model"

    type_name: ClassVar[str] = "dpsgd"
    count_field: ClassVar[str | None] = "steps"
    noise_field: ClassVar[str | None] = "noise_multiplier"

    def __post_init__(self) -> None:
        object.__setattr__(self, "noise_multiplier", check_positive("noise multiplier", self.noise_multiplier))
        object.__setattr__(self, "steps", check_count("steps", self.steps))
        if not 0 < self.sample_rate <= 1:
            raise PrivacyError(f"sample rate must lie in (0, 1], got {self.sample_rate}")
        if not 0 < self.delta < 1:
            raise PrivacyError(f"the DP-SGD event's delta share must lie in (0, 1), got {self.delta}")

    def describe(self) -> str:
        return (f"{self.what}: DP-SGD, {self.steps} steps, Poisson rate {self.sample_rate:.4g}, noise multiplier "
                f"{self.noise_multiplier:.4g}, priced at delta {self.delta:g}")


# ------------------------------------------------------------------------------------------------- DGD
@_register
@dataclass(frozen=True)
class LatentLaplace(PrivacyEvent):
    """DGD's Laplace noise (scale 2c/epsilon1) on the clipped VAE latent codes of SYNTHETIC samples.

    The paper counts ``epsilon1`` in its total; these codes are not private records, so the strict
    accounting gives this event no cost and no credit (see docs/privacy.md).
    """

    epsilon1: float
    dim: int | None = None
    clip: float = 1.0

    type_name: ClassVar[str] = "latent-laplace"
    noise_field: ClassVar[str | None] = "epsilon1"
    noise_is_scale: ClassVar[bool] = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon1", check_epsilon(self.epsilon1, "epsilon1"))
        if self.dim is not None:
            object.__setattr__(self, "dim", check_count("latent dimension", self.dim, minimum=1))
        object.__setattr__(self, "clip", check_positive("latent clip", self.clip))

    def describe(self) -> str:
        return f"DGD latent-code Laplace noise, epsilon1 = {self.epsilon1:g} (synthetic codes)"


def as_events(items: Any) -> list[PrivacyEvent]:
    """Accept events or their dicts; a single event is wrapped in a list."""
    if isinstance(items, (PrivacyEvent, Mapping)):
        items = [items]
    out = []
    for item in items:
        if isinstance(item, PrivacyEvent):
            out.append(item)
        elif isinstance(item, Mapping):
            out.append(event_from_dict(item))
        else:
            raise PrivacyError(f"not a privacy event: {item!r}")
    return out
