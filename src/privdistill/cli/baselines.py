"""`privdistill dpsgd` and `privdistill pate`: the private baselines that the distillation methods are compared
with."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console

from privdistill.cli import options as o
from privdistill.cli.display import show_summary
from privdistill.cli.lazy import lazy_module
from privdistill.privacy.events import count_of

# imported when a command runs, not for --help: they import torch (cli/lazy.py)
dpsgd = lazy_module("privdistill.methods.dpsgd")
pate = lazy_module("privdistill.methods.pate")

console = Console()


@o.private_command("dpsgd", cache=False)
def dpsgd_command(
    run: o.RunArgs,
    accountant: Annotated[Optional[str], typer.Option(
        "--accountant", help="Opacus accountant for --accounting paper: rdp or prv")] = None,
    epochs: Annotated[Optional[int], typer.Option("--epochs", help="training epochs (dpsgd.epochs)")] = None,
) -> None:
    """DP-SGD through Opacus: a model trained on the private data with clipped, noised gradients (the default
    recipe: a linear head on ScatterNet features; -r paper: the papers' CNN). σ is
    calibrated to --epsilon under --accounting: strict (the default) on the replace-one ε, paper by Opacus's
    make_private_with_epsilon under --accountant (add/remove-one, as DP-SGD papers report)."""
    s = dpsgd.run_dpsgd(run.request(o.section_overrides("dpsgd", accountant=accountant, epochs=epochs))).summary
    show_summary(s, title=f"DP-SGD on {s['dataset']}")
    a = s["dpsgd_accounting"]
    console.print(f"σ = {a['noise_multiplier']:g}, q = {a['sample_rate']:.4g}, {a['steps']} steps, "
                  f"C = {a['max_grad_norm']:g}. ε at δ = {s['delta']:g}: Opacus RDP {a['epsilon_opacus_rdp']:g}, "
                  f"Opacus PRV {a['epsilon_opacus_prv']:g} (add/remove-one); "
                  f"replace-one (strict) {a['epsilon_replace_one_pld']:g}. Headline: {a['headline']}.",
                  highlight=False)


@o.private_command("pate")
def pate_command(
    run: o.RunArgs,
    queries: Annotated[Optional[int], typer.Option(
        "--queries", "-q", min=1, help="number of queries (overrides --epsilon)")] = None,
    aggregation: Annotated[Optional[str], typer.Option(
        "--aggregation", "-a", help="lnmax, gnmax or confident-gnmax")] = None,
) -> None:
    """PATE: teachers on the private part, noisy aggregation of queries on a held-out public slice, VAT student."""
    request = run.request(o.section_overrides("pate", queries=queries, aggregation=aggregation))
    s = pate.run_pate(request, cache=not run.no_cache).summary
    show_summary(s, title=f"PATE ({s['aggregation']}) on {s['dataset']}")
    console.print(f"{count_of(s['queries'], 'query', 'queries')}, {s['answered']} answered (label accuracy "
                  f"{s['label_accuracy']}); ε covers "
                  f"{s['epsilon_covers']} (δ = {s['delta']:g}). Data-dependent ε {s['epsilon_data_dependent']} "
                  "(not releasable: no smooth-sensitivity step). "
                  f"[yellow]Not covered:[/] {'; '.join(s['not_covered']) or 'nothing'}. "
                  f"Report: privdistill privacy report {s['run_dir']}", highlight=False)
