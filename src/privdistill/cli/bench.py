"""`privdistill bench ...`: the reproduction matrix (`bench` alone, or `bench run`), its status, the
results tables (`bench report`) and timing benchmarks (`bench teachers`); `privdistill report RUN_DIR`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from privdistill.cli.lazy import lazy_module
from privdistill.errors import ConfigError

# imported when a command runs, not for --help: they import torch (cli/lazy.py)
bench_matrix = lazy_module("privdistill.bench.matrix")
bench_plots = lazy_module("privdistill.bench.plots")
bench_report = lazy_module("privdistill.bench.report")
noise_bench = lazy_module("privdistill.bench.noise")
run_reports = lazy_module("privdistill.bench.run_report")
teacher_bench = lazy_module("privdistill.bench.teachers")

app = typer.Typer(help="The reproduction matrix (run with no sub-command), its report, timing benchmarks.",
                  invoke_without_command=True)
console = Console()

PresetOpt = Annotated[str, typer.Option("--preset", "-p", help="preset whose matrix to run "
                                                               "(bench/matrix/<preset>.yaml)")]
MatrixOpt = Annotated[Optional[str], typer.Option("--matrix", "-m", help="a matrix YAML file instead of the preset's")]
DatasetsOpt = Annotated[Optional[list[str]], typer.Option("--dataset", "-d", help="only these datasets (repeatable)")]
OnlyOpt = Annotated[Optional[list[str]], typer.Option(
    "--only", help="only cells whose name contains this, or =NAME for exactly that cell (repeatable)")]
ResultsOpt = Annotated[Path, typer.Option("--results", help="results directory")]
DocOpt = Annotated[Path, typer.Option("--doc", help="markdown file whose tables are regenerated")]
FiguresOpt = Annotated[Path, typer.Option("--figures", help="directory for the figures")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="list what would run; run nothing")]
NoAuditOpt = Annotated[bool, typer.Option("--no-audit", help="skip the audits")]
NoReportOpt = Annotated[bool, typer.Option("--no-report", help="do not rewrite the tables and figures")]
LockOpt = Annotated[str, typer.Option("--lock", help="CPU lock file taken around every cell")]
NoLockOpt = Annotated[bool, typer.Option("--no-lock", help="run cells without the CPU lock")]
StopOpt = Annotated[bool, typer.Option("--stop-on-failure", help="stop at the first failed cell")]


@app.callback()
def bench(ctx: typer.Context, preset: PresetOpt = "quick", matrix: MatrixOpt = None, dataset: DatasetsOpt = None,
          only: OnlyOpt = None, results: ResultsOpt = Path("results"), doc: DocOpt = Path("docs/results.md"),
          figures: FiguresOpt = Path("docs/figures"), dry_run: DryRunOpt = False, no_audit: NoAuditOpt = False,
          no_report: NoReportOpt = False, lock: LockOpt = "/tmp/privdistill-cpu.lock", no_lock: NoLockOpt = False,
          stop_on_failure: StopOpt = False) -> None:
    """Run the reproduction matrix at a preset (resumable: recorded cells are skipped), audit every released
    model, regenerate docs/results.md and docs/figures/. `privdistill bench --preset quick`."""
    if ctx.invoked_subcommand is None:
        run(preset, matrix, dataset, only, results, doc, figures, dry_run, no_audit, no_report, lock, no_lock,
            stop_on_failure)


@app.command("run")
def run(preset: PresetOpt = "quick", matrix: MatrixOpt = None, dataset: DatasetsOpt = None, only: OnlyOpt = None,
        results: ResultsOpt = Path("results"), doc: DocOpt = Path("docs/results.md"),
        figures: FiguresOpt = Path("docs/figures"), dry_run: DryRunOpt = False, no_audit: NoAuditOpt = False,
        no_report: NoReportOpt = False, lock: LockOpt = "/tmp/privdistill-cpu.lock", no_lock: NoLockOpt = False,
        stop_on_failure: StopOpt = False) -> None:
    """The same as `privdistill bench` without a sub-command."""
    m = bench_matrix.load_matrix(matrix or preset, results_dir=results, datasets=dataset, only=only)
    console.print(f"matrix {m.source}: {len(m.cells)} cells at preset {m.preset}", highlight=False)
    started = time.perf_counter()
    out = bench_matrix.run_matrix(m, lock=None if no_lock else lock, audits=not no_audit, dry_run=dry_run,
                                  keep_going=not stop_on_failure,
                                  say=lambda line: console.print(line, highlight=False, markup=False))
    table = Table(title=f"bench {m.preset}: {out['wall_seconds'] / 60:.1f} min")
    table.add_column("cell")
    table.add_column("status")
    for name, status in out["statuses"].items():
        table.add_row(name, status)
    console.print(table)
    if not dry_run and not no_report:
        _report(results, doc, figures)
    console.print(f"bench wall time {(time.perf_counter() - started) / 60:.1f} min", highlight=False)
    if any(s.startswith("failed") for s in out["statuses"].values()):
        raise typer.Exit(1)


def _report(results: Path, doc: Path, figures: Path | None) -> None:
    if not results.is_dir():
        raise ConfigError(f"no results directory {results}: run from the repository root or pass --results DIR")
    if not doc.parent.is_dir():
        raise ConfigError(f"cannot write {doc}: {doc.parent} does not exist (pass --doc FILE)")
    names = bench_report.regenerate(results, doc)
    console.print(f"updated {len(names)} tables in {doc}", highlight=False)
    if figures is not None:
        files = bench_plots.make_figures(results, figures)
        console.print(f"wrote {len(files)} figures to {figures}", highlight=False)


@app.command("status")
def status(preset: PresetOpt = "quick", matrix: MatrixOpt = None, results: ResultsOpt = Path("results")) -> None:
    """Each cell of the matrix: recorded, finished, resumable or new; audited or not."""
    m = bench_matrix.load_matrix(matrix or preset, results_dir=results)
    table = Table(title=f"{m.source}")
    for col in ("cell", "state", "accuracy", "MIA AUC", "owner", "command"):
        table.add_column(col)
    for c in m.cells:
        r = bench_matrix.load_json(c.result) or {}
        table.add_row(c.name, bench_matrix.cell_state(c), str(r.get("test_accuracy", "-")), str(r.get("mia_auc", "-")),
                      c.owner, "privdistill " + " ".join(c.args))
    console.print(table)


@app.command("teachers")
def teachers(dataset: Annotated[str, typer.Option("--dataset", "-d")] = "mnist",
             num_teachers: Annotated[int, typer.Option("--num-teachers", "-n")] = 250,
             steps: Annotated[int, typer.Option("--steps", help="iterations measured per teacher")] = 10,
             full_steps: Annotated[int, typer.Option("--full-steps", help="schedule to project (paper: 3000)")] = 3000,
             batch_size: Annotated[int, typer.Option("--batch-size")] = 128,
             model: Annotated[str, typer.Option("--model")] = "paper-cnn",
             trainers: Annotated[str, typer.Option("--trainers", help="comma-separated: vectorized,loop")] = (
                 "vectorized,loop"),
             chunk_size: Annotated[int, typer.Option("--chunk-size", help="teachers per vmap step (0: auto)")] = 0,
             device: Annotated[str, typer.Option("--device")] = "auto",
             precision: Annotated[str, typer.Option("--precision")] = "auto",
             output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write the result as JSON")] = None,
             ) -> None:
    """Teachers per minute, vectorised vs plain loop, measured side by side on the same teachers."""
    r = teacher_bench.bench_teachers(dataset, num_teachers=num_teachers, steps=steps, batch_size=batch_size,
                                     model=model, trainers=tuple(t.strip() for t in trainers.split(",")),
                                     full_steps=full_steps, device=device, precision=precision,
                                     chunk_size=chunk_size, output=output)
    table = Table(title=f"{num_teachers} {model} teachers on {dataset}, "
                        f"{steps} steps of batch {batch_size} ({r['device']})")
    for col in ("trainer", "wall s", "samples/s", "teachers/min (full schedule)",
                f"projected {full_steps}-step schedule"):
        table.add_column(col)
    for row in r["rows"]:
        table.add_row(row["trainer"], str(row["wall_seconds"]), str(row["samples_per_second"]),
                      str(row["teachers_per_minute_at_full_schedule"]), f"{row['projected_full_schedule_minutes']} min")
    console.print(table)


@app.command("noise")
def noise(size: Annotated[int, typer.Option("--size", help="coordinates a draw (default: one step of the "
                                                         "quickstart's DP-SGD head)")] = 39_700,
          repeats: Annotated[int, typer.Option("--repeats", help="best of this many, interleaved")] = 7,
          opendp_size: Annotated[int, typer.Option("--opendp-size", help="draws timed for OpenDP (0: skip)")] = 2_000,
          ) -> None:
    """Draws per second of each secure sampler against torch's plain noise on the same shape (and OpenDP's)."""
    rows = noise_bench.bench_noise(size=size, repeats=repeats, opendp_size=opendp_size)
    table = Table(title=f"secure noise, {size:,} coordinates a draw ({noise_bench.machine()})")
    for col in ("sampler", "secure M draws/s", "plain M draws/s", "secure / plain", "OpenDP k draws/s"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.name, f"{1e3 / r.secure_ns:.1f}", f"{1e3 / r.plain_ns:.1f}", f"{r.ratio:.1f}x",
                      "-" if r.opendp_ns is None else f"{1e6 / r.opendp_ns:.0f}")
    console.print(table)


@app.command("report")
def report(results_dir: Annotated[Path, typer.Option("--results", help="results directory")] = Path("results"),
           doc: Annotated[Path, typer.Option("--doc", help="markdown file to update")] = Path("docs/results.md"),
           figures: Annotated[Optional[Path], typer.Option(
               "--figures", help="also write the figures to this directory (e.g. docs/figures)")] = None) -> None:
    """Regenerate the tables of docs/results.md from results/<preset>/*.json (and the figures with --figures)."""
    _report(results_dir, doc, figures)


def run_report_command(
    run_dir: Annotated[Path, typer.Argument(help="a run directory")],
    format: Annotated[str, typer.Option("--format", "-f", help="md or html")] = "md",
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="where to write (default RUN_DIR/report.<format>)")] = None,
) -> None:
    """A short report of one run: summary, privacy report, audits and figures (markdown or self-contained HTML)."""
    console.print(f"wrote {run_reports.render(run_dir, fmt=format, output=output)}", highlight=False)
