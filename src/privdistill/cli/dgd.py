"""`privdistill dgd`: discriminative-generative distillation."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console

from privdistill.cli import options as o
from privdistill.cli.display import show_summary
from privdistill.cli.lazy import lazy_module
from privdistill.privacy.events import count_of

# imported when a command runs, not for --help: they import torch (cli/lazy.py)
dgd = lazy_module("privdistill.methods.dgd")


@o.private_command("dgd")
def command(
    run: o.RunArgs,
    queries: Annotated[Optional[int], typer.Option(
        "--queries", "-q", min=1, help="|D̂s|: number of labelled queries (overrides --epsilon)")] = None,
    aggregation: Annotated[Optional[str], typer.Option("--aggregation", help="laplace (DGD), gaussian (DGD+)")] = None,
    no_latent_noise: Annotated[bool, typer.Option(
        "--no-latent-noise", help="skip the Laplace noise on VAE codes (ablation)")] = False,
    inputs: Annotated[Optional[str], typer.Option("--inputs", help="generator, or private-holdout (Fig. 7)")] = None,
) -> None:
    """DGD: teacher ensemble + noisy votes, data-free generator, VAE, semi-supervised student."""
    extra = o.section_overrides("dgd", queries=queries, aggregation=aggregation, inputs=inputs,
                                latent_noise=False if no_latent_noise else None)
    s = dgd.run_dgd(run.request(extra), cache=not run.no_cache).summary
    show_summary(s, title=f"{s['method']} on {s['dataset']}")
    Console().print(f"ε covers {s['epsilon_covers']} (δ = {s['delta']:g}, "
                    f"{count_of(s['queries'], 'query', 'queries')}). "
                    f"[yellow]Not covered:[/] {'; '.join(s['not_covered']) or 'nothing'}. "
                    f"Full report: privdistill privacy report {s['run_dir']}", highlight=False)
