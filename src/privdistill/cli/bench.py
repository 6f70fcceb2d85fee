"""`privdistill bench ...`: timing benchmarks and the reproduction matrix."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(help="Benchmarks.", no_args_is_help=True)
console = Console()


@app.command("teachers")
def teachers(dataset: Annotated[str, typer.Option("--dataset", "-d")] = "mnist",
             num_teachers: Annotated[int, typer.Option("--num-teachers", "-n")] = 250,
             steps: Annotated[int, typer.Option("--steps", help="iterations measured per teacher")] = 10,
             full_steps: Annotated[int, typer.Option("--full-steps", help="schedule to project (paper: 3000)")] = 3000,
             batch_size: Annotated[int, typer.Option("--batch-size")] = 128,
             model: Annotated[str, typer.Option("--model")] = "paper-cnn",
             trainers: Annotated[str, typer.Option("--trainers", help="comma-separated: vectorized,loop")] = "vectorized,loop",
             chunk_size: Annotated[int, typer.Option("--chunk-size", help="teachers per vmap step (0: auto)")] = 0,
             device: Annotated[str, typer.Option("--device")] = "auto",
             precision: Annotated[str, typer.Option("--precision")] = "auto",
             output: Annotated[Optional[Path], typer.Option("--output", "-o", help="write the result as JSON")] = None) -> None:
    """Teachers per minute, vectorised vs plain loop, measured side by side on the same teachers."""
    from privdistill.bench.teachers import bench_teachers

    r = bench_teachers(dataset, num_teachers=num_teachers, steps=steps, batch_size=batch_size, model=model,
                       trainers=tuple(t.strip() for t in trainers.split(",")), full_steps=full_steps, device=device,
                       precision=precision, chunk_size=chunk_size, output=output)
    table = Table(title=f"{num_teachers} {model} teachers on {dataset}, {steps} steps of batch {batch_size} ({r['device']})")
    for col in ("trainer", "wall s", "samples/s", "teachers/min (full schedule)", f"projected {full_steps}-step schedule"):
        table.add_column(col)
    for row in r["rows"]:
        table.add_row(row["trainer"], str(row["wall_seconds"]), str(row["samples_per_second"]),
                      str(row["teachers_per_minute_at_full_schedule"]), f"{row['projected_full_schedule_minutes']} min")
    console.print(table)


@app.command("report")
def report(results_dir: Annotated[Path, typer.Option("--results", help="results directory")] = Path("results"),
           doc: Annotated[Path, typer.Option("--doc", help="markdown file to update")] = Path("docs/results.md")) -> None:
    """Regenerate the tables of docs/results.md from results/<preset>/*.json."""
    from privdistill.bench.report import regenerate

    names = regenerate(results_dir, doc)
    console.print(f"updated {len(names)} tables in {doc}")
