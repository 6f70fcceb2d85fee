"""Options shared by every command that runs a method, so they read the same everywhere."""

from __future__ import annotations

import atexit
import functools
import inspect
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from privdistill.cli.lazy import lazy_module
from privdistill.config import parse_overrides

# imported when a command builds its request, not for --help: it imports torch (cli/lazy.py)
common = lazy_module("privdistill.methods.common")

Dataset = Annotated[str, typer.Option("--dataset", "-d", help="mnist, fashion-mnist, cifar10, svhn, npz:PATH or "
                                                                "folder:DIR")]
Preset = Annotated[str, typer.Option("--preset", "-p", help="quick (CPU, minutes) or paper (the papers' settings, "
                                                              "GPU)")]
ConfigFile = Annotated[Optional[Path], typer.Option("--config", "-c", help="a YAML file of your own with the same "
                                                    "sections as the presets (a method's measured configurations are "
                                                    "its recipes: --recipe)")]
Overrides = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="override one value: section.key=value "
                                                                           "(repeatable)")]
RunDirOpt = Annotated[Optional[Path], typer.Option("--run-dir", help="where to write the run (default "
                                                                    "runs/<method>-<dataset>-<time>)")]
Resume = Annotated[bool, typer.Option("--resume", help="continue an interrupted run in --run-dir")]
Record = Annotated[bool, typer.Option("--record", help="copy summary.json to results/<preset>/")]
RecipeOpt = Annotated[Optional[str], typer.Option(
    "--recipe", "-r", help="the method's recipe (default: its best measured one; `paper`: the paper's; "
                           "`privdistill recipes METHOD` lists them)")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="check and price the plan (what it would spend, what the "
                                                        "noise leaves of the answers), print it, train nothing")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="random seed (run.seed)")]
Device = Annotated[Optional[str], typer.Option("--device", help="auto, cpu, cuda, cuda:N (run.device)")]
Precision = Annotated[Optional[str], typer.Option("--precision", help="auto, fp32, bf16, fp16 (run.precision)")]
DataRoot = Annotated[Optional[Path], typer.Option("--data-root", help="data root (default $PRIVDISTILL_DATA or "
                                                                      "~/.cache/privdistill/data)")]
NoProgress = Annotated[bool, typer.Option("--no-progress", help="no plan or progress lines (a bar on a terminal, "
                                                                   "plain lines on a file or a pipe)")]
NoCache = Annotated[bool, typer.Option(
    "--no-cache", help="build every stage (baseline, teachers, generator, ...) inside this run; share none")]
Variant = Annotated[Optional[str], typer.Option(
    "--variant", help="name suffix of the recorded result (<method>.variant; default: derived from the configuration)")]


class Accounting(str, Enum):
    paper = "paper"
    strict = "strict"


# The budget, the same for every private method (section `budget`, see methods/runner.py: Budget).
Epsilon = Annotated[Optional[float], typer.Option(
    "--epsilon", "-e", help="target ε under --accounting (budget.epsilon): the method sizes its plan (queries, "
                            "steps, noise, per-label ε) so that the run fits it \\[default: none; without it, "
                            "give the queries or steps]")]
Delta = Annotated[Optional[float], typer.Option("--delta", help="δ (budget.delta, default 1e-5)")]
MaxEpsilon = Annotated[Optional[float], typer.Option(
    "--max-epsilon", help="hard limit the privacy ledger enforces (budget.max_epsilon; default: the target)")]
BudgetAccounting = Annotated[Optional[Accounting], typer.Option(
    "--accounting", help="what the target and the limit are measured in: strict (dp-accounting's (ε, δ) of every "
                         "recorded use of the private data; the run's privacy line says whether that covers the whole "
                         "model) or paper (the paper's own formula, to reproduce it) \\[default: strict]")]


class PrivacyScope(str, Enum):
    method = "method"
    end_to_end = "end-to-end"


BudgetPrivacy = Annotated[Optional[PrivacyScope], typer.Option(
    "--privacy", help="method: the method as published (the privacy line says what ε covers); end-to-end: every "
                      "pathway to the released model priced within the target ε, e.g. a DP-SGD model in place of a "
                      "non-private source (docs/privacy.md) \\[default: method]")]


class SRRSetting(str, Enum):
    """SRR's two settings: data-free (Table I) and label-DP on real inputs (Table II)."""

    data_free = "data-free"
    label_dp = "label-dp"


def parse_range(text: str | None, option: str) -> tuple[float, float] | None:
    """'0,1' -> (0.0, 1.0) for an option that takes LO,HI; None when not given."""
    if text is None:
        return None
    try:
        lo, hi = (float(v) for v in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"{option} takes LO,HI (e.g. 0,1), got {text!r}") from None
    if not lo < hi:
        raise typer.BadParameter(f"{option} needs LO < HI, got {text!r}")
    return lo, hi


def section_overrides(section: str, **values) -> dict[str, Any]:
    """{"section.key": value} for every dedicated option the user gave (None: not given, the preset decides).
    The values stay typed: only `--set` text is read by the field's type (config.CommandLineText)."""
    return {f"{section}.{key}": value for key, value in values.items() if value is not None}


def run_overrides(overrides: list[str] | None, *, extra: Mapping[str, Any] | None = None, seed=None, device=None,
                  precision=None, data_root=None, no_progress=False) -> dict[str, Any]:
    """--set overrides, then ``extra`` (a command's dedicated options, from section_overrides), then the shared
    options folded into the `run` section; later wins. Returns {"section.key": value}."""
    out: dict[str, Any] = {f"{section}.{key}": value for section, block in parse_overrides(overrides).items()
                           for key, value in block.items()}
    out.update(extra or {})
    out.update(section_overrides("run", seed=seed, device=device, precision=precision,
                                 data_root=str(data_root) if data_root is not None else None))
    if no_progress:
        out["run.progress"] = False
    return out


@dataclass
class RunArgs:
    """The options every command that runs something shares, as one value (see `run_command`), and, for a
    private method's command, the budget options (see `private_command`)."""

    dataset: str
    preset: str
    config: Optional[Path]
    set_: Optional[list[str]]
    run_dir: Optional[Path]
    resume: bool
    record: bool
    seed: Optional[int]
    device: Optional[str]
    precision: Optional[str]
    data_root: Optional[Path]
    no_progress: bool
    budget: dict[str, Any] = field(default_factory=dict)  # {"budget.epsilon": ...} of the options given
    method: dict[str, Any] = field(default_factory=dict)  # {"<section>.variant": ...} of a private command
    no_cache: bool = False  # a private command's --no-cache
    dry_run: bool = False  # a private command's --dry-run

    def request(self, extra: Mapping[str, Any] | None = None):
        """The RunRequest of these options plus a command's dedicated ones (``extra``: section_overrides). A dry
        run plans in a throw-away directory (main() prints the plan and removes it)."""
        if self.dry_run:
            self.run_dir, self.resume, self.record = Path(tempfile.mkdtemp(prefix="privdistill-dry-run-")), False, False
            atexit.register(shutil.rmtree, self.run_dir, ignore_errors=True)  # also when the plan is refused
        overrides = run_overrides(self.set_, extra={**self.budget, **self.method, **(extra or {})}, seed=self.seed,
                                  device=self.device, precision=self.precision, data_root=self.data_root,
                                  no_progress=self.no_progress)
        return common.RunRequest(dataset=self.dataset, preset=self.preset,
                                 config_file=str(self.config) if self.config else None, overrides=overrides,
                                 run_dir=str(self.run_dir) if self.run_dir else None, resume=self.resume,
                                 record=self.record, dry_run=self.dry_run)


_SHARED = (("dataset", Dataset, "mnist"), ("preset", Preset, "quick"), ("config", ConfigFile, None),
           ("set_", Overrides, None), ("run_dir", RunDirOpt, None), ("resume", Resume, False),
           ("record", Record, False), ("seed", Seed, None), ("device", Device, None), ("precision", Precision, None),
           ("data_root", DataRoot, None), ("no_progress", NoProgress, False))
_BUDGET = (("epsilon", Epsilon, None), ("delta", Delta, None), ("max_epsilon", MaxEpsilon, None),
           ("accounting", BudgetAccounting, None), ("privacy", BudgetPrivacy, None))


def run_command(func: Callable[..., Any], *, budget: bool = False, section: str | None = None,
                cache: bool = False) -> Callable[..., Any]:
    """Give a command the shared options (`--dataset --preset --config --set --run-dir --resume --record --seed
    --device --precision --data-root --no-progress`) without repeating them: `func(run: RunArgs, ...own options)`
    receives them bundled as `run`, and typer sees them in the signature, first, the same in every command.
    With `budget`, also the budget options; with `section`, `--variant` (<section>.variant); with `cache`,
    `--no-cache` (`run.no_cache`)."""
    own = inspect.signature(func, eval_str=True)  # the command's own options, annotations evaluated
    budget_options = (("recipe", RecipeOpt, None), ("dry_run", DryRun, False)) + _BUDGET
    added = _SHARED + (budget_options if budget else ()) + ((("variant", Variant, None),) if section else ()) + (
        (("no_cache", NoCache, False),) if cache else ())
    params = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
              for name, annotation, default in added]
    params += [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own.parameters.values() if p.name != "run"]

    @functools.wraps(func)
    def command(**kwargs: Any) -> Any:
        run = RunArgs(**{name: kwargs.pop(name) for name, _, _ in _SHARED})
        if budget:
            run.method = section_overrides("run", recipe=kwargs.pop("recipe"))
            run.dry_run = kwargs.pop("dry_run")
            given = {name: kwargs.pop(name) for name, _, _ in _BUDGET}
            run.budget = section_overrides("budget", **{k: v.value if isinstance(v, Enum) else v
                                                        for k, v in given.items()})
        if section:
            run.method.update(section_overrides(section, variant=kwargs.pop("variant")))
        if cache:
            run.no_cache = kwargs.pop("no_cache")
        return func(run=run, **kwargs)

    command.__signature__ = own.replace(parameters=params)
    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": own.return_annotation}
    del command.__wrapped__  # typer must read this signature, not the wrapped function's
    return command


def private_command(section: str, *, cache: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`run_command` for a private method whose config section is `section`: plus the budget options every
    private method takes (`--epsilon --delta --max-epsilon --accounting`, section `budget`), `--variant` and,
    with `cache`, `--no-cache`, all folded into `run.request()` (`run.no_cache` for the last)."""
    return functools.partial(run_command, budget=True, section=section, cache=cache)
