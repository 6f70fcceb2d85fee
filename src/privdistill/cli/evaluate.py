"""`privdistill eval RUN_DIR`: accuracy of a run's released model on a test split, and whether it is at chance or
misses a class there (the release check of methods/chance.py)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from privdistill.cli import options as o
from privdistill.cli.lazy import lazy_module
from privdistill.config import RunOptions
from privdistill.errors import ModelError, RunError

# imported when a command runs, not for --help: they import torch (cli/lazy.py)
datasets = lazy_module("privdistill.data")
engine = lazy_module("privdistill.engine")
chance = lazy_module("privdistill.methods.chance")


def eval_command(run_dir: Annotated[Path, typer.Argument(help="a run directory")],
                 dataset: Annotated[Optional[str], typer.Option(
                     "--dataset", "-d", help="evaluate on another dataset's test split")] = None,
                 weights: Annotated[Optional[str], typer.Option(
                     "--weights", help="which weights (default: student, else model)")] = None,
                 data_root: o.DataRoot = None, device: o.Device = None) -> None:
    """Evaluate the released model of a run on a test split and print its accuracy."""
    run = engine.RunDir.existing(run_dir)
    config = run.config()
    name = weights or next((w for w in ("student", "model") if run.has_weights(w)), None)
    if name is None:
        raise RunError(f"{run_dir} holds no student.safetensors or model.safetensors to evaluate")
    if not run.has_weights(name):
        present = sorted(p.stem for p in Path(run_dir).glob("*.safetensors"))
        raise RunError(f"{run_dir} has no {name}.safetensors; weights in it: {', '.join(present) or 'none'}")
    env = engine.Env.from_options(RunOptions(device=device or "auto", progress=False))
    model = run.load_weights(name, device=env.device)
    data = datasets.load_data(dataset or config["dataset"], data_root or config.get("run", {}).get("data_root"))
    _check_fits(model, data, run_dir, name)
    with warnings.catch_warnings():  # the check's warning is printed below, first, as a run's summary does
        warnings.simplefilter("ignore", chance.ChanceWarning)
        accuracy, fields = chance.evaluate_release(env.place(model), data.test, env)
    console = Console()
    if fields.get("warning"):  # at chance, or a missed class, on this test split (methods/chance.py)
        console.print(f"[bold red]warning:[/] {escape(fields['warning'])}", highlight=False, soft_wrap=True)
    console.print(f"{name} of {run_dir} on {data.test.name} test ({len(data.test)} images): "
                  f"[bold]accuracy {accuracy:.4f}[/]", highlight=False)


def _check_fits(model, data, run_dir: Path, name: str) -> None:
    """A model built for other images or classes gives a shape error deep in torch, or a meaningless
    accuracy: compare what the registry built it for with the test split first."""
    built = getattr(model, "registry_kwargs", {}) or {}
    wanted = {"in_channels": data.channels, "num_classes": data.num_classes, "image_size": data.image_size[0]}
    differ = [f"{k} {built[k]} (data: {v})" for k, v in wanted.items() if k in built and built[k] != v]
    if differ:
        raise ModelError(f"{name} of {run_dir} was built for other data than {data.test.name}: " + ", ".join(differ))
