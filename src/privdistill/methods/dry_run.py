"""What a dry run (`--dry-run`) states before anything trains, from the plan the run itself spends: the noise and
counts, ε under both accountings as the summary will state it, what it covers, and the budget check (the runner
raises DryRunPlan once every check has passed). Imports no torch: the command line catches DryRunPlan.

One source of truth: a ledger method's ε is `PrivacyLedger.epsilon_both(planned=...)`, the function its summary
reads once spent; DP-SGD states its ε in its plan (`Plan.epsilon`), which its report reuses.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from privdistill.errors import BudgetExceededError, RunError
from privdistill.privacy.accounting import REPLACE_ONE, merge_events
from privdistill.privacy.report import guarantee

if TYPE_CHECKING:
    from privdistill.methods.runner import Budget, Context, Method, Plan
    from privdistill.privacy.ledger import PrivacyLedger


class DryRunPlan(Exception):
    """Raised by a dry run (RunRequest.dry_run) once the plan has passed every check: `info` is what the run would
    spend and what the plan notes (e.g. what the vote noise leaves of the teachers' answer). Nothing trained."""

    def __init__(self, info: dict[str, Any]):
        super().__init__("dry run: nothing was trained")
        self.info = info


def round_epsilon(x: float) -> float | str:
    """Every summary prints ε the same way: 6 significant decimals, "inf" for no guarantee."""
    return "inf" if math.isinf(x) else round(float(x), 6)


def planned_epsilon(method: Method, plan: Plan, ledger: PrivacyLedger | None) -> tuple[dict[str, float], str]:
    """ε by accounting the run will report once its plan is spent, and the neighbouring relation of the strict one:
    the ledger's pricing of what it holds plus the plan's events (merged as the ledger merges them: one label-DP
    release is priced once, whatever its stages), or the plan's own ε for a method without the ledger."""
    if ledger is None:
        if plan.epsilon is None:
            raise RunError(f"{method.name} keeps its own privacy record but its plan states no epsilon")
        return dict(plan.epsilon), REPLACE_ONE
    eps = ledger.epsilon_both(planned=plan.remaining)
    return {name: r.value for name, r in eps.items()}, eps["strict"].relation


def check_own_budget(method: Method, budget: Budget, plan: Plan) -> None:
    """A method without the ledger is held to --max-epsilon by its plan's ε, as the ledger holds the others."""
    limit = budget.limit
    if method.uses_ledger or plan.epsilon is None or limit is None:
        return
    value = plan.epsilon[budget.accounting]
    if value > limit:
        spends = "; ".join(s["describe"] for s in plan.spends)
        raise BudgetExceededError(f"the planned run ({spends}) would bring epsilon to {value:.6g} "
                                  f"({budget.accounting} accounting, delta={budget.delta:g}), above --max-epsilon "
                                  f"{limit:g}: nothing was trained")


def dry_run_info(method: Method, ctx: Context, plan: Plan, ledger: PrivacyLedger | None) -> dict[str, Any]:
    """What the run would spend (merged as the ledger records it; "spend": each mechanism's parameters and counts),
    ε under both accountings as its summary will state it (rounded alike), and what that ε covers (the run's
    pathways: "not_covered" as its summary lists them, "covers" in the words its summary is shown with)."""
    eps, relation = planned_epsilon(method, plan, ledger)
    spent = merge_events(plan.remaining)
    not_covered = [p.via for p in method.pathways(ctx, plan)[method.weights_name] if not p.covered]
    epsilon = {name: round_epsilon(eps[name]) for name in ("strict", "paper")}
    _, covers = guarantee({"epsilon_strict": epsilon["strict"], "epsilon_paper": epsilon["paper"],
                           "delta": ctx.budget.delta, "not_covered": not_covered, "relation": relation})
    own = [{k: v for k, v in s.items() if k != "describe"} for s in plan.spends]
    events = [e.describe() for e in spent] + [s["describe"] for s in plan.spends]
    return {"method": method.name, "dataset": ctx.dataset, "train_records": len(ctx.data.train),
            "run_dir": str(ctx.run.path), "events": events, "spend": [e.to_dict() for e in spent] + own,
            "epsilon": epsilon, "relation": relation,
            "not_covered": not_covered, "covers": covers, "delta": ctx.budget.delta,
            "target_epsilon": ctx.budget.epsilon, "max_epsilon": ctx.budget.limit,
            "accounting": ctx.budget.accounting, "privacy": ctx.budget.privacy, "notes": list(plan.notes)}


def plan_lines(method: Method, ctx: Context, plan: Plan) -> list[str]:
    """The plan in a few lines, said as a run starts training (engine.progress.say: on a terminal, a file or a pipe):
    what it trains on, what it will spend, the budget, and the plan's notes. Cheap: no accounting is repeated."""
    budget = ctx.budget
    events = [e.describe() for e in merge_events(plan.remaining)] + [s["describe"] for s in plan.spends]
    target = "none" if budget.epsilon is None else f"{budget.epsilon:g}"
    lines = [f"plan: {method.name} on {ctx.dataset} ({len(ctx.data.train):,} training records, "
             f"{len(ctx.data.test):,} test), run directory {ctx.run.path}"]
    lines += [f"  will spend: {event}" for event in events]
    lines.append(f"  budget: target epsilon {target} under {budget.accounting} accounting, delta {budget.delta:g}"
                 + (f", max {budget.limit:g}" if budget.limit is not None and budget.limit != budget.epsilon else ""))
    lines += [f"  note: {note}" for note in plan.notes]
    return lines
