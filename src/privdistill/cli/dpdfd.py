"""`privdistill dpdfd`: DPDFD model conversion (one teacher, n disjoint teachers, or private data directly)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from privdistill.cli import options as o
from privdistill.cli.display import show_summary
from privdistill.cli.lazy import lazy_module

# imported when a command runs, not for --help: they import torch (cli/lazy.py)
dpdfd = lazy_module("privdistill.methods.dpdfd")

console = Console()


@o.private_command("dpdfd")
def command(
    run: o.RunArgs,
    algorithm: Annotated[Optional[int], typer.Option(
        "--algorithm", "-a", help="1: one teacher, 2: n disjoint teachers, 3: private data directly")] = None,
    steps: Annotated[Optional[int], typer.Option(
        "--steps", min=0, help="exactly this many steps (refused over budget); 0: all the budget allows")] = None,
    max_steps: Annotated[Optional[int], typer.Option("--max-steps", help="cap on the steps the budget allows")] = None,
    teacher: Annotated[Optional[Path], typer.Option(
        "--teacher", "-t", help="run directory of a trained classifier (model.safetensors); default: the cached "
                                "baseline stage")] = None,
    teacher_module: Annotated[Optional[Path], typer.Option(
        "--teacher-module", help="a torch.save'd nn.Module (unpickled: trusted files only)")] = None,
    torchvision_model: Annotated[Optional[str], typer.Option(
        "--torchvision", help="torchvision model name (with --weights)")] = None,
    weights: Annotated[Optional[Path], typer.Option("--weights", help="state_dict file for --torchvision")] = None,
    teacher_range: Annotated[Optional[str], typer.Option(
        "--teacher-range", help="LO,HI: the pixel range the given teacher was trained on (e.g. 0,1 for ToTensor); "
                                "default: this package's -1,1")] = None,
) -> None:
    """Convert a teacher into a DP student by data-free distillation with noised output gradients (DPDFD)."""
    request = run.request(o.section_overrides("dpdfd", algorithm=algorithm, steps=steps, max_steps=max_steps))
    spec = dpdfd.TeacherSpec(run_dir=str(teacher) if teacher else None,
                             module_file=str(teacher_module) if teacher_module else None,
                             torchvision=torchvision_model, weights=str(weights) if weights else None,
                             input_range=o.parse_range(teacher_range, "--teacher-range"))
    summary = dpdfd.run_dpdfd(request, teacher=spec, cache=not run.no_cache).summary
    show_summary(summary, title=f"DPDFD (Alg. {summary['algorithm']}) on {summary['dataset']}")
    console.print(f"{summary['steps']} steps (planned {summary['planned_steps']}), sigma {summary['sigma']:g}, "
                  f"C {summary['clip_norm']:g}, B {summary['batch_size']}; target epsilon {summary['target_epsilon']} "
                  f"({summary['accounting']} accounting); steps the target allows: {summary['steps_allowed']}",
                  highlight=False)
    for note in summary.get("plan_notes") or []:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
    if summary.get("stopped"):
        console.print(f"[yellow]stopped early:[/] {summary['stopped']}", highlight=False)
    console.print(f"privacy: {summary['privacy']}", highlight=False)
    console.print(f"report: privdistill privacy report {summary['run_dir']}", highlight=False)
