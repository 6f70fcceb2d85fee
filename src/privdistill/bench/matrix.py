"""The reproduction matrix: method × dataset × ε, run as subprocesses of the method CLIs, resumable.

A matrix is a YAML file (`bench/matrix/<preset>.yaml`, or any path) of declarative cells:

    preset: quick
    datasets: [mnist, fashion-mnist]          # default for cells that do not list their own
    cells:
      - name: dgd-{dataset}-eps{epsilon}       # = the file --record writes: results/<preset>/<name>.json
        args: [dgd, -d, "{dataset}", --epsilon, "{epsilon}", --queries, "{queries}", --preset, "{preset}"]
        grid: [{epsilon: 10, queries: 1300}, {epsilon: 1, queries: 27}]   # one cell per row (× datasets)
        audit: true                            # membership inference + inversion of its released model

or `cells_from: quick` (the same cells at another preset); shared args are YAML anchors under `sets:`, spliced in
where an alias stands. `recipe_cells: true` adds one cell for each recipe's measured (dataset, ε), the paper
recipe's aside, by the recipe's own short command (recipe_entries). A cell runs as `privdistill <args> --record
--run-dir <runs_dir>/<name>` (`--resume` for an unfinished run) under the shared CPU lock
(`/tmp/privdistill-cpu.lock`) and a per-cell lock, both inherited by the child; a recorded cell is skipped, then
every auditable cell without `mia_auc` is audited. An interrupted bench loses at most the cell in flight.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterator

from privdistill.config import load_yaml_file
from privdistill.engine.run import record_result
from privdistill.errors import ConfigError
from privdistill.recipes import DEFAULT, METHODS, PAPER, recipes

CPU_LOCK = os.environ.get("PRIVDISTILL_CPU_LOCK", "/tmp/privdistill-cpu.lock")


@dataclass
class Cell:
    name: str
    args: list[str]
    preset: str
    result: Path
    run_dir: Path
    audit: bool = True
    owner: str = ""
    note: str = ""
    values: dict[str, Any] = field(default_factory=dict)

    def command(self, privdistill: list[str], *, resume: bool) -> list[str]:
        cmd = privdistill + self.args + ["--record", "--no-progress", "--run-dir", str(self.run_dir)]
        return cmd + (["--resume"] if resume else [])


@dataclass
class Matrix:
    preset: str
    cells: list[Cell]
    source: str


def matrix_path(name_or_path: str) -> Path:
    """A path to a YAML file, or the name of a packaged matrix (quick, paper)."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise ConfigError(f"matrix file {p} does not exist")
        return p
    packaged = resources.files("privdistill.bench").joinpath("matrix", f"{name_or_path}.yaml")
    if not packaged.is_file():
        raise ConfigError(f"no packaged matrix {name_or_path!r} (bench/matrix/{name_or_path}.yaml); give a YAML path")
    return Path(str(packaged))


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _spliced(args: list[Any]) -> list[Any]:
    """A cell's args with each list among them (a YAML alias of the file's shared `sets`) spliced in where it is."""
    return [a for item in args for a in (item if isinstance(item, list) else [item])]


def recipe_options(name: str, recipe) -> list[str]:
    """The options that pick a recipe on the command line: `-r NAME` unless the default, `--accounting` unless
    strict (the accounting its measured cells were sized under)."""
    return [*([] if name == DEFAULT else ["-r", name]),
            *([] if recipe.accounting == "strict" else ["--accounting", recipe.accounting])]


def recipe_entries() -> list[dict[str, Any]]:
    """Cells for every recipe but the paper's, one per (dataset, ε) it measured: `privdistill METHOD -d D -e ε
    [-r RECIPE] [--accounting paper]`, named as --record names the run (engine/run.py: record_result)."""
    entries = []
    for method in METHODS:
        for name, recipe in recipes(method).items():
            if name == PAPER:
                continue
            for dataset, epsilon in sorted(recipe.measured, key=lambda cell: (cell[0] != "mnist", cell[1])):
                args = [method, "-d", "{dataset}", "-e", "{epsilon}", *recipe_options(name, recipe),
                        "--preset", "{preset}"]
                entries.append({"name": f"{method}-{{dataset}}-eps{{epsilon}}-{name}", "args": args,
                                "datasets": [dataset], "grid": [{"epsilon": float(epsilon)}], "owner": method})
    return entries


def load_matrix(name_or_path: str, *, results_dir: str | Path = "results", runs_dir: str | Path | None = None,
                datasets: list[str] | None = None, only: list[str] | None = None) -> Matrix:
    """Expand a matrix file into cells (`datasets` / `only` filter by dataset and by name: a substring, or
    `=NAME` for exactly that cell)."""
    path = matrix_path(name_or_path)
    doc = load_yaml_file(path, what="matrix file", holds="preset, datasets and cells")
    preset = str(doc.get("preset", "quick"))
    runs = Path(runs_dir or doc.get("runs_dir") or f"runs/bench-{preset}")
    default_datasets = list(doc.get("datasets") or [])
    entries = doc.get("cells") or []
    if doc.get("cells_from"):  # the paper matrix runs the quick matrix's cells at its own preset
        if entries:
            raise ConfigError(f"{path}: give either cells or cells_from, not both")
        doc = load_yaml_file(matrix_path(str(doc["cells_from"])), what="matrix file")
        entries = doc.get("cells") or []
    if doc.get("recipe_cells"):
        entries = recipe_entries() + list(entries)
    cells: list[Cell] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry or "args" not in entry:
            raise ConfigError(f"{path}: cell {i} needs a name and args")
        if entry.get("disabled"):
            continue
        grid = entry.get("grid") or [{}]
        cell_datasets = entry.get("datasets", default_datasets) or [None]
        for dataset, row in itertools.product(cell_datasets, grid):
            if datasets and dataset is not None and dataset not in datasets:
                continue
            values = {"preset": preset, **({"dataset": dataset} if dataset else {}), **(row or {})}
            texts = {k: _fmt(v) for k, v in values.items()}
            try:
                name = str(entry["name"]).format(**texts)
                args = [str(a).format(**texts) for a in _spliced(entry["args"])]
            except KeyError as err:
                raise ConfigError(f"{path}: cell {entry['name']!r} uses {err} which is neither 'dataset', 'preset' "
                                  "nor a grid key") from None
            if only and not any(name == o[1:] if o.startswith("=") else o in name for o in only):
                continue
            if name in seen:
                raise ConfigError(f"{path}: two cells are named {name!r}")
            seen.add(name)
            cells.append(Cell(name=name, args=args, preset=preset, result=Path(results_dir) / preset / f"{name}.json",
                              run_dir=runs / name, audit=bool(entry.get("audit", True)),
                              owner=str(entry.get("owner", "")),
                              note=str(entry.get("note", "")), values=values))
    if not cells and (only or datasets):
        raise ConfigError(f"no cell of {path} matches " + " and ".join(
            f"{flag} {', '.join(v)}" for flag, v in (("--only", only), ("--dataset", datasets)) if v)
            + " (`privdistill bench run --dry-run` lists the cells)")
    return Matrix(preset=preset, cells=cells, source=str(path))


@contextmanager
def file_lock(path: str | Path | None, *, blocking: bool = True) -> Iterator[int | None]:
    """Hold an exclusive flock on `path` (None: no lock); yields the fd (to pass to a child) or None.
    Non-blocking: raises BlockingIOError if another process holds it."""
    if path is None:
        yield None
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(path), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        yield fd
    finally:
        os.close(fd)  # releases the lock once no inheriting child holds it any more


def privdistill_command() -> list[str]:
    exe = shutil.which("privdistill", path=str(Path(sys.executable).parent)) or shutil.which("privdistill")
    return [exe] if exe else [sys.executable, "-m", "privdistill"]


# ---------------------------------------------------------------------------------------------- state
def load_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def cell_state(cell: Cell) -> str:
    """done (result recorded) | finished (summary written, not recorded) | partial (resumable) | new."""
    if cell.result.is_file():
        return "done"
    if (cell.run_dir / "summary.json").is_file():
        return "finished"
    if (cell.run_dir / "config.yaml").is_file():
        return "partial"
    return "new"


def needs_audit(cell: Cell) -> bool:
    if not cell.audit or not cell.result.is_file():
        return False
    r = load_json(cell.result) or {}
    return r.get("mia_auc") is None or (r.get("audit") or {}).get("inversion") is None


def audited_run_dir(cell: Cell) -> Path | None:
    """The run directory the cell's recorded result came from (it may predate the bench)."""
    r = load_json(cell.result) or {}
    for candidate in (r.get("run_dir"), cell.run_dir):
        if candidate and (Path(candidate) / "summary.json").is_file():
            return Path(candidate)
    return None


Runner = Callable[[list[str], Path, int | None], int]


def _subprocess_runner(cmd: list[str], log: Path, pass_fd: int | None) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n# started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, pass_fds=() if pass_fd is None else pass_fd)
    return proc.returncode


def _log_event(path: Path | None, **event: Any) -> None:
    """Append one event to the bench's log (bench.jsonl beside the cells' run directories)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **event}) + "\n")


def run_matrix(matrix: Matrix, *, lock: str | Path | None = CPU_LOCK, audits: bool = True, dry_run: bool = False,
               runner: Runner | None = None, keep_going: bool = True, say: Callable[[str], None] = print,
               privdistill: list[str] | None = None) -> dict[str, Any]:
    """Run every cell not yet recorded, then the audits; returns {cell name: status} and timings."""
    runner = runner or _subprocess_runner
    exe = privdistill or privdistill_command()
    log = Path(matrix.cells[0].run_dir).parent / "bench.jsonl" if matrix.cells else None
    statuses: dict[str, str] = {}
    started = time.perf_counter()
    for cell in matrix.cells:
        state = cell_state(cell)
        if state == "done":
            statuses[cell.name] = "skipped (recorded)"
            continue
        if state == "finished":  # the run ended but was not recorded (e.g. killed between the two)
            summary = load_json(cell.run_dir / "summary.json")
            if summary is not None and not dry_run:
                record_result(summary, results_dir=cell.result.parent.parent, name=cell.name)
                statuses[cell.name] = "recorded from its finished run"
                continue
        cmd = cell.command(exe, resume=state == "partial")
        if dry_run:
            statuses[cell.name] = "would run: " + " ".join(cmd[len(exe):])
            continue
        statuses[cell.name] = _run_locked(cell, cmd, cell.run_dir.parent / f"{cell.name}.log", lock, runner, say, log)
        if statuses[cell.name].startswith("failed") and not keep_going:
            break
    if audits:
        for cell in matrix.cells:
            if not needs_audit(cell):
                continue
            run_dir = audited_run_dir(cell)
            if run_dir is None:
                statuses[f"audit {cell.name}"] = "skipped: its run directory is not on this machine"
                continue
            cmd = exe + ["audit", str(run_dir), "--record", "--result-name", cell.name, "--preset", matrix.preset,
                         "--no-progress"]
            if dry_run:
                statuses[f"audit {cell.name}"] = "would run: " + " ".join(cmd[len(exe):])
                continue
            statuses[f"audit {cell.name}"] = _run_locked(cell, cmd, cell.run_dir.parent / f"{cell.name}.audit.log",
                                                          lock, runner, say, log, what="audit")
    return {"statuses": statuses, "wall_seconds": round(time.perf_counter() - started, 1)}


def _run_locked(cell: Cell, cmd: list[str], log_path: Path, lock, runner: Runner, say, log: Path | None,
                what: str = "run") -> str:
    cell_lock = cell.run_dir.parent / f".{cell.name}.lock"
    try:
        with file_lock(cell_lock, blocking=False) as cell_fd:
            say(f"[{cell.name}] waiting for the CPU lock ({lock})" if lock else f"[{cell.name}] starting")
            with file_lock(lock) as cpu_fd:
                t0 = time.perf_counter()
                say(f"[{cell.name}] {what}: {' '.join(cmd)}")
                fds = tuple(fd for fd in (cell_fd, cpu_fd) if fd is not None)
                rc = runner(cmd, log_path, fds or None)
                seconds = round(time.perf_counter() - t0, 1)
    except BlockingIOError:
        return "skipped: running in another process"
    _log_event(log, cell=cell.name, what=what, returncode=rc, seconds=seconds, command=cmd)
    if rc != 0:
        say(f"[{cell.name}] {what} FAILED (exit {rc}); see {log_path}")
        return f"failed (exit {rc}, {seconds} s; log {log_path})"
    say(f"[{cell.name}] {what} done in {seconds / 60:.1f} min")
    return f"{'ran' if what == 'run' else 'audited'} in {seconds} s"
