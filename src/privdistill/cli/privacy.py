"""`privdistill privacy ...`: estimate epsilon under both accountings; print a run's privacy report.

    privdistill privacy estimate --mechanism lnmax --laplace-scale 40 --queries 1300 --delta 1e-5
    privdistill privacy estimate --mechanism dpdfd --clip-norm 1e-3 --sigma 100 --batch-size 256 --steps 1000
    privdistill privacy estimate --mechanism srr --epsilon-per-label 1 --queries 60000 --num-classes 10
    privdistill privacy estimate --mechanism dpdfd ... --target-epsilon 1     (calibrate)
    privdistill privacy report RUN_DIR [--json]
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import typer

from privdistill.cli import options as o
from privdistill.cli.lazy import lazy_module
from privdistill.errors import PrivacyError
from privdistill.privacy._checks import check_delta
from privdistill.privacy.calibration import calibrate_noise, max_count
from privdistill.privacy.events import (
    ConfidentGaussianQueries,
    GaussianQueries,
    LaplaceOnSyntheticCodes,
    LaplaceQueries,
    NormalisedGaussian,
    RandomizedResponse,
    RandomizedResponseWithPrior,
)
from privdistill.privacy.report import fmt_num, privacy_report, render_text, run_report

# each method's pathways live with the method (they import torch: imported when `estimate` runs)
dgd = lazy_module("privdistill.methods.dgd_plan")
dpdfd_plan = lazy_module("privdistill.methods.dpdfd_plan")
pate = lazy_module("privdistill.methods.pate")
srr_plan = lazy_module("privdistill.methods.srr_plan")

app = typer.Typer(help="Estimate epsilon under both accountings (paper and strict); privacy reports of runs.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


class Mechanism(str, Enum):
    lnmax = "lnmax"
    gnmax = "gnmax"
    confident_gnmax = "confident-gnmax"
    dpdfd = "dpdfd"
    srr = "srr"
    rr = "rr"


class Granularity(str, Enum):
    per_sample = "per_sample"
    batch_sum = "batch_sum"


def _need(value: Any, flag: str, mechanism: str) -> Any:
    if value is None:
        raise PrivacyError(f"--mechanism {mechanism} needs {flag}")
    return value


def _build_events(mechanism: Mechanism, *, queries, steps, laplace_scale, epsilon0, sigma, sigma1, sigma2,
                  threshold, answered, clip_norm, batch_size, num_teachers, granularity, algorithm,
                  dataset_size, num_classes, epsilon_per_label, srr_setting, latent_epsilon, filter_budget=None):
    m = mechanism.value
    if mechanism is Mechanism.dpdfd:
        if queries is not None and steps is None:
            steps = queries
        main = NormalisedGaussian(clip_norm=_need(clip_norm, "--clip-norm", m), sigma=_need(sigma, "--sigma", m),
                          batch_size=_need(batch_size, "--batch-size", m), steps=_need(steps, "--steps", m),
                          num_teachers=num_teachers, granularity=granularity.value, algorithm=algorithm,
                          dataset_size=dataset_size, num_classes=num_classes)
    else:
        if steps is not None and queries is None:
            queries = steps
        queries = _need(queries, "--queries", m)
        if mechanism is Mechanism.lnmax:
            if laplace_scale is None and epsilon0 is None:
                raise PrivacyError("--mechanism lnmax needs --laplace-scale (or --epsilon0, scale = 2/epsilon0)")
            if laplace_scale is not None and epsilon0 is not None:
                raise PrivacyError("give either --laplace-scale or --epsilon0, not both")
            main = (LaplaceQueries(scale=laplace_scale, count=queries) if laplace_scale is not None
                    else LaplaceQueries.from_epsilon0(epsilon0, queries))
        elif mechanism is Mechanism.gnmax:
            main = GaussianQueries(sigma=_need(sigma if sigma is not None else sigma2, "--sigma", m), count=queries)
        elif mechanism is Mechanism.confident_gnmax:
            s2 = sigma2 if sigma2 is not None else sigma
            main = ConfidentGaussianQueries(threshold=_need(threshold, "--threshold", m),
                                         sigma1=_need(sigma1, "--sigma1", m), sigma2=_need(s2, "--sigma2", m),
                                         count=queries, answered=answered, filter_budget=filter_budget)
        elif mechanism is Mechanism.srr:
            main = RandomizedResponseWithPrior(epsilon=_need(epsilon_per_label, "--epsilon-per-label", m),
                                               count=queries, num_classes=_need(num_classes, "--num-classes", m),
                                               setting=srr_setting.value)
        else:
            main = RandomizedResponse(epsilon=_need(epsilon_per_label, "--epsilon-per-label", m), count=queries,
                            num_classes=_need(num_classes, "--num-classes", m))
    events = [main]
    if latent_epsilon is not None:
        events.append(LaplaceOnSyntheticCodes(epsilon1=latent_epsilon))
    return main, events


def _pathways_for(mechanism: Mechanism, algorithm: int, srr_setting: o.SRRSetting):
    if mechanism is Mechanism.lnmax:
        return "DGD", dgd.dgd_pathways(aggregation="laplace")
    if mechanism is Mechanism.gnmax:
        return "DGD+ (Gaussian aggregation)", dgd.dgd_pathways(aggregation="gaussian")
    if mechanism is Mechanism.confident_gnmax:
        return "PATE (Confident-GNMax, public inputs)", pate.pate_pathways(aggregation="Confident-GNMax")
    if mechanism is Mechanism.dpdfd:
        return f"DPDFD Alg. {algorithm}", dpdfd_plan.dpdfd_pathways(algorithm=algorithm)
    if mechanism is Mechanism.srr:
        return f"SRR ({srr_setting.value})", srr_plan.srr_pathways(setting=srr_setting.value)
    return None, None


@app.command("estimate")
def estimate(
    mechanism: Mechanism = typer.Option(..., "--mechanism", "-m", help="lnmax | gnmax | confident-gnmax | dpdfd | srr "
                                        "| rr"),
    queries: Optional[int] = typer.Option(None, "--queries", "--labels", "-q", help="noisy-argmax queries or labels "
                                          "released"),
    steps: Optional[int] = typer.Option(None, "--steps", "-T", help="DPDFD training steps"),
    laplace_scale: Optional[float] = typer.Option(None, "--laplace-scale", "-b", help="LNMax Laplace scale b (DGD: "
                                                  "40)"),
    epsilon0: Optional[float] = typer.Option(None, "--epsilon0", help="LNMax per-query epsilon (scale = 2/epsilon0)"),
    sigma: Optional[float] = typer.Option(None, "--sigma", help="GNMax sigma / DPDFD noise scale sigma / "
                                          "Confident-GNMax sigma2"),
    sigma1: Optional[float] = typer.Option(None, "--sigma1", help="Confident-GNMax threshold noise"),
    sigma2: Optional[float] = typer.Option(None, "--sigma2", help="Confident-GNMax answer noise"),
    threshold: Optional[float] = typer.Option(None, "--threshold", help="Confident-GNMax threshold T"),
    answered: Optional[int] = typer.Option(None, "--answered", help="Confident-GNMax: queries answered (default: all)"),
    filter_budget: Optional[int] = typer.Option(
        None, "--filter-budget", help="Confident-GNMax asked under an RDP filter whose budget is this many queries all "
        "answered (pate.filter): the bound, whatever --queries and --answered were"),
    clip_norm: Optional[float] = typer.Option(None, "--clip-norm", "-C", help="DPDFD norm bound C"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", "-B", help="DPDFD batch size B"),
    num_teachers: int = typer.Option(1, "--num-teachers", "-n", help="DPDFD teachers (Alg. 2 if > 1)"),
    granularity: Granularity = typer.Option(Granularity.per_sample, "--granularity", help="DPDFD: per_sample | "
                                            "batch_sum"),
    algorithm: Optional[int] = typer.Option(None, "--algorithm", help="DPDFD algorithm 1, 2 or 3 (default: 1, or 2 if "
                                            "--num-teachers > 1)"),
    dataset_size: Optional[int] = typer.Option(None, "--dataset-size", "-N", help="DPDFD Alg. 3: private set size"),
    num_classes: Optional[int] = typer.Option(None, "--num-classes", "-K", help="classes (SRR/RR; DPDFD Lemma 1 note)"),
    epsilon_per_label: Optional[float] = typer.Option(None, "--epsilon-per-label", help="SRR / RR epsilon per label"),
    srr_setting: o.SRRSetting = typer.Option(o.SRRSetting.data_free, "--srr-setting", help="data-free | label-dp"),
    latent_epsilon: Optional[float] = typer.Option(None, "--latent-epsilon", help="DGD epsilon1 of the latent-code "
                                                   "noise"),
    delta: float = typer.Option(1e-5, "--delta", "-d", help="target delta"),
    target_epsilon: Optional[float] = typer.Option(None, "--target-epsilon", help="calibrate: most queries/steps and "
                                                   "least noise for this epsilon"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Epsilon of a mechanism under both accountings, side by side, and what each covers."""
    check_delta(delta)
    if algorithm is None:
        algorithm = 2 if num_teachers > 1 else 1
    def build(count, answered):
        return _build_events(
            mechanism, queries=count, steps=steps, laplace_scale=laplace_scale, epsilon0=epsilon0, sigma=sigma,
            sigma1=sigma1, sigma2=sigma2, threshold=threshold, answered=answered, clip_norm=clip_norm,
            batch_size=batch_size, num_teachers=num_teachers, granularity=granularity, algorithm=algorithm,
            dataset_size=dataset_size, num_classes=num_classes, epsilon_per_label=epsilon_per_label,
            srr_setting=srr_setting, latent_epsilon=latent_epsilon, filter_budget=filter_budget)

    if filter_budget is not None and mechanism is not Mechanism.confident_gnmax:
        raise PrivacyError("--filter-budget is for --mechanism confident-gnmax only")
    if filter_budget is not None and target_epsilon is not None:
        raise PrivacyError("--filter-budget prices a run made under a filter; calibrate its budget as plain "
                           "confident-gnmax queries (--target-epsilon without --filter-budget)")
    if target_epsilon is not None and queries is None and steps is None:
        # no count given: the question is "how many does the target allow?"; report ε at the strict answer
        probe, probe_events = build(1, answered=None)  # a 1-query probe cannot carry --answered
        strict = _calibrate(probe, probe_events[1:], target_epsilon, delta)["strict"]
        allowed = strict["max_" + (probe.count_field or "count")]
        if allowed < 1:
            raise PrivacyError(f"epsilon {target_epsilon:g} at delta {delta:g} allows no {mechanism.value} "
                               "query/step with this noise under the strict accounting")
        if allowed >= 10**12:
            raise PrivacyError("epsilon does not grow with the count for this mechanism (e.g. label-DP, each label "
                               "released once): give --queries")
        queries = allowed
    main, events = build(queries, answered)
    method, artifacts = _pathways_for(mechanism, algorithm, srr_setting)
    report = privacy_report(events, delta=delta, artifacts=artifacts, method=method)
    calibration = None
    if target_epsilon is not None:
        calibration = _calibrate(main, events[1:], target_epsilon, delta)
        report["calibration"] = calibration
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    _print_estimate(report, calibration)


def _calibrate(main, fixed, target_epsilon: float, delta: float) -> dict[str, Any]:
    out: dict[str, Any] = {"target_epsilon": target_epsilon, "delta": delta, "count_field": main.count_field,
                           "noise_field": main.noise_field}
    for acc in ("paper", "strict"):
        entry: dict[str, Any] = {"max_" + (main.count_field or "count"): max_count(
            main, target_epsilon=target_epsilon, delta=delta, accounting=acc, fixed=fixed)}
        try:
            entry[main.noise_field] = calibrate_noise(main, target_epsilon=target_epsilon, delta=delta,
                                                      accounting=acc, fixed=fixed)
        except PrivacyError as err:
            entry[main.noise_field] = None
            entry["note"] = str(err)
        out[acc] = entry
    return out


def _print_estimate(report: dict[str, Any], calibration: dict[str, Any] | None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    strict = report["accountings"]["strict"]
    paper = report["accountings"]["paper"]
    table = Table(title=f"epsilon at delta = {report['delta']:g} ({report['relation']})")
    table.add_column("accounting", style="bold")
    table.add_column("epsilon", justify="right")
    table.add_column("what it covers")
    table.add_row("paper", fmt_num(report["epsilon"]["paper"]),
                  "the formula the paper prints: " + "; ".join(paper["notes"]))
    strict_notes = [n for m in report["mechanisms"] for n in m["strict_notes"]] + list(strict["notes"])
    table.add_row("strict", fmt_num(report["epsilon"]["strict"]),
                  "a correct bound on every recorded use of the private data (which released artifacts it "
                  "covers: below): " + "; ".join(strict_notes))
    console.print(table)
    details = {k: v for m in report["mechanisms"] for k, v in m["details"].items()}
    if details:
        console.print("details: " + ", ".join(f"{k} = {fmt_num(v)}" for k, v in details.items()), highlight=False)
    if report["artifacts"]:
        console.print(f"\n[bold]Pathways from the private data ({report['method']}):[/]")
        for name, art in report["artifacts"].items():
            console.print(f"  [bold]{name}[/]: {art['statement']}", highlight=False)
            for p in art["pathways"]:
                mark = "[green]covered[/]    " if p["covered"] else "[red]NOT covered[/]"
                console.print(f"    {mark} {p['via']} -> {p['to']}", highlight=False)
    if calibration:
        cal = Table(title=f"calibration for epsilon <= {calibration['target_epsilon']:g}, "
                          f"delta = {calibration['delta']:g}")
        cal.add_column("accounting", style="bold")
        cf = "max_" + (calibration["count_field"] or "count")
        cal.add_column(cf.replace("_", " "), justify="right")
        cal.add_column(f"{calibration['noise_field']} (at the given count)", justify="right")
        for acc in ("paper", "strict"):
            e = calibration[acc]
            cal.add_row(acc, fmt_num(e[cf]),
                        fmt_num(e[calibration["noise_field"]]) + (f"  ({e['note']})" if e.get("note") else ""))
        console.print(cal)


@app.command("report")
def report_command(
    run_dir: Path = typer.Argument(..., help="a run directory holding ledger.jsonl (and privacy.json)"),
    delta: Optional[float] = typer.Option(None, "--delta", "-d", help="delta (default: the ledger's)"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """A run's privacy report: epsilon under both accountings and what each released artifact's epsilon covers."""
    rep = run_report(run_dir, delta=delta)
    if as_json:
        typer.echo(json.dumps(rep, indent=2))
    else:
        typer.echo(render_text(rep), nl=False)
