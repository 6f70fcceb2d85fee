"""What every method does around its algorithm: resolve the configuration, open the run directory,
load the data, and write the summary (optionally recorded under results/<preset>/)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privdistill.config import RunOptions, resolve_sections, to_plain
from privdistill.data import DataSplits, canonical_name, dataset_slug, load_data
from privdistill.engine import Env, RunDir, record_result


@dataclass
class RunRequest:
    """What the user asked for, independent of the method: the CLI and the Python API both build one."""

    dataset: str
    preset: str = "quick"
    config_file: str | None = None
    overrides: list[str] | dict = field(default_factory=list)
    run_dir: str | None = None
    resume: bool = False
    record: bool = False
    results_dir: str = "results"


@dataclass
class Prepared:
    sections: dict[str, Any]
    env: Env
    run: RunDir
    data: DataSplits
    dataset: str
    started: float


def prepare_run(method: str, request: RunRequest, sections: dict[str, type]) -> Prepared:
    dataset = canonical_name(request.dataset) if ":" not in request.dataset else request.dataset
    resolved = resolve_sections({"run": RunOptions, **sections}, preset=request.preset, dataset=dataset,
                                config_file=request.config_file, overrides=request.overrides)
    options: RunOptions = resolved["run"]
    env = Env.from_options(options)
    data = load_data(dataset, options.data_root, seed=options.seed)
    config = {"method": method, "dataset": dataset, "preset": request.preset, **to_plain(resolved)}
    run_dir = request.run_dir or str(Path(options.runs_dir) / f"{method}-{dataset_slug(dataset)}-{time.strftime('%Y%m%d-%H%M%S')}")
    run = RunDir.open(run_dir, config=config, resume=request.resume)
    return Prepared(sections=resolved, env=env, run=run, data=data, dataset=dataset, started=time.perf_counter())


def finish_run(prep: Prepared, request: RunRequest, *, method: str, wall_seconds: float, **fields: Any) -> dict[str, Any]:
    summary = prep.run.write_summary(method=method, dataset=prep.dataset, preset=request.preset,
                                     wall_seconds=round(wall_seconds, 1), device=prep.env.describe(), **fields)
    if request.record:
        summary["recorded_as"] = str(record_result(summary, results_dir=request.results_dir))
    return summary
