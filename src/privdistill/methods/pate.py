"""PATE baselines (Papernot et al. ICLR 2017 and ICLR 2018): teachers on disjoint subsets of the private
data answer queries on public unlabelled data through a noisy aggregator; a student learns from the
answered queries and, semi-supervised, from the rest of the public data.

    public slice       `pate.holdout` examples held out of the training set (DGD's Fig. 7 split: one ensemble)
    teachers           n teachers on disjoint partitions of the private part (cached stage `teachers`)
    aggregation        LNMax (argmax(votes + Lap(b))), GNMax (argmax(votes + N(0, σ²))) or Confident-GNMax
                       (answer only when max(votes) + N(0, σ1²) >= T) on `queries` public images, via the ledger
    query choice       random public images (the papers), or medoids of the slice's clusters (engine/few_label.py)
    student            CE on the answers + VAT (Miyato et al. 2018, as PATE 2018) and entropy minimisation on the
                       whole slice; `pate_student.labels=spread` spreads the answers over the slice first

Privacy: the query count is calibrated from the target ε under the data-INDEPENDENT strict accounting, every
Confident-GNMax query priced as answered (the answered count is chosen by the mechanism; counting only those, as
PATE 2018 does, is an odometer reading, shown beside it, not a guarantee). `pate.filter`: an RDP privacy filter
(Feldman & Zrnic 2021) asks until the realised cost would pass that of the planned answered queries: the same
guarantee, more answers. The data-dependent bound (`epsilon_data_dependent`) is a function of the private votes and
NOT releasable without PATE 2018's smooth sensitivity (not implemented). The public slice gets no protection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from privdistill.config import check
from privdistill.data.dataset import ImageDataset
from privdistill.engine import streams
from privdistill.engine.context import Env
from privdistill.engine.ensemble import TeacherEnsemble, TeacherTraining, plan_teachers
from privdistill.engine.few_label import embed_pool, medoid_queries, spread_labels
from privdistill.engine.holdout import holdout_split
from privdistill.errors import ConfigError
from privdistill.methods.common import MethodAPI, RunRequest
from privdistill.methods.pate_student import PATEStudentConfig, train_student
from privdistill.methods.runner import Budget, Context, Method, Plan, Report, RunResult, Trained
from privdistill.models import create_model
from privdistill.privacy import calibration, mechanisms
from privdistill.privacy.accounting import EpsilonResult
from privdistill.privacy.events import (
    ConfidentGaussianQueries,
    GaussianQueries,
    LaplaceQueries,
    PrivacyEvent,
    event_from_dict,
)
from privdistill.privacy.ledger import LedgerAnswer, LedgerView, PrivacyLedger
from privdistill.privacy.report import PRIVATE, Pathway

AGGREGATIONS = ("lnmax", "gnmax", "confident-gnmax")
QUERY_SELECTIONS = ("random", "medoids")
QUERY_KEY = "pate/queries"


@dataclass
class PATEConfig:
    """Config section `pate`: the aggregator and the public slice."""

    aggregation: str = "gnmax"  # lnmax (PATE 2017) | gnmax | confident-gnmax (PATE 2018)
    queries: int = 0  # 0: the most queries the budget's target ε allows (capped by the public slice)
    laplace_scale: float = 40.0  # LNMax b (PATE 2017 used 20 = 1/γ; 40 = DGD's 2/ε0, comparable with DGD)
    sigma: float = 40.0  # GNMax σ (PATE 2018, MNIST)
    threshold: float = 200.0  # Confident-GNMax T (PATE 2018, MNIST, 250 teachers)
    sigma1: float = 150.0
    sigma2: float = 40.0
    # Confident-GNMax under an RDP privacy filter (Feldman & Zrnic 2021): the planned queries become the filter's
    # budget and public images are asked until it is spent; a refused query costs only its threshold check.
    # Ignored (set false) with the other aggregators, whose every query is answered
    filter: bool = False
    query_selection: str = "random"  # random (the papers) | medoids (one per k-means cluster, engine/few_label.py)
    holdout: float = 1 / 6  # the held-out public slice: records, or a fraction below 1 (engine.holdout; as dgd.holdout)
    secure_noise: Optional[bool] = None  # None: run.noise decides (methods/common.py)
    variant: Optional[str] = None  # the label --record adds to the result's name (default: the aggregator)

    def validate(self) -> None:
        check(self.aggregation in AGGREGATIONS,
              f"pate.aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        check(self.queries >= 0, "pate.queries must be >= 0")
        if min(self.laplace_scale, self.sigma, self.sigma1, self.sigma2) <= 0:
            raise ConfigError("pate noise scales must be > 0")
        check(self.holdout > 0, "pate.holdout must be > 0 (records, or a fraction of the training set below 1)")
        if self.holdout >= 1:
            self.holdout = int(self.holdout)  # a count: recorded as before (10000, not 10000.0)
        check(self.query_selection in QUERY_SELECTIONS,
              f"pate.query_selection must be one of {QUERY_SELECTIONS}, got {self.query_selection!r}")
        if self.filter and self.aggregation != "confident-gnmax":
            # every GNMax / LNMax query is answered, so a filter would change nothing: dropped (and recorded as
            # dropped), so that `--aggregation gnmax` works under a recipe whose Confident-GNMax is filtered
            self.filter = False


# ----------------------------------------------------------------------------------------- privacy plan
def query_event(cfg: PATEConfig, count: int, answered: int | None = None,
                filter_budget: int | None = None) -> PrivacyEvent:
    if cfg.aggregation == "lnmax":
        return LaplaceQueries(scale=cfg.laplace_scale, count=count)
    if cfg.aggregation == "gnmax":
        return GaussianQueries(sigma=cfg.sigma, count=count)
    return ConfidentGaussianQueries(threshold=cfg.threshold, sigma1=cfg.sigma1, sigma2=cfg.sigma2, count=count,
                                    answered=answered, filter_budget=filter_budget)


def plan_queries(cfg: PATEConfig, budget: Budget, available: int) -> tuple[int, list[str]]:
    """Number of queries and notes: `pate.queries`, or the most the target ε allows under the budget's
    accounting (worst case: every Confident-GNMax query answered), capped by the public slice."""
    if cfg.queries > 0:
        n = cfg.queries
    elif budget.epsilon is None:
        raise ConfigError("give either pate.queries or a target budget.epsilon (--epsilon)")
    else:
        n = calibration.vote_queries(query_event(cfg, 1), budget, cfg.aggregation)
    if n <= available:
        return n, []
    return available, [f"{n} queries allowed/asked but the public slice has {available} images: all of them are "
                       "queried (ε below the target)"]


def uses_few_label(ctx: Context) -> bool:
    """Whether the run reads the public slice's embedding (engine/few_label.py): to choose medoids or spread labels."""
    return ctx.section("pate").query_selection == "medoids" or ctx.section("pate_student").labels == "spread"


def pate_pathways(*, aggregation: str = "gnmax") -> dict[str, list[Pathway]]:
    """PATE baselines: public unlabelled inputs labelled by the private ensemble."""
    return {"student": [
        Pathway(PRIVATE, f"disjoint teachers -> {aggregation} labels", "the student's labels", True),
        Pathway("public unlabelled data", "inputs", "the student's inputs", True, "public by assumption"),
    ]}


def pathways(aggregation: str, *, few_label: bool = False) -> dict[str, list[Pathway]]:
    student = [p for p in pate_pathways(aggregation=aggregation)["student"] if p.source != "public unlabelled data"]
    spread = ", clustered and its labels spread in a fixed ScatterNet feature space" if few_label else ""
    student.append(Pathway("held-out slice of the training set (PATE's public data)",
                           f"used directly as queries and as the student's unlabelled (VAT) inputs{spread}",
                           "the student's inputs", False, "covered only if that slice is genuinely public: its own "
                           "records get no protection; the epsilon is for the private rest"))
    return {"student": student}


class PATEMethod(Method):
    name = "pate"
    sections = {"teachers": TeacherTraining, "pate": PATEConfig, "pate_student": PATEStudentConfig}

    def check_end_to_end(self, ctx: Context) -> None:
        raise ConfigError("PATE's public slice is held out of the private data and used without noise: not end to "
                          "end; dgd --privacy end-to-end replaces it with a generator fitted to a DP model")

    def plan(self, ctx: Context, recorded: LedgerView) -> Plan:
        cfg: PATEConfig = ctx.section("pate")
        private, public = holdout_split(ctx.data, cfg.holdout, ctx.env)
        queries, notes = plan_queries(cfg, ctx.budget, len(public))
        confident = cfg.aggregation == "confident-gnmax"
        notes.append(plan_teachers(
            private, ctx.section("teachers"), option=f"the {cfg.aggregation} noise (pate.*)",
            distribution="laplace" if cfg.aggregation == "lnmax" else "gaussian",
            scale={"lnmax": cfg.laplace_scale, "gnmax": cfg.sigma}.get(cfg.aggregation, cfg.sigma2),
            threshold=cfg.threshold if confident else None, sigma1=cfg.sigma1 if confident else None))
        # worst case (every Confident-GNMax query answered): refused before the teachers train
        return Plan(remaining=[] if QUERY_KEY in recorded else [query_event(cfg, queries)], notes=notes,
                    details={"queries": queries, "private": private, "public": public,
                             "spread_labels": ctx.section("pate_student").labels == "spread"})

    def train(self, ctx: Context, plan: Plan, ledger: PrivacyLedger) -> Trained:
        cfg: PATEConfig = ctx.section("pate")
        env, data = ctx.env, ctx.data
        private, public, queries = plan.details["private"], plan.details["public"], plan.details["queries"]
        teachers, teachers_stage = ctx.stages.teachers_on(private, ctx.section("teachers"))

        st: PATEStudentConfig = ctx.section("pate_student")
        order = torch.randperm(len(public), generator=env.generator(streams.PATE_QUERIES))
        # the public slice in a fixed feature space: reads no private record and no model, so it costs no ε
        embedding = embed_pool(public.images, env) if uses_few_label(ctx) else None
        if cfg.query_selection == "medoids":  # the medoids first, the rest (asked only under the filter) at random
            first = medoid_queries(embedding, min(queries, len(public)), seed=env.seed)
            rest = torch.ones(len(public), dtype=torch.bool)
            rest[first] = False
            order = torch.cat([first, order[rest[order]]])
        # under the filter, `queries` is its budget and the whole slice is the pool it asks from, in this order
        order = order if cfg.filter else order[:queries]
        labels, answered, event = _answer(ledger, teachers, public.images[order], cfg, env, budget=queries)
        order = order[:len(labels)]  # the queries asked
        query_images, keep = public.images[order], labels >= 0
        label_accuracy = float((labels[keep] == public.labels[order][keep]).float().mean()) if keep.any() else None
        spread_accuracy = None
        if st.labels == "spread":  # post-processing of the released answers over the public slice
            spread = spread_labels(embedding, order, labels, data.num_classes).argmax(1)
            labelled = ImageDataset(public.images, spread, data.num_classes, name="public slice, spread labels")
            spread_accuracy = round(float((spread == public.labels).float().mean()), 4)
        else:
            labelled = ImageDataset(query_images[keep], labels[keep], data.num_classes, name="answered queries")

        torch.manual_seed(env.generator(streams.PATE_INIT).initial_seed())
        student = create_model(st.model, kind="classifier", in_channels=data.channels, num_classes=data.num_classes,
                               image_size=data.image_size[0])
        if not keep.any():
            raise ConfigError("no query was answered: nothing to train the student on (lower pate.threshold)")
        student, train_stats = train_student(student, labelled, public.images, st, env, run=ctx.run, test=data.test)
        info = teachers_stage.info()
        return Trained(student=student, fields={
            "aggregation": cfg.aggregation, "queries": len(labels), "answered": int(keep.sum()),
            **({"filter_budget": event.filter_budget} if cfg.filter else {}),
            "public_size": len(public), "private_size": len(private), "num_teachers": teachers.num_teachers,
            "label_accuracy": None if label_accuracy is None else round(label_accuracy, 4),
            **({"spread_label_accuracy": spread_accuracy} if spread_accuracy is not None else {}),
            "query_selection": cfg.query_selection, "student_labels": st.labels, "event": event.to_dict(),
            # a recipe's file name says what it is; the paper recipe's cells, recorded before recipes, keep their
            # derived labels (confident-gnmax-filter)
            "variant": cfg.variant or (_variant(cfg) if ctx.section("run").recipe == "paper" else None),
            "stages": {"teachers": teachers_stage.ref()},
            "teachers_stage_info": {k: v for k, v in info.items()
                                    if k in ("ensemble_accuracy", "mean_teacher_accuracy", "wall_seconds",
                                             "build_seconds")},
            "student_training": train_stats})

    def pathways(self, ctx: Context, plan: Plan) -> dict[str, list[Pathway]]:
        return pathways(ctx.section("pate").aggregation,  # the module's function (a method's name is not in scope)
                        few_label=uses_few_label(ctx))

    def report(self, ctx: Context, plan: Plan, trained: Trained, ledger: PrivacyLedger) -> Report:
        cfg: PATEConfig = ctx.section("pate")
        strict = ledger.epsilon_both()["strict"]
        dependent = ledger.epsilon(accounting="strict", data_dependent=True)
        name = {"lnmax": "LNMax", "gnmax": "GNMax", "confident-gnmax": "Confident-GNMax"}[cfg.aggregation]
        return Report(pathways=self.pathways(ctx, plan), secure_noise=cfg.secure_noise,
                      noise_option="pate.secure_noise", fields={
                          "epsilon_realised_answered_only": realised_answered_only(strict),
                          "epsilon_data_dependent": None if dependent.data_dependent is None
                          else round(dependent.data_dependent, 4),
                          "epsilon_data_dependent_note": "PATE data-dependent bound from the recorded votes: a "
                          "function of the private data, NOT releasable without the smooth-sensitivity step (not "
                          "implemented)",
                          "epsilon_covers": f"the teacher-vote channel ({name}) for the private part (all but the "
                                            "held-out public slice)"})


class PATE(MethodAPI):
    """`PATE(epsilon=10, aggregation="confident-gnmax").fit("mnist")` -> RunResult(student, None, summary, privacy):
    the budget keywords go to the `budget` section, others to `pate` (`queries`, `holdout`, `secure_noise`, ...)."""

    section, method = "pate", PATEMethod


def run_pate(request: RunRequest, *, cache: bool = True) -> RunResult:
    """PATE end to end: the released student, the summary, ε under both accountings."""
    return PATEMethod().run(request, cache=cache)


def realised_answered_only(strict: EpsilonResult) -> float | None:
    """Confident-GNMax: strict ε counting only the answered queries (an odometer reading, not a guarantee)."""
    values = [e.details["epsilon_realised_answered_only"] for e in strict.events
              if "epsilon_realised_answered_only" in e.details]
    return round(values[0], 4) if len(values) == 1 else None


def _variant(cfg: PATEConfig) -> str | None:
    return None if cfg.aggregation == "gnmax" else cfg.aggregation + ("-filter" if cfg.filter else "")


def _answer(ledger: PrivacyLedger, teachers: TeacherEnsemble, images: torch.Tensor, cfg: PATEConfig,
            env: Env, *, budget: int) -> tuple[torch.Tensor, torch.Tensor, PrivacyEvent]:
    """(labels with -1 where not answered, answered mask, the recorded event), through the ledger; one label per
    query asked (under the filter, a prefix of `images`, asked until the budget of `budget` answered queries is
    spent; otherwise all of them).

    Confident-GNMax's event carries the number of answered queries, known only once the noise is drawn:
    the answers are computed first, then recorded with that event before anything uses them (a refusal
    by the budget discards them unused). On resume the recorded event and answers are returned."""
    if QUERY_KEY in ledger:
        rec = next(r for r in ledger.records() if r.get("key") == QUERY_KEY)
        event = event_from_dict(rec["event"])
        labels = torch.as_tensor(ledger.spend(QUERY_KEY, event, lambda: None)).long()
        return labels, labels >= 0, event
    gen = mechanisms.noise_source(env.seed, secure=cfg.secure_noise)
    if cfg.filter:
        labels, answered, votes = _ask_filtered(teachers, images, cfg, env, budget, gen)
    else:
        votes = list(teachers.iter_votes(images, env))
        votes = torch.cat(votes) if votes else torch.zeros(0, 1, dtype=torch.long)
        if cfg.aggregation == "lnmax":
            labels, answered = mechanisms.lnmax(votes, scale=cfg.laplace_scale, generator=gen), None
        elif cfg.aggregation == "gnmax":
            labels, answered = mechanisms.gnmax(votes, sigma=cfg.sigma, generator=gen), None
        else:
            labels, answered = mechanisms.confident_gnmax(votes, threshold=cfg.threshold, sigma1=cfg.sigma1,
                                                          sigma2=cfg.sigma2, generator=gen)
    event = query_event(cfg, len(labels), None if answered is None else int(answered.sum()),
                        filter_budget=budget if cfg.filter else None)
    result = LedgerAnswer(answers=labels, votes=votes, answered=answered)
    labels = torch.as_tensor(ledger.spend(QUERY_KEY, event, lambda: result)).long()
    return labels, labels >= 0, event


def _ask_filtered(teachers: TeacherEnsemble, images: torch.Tensor, cfg: PATEConfig, env: Env, budget: int,
                  gen) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Confident-GNMax under the RDP filter, 500 images at a time until its budget is spent (the teachers vote
    only on the images the filter reaches): labels, answered mask and votes of the queries asked."""
    labels, answered, votes, spent = [], [], [], 0.0
    for v in teachers.iter_votes(images, env):
        lab, ans, asked, spent = mechanisms.filtered_confident_gnmax(
            v, threshold=cfg.threshold, sigma1=cfg.sigma1, sigma2=cfg.sigma2, filter_budget=budget, generator=gen,
            spent=spent)
        labels.append(lab[:asked]), answered.append(ans[:asked]), votes.append(v[:asked])
        if asked < len(v):
            break
    return torch.cat(labels), torch.cat(answered), torch.cat(votes)
