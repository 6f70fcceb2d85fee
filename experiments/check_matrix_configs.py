"""Does every cell of the reproduction matrix resolve to the configuration its recorded result was made with?

For every cell of the matrices (bench/matrix/quick.yaml, paper.yaml, experiments/research-matrix.yaml) whose
results/<preset>/<name>.json exists, two configurations are resolved, nothing trained and no data read:

  cell      the cell's command as `privdistill bench` runs it (bench/matrix.py: Cell.command), parsed by the CLI
            into its RunRequest and resolved as methods/common.prepare_run resolves it (recipe layers, then
            config.resolve_sections), with today's code, presets and recipes;
  recorded  the result's own `command`, resolved the same way but as it ran then: the presets and the named
            `--config` overlays (retired in 00100b9) read from git at the result's `git_commit`, no recipe for a run
            recorded before recipes existed (the preset's own values, today's `--recipe paper`), the recipe it names
            (read at its commit) otherwise; then what the result itself records of its configuration replaces what the
            command implies: SRR's `config` (its srr section), the budget (`accounting`, `target_epsilon`, `delta`,
            `max_epsilon`, `privacy_scope`; a DP-SGD row older than its `accounting` field: `paper` when its
            `dpsgd_accounting.headline` names Opacus's calibration, the default then) and the option fields its
            method echoes (DGD's `aggregation`, `inputs`, `query_selection`, `release`; PATE's `aggregation`,
            `query_selection`; DPDFD's `algorithm`, `operation`, `granularity`, `batch_size`; DP-SGD's `model`,
            `epochs`).

Every `section.key` on which the two differ is listed under its cause: `cell` when today's presets and recipes give
the recorded command the recorded value (what the cell's args must change to re-make the row), `since` when the value
moved after the row was recorded (a preset or a recipe changed since; no matrix line can be at fault). A cell whose
configuration today's code refuses is listed with the refusal. Options added to the code after a row was recorded
take today's default on the recorded side (the behaviour before the option existed), so they differ only where a
cell or a recipe sets them otherwise. Ignored: how a run executes rather than what it computes (run.* but run.seed
and run.deterministic: device, precision, threads, progress, runs_dir, data_root, the recipe's name, plan_check, the
noise source), the name labels (`<section>.variant`) and the secure-noise switches (`secure_noise`, `secure_mode`:
where the noise is drawn from, not its distribution). A recorded command's `--set` of an option that has since left
the package (RETIRED) at the value that left it off is dropped before it is resolved. The preset's refit to the data
(methods/sizing.py) is a no-op on the built-in datasets the matrices use, so it is not applied. A commit ending in
`-dirty` had uncommitted changes when the row ran: they are unknown here.

    .venv/bin/python experiments/check_matrix_configs.py                 # both matrices, a summary and each difference
    .venv/bin/python experiments/check_matrix_configs.py --only dgd+ --json /tmp/check.json

Exit status 1 when a cell differs by its own args or is refused, else 0. CPU: seconds (imports torch once).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import shlex
import subprocess
import sys
import tempfile
import types
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import click
import typer
import yaml

from privdistill import config as config_module
from privdistill.bench.matrix import Cell, load_json, load_matrix
from privdistill.cli import get_app
from privdistill.config import RunOptions, chosen_values, keyed_config, resolve_sections
from privdistill.data import canonical_name
from privdistill.methods.common import apply_noise_policy, requested
from privdistill.recipes import METHODS, recipe_layers

ROOT = Path(__file__).resolve().parents[1]
OVERLAYS_LAST = "e3d2265"  # the last commit with the named overlays (presets/overlays/NAME.yaml)
OVERLAY_DIR = "src/privdistill/presets/overlays"
PRESET_DIR = "src/privdistill/presets"
#: the modules that call methods/common.prepare_run: the checker takes each command's request there
PREPARE_RUN_CALLERS = ("privdistill.methods.runner", "privdistill.methods.baseline", "privdistill.methods.teachers",
                       "privdistill.audits.control")
#: run options that say how a run executes, not what it computes
RUN_KEYS_COMPARED = ("seed", "deterministic")
IGNORED_KEYS = ("variant", "secure_noise", "secure_mode")
#: summary field -> config key, for the budget every private method records
BUDGET_ECHO = {"accounting": "accounting", "target_epsilon": "epsilon", "max_epsilon": "max_epsilon",
               "delta": "delta", "privacy_scope": "privacy"}
#: options that left the package (issue 63; docs/research-log.md, "Code that left the package"), each with the value
#: that left it off: a recorded command that sets one to that value ran as today's code runs without it, so the
#: setting is dropped before the command is resolved (set to anything else, the command stays unverifiable)
RETIRED = {"srr.augment": "none", "srr.label_copies": 1, "srr.copy_augment": "shift", "teachers.fit": "sgd",
           "teachers.input_noise": 0.0, "dpsgd.head_init": "default", "dpdfd.student_ema": 0.0}
#: summary fields each method copies from its own section unchanged
METHOD_ECHO = {"dgd": ("dgd", ("aggregation", "inputs", "query_selection", "release")),
               "pate": ("pate", ("aggregation", "query_selection")),
               "dpdfd": ("dpdfd", ("algorithm", "operation", "granularity", "batch_size")),
               "dpsgd": ("dpsgd", ("model", "epochs"))}


# ------------------------------------------------------------------------------------------------------- git
def git(*args: str) -> str | None:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


@lru_cache(maxsize=None)
def show(commit: str, path: str) -> str | None:
    return git("show", f"{commit}:{path}")


@lru_cache(maxsize=None)
def known_commit(commit: str) -> bool:
    return git("cat-file", "-e", f"{commit}^{{commit}}") is not None


def recorded_commit(result: dict[str, Any]) -> tuple[str | None, str]:
    """The commit a result ran at ((None, why) when it is not in this repository); a note when it is a guess."""
    text = str(result.get("git_commit") or "")
    commit = text.removesuffix("-dirty")
    if commit and known_commit(commit):
        return commit, " (uncommitted changes then)" if text.endswith("-dirty") else ""
    finished = result.get("finished")
    if finished:  # no commit recorded: the last one before the run finished
        guess = (git("rev-list", "-1", f"--before={finished}", "HEAD") or "").strip()
        if guess:
            return guess, f" (no commit recorded: {guess[:8]}, the last before it finished, assumed)"
    return None, " (no commit recorded: today's presets assumed)"


# --------------------------------------------------------------------------------------------- then's inputs
@lru_cache(maxsize=None)
def preset_at(commit: str, preset: str) -> dict[str, Any] | None:
    """The preset as config.load_preset merged it at `commit` (None when it had no such preset folder)."""
    listing = git("ls-tree", "--name-only", f"{commit}:{PRESET_DIR}/{preset}")
    if listing is None:
        return None
    merged: dict[str, Any] = {}
    for name in sorted(listing.split()):
        if not name.endswith(".yaml"):
            continue
        for section, block in (yaml.safe_load(show(commit, f"{PRESET_DIR}/{preset}/{name}") or "") or {}).items():
            if section == "by_dataset":
                for dataset, sections in (block or {}).items():
                    target = merged.setdefault("by_dataset", {}).setdefault(dataset, {})
                    for sec, values in (sections or {}).items():
                        target.setdefault(sec, {}).update(values or {})
            else:
                merged[section] = block
    return merged


def overlay_at(commit: str | None, name: str) -> tuple[dict[str, Any], str]:
    """A named overlay as it was at `commit` (else as first committed after it, else at its last commit)."""
    path = f"{OVERLAY_DIR}/{name}.yaml"
    for candidate, note in ((commit, ""), (_first_with(path, commit), "first committed after the run"),
                            (OVERLAYS_LAST, f"as last committed ({OVERLAYS_LAST})")):
        text = show(candidate, path) if candidate else None
        if text is not None:
            return yaml.safe_load(text) or {}, note
    raise LookupError(f"no overlay {name!r} in git")


@lru_cache(maxsize=None)
def _first_with(path: str, commit: str | None) -> str | None:
    if commit is None:
        return None
    added = (git("log", "--diff-filter=A", "--format=%H", "--", path) or "").split()
    later = [c for c in added if git("merge-base", "--is-ancestor", commit, c) is not None]
    return later[-1] if later else None


def merge_overlays(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """`--config a+b` as config.load_yaml_file composed them (later wins, section by section)."""
    merged: dict[str, Any] = {}
    for part in parts:
        for section, block in part.items():
            if section == "by_dataset" and isinstance(block, dict):
                for dataset, sections in block.items():
                    target = merged.setdefault("by_dataset", {}).setdefault(dataset, {})
                    for name, values in (sections or {}).items():
                        target.setdefault(name, {}).update(values or {})
            elif isinstance(block, dict):
                merged.setdefault(section, {}).update(block)
            else:
                merged[section] = block
    return merged


def recipe_then(method: str, name: str, commit: str | None):
    """The recipe `name` of `method` as recipes/<method>.py defined it at `commit` (today's when unreadable)."""
    source = show(commit, f"src/privdistill/recipes/{method}.py") if commit else None
    if source is not None:
        module = types.ModuleType(f"recipes_then_{method}")
        try:
            exec(compile(source, f"{commit[:8]}:recipes/{method}.py", "exec"), module.__dict__)
            return module.RECIPES[name], ""
        except Exception as err:  # noqa: BLE001 - an old file against today's package: say so, use today's
            return importlib.import_module(f"privdistill.recipes.{method}").RECIPES[name], \
                f" (its recipe as of {commit[:8]} unreadable now: {err}; today's used)"
    return importlib.import_module(f"privdistill.recipes.{method}").RECIPES[name], ""


# --------------------------------------------------------------------------------------- command -> request
class Captured(Exception):
    def __init__(self, method: str, request: Any, sections: dict[str, type]):
        super().__init__(method)
        self.method, self.request, self.sections = method, request, sections


def _capture(method, request, sections):
    raise Captured(method, request, sections)


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    modules = [importlib.import_module(name) for name in PREPARE_RUN_CALLERS]
    saved = [m.prepare_run for m in modules]
    for m in modules:
        m.prepare_run = _capture
    try:
        yield
    finally:
        for m, f in zip(modules, saved):
            m.prepare_run = f


def request_of(argv: list[str]) -> Captured:
    """The (method, RunRequest, sections) the CLI builds for `argv` (the words after `privdistill`)."""
    command = typer.main.get_command(get_app())
    with capturing():
        try:
            command.main(args=list(argv), prog_name="privdistill", standalone_mode=False)
        except Captured as captured:
            return captured
        except click.ClickException as err:
            raise ValueError(f"the CLI refuses it: {err.format_message()}") from None
    raise ValueError("the command resolves no method run")


def command_words(command: str) -> list[str]:
    words = shlex.split(command)
    for i, word in enumerate(words):
        if word.endswith("privdistill") or word == "-m" and i + 1 < len(words) and words[i + 1] == "privdistill":
            return words[i + 1:] if word.endswith("privdistill") else words[i + 2:]
    raise ValueError(f"not a privdistill command: {command}")


def retired_dropped(words: list[str]) -> tuple[list[str], list[str]]:
    """`words` without the `--set KEY=VALUE` pairs that set a RETIRED option to the value that left it off."""
    out, dropped, i = [], [], 0
    while i < len(words):
        key, _, value = words[i + 1].partition("=") if words[i] == "--set" and i + 1 < len(words) else ("", "", "")
        if key in RETIRED and same(yaml.safe_load(value), RETIRED[key]):
            dropped.append(words[i + 1])
            i += 2
            continue
        out.append(words[i])
        i += 1
    return out, dropped


# ---------------------------------------------------------------------------------------------- resolution
def _number(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


@contextlib.contextmanager
def preset_as(preset: dict[str, Any] | None, sections: dict[str, type], dropped: list[str]) -> Iterator[None]:
    """config.load_preset answers `preset` (keys today's sections no longer have dropped, and named in `dropped`)."""
    if preset is None:
        yield
        return
    fields = {name: set(cls.__dataclass_fields__) for name, cls in sections.items()}

    def known(block: dict[str, Any], where: str) -> dict[str, Any]:
        out = {}
        for section, values in block.items():
            if section in fields and isinstance(values, dict):
                stale = sorted(set(values) - fields[section])
                dropped.extend(f"{where}{section}.{k}" for k in stale)
                out[section] = {k: v for k, v in values.items() if k not in stale}
            elif section != "by_dataset":
                out[section] = values
        return out

    filtered = known(preset, "")
    filtered["by_dataset"] = {d: known(b or {}, f"by_dataset.{d}.")
                              for d, b in (preset.get("by_dataset") or {}).items()}
    saved = config_module.load_preset
    config_module.load_preset = lambda name: filtered
    try:
        yield
    finally:
        config_module.load_preset = saved


def resolve(captured: Captured, *, preset: dict[str, Any] | None = None, recipe=None,
            config_file: str | None = None) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The run's configuration as prepare_run resolves it ({section: {key: value}}), and notes. `recipe`: None for
    the recipe the request names (today's), [] for none, or a Recipe; `preset`: a preset mapping instead of today's."""
    request, sections = captured.request, {"run": RunOptions, **captured.sections}
    dataset = canonical_name(request.dataset) if ":" not in request.dataset else request.dataset
    epsilon = _number(requested(request, "budget", "epsilon"))
    if recipe is None:
        name = requested(request, "run", "recipe")
        layers = recipe_layers(captured.method, None if name is None else str(name), dataset, epsilon)
    else:
        layers = recipe if isinstance(recipe, list) else recipe.layers(dataset, epsilon)
    dropped: list[str] = []
    config_file = config_file or request.config_file
    with preset_as(preset, sections, dropped):
        resolved = resolve_sections(sections, preset=request.preset, dataset=dataset, config_file=config_file,
                                    overrides=request.overrides, recipe=layers)
        _, chosen = chosen_values(preset=request.preset, dataset=dataset, config_file=config_file,
                                  overrides=request.overrides, recipe=layers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        apply_noise_policy(resolved, chosen)
    notes = [f"keys of the preset then that today's code lacks: {', '.join(sorted(set(dropped)))}"] if dropped else []
    return {name: keyed_config(section) for name, section in resolved.items()}, notes


def overlays_expanded(words: list[str], commit: str | None, tmp: Path) -> tuple[list[str], list[str]]:
    """`--config NAME[+NAME]` (a retired named overlay) -> `--config FILE` holding the overlays as at `commit`."""
    out, notes, i = [], [], 0
    while i < len(words):
        word = words[i]
        value = None
        if word in ("--config", "-c") and i + 1 < len(words):
            value, i = words[i + 1], i + 2
        elif word.startswith("--config="):
            value, i = word.split("=", 1)[1], i + 1
        else:
            out.append(word)
            i += 1
            continue
        if Path(value).is_file() or value.endswith((".yaml", ".yml")):
            out += ["--config", value]
            continue
        parts = []
        for name in value.split("+"):
            overlay, note = overlay_at(commit, name)
            parts.append(overlay)
            if note:
                notes.append(f"overlay {name} {note}")
        path = tmp / f"overlay-{len(list(tmp.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(merge_overlays(parts)))
        out += ["--config", str(path)]
    return out, notes


def recorded(result: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """{'then': config as it ran, 'now': the recorded command under today's presets and recipes, 'notes': [...]}."""
    commit, commit_note = recorded_commit(result)
    words, notes = overlays_expanded(command_words(str(result["command"])), commit, tmp)
    words, retired = retired_dropped(words)
    notes += [f"options since retired, set to their off value: {', '.join(retired)}"] if retired else []
    captured = request_of(words)
    method = captured.method
    recipe_name = result.get("recipe")
    if recipe_name is None or method not in METHODS:
        then_recipe = now_recipe = []  # before recipes: the preset's own values (today's `--recipe paper`)
    else:
        then_recipe, note = recipe_then(method, str(recipe_name), commit)
        now_recipe = importlib.import_module(f"privdistill.recipes.{method}").RECIPES[str(recipe_name)]
        notes += [f"recipe {recipe_name}{note}"] if note else []
    then_preset = preset_at(commit, captured.request.preset) if commit else None
    if commit and then_preset is None:
        notes.append(f"no presets/{captured.request.preset}/ at {commit[:8]}: today's preset assumed")
    then, then_notes = resolve(captured, preset=then_preset, recipe=then_recipe)
    now, _ = resolve(captured, recipe=now_recipe)
    for config in (then, now):
        echo(config, result, method)
    if commit:
        notes.insert(0, f"ran at {commit[:8]}{commit_note}")
    return {"then": then, "now": now, "notes": notes + then_notes, "method": method}


def echo(config: dict[str, dict[str, Any]], result: dict[str, Any], method: str) -> None:
    """What the result records of its own configuration replaces what its command implied."""
    if "budget" in config:
        for field, key in BUDGET_ECHO.items():
            if field in result and (result[field] is not None or key in ("epsilon", "max_epsilon")):
                config["budget"][key] = result[field]
        headline = str((result.get("dpsgd_accounting") or {}).get("headline", ""))
        if method == "dpsgd" and result.get("accounting") is None and headline:
            # before DP-SGD recorded its accounting: Opacus's calibration was then the default (today's paper)
            config["budget"]["accounting"] = "paper" if headline.startswith("Opacus") else "strict"
    if method == "srr" and isinstance(result.get("config"), dict):
        config["srr"].update({k: v for k, v in result["config"].items() if k in config["srr"]})
    section, names = METHOD_ECHO.get(method, ("", ()))
    for name in names:
        if section in config and name in result and name in config[section]:
            config[section][name] = result[name]


# ---------------------------------------------------------------------------------------------- comparison
def compared(section: str, key: str) -> bool:
    if section == "run":
        return key in RUN_KEYS_COMPARED
    return key not in IGNORED_KEYS


def same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def differences(then: dict, now: dict, cell: dict) -> list[dict[str, Any]]:
    out = []
    for section in sorted(set(then) & set(cell)):
        for key in sorted(set(then[section]) & set(cell[section])):
            if not compared(section, key) or same(then[section][key], cell[section][key]):
                continue
            cause = "since" if key in now.get(section, {}) and same(now[section][key], cell[section][key]) else "cell"
            out.append({"key": f"{section}.{key}", "recorded": then[section][key], "cell": cell[section][key],
                        "cause": cause})
    return out


def check_cell(cell: Cell, tmp: Path) -> dict[str, Any]:
    result = load_json(cell.result) or {}
    row: dict[str, Any] = {"cell": cell.name, "preset": cell.preset, "result": str(cell.result), "recorded": True,
                           "command": result.get("command"), "args": " ".join(cell.args)}
    try:
        current, _ = resolve(request_of(cell.command(["privdistill"], resume=False)[1:]))
    except Exception as err:  # noqa: BLE001 - the cell's own configuration refused: that is the finding
        row.update(status="refused", reason=str(err))
        return row
    try:
        rec = recorded(result, tmp)
    except Exception as err:  # noqa: BLE001 - an old command today's CLI or config refuses: reported, not fatal
        row.update(status="unverifiable", reason=f"the recorded command does not resolve today: {err}")
        return row
    row["notes"] = rec["notes"]
    diffs = differences(rec["then"], rec["now"], current)
    row["differences"] = diffs
    row["status"] = ("differs" if any(d["cause"] == "cell" for d in diffs)
                     else "changed since" if diffs else "same")
    return row


def check_unrecorded(cell: Cell) -> dict[str, Any]:
    """A cell with no result yet: only whether today's code resolves its configuration, and under which recipe."""
    row: dict[str, Any] = {"cell": cell.name, "preset": cell.preset, "result": str(cell.result), "recorded": False,
                           "command": None, "args": " ".join(cell.args)}
    try:
        captured = request_of(cell.command(["privdistill"], resume=False)[1:])
        resolve(captured)
    except Exception as err:  # noqa: BLE001 - the cell's own configuration refused: that is the finding
        row.update(status="refused", reason=str(err))
        return row
    recipe = requested(captured.request, "run", "recipe")
    moving = recipe is None and captured.method in METHODS  # it runs whatever the default recipe is that day
    row["status"] = "unrecorded, default recipe" if moving else "unrecorded"
    return row


def show_value(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def counts_of(rows: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", nargs="+", default=["quick", "paper", str(Path(__file__).with_name(
        "research-matrix.yaml"))], help="matrices (names or YAML paths)")
    parser.add_argument("--results", default="results", help="the results folder (results/<preset>/<name>.json)")
    parser.add_argument("--only", nargs="*", help="cells whose name holds one of these (=NAME: exactly)")
    parser.add_argument("--json", help="write every cell's check here")
    parser.add_argument("--quiet", action="store_true", help="the summary and the differing cells' names only")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="check-matrix-") as tmp:
        for name in args.matrix:
            matrix = load_matrix(name, results_dir=args.results, only=args.only)
            for cell in matrix.cells:
                rows.append(check_cell(cell, Path(tmp)) if cell.result.is_file() else check_unrecorded(cell))
    counts = counts_of(rows)
    for row in rows:
        if row["status"] in ("same", "unrecorded"):
            continue
        print(f"\n[{row['status']}] {row['preset']}/{row['cell']}")
        if args.quiet:
            continue
        print(f"  recorded: {row['command']}")
        print(f"  cell:     privdistill {row['args']}")
        for note in row.get("notes", []):
            print(f"  note: {note}")
        if row.get("reason"):
            print(f"  {row['reason']}")
        for d in row.get("differences", []):
            why = "" if d["cause"] == "cell" else "   (changed since the row was recorded)"
            print(f"  {d['key']}: recorded {show_value(d['recorded'])}, cell {show_value(d['cell'])}{why}")
    recorded_rows = [row for row in rows if row["recorded"]]
    print(f"\n{len(recorded_rows)} cells with a recorded result checked: " + ", ".join(
        f"{n} {status}" for status, n in sorted(counts_of(recorded_rows).items())))
    print(f"{len(rows) - len(recorded_rows)} cells not recorded yet: " + ", ".join(
        f"{n} {status}" for status, n in sorted(counts_of([r for r in rows if not r["recorded"]]).items())))
    print("(differs: the cell's args resolve to another configuration than its result's; refused: today's code refuses "
          "the cell; changed since: only presets or recipes changed after the row was recorded; unverifiable: the "
          "recorded command no longer resolves; unrecorded, default recipe: a cell without a result that runs its "
          "method's moving default recipe)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str) + "\n")
    return 1 if counts.get("differs") or counts.get("refused") else 0


if __name__ == "__main__":
    sys.exit(main())
