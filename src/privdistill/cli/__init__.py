"""The `privdistill` command line. Each sub-command group lives in its own module and is mounted here."""

from __future__ import annotations

import errno
import functools
import os
import sys
import warnings
from pathlib import Path

import typer

from privdistill import __version__
from privdistill.cli import audit as audit_cli
from privdistill.cli import baselines as baselines_cli
from privdistill.cli import bench, data, dgd, evaluate, models, stages, train
from privdistill.cli import dpdfd as dpdfd_cli
from privdistill.cli import privacy as privacy_cli
from privdistill.cli import release as release_cli
from privdistill.cli import srr as srr_cli
from privdistill.cli.display import show_plan
from privdistill.cli.process import keep_freed_memory
from privdistill.errors import PrivdistillError
from privdistill.methods.dry_run import DryRunPlan


def _flags_without_metavar() -> None:
    """typer >= 0.25 shows an on/off flag as `--resume <bool>`, as if it took a value; show it bare, like click
    does. (Setting metavar="" on each of the ~30 flags would do the same, and be forgotten on the next one.)"""
    try:
        from typer.core import TyperOption
    except ImportError:  # pragma: no cover - older typer renders flags bare already
        return
    shown = TyperOption.display_type_rich

    def display_type_rich(self, ctx):
        return "" if getattr(self, "is_flag", False) and self.metavar is None else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich


_flags_without_metavar()

app = typer.Typer(name="privdistill", no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  help="Release classifiers with a stated differential-privacy guarantee by data-free distillation.")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"privdistill {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", help="print the version and exit", is_eager=True,
                                       callback=_version)) -> None:
    """Release classifiers with a stated differential-privacy guarantee by data-free distillation."""


@functools.cache  # mounted once, however often get_app() and main() are called
def _mount_subcommands() -> None:
    app.add_typer(data.app, name="data")
    app.add_typer(train.app, name="train")
    app.add_typer(stages.teachers_app, name="teachers")
    app.add_typer(stages.generator_app, name="generator")
    app.add_typer(stages.cache_app, name="cache")
    app.command("dgd")(dgd.command)
    app.add_typer(bench.app, name="bench")
    app.command("eval")(evaluate.eval_command)
    app.command("models")(models.models_command)
    app.command("recipes")(models.recipes_command)
    app.add_typer(privacy_cli.app, name="privacy", help="Estimate ε under both accountings; privacy reports.")
    app.command("srr")(srr_cli.srr_command)
    app.command("dpdfd")(dpdfd_cli.command)
    app.command("dpsgd")(baselines_cli.dpsgd_command)
    app.command("pate")(baselines_cli.pate_command)
    app.command("audit")(audit_cli.audit_command)
    app.command("report")(bench.run_report_command)
    app.command("export")(release_cli.export_command)


def get_app() -> typer.Typer:
    """The fully mounted app (tests call it through typer's CliRunner)."""
    _mount_subcommands()
    return app


# Other libraries' warnings that say nothing a user of this command can act on (the Python API leaves them be).
_LIBRARY_NOISE = [
    r"Optimal order is the (largest|smallest) alpha",  # Opacus's RDP accountant; the strict ε is PLD anyway
    r"Full backward hook is firing when gradients are computed with respect to module outputs",  # Opacus hooks
    r"Using a non-full backward hook",
    r"`torch.jit.script` is deprecated",  # kymatio / torchvision internals
    r"Secure RNG turned off",  # Opacus: secure noise here is OpenDP's (dpsgd.secure_mode)
    r"Ignoring drop_last as it is not compatible with DPDataLoader",
]


def _quiet_library_warnings() -> None:
    for pattern in _LIBRARY_NOISE:
        warnings.filterwarnings("ignore", message=pattern)
    default_show = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        # privdistill's own warnings are sentences for the user: one line on stderr, as they happen
        if not getattr(category, "__module__", "").startswith("privdistill"):
            return default_show(message, category, filename, lineno, file, line)
        print(f"warning: {message}", file=sys.stderr, flush=True)

    warnings.showwarning = show


# An operating-system refusal to write (or read) a file: the run directory became unwritable or its disk filled up.
_UNWRITABLE = ("EACCES", "EPERM", "EROFS", "ENOSPC", "EDQUOT")


def unwritable_message(err: OSError) -> str | None:
    """The one-line message for an OSError that says a file could not be written (permissions, a read-only or full
    file system), naming the file and, when it lies in one, the run directory; None for any other OSError."""
    codes = {getattr(errno, name) for name in _UNWRITABLE if hasattr(errno, name)}
    if err.errno not in codes or not err.filename:
        return None
    path = Path(os.fsdecode(err.filename))
    run = None
    for folder in [path, *path.parents][:4]:  # the file, or one of its run directory's folders (ledger_answers/)
        try:
            if (folder / "config.yaml").is_file() and (folder / ".lock").exists():
                run = folder
                break
        except OSError:
            continue
    if run is None:
        return f"cannot access {path}: {err.strerror or err} (check its permissions and the free space of its disk)"
    return (f"cannot write {path}: {err.strerror or err}. The run directory {run} is not writable (permissions, a "
            "read-only or full disk); what the run recorded before this point is consistent (the privacy ledger "
            "records each spend before its answers are used, checkpoints are replaced atomically): make it writable, "
            "or free space, and continue with --resume")


def main() -> None:
    keep_freed_memory()  # before any tensor exists; see its docstring for the measured cost of not doing it
    _quiet_library_warnings()
    _mount_subcommands()
    try:
        app()
    except PrivdistillError as err:
        _exit_with(str(err))
    except OSError as err:
        message = unwritable_message(err)
        if message is None:
            raise
        _exit_with(message)
    except Exception as exc:
        # a dry run ends by raising its plan (methods/dry_run.py, which imports no torch): printed, not an error
        if not isinstance(exc, DryRunPlan):
            raise
        show_plan(exc.info)


def _exit_with(message: str) -> None:
    """One line on stderr, no traceback, exit status 2."""
    from rich.console import Console
    from rich.markup import escape

    # escaped: a message's own brackets ("'value_range' ([lo, hi], ...") are text, not markup to swallow
    Console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(2)


if __name__ == "__main__":
    main()
