"""`privdistill models`: the model registry."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def models_command() -> None:
    """List the registered networks."""
    from privdistill.models import list_models

    table = Table(title="models")
    for col in ("name", "kind", "description"):
        table.add_column(col)
    for entry in list_models():
        table.add_row(entry.name, entry.kind, entry.description)
    Console().print(table)
