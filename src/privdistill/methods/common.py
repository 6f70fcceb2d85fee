"""What every method does around its algorithm: resolve the configuration, open the run directory,
load the data, and write the summary (optionally recorded under results/<preset>/)."""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privdistill.config import (
    RunOptions,
    chosen_values,
    keyed_config,
    load_yaml_file,
    normalize_overrides,
    resolve_sections,
)
from privdistill.data import DataSplits, canonical_name, dataset_slug, load_data
from privdistill.data.custom import as_dataset_spec
from privdistill.engine import Env, RunDir, record_result
from privdistill.engine.run import lock_run_dir, unlock_run_dir
from privdistill.errors import ConfigError, RunError
from privdistill.methods.sizing import fit_to_data
from privdistill.privacy._checks import check_delta_for_records
from privdistill.recipes import recipe_layers, recipes


@dataclass
class RunRequest:
    """What the user asked for, independent of the method: the CLI and the Python API both build one."""

    dataset: str
    preset: str = "quick"
    config_file: str | None = None
    overrides: list[str] | dict[str, Any] = field(default_factory=dict)  # see config.normalize_overrides
    run_dir: str | None = None
    resume: bool = False
    record: bool = False
    results_dir: str = "results"
    dry_run: bool = False  # plan, check and price the run, train nothing (dry_run.DryRunPlan)


@dataclass
class Prepared:
    sections: dict[str, Any]
    env: Env
    run: RunDir
    data: DataSplits
    dataset: str
    started: float
    notes: list[str] = field(default_factory=list)  # what was fitted to the data (methods/sizing.py)
    method: str = ""  # the method's name, as recipes/ knows it


def prepare_run(method: str, request: RunRequest, sections: dict[str, type]) -> Prepared:
    if request.resume and not (request.run_dir and (Path(request.run_dir) / "config.yaml").is_file()):
        # a typo in --run-dir would otherwise start a fresh run (and spend a fresh budget) silently
        raise RunError(f"--resume needs the --run-dir of an earlier run; {request.run_dir or '(none given)'} "
                       "holds none. Drop --resume to start a new run")
    dataset = canonical_name(request.dataset) if ":" not in request.dataset else request.dataset
    resolved, preset_values, chosen, by_recipe = _resolve(method, request, sections, dataset)
    options: RunOptions = resolved["run"]
    env = Env.from_options(options)
    data = load_data(dataset, options.data_root, seed=options.seed)
    # the preset's sizes and vote noise refitted to this dataset's N before anything is keyed or planned
    resolved, notes = fit_to_data(resolved, data, preset_values=preset_values, chosen=chosen, by_recipe=by_recipe)
    notes += data_notes(data, dataset)
    if "budget" in resolved:  # δ against the N private records, before any work (no run directory yet)
        check_delta_for_records(resolved["budget"].delta, len(data.train))
    config = {"method": method, "dataset": dataset, "preset": request.preset,
              **{name: keyed_config(section) for name, section in resolved.items()}}
    run_dir = request.run_dir or str(
        Path(options.runs_dir) / f"{method}-{dataset_slug(dataset)}-{time.strftime('%Y%m%d-%H%M%S')}")
    lock_run_dir(run_dir)  # held until finish_run: a second process on this directory is refused
    run = RunDir.open(run_dir, config=config, resume=request.resume)
    return Prepared(sections=resolved, env=env, run=run, data=data, dataset=dataset, started=time.perf_counter(),
                    notes=notes, method=method)


def _resolve(method: str, request: RunRequest, sections: dict[str, type],
             dataset: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]], set[str], set[str]]:
    """(the resolved sections: preset < recipe layers for this dataset and target ε < --config < --set, the
    preset's own values, the keys chosen, those of them only the recipe chose), before anything is fitted to the
    data."""
    recipe_name = requested(request, "run", "recipe")
    recipe_args = (method, None if recipe_name is None else str(recipe_name), dataset,
                   _number(requested(request, "budget", "epsilon")))
    recipe = recipe_layers(*recipe_args)
    resolved = resolve_sections({"run": RunOptions, **sections}, preset=request.preset, dataset=dataset,
                                config_file=request.config_file, overrides=request.overrides, recipe=recipe)
    preset_values, chosen = chosen_values(preset=request.preset, dataset=dataset, config_file=request.config_file,
                                          overrides=request.overrides, recipe=recipe)
    # the recipe's general values were measured on the built-in data; its blocks for this dataset, on this dataset
    _, measured_here = chosen_values(preset=request.preset, dataset=dataset, config_file=request.config_file,
                                     overrides=request.overrides, recipe=recipe_layers(*recipe_args, dataset_only=True))
    apply_noise_policy(resolved, chosen)
    return resolved, preset_values, chosen, chosen - measured_here


def sections_at_epsilon(prep: Prepared, request: RunRequest, epsilon: float) -> dict[str, Any]:
    """The sections a run of the same request would resolve at target `epsilon` (a recipe's ε layers, then
    the sizing to the data): what the plan judge prices a nearer plan with, so that "ε = X would pass" holds for
    the plan `-e X` actually makes."""
    overrides = {s: dict(block) for s, block in normalize_overrides(request.overrides).items()}
    overrides.setdefault("budget", {}).update(epsilon=epsilon, max_epsilon=None)
    trial = dataclasses.replace(request, overrides=overrides)
    sections = {name: type(section) for name, section in prep.sections.items() if name != "run"}
    resolved, preset_values, chosen, by_recipe = _resolve(prep.method, trial, sections, prep.dataset)
    return fit_to_data(resolved, prep.data, preset_values=preset_values, chosen=chosen, by_recipe=by_recipe)[0]


def data_notes(data: DataSplits, dataset: str) -> list[str]:
    """What the plan says of data of one's own: the labels renumbered, and where the test accuracy is measured."""
    notes = []
    if data.label_map:
        given = ", ".join(str(v) for v in data.label_map)
        notes.append(f"labels renumbered: the data's labels {given} are classes 0..{len(data.label_map) - 1} in that "
                     "order (label_map in the summary; the model card lists the labels as given)")
    if ":" in dataset and data.test_from:  # a built-in dataset's test set goes without saying
        notes.append(f"test accuracy is measured on {len(data.test):,} images: {data.test_from}"
                     + ("; give your own test split: x_test / y_test in the npz, or fit(..., test=(images, labels))"
                        if data.test_from.startswith("held out") else ""))
    return notes


def requested(request: RunRequest, section: str, key: str) -> Any:
    """A value the user gave (--set or --config), read before the sections are resolved: the recipe (run.recipe)
    and the target ε (budget.epsilon) choose the recipe's layers."""
    value = normalize_overrides(request.overrides).get(section, {}).get(key)
    if value is None and request.config_file:
        value = (load_yaml_file(request.config_file).get(section) or {}).get(key)
    return value


def _number(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None  # the budget section's own check says what is wrong with it


class ReproducibleNoiseWarning(UserWarning):
    """A run whose privacy noise a seed regenerates: said first, before anything trains (and refused by export)."""


#: the method options that switch secure noise on; each follows run.noise unless set explicitly
SECURE_FLAGS = ("secure_noise", "secure_mode")


def apply_noise_policy(resolved: dict[str, Any], chosen: set[str]) -> bool:
    """Secure noise unless reproducible noise is asked for by name: run.noise=reproducible, or an explicit seed
    (--seed, run.seed) without run.noise. Every method's secure flag left unset follows; returns whether the run's
    noise is secure: whether its secure flags, set or followed, all are (a run nested in another, an end-to-end
    DP source, is given the seed and its flag by its parent). A reproducible run is said in a warning before
    anything trains."""
    options = resolved["run"]
    if "run.seed" in chosen and "run.noise" not in chosen:
        options.noise = "reproducible"
    flags = []
    for section in resolved.values():
        for flag in SECURE_FLAGS:
            if hasattr(section, flag):
                if getattr(section, flag) is None:
                    setattr(section, flag, options.noise == "secure")
                flags.append(getattr(section, flag))
    secure = all(flags) if flags else options.noise == "secure"
    if not secure:
        warnings.warn("reproducible privacy noise: every draw is regenerated from the run's seed, so the stated ε "
                      "holds only while the seed stays secret; `export` refuses this run unless "
                      "--allow-reproducible-noise is given (drop --seed / run.noise for secure noise)",
                      ReproducibleNoiseWarning, stacklevel=3)
    return secure


BUDGET_KEYWORDS = ("epsilon", "max_epsilon", "delta", "accounting", "privacy")


class MethodAPI:
    """Shared shape of the methods' Python API: options in the constructor, the private data in `fit`.

    `dataset` is a name (mnist, fashion-mnist, cifar10, svhn) or a source string (`npz:PATH`, `folder:DIR`);
    `recipe`: one of the method's recipes, as `--recipe`; `config`: a YAML file of one's own, as `--config`;
    `overrides`: typed values by dotted key (`{"student.steps": 300}`), or `section.key=value` strings as on the
    command line (`--set`);
    `epsilon`, `max_epsilon`, `delta`, `accounting` and `privacy` go to the `budget` section, other keyword
    options to the method's section, typed as given; `cache=False` trains every shared stage afresh."""

    section = ""  # the configuration section the keyword options go to
    method: type = type(None)  # the runner's Method class (methods/runner.py)

    def __init__(self, dataset: str | None = None, *, recipe: str | None = None, preset: str = "quick",
                 config: str | None = None, overrides: list[str] | dict[str, Any] | None = None,
                 run_dir: str | None = None, record: bool = False, cache: bool = True, **options: Any):
        self.dataset, self.preset, self.config, self.run_dir, self.record = dataset, preset, config, run_dir, record
        self.recipe = recipe
        self.cache = cache
        self.overrides = {f"{section}.{key}": value for section, block in normalize_overrides(overrides).items()
                          for key, value in block.items()}
        # the budget keywords are the same for every method: they go to the `budget` section
        self.overrides.update({f"budget.{k}": options.pop(k) for k in BUDGET_KEYWORDS if options.get(k) is not None})
        self.overrides.update({f"{self.section}.{k}": v for k, v in options.items() if v is not None})

    def request(self, data: Any = None, labels: Any = None, value_range: tuple[float, float] | None = None,
                name: str | None = None, test: Any = None) -> RunRequest:
        """`data`: a dataset name or source string, images with `labels` (numpy or torch), an (images, labels)
        pair, or a torch Dataset of (image, label) items (data.custom.as_dataset_spec: such arrays stay in memory,
        nothing is written to disk); `value_range`: the pixel scale of such images when it is neither 0..255 nor
        0..1 (e.g. (0, 16)); `name`: what summaries and model cards call them (default: a hash of their content);
        `test`: the held-out (images, labels) the test accuracy is measured on (default: 10 % held out at random)."""
        dataset = as_dataset_spec(data, labels, value_range=value_range, name=name, test=test) or self.dataset
        if not dataset:
            raise ConfigError(f"{type(self).__name__}.fit needs the private dataset: fit('mnist'), fit('npz:PATH') "
                              "or fit(images, labels)")
        overrides = {**self.overrides, **({"run.recipe": self.recipe} if self.recipe is not None else {})}
        return RunRequest(dataset=dataset, preset=self.preset, config_file=self.config, overrides=overrides,
                          run_dir=self.run_dir, record=self.record)

    def fit(self, data: Any = None, labels: Any = None, *, value_range: tuple[float, float] | None = None,
            name: str | None = None, test: Any = None):
        """Run the method on the private data (see `request`) -> RunResult(student, generator, summary, privacy)."""
        return self.method().run(self.request(data, labels, value_range, name=name, test=test), cache=self.cache,
                                 **self.inputs())

    def inputs(self) -> dict[str, Any]:
        """What the method takes besides the request (DPDFD: the teacher)."""
        return {}


def finish_run(prep: Prepared, request: RunRequest, *, method: str, wall_seconds: float,
               **fields: Any) -> dict[str, Any]:
    recipe = {"recipe": prep.sections["run"].recipe} if recipes(prep.method) else {}
    data = prep.data
    # what the data were: where the test accuracy comes from, the labels as given, the pixel scale as given
    about = {"test_split": f"{len(data.test):,} images: {data.test_from or 'the test split'}",
             "data_value_range": list(data.value_range)}
    if list(data.train.classes) != [str(k) for k in range(data.num_classes)]:
        about["classes"] = list(data.train.classes)
    if data.label_map:
        about["label_map"] = {str(k): v for k, v in data.label_map.items()}
    summary = prep.run.write_summary(method=method, dataset=prep.dataset, preset=request.preset, **recipe,
                                     wall_seconds=round(wall_seconds, 1), device=prep.env.describe(),
                                     **{**about, **fields})
    unlock_run_dir(prep.run.path)
    if request.record:
        summary["recorded_as"] = str(record_result(summary, results_dir=request.results_dir))
    return summary
