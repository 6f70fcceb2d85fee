"""`privdistill export RUN_DIR OUT`: the releasable part of a finished run, with its model card."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from privdistill.cli.lazy import lazy_module

# imported when a command runs, not for --help: they import torch (cli/lazy.py)
release = lazy_module("privdistill.release")


def export_command(
    run_dir: Annotated[Path, typer.Argument(help="a finished run directory")],
    out: Annotated[Path, typer.Argument(help="new directory for the release (model.safetensors, README.md model "
                                             "card, privacy.json)")],
    allow_non_private: Annotated[bool, typer.Option(
        "--allow-non-private", help="export a model that is not differentially private as a whole (refused "
                                    "otherwise); its model card says so first")] = False,
    generator: Annotated[bool, typer.Option(
        "--generator", help="also export the run's generator (refused unless its epsilon covers it)")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace OUT if it exists")] = False,
    allow_reproducible_noise: Annotated[bool, typer.Option(
        "--allow-reproducible-noise", help="export a run whose privacy noise a seed regenerates (refused "
                                           "otherwise); its model card says first that the guarantee holds only "
                                           "while the seed stays secret")] = False,
    allow_chance: Annotated[bool, typer.Option(
        "--allow-chance", help="export a model that answers at chance (refused otherwise: see its summary's "
                               "warning); its model card says so first")] = False,
) -> None:
    """Export a run's released classifier: weights with their metadata, a model card (what ε covers and what it
    does not, accuracy, audits, preprocessing) and the privacy report; never checkpoints, the ledger or the seed.
    Load it with `privdistill.load(OUT)`."""
    console = Console()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", release.NonPrivateReleaseWarning)
        path = release.export_run(run_dir, out, allow_non_private=allow_non_private, generator=generator,
                                  overwrite=overwrite, allow_reproducible_noise=allow_reproducible_noise,
                                  allow_chance=allow_chance)
    if any(issubclass(w.category, release.NonPrivateReleaseWarning) for w in caught):
        console.print("[red]warning:[/] exported with --allow-non-private: this release is not differentially "
                      "private as a whole (its model card says so first)", highlight=False)
    card = release.load(path).card
    if card.get("at_chance"):
        console.print("[red]warning:[/] exported with --allow-chance: this model answers at chance (its model card "
                      "says so first)", highlight=False)
    style = "green" if card.get("dp_as_a_whole") else "yellow"
    console.print(f"exported {run_dir} -> {path} ({', '.join(sorted(p.name for p in path.iterdir()))})",
                  highlight=False)
    console.print(f"[{style}]Privacy:[/] {card['guarantee']}", highlight=False)
