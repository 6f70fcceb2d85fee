"""`privdistill train baseline|audit-control`: the non-private reference classifier, and the audits'
positive control."""

from __future__ import annotations

import typer

from privdistill.cli import options as o
from privdistill.cli.display import console, show_summary
from privdistill.cli.lazy import lazy_module

# imported when a command runs, not for --help: they import torch (cli/lazy.py)
baseline_method = lazy_module("privdistill.methods.baseline")
control = lazy_module("privdistill.audits.control")

app = typer.Typer(help="Train reference models.", no_args_is_help=True)


@app.command("baseline")
@o.run_command
def baseline(run: o.RunArgs, no_cache: o.NoCache = False) -> None:
    """Train the classifier directly on all private data (no privacy): the accuracy to beat."""
    summary = baseline_method.train_baseline(run.request(), cache=not no_cache)
    show_summary(summary)
    stage = summary.get("baseline_stage") or {}
    if stage.get("reused"):
        # Otherwise the table's wall_seconds reads as this run's time, and a user expecting a fresh model is misled.
        console.print(f"[yellow]Reused the cached baseline stage[/] {stage.get('path')}: no training ran now; "
                      "wall_seconds is that stage's original training time. --no-cache trains afresh.",
                      highlight=False)


@app.command("audit-control")
@o.run_command
def audit_control(run: o.RunArgs) -> None:
    """Overfit a classifier on the membership audit's members only (no privacy): the attacks' positive control.
    Audit it like any run (`privdistill audit RUN_DIR`): if the attacks cannot find its members either, they are
    too weak at this scale to say anything about the private models."""
    show_summary(control.train_audit_control(run.request()))
