"""`privdistill data`: list, prepare and verify datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from privdistill.cli import options as o
from privdistill.cli.lazy import lazy_module
from privdistill.errors import DataError

# imported when a command runs, not for --help: they import torch (cli/lazy.py)
datasets = lazy_module("privdistill.data")
synthetic = lazy_module("privdistill.engine.synthetic")

app = typer.Typer(help="List, prepare and verify datasets (run without a sub-command to list).",
                  invoke_without_command=True)
console = Console()


@app.callback()
def data_main(ctx: typer.Context, data_root: o.DataRoot = None,
              no_verify: Annotated[bool, typer.Option("--no-verify", help="skip content hashes")] = False) -> None:
    """List the built-in datasets: where each was found, sizes, integrity."""
    if ctx.invoked_subcommand is not None:
        return
    root = datasets.resolve_data_root(data_root)
    table = Table(title=f"datasets under {root}")
    for col in ("dataset", "status", "train", "test", "integrity", "location"):
        table.add_column(col)
    statuses = [datasets.status(name, root, verify=not no_verify) for name in datasets.BUILTIN]
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
                source: Annotated[Optional[Path], typer.Option("--from", help="directory holding the official "
                                                                              "files")] = None,
                data_root: o.DataRoot = None,
                offline: Annotated[bool, typer.Option("--offline", help="never download")] = False) -> None:
    """Copy (and verify) datasets into the data root from offline files, or download them."""
    root = datasets.resolve_data_root(data_root)
    for name in names:
        if name.startswith(("npz:", "folder:")):
            raise DataError(f"{name}: your own data is read in place and needs no preparing; pass it as "
                            "--dataset to any command")
        how = datasets.prepare(name, root, source=source, download=not offline)
        console.print(f"[green]{name}[/]: {how} -> {root}", highlight=False, soft_wrap=True)


@app.command("inspect")
def inspect_cmd(name: Annotated[str, typer.Argument(help="mnist, fashion-mnist, ..., npz:PATH[?range=LO,HI] or "
                                                         "folder:DIR")],
                grid: Annotated[Optional[Path], typer.Option("--grid", help="write a sample grid (PNG): one row "
                                                                             "per class")] = None,
                data_root: o.DataRoot = None) -> None:
    """What privdistill reads from a dataset: image shape, pixel scale, class counts per split, and a sample
    grid to look at before training anything (a wrong scale shows as black or washed-out images)."""
    import torch

    data = datasets.load_data(name, data_root)
    train, test = data.train, data.test
    # one unwrapped line, not the table's title: a title wraps to the narrow table ("?range=0,1" / "6: ...")
    console.print(f"{name}: {len(train)} training and {len(test)} test images, {data.channels} x "
                  f"{data.image_size[0]} x {data.image_size[1]}, {data.num_classes} classes; the test images: "
                  f"{data.test_from or 'the test split'}", highlight=False, soft_wrap=True, markup=False)
    table = Table()
    for col in ("class", "train", "test"):
        table.add_column(col, justify="right")
    counts = [torch.bincount(split.labels, minlength=data.num_classes).tolist() for split in (train, test)]
    for k, (a, b) in enumerate(zip(*counts)):
        table.add_row(str(train.classes[k] if k < len(train.classes) else k), str(a), str(b))
    console.print(table)
    pixels = train.images.float()
    console.print(f"pixels as read (uint8, 0..255): min {int(pixels.min())}, max {int(pixels.max())}, mean "
                  f"{float(pixels.mean()):.1f}; the models read x / 127.5 - 1, in [-1, 1]", highlight=False)
    if float(pixels.mean()) < 10 or float(pixels.mean()) > 245:
        console.print("[yellow]warning:[/] nearly uniform images: check the pixel scale (npz:PATH?range=LO,HI)",
                      highlight=False)
    if min(counts[0]) < max(1, len(train) // (20 * data.num_classes)):
        console.print("[yellow]warning:[/] some classes are rare in the training split (see the counts)",
                      highlight=False)
    if grid is not None:
        path = synthetic.save_grid(train.images, train.labels, grid, per_class=10, num_classes=data.num_classes)
        console.print(f"sample grid: {path}", highlight=False)
