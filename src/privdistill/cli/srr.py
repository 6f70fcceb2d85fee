"""`privdistill srr`: label-DP data-free distillation with selective randomized response (SRR paper)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer
from rich.console import Console

from privdistill.cli import options as o
from privdistill.cli.display import show_summary
from privdistill.cli.lazy import lazy_module

# imported when a command runs, not for --help: they import torch (cli/lazy.py)
srr = lazy_module("privdistill.methods.srr")

console = Console()


class Mechanism(str, Enum):
    srr = "srr"
    rr = "rr"
    rr_prior = "rr-prior"


@o.private_command("srr")
def srr_command(
    run: o.RunArgs,
    # the target is per label with --accounting paper (the paper's ε), of the whole run with strict (the
    # per-label ε is calibrated to fit it)
    setting: Annotated[Optional[o.SRRSetting], typer.Option(
        "--setting", help="data-free (Table I) or label-dp (Table II: real inputs, labels protected)")] = None,
    mechanism: Annotated[Optional[Mechanism], typer.Option(
        "--mechanism", "-m", help="srr, rr (plain randomized response) or rr-prior (RRWithPrior)")] = None,
    stages: Annotated[Optional[int], typer.Option("--stages", "-T", help="number of stages T (srr.stages)")] = None,
    samples: Annotated[Optional[int], typer.Option(
        "--samples", "-N", help="labels drawn in all (srr.num_samples; 0 = |D|)")] = None,
) -> None:
    """Distil a private teacher into a student through labels drawn once by selective randomized response.

    Prints the student's accuracy with both epsilons: the paper's (per label, pure) and the strict one
    (composed over every label from the one teacher), and what neither covers.
    """
    request = run.request(o.section_overrides("srr", setting=setting and setting.value,
                                              mechanism=mechanism and mechanism.value, stages=stages,
                                              num_samples=samples))
    summary = srr.run_srr(request, cache=not run.no_cache).summary
    show_summary(summary, title=f"SRR ({summary['setting']}, {summary['mechanism']}) on {summary['dataset']}")
    if summary.get("dp_source"):  # end to end: the labels are a DP teacher's own, no mechanism ran
        console.print(f"{summary['num_labels']} labels in {summary['stages']} stages from the DP teacher "
                      f"({summary['dp_source']['test_accuracy']:.4f} on the test set; post-processing, no label "
                      f"noise). Strict epsilon {summary['epsilon_strict']} at delta {summary['delta']:g} covers "
                      f"{summary['epsilon_covers']}. Report: privdistill privacy report {summary['run_dir']}",
                      highlight=False)
        return
    field = "label_accuracy_vs_truth" if summary["setting"] == "label-dp" else "label_accuracy_vs_teacher"
    agree = "the true label" if summary["setting"] == "label-dp" else "the teacher's label"
    console.print(f"{summary['num_labels']} labels in {summary['stages']} stages, a share {summary[field]:.4f} "
                  f"of them equal to {agree} (evaluation only); epsilon per label "
                  f"{summary['epsilon_per_label']:.6g} for the target {summary['target_epsilon']:g} "
                  f"({summary['accounting']} accounting); paper: "
                  f"{summary['epsilon_paper']}, strict {summary['epsilon_strict']} at delta {summary['delta']:g} "
                  f"({summary['relation']}).", highlight=False)
    console.print(f"[yellow]Not covered:[/] {summary['privacy']}. Report: privdistill privacy report "
                  f"{summary['run_dir']}", highlight=False)
