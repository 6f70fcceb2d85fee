"""The `privdistill` command line. Each sub-command group lives in its own module and is mounted here."""

from __future__ import annotations

import sys

import typer

from privdistill.errors import PrivdistillError

app = typer.Typer(
    name="privdistill",
    help="Release classifiers with a stated differential-privacy guarantee by data-free distillation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _mount_subcommands() -> None:
    # Imported here so that `privdistill --help` stays fast and a broken optional module
    # cannot stop the others from loading.
    from privdistill.cli import privacy as privacy_cli

    app.add_typer(privacy_cli.app, name="privacy")


def main() -> None:
    _mount_subcommands()
    try:
        app()
    except PrivdistillError as err:
        from rich.console import Console

        Console(stderr=True).print(f"[bold red]error:[/] {err}", highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
