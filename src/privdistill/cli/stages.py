"""`privdistill teachers ...`, `privdistill generator ...` and `privdistill cache ...`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from privdistill.cli import options as o
from privdistill.cli.display import show_summary
from privdistill.cli.lazy import lazy_module
from privdistill.errors import ConfigError

# imported when a command runs, not for --help: they import torch (cli/lazy.py)
datafree = lazy_module("privdistill.methods.datafree")
stage_cache = lazy_module("privdistill.engine.cache")
teachers = lazy_module("privdistill.methods.teachers")

teachers_app = typer.Typer(help="Teacher ensembles on disjoint partitions.", no_args_is_help=True)
generator_app = typer.Typer(help="Data-free generators.", no_args_is_help=True)
cache_app = typer.Typer(help="The stage cache (baseline, teachers, generator, synthetic set, VAE).",
                        no_args_is_help=True)
console = Console()

@teachers_app.command("train")
@o.run_command
def teachers_train(
    run: o.RunArgs,
    num_teachers: Annotated[Optional[int], typer.Option(
        "--num-teachers", "-n", min=1, help="teachers, one per disjoint partition (default: preset)")] = None,
    trainer: Annotated[Optional[str], typer.Option("--trainer", help="vectorized or loop")] = None,
    laplace_scale: Annotated[float, typer.Option("--laplace-scale", help="b of the noisy vote evaluated")] = 40.0,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray", help="train as Ray tasks: local, auto or ray://host:port")] = None,
    no_cache: o.NoCache = False,
) -> None:
    """Train n teachers on n disjoint partitions; report plurality and noisy-vote accuracy on the test set."""
    if not laplace_scale > 0:
        raise ConfigError(f"--laplace-scale must be > 0, got {laplace_scale}")
    # `or None`: an empty --trainer means "not given"
    request = run.request(o.section_overrides("teachers", num_teachers=num_teachers, trainer=trainer or None))
    summary = teachers.train_teachers_workflow(request, laplace_scale=laplace_scale, cache=not no_cache,
                                               ray_address=ray_address)
    show_summary(summary, title=f"{summary['num_teachers']} teachers on {summary['dataset']}")
    console.print(f"ensemble (plurality) {summary['ensemble_accuracy']:.4f}, Laplace b={laplace_scale:g} noisy vote "
                  f"{summary.get('noisy_ensemble_accuracy', float('nan')):.4f}, mean single teacher "
                  f"{summary['mean_teacher_accuracy']:.4f}; {summary['teachers_per_minute']} teachers/min",
                  highlight=False)


@generator_app.command("train")
def generator_train(teacher: Annotated[Path, typer.Option("--teacher", "-t", help="run directory of the fixed "
                                                                              "classifier")],
                    preset: o.Preset = "quick", config: o.ConfigFile = None, set_: o.Overrides = None,
                    run_dir: o.RunDirOpt = None, resume: o.Resume = False, record: o.Record = False,
                    seed: o.Seed = None, device: o.Device = None, precision: o.Precision = None,
                    data_root: o.DataRoot = None, no_progress: o.NoProgress = False,
                    loss: Annotated[Optional[str], typer.Option("--loss", help="dgd, dpdfd or srr")] = None,
                    samples: Annotated[Optional[int], typer.Option("--samples", help="N synthetic samples")] = None,
                    variant: o.Variant = None, no_cache: o.NoCache = False) -> None:
    """Train a generator against a fixed classifier, write N samples + a grid, report their quality."""
    extra = o.section_overrides("generator", loss=loss or None, num_samples=samples or None)
    req = datafree.GeneratorRequest(teacher=str(teacher), preset=preset, config_file=str(config) if config else None,
                                    overrides=o.run_overrides(set_, extra=extra, seed=seed, device=device,
                                                              precision=precision, data_root=data_root,
                                                              no_progress=no_progress),
                                    run_dir=str(run_dir) if run_dir else None, resume=resume, record=record,
                                    cache=not no_cache, variant=variant)
    summary = datafree.train_generator_workflow(req)
    show_summary(summary, title=f"generator ({summary['loss']} loss) on {summary['dataset']}")
    q = summary["synthetic_quality"]
    console.print(f"teacher on {summary['num_samples']} synthetic samples: histogram {q['class_histogram']}, "
                  f"entropy {q['histogram_entropy_normalised']:.3f} of max, "
                  f"mean confidence {q['mean_confidence']:.3f}; "
                  f"student trained on them alone: test accuracy {summary['test_accuracy']:.4f}. "
                  f"Grid: {summary['run_dir']}/samples.png", highlight=False)


@generator_app.command("quality")
def generator_quality(
    stage: Annotated[str, typer.Argument(help="a generator stage: its key (privdistill cache ls) or directory")],
    dataset: o.Dataset = "mnist",
    source: Annotated[Optional[Path], typer.Option(
        "--source", help="the model the generator was fitted to (default: found in the stage cache)")] = None,
    reader: Annotated[Optional[list[str]], typer.Option(
        "--reader", help="NAME=DIR: another model (model.safetensors) or ensemble (teachers.safetensors) whose "
                         "agreement with the source's labels is measured; repeatable")] = None,
    samples: Annotated[int, typer.Option("--samples", min=10, help="synthetic samples drawn")] = 2000,
    ceiling: Annotated[bool, typer.Option(
        "--ceiling", help="also train a student only on the samples (source labels) and test it")] = False,
    ceiling_labels: Annotated[str, typer.Option(
        "--ceiling-labels", help="the ceiling student learns the source's label (hard: what a label channel such "
                                 "as DGD's votes or SRR's responses carries) or its softmax (soft)")] = "hard",
    ceiling_epochs: Annotated[Optional[float], typer.Option(
        "--ceiling-epochs", min=0.01, help="the ceiling student's epochs over its samples; default 3")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="where quality.json and samples.png go")] = None,
    data_root: o.DataRoot = None,
    seed: Annotated[int, typer.Option(
        "--seed", help="draws the samples and the ceiling student's initial weights: the ceiling's spread over "
                       "seeds says which differences between generators are noise")] = 0,
) -> None:
    """Print the quality of any generator stage: class balance, other models' agreement, ceiling, a grid."""
    readers = {}
    for item in reader or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--reader takes NAME=DIR, got {item!r}")
        readers[name] = path
    report = datafree.generator_quality(stage, dataset=dataset, source=str(source) if source else None,
                                        readers=readers, samples=samples, ceiling=ceiling,
                                        ceiling_labels=ceiling_labels, ceiling_epochs=ceiling_epochs,
                                        out=str(out) if out else None,
                                        data_root=str(data_root) if data_root else None, seed=seed)
    table = Table(title=f"generator stage {report['stage']} on {dataset} (evaluation only, no epsilon)")
    table.add_column("measure")
    table.add_column("value")
    for key, value in report.items():
        if key not in ("stage", "dataset", "note"):
            table.add_row(key, str(value))
    console.print(table)


@cache_app.command("ls")
def cache_ls() -> None:
    """List cached stages."""
    cache = stage_cache.StageCache()
    table = Table(title=f"stage cache {cache.root}")
    for col in ("stage", "complete", "size", "built in", "created"):
        table.add_column(col)
    for e in cache.entries():
        table.add_row(e["name"], "yes" if e["complete"] else "[yellow]partial[/]", f"{e['bytes'] / 2**20:.1f} MiB",
                      f"{e.get('build_seconds') or '-'} s", e.get("created") or "-")
    console.print(table)


@cache_app.command("rm")
def cache_rm(pattern: Annotated[Optional[str], typer.Argument(help="remove entries whose name contains this")] = None,
             all_: Annotated[bool, typer.Option("--all", help="remove every entry")] = False) -> None:
    """Remove cached stages (by name fragment, or --all)."""
    if pattern is None and not all_:
        raise ConfigError("say which entries to remove (a name fragment) or pass --all")
    removed = stage_cache.StageCache().remove(None if all_ else pattern)
    console.print(f"removed {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}: {', '.join(removed) or '-'}")
