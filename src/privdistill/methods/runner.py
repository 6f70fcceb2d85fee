"""The one run skeleton every method plugs into, and what every run returns.

    plan      the method prices what it will spend (events still to spend, given what the ledger holds)
    check     the ledger refuses to start beyond the budget, before any model is trained
    train     the method's algorithm (its stages, its loop), spending through the ledger
    release   the runner evaluates the student, writes its weights (and the generator's)
    report    privacy.json (what ε covers, per released artifact), ε under both accountings, summary.json

A method is a `Method` subclass: its name, its config sections (the `budget` and `run` sections are added
for every method), and `plan` / `train` / `report`. `Method.run(request)` returns a `RunResult`, the same
typed value for every method, from Python and from the command line.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from torch import nn

from privdistill.atomic import atomic_write_text
from privdistill.config import check
from privdistill.engine.cache import StageCache
from privdistill.engine.progress import say
from privdistill.engine.stages import Stages
from privdistill.errors import ConfigError, RunError
from privdistill.methods.chance import evaluate_release
from privdistill.methods.common import Prepared, RunRequest, finish_run, prepare_run
from privdistill.methods.dry_run import DryRunPlan, check_own_budget, dry_run_info, plan_lines, round_epsilon
from privdistill.methods.plan_judge import check_plan
from privdistill.privacy.events import PrivacyEvent
from privdistill.privacy.ledger import LedgerView, PrivacyLedger
from privdistill.privacy.report import Pathway, noise_source, write_privacy_json
from privdistill.privacy.secure import TALLY

ACCOUNTINGS = ("strict", "paper")


#: the smallest δ a budget may state (see Budget.validate)
MIN_DELTA = 1e-12


@dataclass
class Budget:
    """Config section `budget`, the same for every private method: what the user asks to spend.

    `epsilon` is the target under `accounting`: the method sizes its plan (queries, steps, noise, per-label
    ε) so that the ε of the whole run under that accounting does not exceed it. `max_epsilon` is the hard
    limit the privacy ledger enforces under the same accounting (None: the target). The default accounting
    is `strict`, a correct (ε, δ) for the private training set; `paper` reproduces a paper's own formula
    and is only used when asked for (docs/privacy.md says where each paper's analysis fails)."""

    epsilon: Optional[float] = None
    max_epsilon: Optional[float] = None
    delta: float = 1e-5
    accounting: str = "strict"
    # "method": each method as published (its privacy report lists what ε covers); "end-to-end": every pathway
    # to the released model priced within the target (methods/end_to_end.py), or the run is refused
    privacy: str = "method"

    def validate(self) -> None:
        check(self.epsilon is None or (math.isfinite(self.epsilon) and self.epsilon > 0),
              f"epsilon must be a finite number > 0, got {self.epsilon}")
        check(self.max_epsilon is None or self.max_epsilon > 0, f"max_epsilon must be > 0, got {self.max_epsilon}")
        check(0 < self.delta < 1, f"delta must lie in (0, 1), got {self.delta}")
        # dp-accounting's PLDs truncate tails near 1e-15: every ε there reads inf
        check(self.delta >= MIN_DELTA, f"delta {self.delta:g} is below {MIN_DELTA:g}, the smallest this package's "
              "accountants resolve (with room for the shares an end-to-end run splits it into)")
        check(self.accounting in ACCOUNTINGS, f"accounting must be strict or paper, got {self.accounting!r}")
        check(self.privacy in ("method", "end-to-end"), f"privacy must be method or end-to-end, got {self.privacy!r}")
        check(self.privacy != "end-to-end" or self.accounting == "strict",
              "--privacy end-to-end is a guarantee: it needs --accounting strict (the default)")

    @property
    def limit(self) -> float | None:
        """The ε the ledger never lets the run exceed (under `accounting`)."""
        return self.max_epsilon if self.max_epsilon is not None else self.epsilon


@dataclass
class RunResult:
    """What every method returns: the released student (and generator, where the method releases one), the
    run's summary (accuracy, ε under both accountings, what ε covers) and its privacy report (privacy.json).

    ``generator`` is None unless the ε covers it (privacy.json, artifact "generator": every pathway covered; e.g.
    DPDFD's, which only ever saw noised gradients). A generator fitted to a non-private model (DGD's, SRR's)
    stays in the run directory, as generator.safetensors, and is never handed out as a release."""

    student: nn.Module
    generator: nn.Module | None
    summary: dict[str, Any]
    privacy: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.generator is not None and not generator_is_covered(self.privacy):
            self.generator = None

    @property
    def run_dir(self) -> str:
        return self.summary["run_dir"]


def generator_is_covered(privacy: dict[str, Any]) -> bool:
    """Whether a run's privacy report says its ε covers every pathway to the generator it trained."""
    pathways = (privacy.get("artifacts") or {}).get("generator")
    return bool(pathways) and all(p.get("covered") for p in pathways)


@dataclass
class Context:
    """What a method's plan, train and report see: the resolved sections, the environment, the run
    directory, the data, the cached stages and the budget."""

    prep: Prepared
    request: RunRequest
    stages: Stages
    budget: Budget
    inputs: dict[str, Any] = field(default_factory=dict)  # what the caller passed besides the request

    def __getattr__(self, name: str) -> Any:  # env, run, data, dataset, sections: those of the prepared run
        return getattr(self.prep, name)

    def section(self, name: str) -> Any:
        return self.prep.sections[name]


@dataclass
class Plan:
    """What a method will spend: the events not yet in the ledger (checked before anything trains)."""

    remaining: list[PrivacyEvent]
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)  # the method's own numbers (queries, T, sigma, ...)
    # a method that keeps its own record (uses_ledger False) states its spend here, as its report will: what it
    # spends (noise, counts; "describe": in words) and ε by accounting (DP-SGD: σ, q, T; Opacus's ε, replace-one PLD)
    spends: list[dict[str, Any]] = field(default_factory=list)
    epsilon: dict[str, float] | None = None


@dataclass
class Trained:
    """What a method's train step hands back to the runner."""

    student: nn.Module
    generator: nn.Module | None = None
    baseline_accuracy: float | None = None
    wall_seconds: float | None = None  # training time of all invocations (None: since this one started)
    fields: dict[str, Any] = field(default_factory=dict)  # the method's own summary fields


@dataclass
class Report:
    """What ε covers and how it is stated: the released artifacts' pathways and the privacy.json extras."""

    pathways: dict[str, list[Pathway]]
    secure_noise: bool
    noise_option: str  # the config key that switches to secure (OpenDP) noise
    statement: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more privacy.json fields
    epsilon: dict[str, float] | None = None  # ε by accounting when it is not the ledger's (DP-SGD: Opacus)
    fields: dict[str, Any] = field(default_factory=dict)  # more summary fields


NOISE_DRAWS = "noise_draws.json"  # the secure samplers' draws and bounds, summed over a run's invocations


def noise_draws(run_dir) -> dict[str, float]:
    """Add this invocation's secure draws (privacy.secure.TALLY) to those recorded in the run directory, so that a
    resumed run keeps the earlier invocations' share of what they add to ε and δ; returns the run's totals."""
    path = Path(run_dir) / NOISE_DRAWS
    total = json.loads(path.read_text()) if path.is_file() else {"draws": 0, "rho": 0.0, "tail": 0.0}
    total = {"draws": int(total["draws"]) + TALLY.draws, "rho": float(total["rho"]) + TALLY.rho,
             "tail": float(total["tail"]) + TALLY.tail}
    atomic_write_text(path, json.dumps(total) + "\n")
    TALLY.reset()
    return total


def _sampling(noise: dict[str, Any], key: str) -> float | None:
    added = noise.get(key)
    return None if added is None else float(f"{added:.3g}")


class Method:
    """A method: `name`, config `sections`, and the three steps the runner calls."""

    name: str = ""
    sections: dict[str, type] = {}
    uses_ledger: bool = True  # False: the method keeps its own record (DP-SGD: Opacus's accountant)
    weights_name: str = "student"  # the released model's file in the run directory (DP-SGD: "model")

    def plan(self, ctx: Context, recorded: LedgerView) -> Plan:
        """The events still to spend (`recorded`: what an earlier, interrupted invocation already spent)."""
        raise NotImplementedError

    def train(self, ctx: Context, plan: Plan, ledger: PrivacyLedger | None) -> Trained:
        raise NotImplementedError

    def report(self, ctx: Context, plan: Plan, trained: Trained, ledger: PrivacyLedger | None) -> Report:
        raise NotImplementedError

    def pathways(self, ctx: Context, plan: Plan) -> dict[str, list[Pathway]]:
        """Every pathway from the private data to each released artifact, and whether ε covers it: from the
        configuration and the plan alone, so that a dry run states what its ε covers as the run's report will."""
        raise NotImplementedError

    def summary_name(self, ctx: Context) -> str:
        """The method name written into summary.json (DGD with Gaussian votes is "dgd+")."""
        return self.name

    def check_end_to_end(self, ctx: Context) -> None:
        """`--privacy end-to-end`: refuse, before anything trains, a configuration whose released model could not
        be covered as a whole (methods/end_to_end.py). A method without such a mode refuses every configuration; one
        that can say why it has none (SRR's label-DP setting, PATE) overrides this with its reason."""
        raise ConfigError(f"{self.name} has no end-to-end mode: drop --privacy end-to-end")

    def run(self, request: RunRequest, *, cache: bool = True, **inputs: Any) -> RunResult:
        prep = prepare_run(self.name, request, {"budget": Budget, **self.sections})
        budget: Budget = prep.sections["budget"]
        stages = Stages(StageCache(enabled=cache), prep.env, prep.data, prep.run)
        ctx = Context(prep=prep, request=request, stages=stages, budget=budget, inputs=inputs)
        # plan against what an interrupted earlier invocation recorded (read-only: a plan refused by its own
        # checks leaves no ledger behind), then refuse to start beyond the budget, before anything trains
        if budget.privacy == "end-to-end":
            self.check_end_to_end(ctx)
        plan = self.plan(ctx, LedgerView.read(prep.run.path))
        plan.notes[:0] = prep.notes  # what was fitted to the data comes first
        check_plan(self, ctx, plan)  # what the budget buys, and whether it can teach anything (methods/plan_judge.py)
        ledger = (PrivacyLedger(prep.run.path, max_epsilon=budget.limit, accounting=budget.accounting,
                                delta=budget.delta) if self.uses_ledger else None)
        if ledger is not None:
            ledger.check_can_start(plan.remaining)
        check_own_budget(self, budget, plan)  # a method without the ledger: its plan's ε (methods/dry_run.py)
        if request.dry_run:
            raise DryRunPlan(dry_run_info(self, ctx, plan, ledger))
        for line in plan_lines(self, ctx, plan):  # said now, on a terminal, a file or a pipe (engine/progress.py)
            say(line, enabled=prep.env.progress)

        TALLY.reset()  # this invocation's secure draws; earlier invocations' are in the run directory (noise_draws)
        trained = self.train(ctx, plan, ledger)
        sampled = noise_draws(prep.run.path)
        student = trained.student
        accuracy, chance = evaluate_release(student, prep.data.test, prep.env)  # and whether it answers at chance
        prep.run.save_weights(self.weights_name, student, metadata={"method": self.name})
        if trained.generator is not None:
            prep.run.save_weights("generator", trained.generator, metadata={"method": self.name})

        report = self.report(ctx, plan, trained, ledger)
        uncovered = [p.via for p in report.pathways[self.weights_name] if not p.covered]
        if budget.privacy == "end-to-end" and uncovered:  # check_end_to_end let through what it should have refused
            raise RunError(f"end-to-end run left pathways uncovered ({'; '.join(uncovered)}): the release is withheld")
        eps = (report.epsilon if report.epsilon is not None
               else {name: r.value for name, r in ledger.epsilon_both().items()})
        noise = noise_source(report.secure_noise, report.noise_option, draws=sampled["draws"], rho=sampled["rho"],
                             tail=sampled["tail"], epsilon=eps["strict"], delta=budget.delta)
        extra = dict(report.extra)
        if chance.get("warning"):  # the privacy report says first that the model it describes answers at chance
            extra["release_warning"] = chance["warning"]
        if report.statement is not None:
            extra["statement"] = report.statement
        write_privacy_json(prep.run.path, report.pathways, method=self.name, noise=noise, extra=extra)
        wall = trained.wall_seconds if trained.wall_seconds is not None else time.perf_counter() - prep.started
        summary = finish_run(
            prep, request, method=self.summary_name(ctx), wall_seconds=wall,
            test_accuracy=round(accuracy, 4),
            baseline_accuracy=None if trained.baseline_accuracy is None else round(float(trained.baseline_accuracy), 4),
            epsilon_paper=round_epsilon(eps["paper"]), epsilon_strict=round_epsilon(eps["strict"]), delta=budget.delta,
            target_epsilon=budget.epsilon, max_epsilon=budget.max_epsilon, accounting=budget.accounting,
            noise_secure=noise["secure"], epsilon_sampling=_sampling(noise, "epsilon_added"),
            delta_sampling=_sampling(noise, "delta_added"),
            not_covered=uncovered, privacy_scope=budget.privacy,
            plan_notes=plan.notes, **{**trained.fields, **report.fields, **chance})
        privacy = json.loads((prep.run.path / "privacy.json").read_text())
        return RunResult(student=student.cpu().eval(),
                         generator=None if trained.generator is None else trained.generator.cpu().eval(),
                         summary=summary, privacy=privacy)
