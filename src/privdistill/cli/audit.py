"""`privdistill audit RUN_DIR...`: membership inference and model inversion against released models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from privdistill.cli import options as o
from privdistill.cli.lazy import lazy_module

# imported when a command runs, not for --help: they import torch (cli/lazy.py)
audits = lazy_module("privdistill.audits.audit")

console = Console()


def audit_command(
    run_dirs: Annotated[list[Path], typer.Argument(help="run directories (each with summary.json and a released "
                                                         "model)")],
    preset: Annotated[Optional[str], typer.Option(
        "--preset", "-p", help="audit settings (default: the run's preset)")] = None,
    config: o.ConfigFile = None, set_: o.Overrides = None, record: o.Record = False,
    device: o.Device = None, data_root: o.DataRoot = None, no_progress: o.NoProgress = False,
    no_mia: Annotated[bool, typer.Option("--no-mia", help="skip membership inference")] = False,
    no_inversion: Annotated[bool, typer.Option("--no-inversion", help="skip model inversion")] = False,
    shadows: Annotated[Optional[int], typer.Option("--shadows", help="LiRA shadow models (audit.shadows)")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="train the shadow models inside the run")] = False,
    result_name: Annotated[Optional[str], typer.Option(
        "--result-name", help="with --record and one run: the results/<preset>/<NAME>.json to update (default: "
                              "derived from the summary)")] = None,
) -> None:
    """Membership inference (loss threshold, LiRA online/offline) and model inversion; numbers go into
    each run's summary.json (and results/<preset>/ with --record)."""
    extra = o.section_overrides("audit", mia=False if no_mia else None, inversion=False if no_inversion else None,
                                shadows=shadows)
    overrides = o.run_overrides(set_, extra=extra, device=device, data_root=data_root, no_progress=no_progress)
    table = Table(title="membership inference (members: training data, non-members: test data)")
    for col in ("run", "attack", "AUC", "TPR @ 1% FPR", "loss-attack AUC", "inversion corr.", "seconds"):
        table.add_column(col)
    for run_dir in run_dirs:
        r = audits.audit_run(run_dir, preset=preset, config_file=str(config) if config else None, overrides=overrides,
                             record=record, cache=not no_cache, result_name=result_name if len(run_dirs) == 1 else None)
        table.add_row(str(run_dir), r.get("mia_attack", "-"), str(r.get("mia_auc", "-")),
                      str(r.get("mia_tpr_at_1pct_fpr", "-")), str(r.get("mia_loss_auc", "-")),
                      str((r.get("inversion") or {}).get("mean_correlation_with_class_mean", "-")), str(r["seconds"]))
        if r.get("inversion"):
            console.print(f"inversion grid: {r['inversion']['grid']}", highlight=False)
    console.print(table)
