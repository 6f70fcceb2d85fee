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


def _version(value: bool) -> None:
    if value:
        from privdistill import __version__

        typer.echo(f"privdistill {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", help="print the version and exit", is_eager=True,
                                       callback=_version)) -> None:
    """Release classifiers with a stated differential-privacy guarantee by data-free distillation."""


_MOUNTED = False


def _mount_subcommands() -> None:
    global _MOUNTED
    if _MOUNTED:
        return
    _MOUNTED = True
    from privdistill.cli import bench, data, dgd, evaluate, models, stages, train

    app.add_typer(data.app, name="data")
    app.add_typer(train.app, name="train")
    app.add_typer(stages.teachers_app, name="teachers")
    app.add_typer(stages.generator_app, name="generator")
    app.add_typer(stages.cache_app, name="cache")
    app.command("dgd")(dgd.command)
    app.add_typer(bench.app, name="bench")
    app.command("eval")(evaluate.eval_command)
    app.command("models")(models.models_command)
    from privdistill.cli import privacy as privacy_cli

    app.add_typer(privacy_cli.app, name="privacy", help="Estimate ε under both accountings; privacy reports.")
    from privdistill.cli import srr as srr_cli

    app.command("srr")(srr_cli.srr_command)
    from privdistill.cli import dpdfd as dpdfd_cli

    app.command("dpdfd")(dpdfd_cli.command)
    from privdistill.cli import audit as audit_cli
    from privdistill.cli import baselines as baselines_cli

    app.command("dpsgd")(baselines_cli.dpsgd_command)
    app.command("pate")(baselines_cli.pate_command)
    app.command("audit")(audit_cli.audit_command)
    app.command("report")(bench.run_report_command)
    from privdistill.cli import release as release_cli

    app.command("export")(release_cli.export_command)


def get_app() -> typer.Typer:
    """The fully mounted app (tests call it through typer's CliRunner)."""
    _mount_subcommands()
    return app


def main() -> None:
    from privdistill.engine.device import keep_freed_memory

    keep_freed_memory()  # before any tensor exists; see its docstring for the measured cost of not doing it
    _mount_subcommands()
    try:
        app()
    except PrivdistillError as err:
        from rich.console import Console

        Console(stderr=True).print(f"[bold red]error:[/] {err}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
