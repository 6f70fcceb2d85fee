"""How results are shown: one summary table per run, ε always with what it covers."""

from __future__ import annotations

import itertools
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from privdistill.privacy.report import guarantee, is_label_dp

console = Console()


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != 0 and abs(value) < 1e-3:
            return f"{value:g}"
        return f"{value:.4f}" if value < 10 else f"{value:.2f}"
    return str(value)


# ε under the strict accounting comes first; the paper's figure is shown second, and says what it is
_LABELS = {"epsilon_paper": "epsilon_paper (paper's formula)"}


def strict_label(summary: dict[str, Any], is_dp: bool) -> str:
    """The strict ε's row label: "guarantee" only where it covers the whole released model; a correct bound for
    part of the pathways (or for the labels alone) must not read as one."""
    if is_dp:
        return "epsilon_strict (guarantee)"
    return "epsilon_strict (labels only)" if is_label_dp(summary) else "epsilon_strict (part only: see Privacy)"


def show_summary(summary: dict[str, Any], title: str | None = None) -> None:
    is_dp, sentence = guarantee(summary)
    if summary.get("warning"):  # a model at chance (methods/chance.py): said before anything else
        console.print(f"[bold red]warning:[/] {escape(str(summary['warning']))}", highlight=False, soft_wrap=True)
    # the title on a line of its own: as the table's title it wraps to the table's width, mid-name
    console.print(title or f"{summary.get('method')} on {summary.get('dataset')}", style="italic",
                  highlight=False, soft_wrap=True, markup=False)
    table = Table(show_header=False)
    table.add_column("key", style="bold")
    table.add_column("value")
    rows = ["test_accuracy", "test_split", "baseline_accuracy", "epsilon_strict", "epsilon_paper", "delta",
            "wall_seconds", "device", "run_dir", "recorded_as"]
    for key in rows:
        if key in summary and summary[key] is not None:
            label = strict_label(summary, is_dp) if key == "epsilon_strict" else _LABELS.get(key, key)
            table.add_row(label, _fmt(summary[key]))
    console.print(table)
    style = "green" if is_dp else ("red" if summary.get("epsilon_strict") is not None else "yellow")
    console.print(f"[{style}]Privacy:[/] {escape(sentence)}", highlight=False)
    if summary.get("epsilon_paper") is not None and summary.get("epsilon_strict") is not None \
            and summary.get("noise_secure") is False:
        console.print("[yellow]Reproducible noise:[/] the privacy noise was drawn from generators seeded with the "
                      "run's seed (saved in config.yaml); the ε holds only while that seed stays secret, and export "
                      "refuses the run. For a release, train without --seed (secure noise is the default).",
                      highlight=False)


def show_plan(info: dict[str, Any]) -> None:
    """A dry run's plan: what it would spend (ε under both accountings) and the plan's notes; nothing trained."""
    console.print(f"[bold]Dry run[/] of {info['method']} on {info['dataset']} ({info['train_records']} training "
                  f"records): nothing was trained, nothing spent.", highlight=False)
    for event, group in itertools.groupby(info["events"]):  # SRR's 20 stages spend 20 equal events: one line
        times = len(list(group))
        console.print(f"  would spend: {f'{times} x ' if times > 1 else ''}{event}", highlight=False, markup=False)
    eps = info["epsilon"]  # of the whole run, as its summary will state it (the ledger's pricing, or the method's)
    console.print(f"  epsilon at delta {info['delta']:g}: strict {_fmt(eps['strict'])}, paper {_fmt(eps['paper'])} "
                  f"(budget under {info['accounting']}: target {_fmt(info['target_epsilon'])}, max "
                  f"{_fmt(info['max_epsilon'])}; privacy scope: {info['privacy']})", highlight=False)
    console.print(f"  covers: {info['covers']}", highlight=False, markup=False)
    for note in info["notes"]:
        console.print(f"  note: {note}", highlight=False, markup=False)
