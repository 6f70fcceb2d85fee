"""`privdistill models`: the model registry."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from privdistill.models import list_models
from privdistill.recipes import METHODS, recipes


def models_command() -> None:
    """List the registered networks."""
    table = Table(title="models")
    for col in ("name", "kind", "description"):
        table.add_column(col)
    for entry in list_models():
        table.add_row(entry.name, entry.kind, entry.description)
    Console().print(table)


def recipes_command(method: Annotated[Optional[str], typer.Argument(help="one method (default: all)")] = None
                    ) -> None:
    """List each method's recipes: what each is, what its ε covers against the paper's, what it measured."""
    table = Table(title="recipes (privdistill METHOD -d DATASET -e EPSILON [--recipe NAME])")
    for col in ("method", "recipe", "what it is", "what its ε covers", "measured (quick preset, CPU)"):
        table.add_column(col)
    for name in [method] if method else METHODS:
        for recipe_name, recipe in recipes(name).items():
            measured = "; ".join(f"{d} ε {e:g} ({recipe.accounting}): {text}"
                                 for (d, e), text in recipe.measured.items())
            paper = "; sized by the paper's ε, no guarantee: see its strict ε" if recipe.accounting == "paper" else ""
            table.add_row(name, recipe_name, recipe.summary, f"{recipe.covers} ({recipe.guarantee}){paper}", measured)
    Console().print(table)
