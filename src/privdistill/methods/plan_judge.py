"""Judging a plan before anything trains: what the privacy budget buys, and whether that can teach anything.

Every method's plan is priced (methods/runner.py); this module asks, with a stated rule per kind of channel:

* vote channels (DGD, PATE): Q answered queries, each right with probability at most p (a unanimous vote through the
  noise, privacy/vote_noise.py), buy about Q s informative labels, s = (p - 1/K) / (1 - 1/K).
* randomized response (SRR): N labels each kept with probability p = e^ε / (e^ε + K - 1) buy N s^2 (a learner
  needs about 1 / s^2 noisy labels for one clean one).
* noisy gradients (DP-SGD, DPDFD): noise to signal over the T steps, r = sigma sqrt(d) / (B sqrt(T)) for DP-SGD
  (d parameters, batch B), r = sigma sqrt(K) / sqrt(B T) for DPDFD.

A plan is refused below REFUSE_PER_CLASS informative labels a class or above R_REFUSE (DPDFD: R_REFUSE_DPDFD), and
warned below WEAK_PER_CLASS or above R_WEAK; the thresholds pass every recorded release above chance and refuse the
chance-level ones (docs/results.md, "Data of your own"). A refusal names the smallest ε (by doubling) that passes.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from privdistill.errors import ConfigError
from privdistill.methods.common import sections_at_epsilon
from privdistill.methods.sizing import dpsgd_noise_ratio, trainable_parameters
from privdistill.privacy.events import (
    ConfidentGaussianQueries,
    GaussianQueries,
    LaplaceQueries,
    NormalisedGaussian,
    RandomizedResponse,
    RandomizedResponseWithPrior,
)
from privdistill.privacy.ledger import LedgerView
from privdistill.privacy.mechanisms import rr_keep_probability
from privdistill.privacy.vote_noise import unanimous_label_accuracy

if TYPE_CHECKING:
    from privdistill.methods.runner import Context, Method, Plan

REFUSE_PER_CLASS = 2  # informative labels a class below which a plan is refused (measured: docs/research-log.md)
WEAK_PER_CLASS = 10  # informative labels a class below which a plan is weak
# a student whose labels are spread over a pool from its clusters' medoids (engine/few_label.py; Plan.details
# "spread_labels") needs fewer (docs/research-log.md, "Few labels")
SPREAD_REFUSE_PER_CLASS, SPREAD_WEAK_PER_CLASS = 1, 3
# cluster votes (DGD's dgd.query_selection=clusters; Plan.details "cluster_labels"): each answer names a whole cluster
# and the naming gives every class one, so about one informative answer a class is what they need
CLUSTER_REFUSE_PER_CLASS, CLUSTER_WEAK_PER_CLASS = 0.5, 0.9


# each method's other plans, with what says the run already is that plan (no advice to do what it does)
END_TO_END = ("the end-to-end recipe (-r end-to-end: a DP-SGD teacher, one ε for the whole model)",
              lambda ctx: ctx.section("run").recipe == "end-to-end")
OTHER_PLANS = {
    "srr": [END_TO_END,
            ("the paper's accounting (--accounting paper: ε per label, which is not a guarantee for the model)",
             lambda ctx: ctx.budget.accounting == "paper")],
    # not "fewer teachers" as for PATE: DGD's vote noise is lowered with the teacher count (privacy/vote_noise.py),
    # so at one ε fewer teachers buy fewer answers, not better ones
    "dgd": [("cluster votes (--set dgd.query_selection=clusters: each answer names a whole cluster of the pool, "
             "about one a class is enough)", lambda ctx: ctx.section("dgd").query_selection == "clusters"),
            ("the end-to-end recipe (-r end-to-end: a DP-SGD source labels the pool, one ε for the whole model)",
             END_TO_END[1])],
    "pate": [("fewer teachers, each on more records (--set teachers.num_teachers=N)", lambda ctx: False)],
    "dpdfd": [("the paper's accounting (--accounting paper), as the paper counts",
               lambda ctx: ctx.budget.accounting == "paper")],
}
R_REFUSE, R_WEAK = 3.0, 0.3  # gradient noise-to-signal ratios (module docstring)
# DPDFD's student learns through a generator the same noised gradients steer: chance from r 1.0 on (research log,
# "Notes that left the code: methods/plan_judge.py")
R_REFUSE_DPDFD = 1.0


class PlanRefused(ConfigError):
    """The budget cannot teach anything with this plan: refused before anything trains (the message says why and
    what would)."""


class WeakPlanWarning(UserWarning):
    """The budget buys little with this plan: the run goes ahead, and says so first."""


@dataclass
class Verdict:
    level: str  # "ok" | "weak" | "refuse"
    buys: str  # what the budget buys, in words
    rule: str  # the rule that decided

    @property
    def line(self) -> str:
        return f"plan judged {self.level}: {self.buys} ({self.rule})"


def _signal(p: float, k: int) -> float:
    return max(0.0, (p - 1.0 / k) / (1.0 - 1.0 / k))


def _labels_verdict(informative: float, k: int, what: str, *, spread: bool = False, clusters: bool = False) -> Verdict:
    refuse, weak = ((CLUSTER_REFUSE_PER_CLASS, CLUSTER_WEAK_PER_CLASS) if clusters else
                    (SPREAD_REFUSE_PER_CLASS, SPREAD_WEAK_PER_CLASS) if spread else (REFUSE_PER_CLASS, WEAK_PER_CLASS))
    rule = (f"refused below {refuse * k:g} informative labels ({refuse:g} a class), weak below {weak * k:g} "
            f"({weak:g} a class)" + (", spread over the pool from cluster medoids" if spread else "")
            + (", each naming a whole cluster of the pool" if clusters else ""))
    level = "refuse" if informative < refuse * k else "weak" if informative < weak * k else "ok"
    return Verdict(level, f"{what}: about {informative:,.0f} informative labels for {k} classes", rule)


def _ratio_verdict(ratio: float, what: str, refuse: float = R_REFUSE) -> Verdict:
    rule = f"refused above a noise-to-signal ratio of {refuse:g}, weak above {R_WEAK:g}"
    level = "refuse" if ratio > refuse else "weak" if ratio > R_WEAK else "ok"
    return Verdict(level, f"{what}: noise-to-signal ratio {ratio:.3g} over the run", rule)


def _vote_verdict(event: Any, k: int, ctx: "Context", *, spread: bool = False, clusters: bool = False) -> Verdict:
    teachers = ctx.section("teachers").num_teachers
    if isinstance(event, LaplaceQueries):
        p, _ = unanimous_label_accuracy(teachers, k, distribution="laplace", scale=event.scale)
        queries, what = event.count, f"{event.count} LNMax answers (Laplace {event.scale:g}, {teachers} teachers)"
    elif isinstance(event, ConfidentGaussianQueries):
        p, answered = unanimous_label_accuracy(teachers, k, distribution="gaussian", scale=event.sigma2,
                                               threshold=event.threshold, sigma1=event.sigma1)
        queries = event.count * answered
        what = f"{event.count} Confident-GNMax queries, about {queries:,.0f} answered ({teachers} teachers)"
    else:
        p, _ = unanimous_label_accuracy(teachers, k, distribution="gaussian", scale=event.sigma)
        queries, what = event.count, f"{event.count} GNMax answers (σ {event.sigma:g}, {teachers} teachers)"
    return _labels_verdict(queries * _signal(p, k), k, f"{what}, each right at most {p:.0%} of the time",
                           spread=spread, clusters=clusters)


def judge(method: "Method", ctx: "Context", plan: "Plan") -> Verdict | None:
    """The verdict on `plan` (None: nothing in it this module knows how to judge, e.g. an end-to-end source)."""
    k = ctx.data.train.num_classes
    events = list(plan.remaining)
    if plan.details.get("source_labels"):  # DGD end to end: the votes are not the student's only labels
        return Verdict("ok", f"{plan.details.get('queries', 0):,} voted queries, and every other sample labelled by "
                       "the DP source (post-processing, free)", "the DP source's DP-SGD plan is judged by its own run")
    for event in events:
        if isinstance(event, (LaplaceQueries, GaussianQueries, ConfidentGaussianQueries)):
            return _vote_verdict(event, k, ctx, spread=bool(plan.details.get("spread_labels")),
                                 clusters=bool(plan.details.get("cluster_labels")))
        if isinstance(event, (RandomizedResponse, RandomizedResponseWithPrior)):  # every stage's labels together
            stages = [e for e in events if isinstance(e, (RandomizedResponse, RandomizedResponseWithPrior))]
            informative = sum(e.count * _signal(rr_keep_probability(k, e.epsilon), k) ** 2 for e in stages)
            what = (f"{sum(e.count for e in stages):,} labels at ε {event.epsilon:.3g} each, each kept at least "
                    f"{rr_keep_probability(k, event.epsilon):.0%} of the time (chance {1 / k:.0%})")
            return _labels_verdict(informative, k, what)
        if isinstance(event, NormalisedGaussian):
            ratio = event.sigma * math.sqrt(k) / math.sqrt(event.batch_size * event.steps)
            return _ratio_verdict(ratio, f"{event.steps} steps of B = {event.batch_size} at σ {event.sigma:.4g}",
                                  refuse=R_REFUSE_DPDFD)
    if method.name == "dpsgd" and plan.details.get("sigma") is not None:
        ratio = dpsgd_noise_ratio(plan.details["sigma"], trainable_parameters(ctx.section("dpsgd").model, ctx.data),
                                  plan.details["sample_rate"] * len(ctx.data.train), plan.details["total"])
        return _ratio_verdict(ratio, f"{plan.details['total']} DP-SGD steps at noise multiplier "
                                     f"{plan.details['sigma']:.4g}")
    return None


def nearest_epsilon(method: "Method", ctx: "Context", tries: int = 7) -> float | None:
    """The smallest ε, doubling from the target, at which this method's plan is not refused (None: none within
    2^tries times the target). Each trial is the plan `-e ε` would make: the configuration resolved again at that
    ε (a recipe's ε layers, e.g. DGD's at ε <= 2, and the sizing to the data), not this run's values."""
    if ctx.budget.epsilon is None:
        return None
    for i in range(1, tries + 1):
        epsilon = ctx.budget.epsilon * 2 ** i
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sections = sections_at_epsilon(ctx.prep, ctx.request, epsilon)
                trial = dataclasses.replace(ctx, prep=dataclasses.replace(ctx.prep, sections=sections),
                                            budget=sections["budget"])
                verdict = judge(method, trial, method.plan(trial, LedgerView([], None)))
        except ConfigError:
            continue
        if verdict is None or verdict.level != "refuse":
            return epsilon
    return None


def check_plan(method: "Method", ctx: "Context", plan: "Plan") -> Verdict | None:
    """Judge the plan: refuse (PlanRefused, naming the nearest plan that would pass) or warn (WeakPlanWarning);
    the verdict's line goes first among the plan's notes."""
    verdict = judge(method, ctx, plan)
    if verdict is None:
        return None
    if verdict.level == "refuse" and ctx.section("run").plan_check == "warn":
        plan.notes.insert(0, f"{verdict.line}; run all the same (run.plan_check=warn)")
        warnings.warn(f"this plan cannot teach anything: {verdict.buys} ({verdict.rule}); it runs all the same "
                      "(run.plan_check=warn)", WeakPlanWarning, stacklevel=3)
        return verdict
    if verdict.level == "refuse":
        nearer = nearest_epsilon(method, ctx)
        options = [f"ε = {nearer:g} with this method and recipe" if nearer else
                   f"no ε up to {2 ** 7:g} times the target with this method"]
        options += [advice for advice, already in OTHER_PLANS.get(method.name, []) if not already(ctx)]
        if method.name != "dpsgd":
            options.append("DP-SGD on the private data itself (privdistill dpsgd, judged the same way)")
        raise PlanRefused(f"this plan cannot teach anything: {verdict.buys}; {verdict.rule}. Nearest plans that "
                          f"would pass: {'; '.join(options)}. (--dry-run prints the plan; --set run.plan_check=warn "
                          "runs it all the same; docs/usage.md, \"Judging a plan\")")
    plan.notes.insert(0, verdict.line)
    if verdict.level == "weak":
        warnings.warn(f"weak plan: {verdict.buys} ({verdict.rule}); the run goes ahead", WeakPlanWarning,
                      stacklevel=3)
    return verdict
