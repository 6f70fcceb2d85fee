"""`privdistill data`: list, prepare and verify datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from privdistill.cli import options as o

app = typer.Typer(help="List, prepare and verify datasets (run without a sub-command to list).",
                  invoke_without_command=True)
console = Console()


@app.callback()
def data_main(ctx: typer.Context, data_root: o.DataRoot = None,
              no_verify: Annotated[bool, typer.Option("--no-verify", help="skip content hashes")] = False) -> None:
    """List the built-in datasets: where each was found, sizes, integrity."""
    if ctx.invoked_subcommand is not None:
        return
    from privdistill.data import BUILTIN, resolve_data_root, status

    root = resolve_data_root(data_root)
    table = Table(title=f"datasets under {root}")
    for col in ("dataset", "status", "train", "test", "integrity", "location"):
        table.add_column(col)
    statuses = [status(name, root, verify=not no_verify) for name in BUILTIN]
    for st in statuses:
        integrity = {True: "[green]verified[/]", False: "[red]FAILED[/]", None: "-"}[st.verified]
        table.add_row(st.name, "[green]ready[/]" if st.present and not st.problems else
                      ("[red]problem[/]" if st.present else "[yellow]missing[/]"),
                      str(st.train_size or "-"), str(st.test_size or "-"), integrity, str(st.location))
    console.print(table)
    for st in statuses:
        for problem in st.problems:
            console.print(f"[bold]{st.name}[/]: {problem}", highlight=False)


@app.command("prepare")
def prepare_cmd(names: Annotated[list[str], typer.Argument(help="datasets, e.g. mnist fashion-mnist")],
                source: Annotated[
                    Optional[Path], typer.Option("--from", help="directory holding the official files")
                ] = None,
                data_root: o.DataRoot = None,
                offline: Annotated[bool, typer.Option("--offline", help="never download")] = False) -> None:
    """Copy (and verify) datasets into the data root from offline files, or download them."""
    from privdistill.data import prepare, resolve_data_root
    from privdistill.errors import DataError

    root = resolve_data_root(data_root)
    for name in names:
        if name.startswith(("npz:", "folder:")):
            raise DataError(f"{name}: your own data is read in place and needs no preparing; pass it as "
                            "--dataset to any command")
        how = prepare(name, root, source=source, download=not offline)
        console.print(f"[green]{name}[/]: {how} -> {root}", highlight=False, soft_wrap=True)
