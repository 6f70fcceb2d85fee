"""Configuration: typed sections, presets, YAML files and command-line overrides.

A run's configuration is a set of named sections (``run``, ``baseline``, ``teachers``, ...), each a
dataclass. Values are resolved in this order, later winning:

    dataclass defaults < preset (``presets/<name>/*.yaml``: the scale) < the preset's ``by_dataset.<dataset>``
    block < the method's recipe (``recipes/<method>.py``: what is trained) < the user's ``--config FILE.yaml``
    (same layout) < ``--set section.key=value`` on the command line

The resolved configuration is written to the run directory as ``config.yaml``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml

from privdistill.errors import ConfigError, ModelError
from privdistill.models.registry import get_entry

# engine/augment.py's batch augmentations, by name (every config section with an `augment` option)
AUGMENTATIONS = ("none", "shift", "flip-shift", "affine")

PRESETS = ("quick", "paper")

NOISE_SOURCES = ("secure", "reproducible")  # run.noise

T = TypeVar("T")


# --------------------------------------------------------------------------------------------- sections
@dataclass
class RunOptions:
    """Where and how a run executes (not a hyper-parameter of any method)."""

    seed: int = 0
    # where the privacy noise comes from: "secure" (a CSPRNG keyed from OS entropy, privacy/secure.py; the default,
    # and what a release needs) or "reproducible" (torch generators seeded from `seed`, for research: the ε then
    # holds only while the seed stays secret, and `export` refuses the run unless told). An explicit --seed (or
    # run.seed) without run.noise asks for reproducible noise.
    noise: str = "secure"
    recipe: str = "default"  # the method's recipe (recipes/<method>.py; --recipe): read before the sections resolve
    # a plan that cannot teach anything (methods/plan_judge.py) is refused; "warn" runs it all the same, saying so
    # first (research on what such a plan does, the tests' tiny datasets)
    plan_check: str = "refuse"
    deterministic: bool = False
    device: str = "auto"
    precision: str = "auto"  # auto | fp32 | bf16 | fp16
    threads: int = 0  # 0: one per available core
    data_root: str | None = None
    runs_dir: str = "runs"
    progress: bool = True

    def validate(self) -> None:
        check(self.precision in ("auto", "fp32", "bf16", "fp16"), f"run.precision: unknown {self.precision!r}")
        check(self.noise in NOISE_SOURCES, f"run.noise must be one of {', '.join(NOISE_SOURCES)}, got {self.noise!r}")
        check(self.plan_check in ("refuse", "warn"), f"run.plan_check must be refuse or warn, got {self.plan_check!r}")
        check(self.threads >= 0, "run.threads must be >= 0")
        check(0 <= self.seed < 2**63 - 1, f"run.seed must lie in [0, 2**63 - 1), got {self.seed}")


@dataclass
class ClassifierTraining:
    """Supervised training of a classifier (the non-private baseline, teachers, DP-SGD's network)."""

    model: str = "paper-cnn"
    epochs: float = 5.0
    steps: int = 0  # > 0 overrides epochs
    batch_size: int = 128
    optimizer: str = "adam"  # adam | sgd
    lr: float = 1e-3
    momentum: float = 0.9  # sgd only
    lr_schedule: str = "linear"  # linear decay to 0 (the papers' schedule) | cosine | constant
    weight_decay: float = 0.0
    augment: str = "none"  # one of AUGMENTATIONS (engine/augment.py), as every other `augment` option
    label_smoothing: float = 0.0
    eval_every_epochs: float = 1.0
    checkpoint_every: int = 200  # steps

    def validate(self) -> None:
        check(self.epochs > 0 or self.steps > 0, "epochs or steps must be > 0")
        check(self.steps >= 0, "steps must be >= 0")
        check(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        check(self.lr > 0, f"lr must be > 0, got {self.lr}")
        check(self.optimizer in ("adam", "sgd"), f"optimizer must be adam or sgd, got {self.optimizer!r}")
        check(self.lr_schedule in ("linear", "cosine", "constant"), f"unknown lr_schedule {self.lr_schedule!r}")
        check_augment(self.augment, "augment")
        check(0 <= self.label_smoothing < 1, "label_smoothing must lie in [0, 1)")
        check(self.checkpoint_every >= 1, "checkpoint_every must be >= 1")
        check(self.weight_decay >= 0, "weight_decay must be >= 0")


def check_augment(name: str, where: str) -> None:
    """Refuse an augmentation engine/augment.py does not have, naming the ones it has."""
    check(name in AUGMENTATIONS, f"{where} must be one of {', '.join(AUGMENTATIONS)}, got {name!r}")


def check_model_name(name: str, where: str, kind: str = "classifier") -> None:
    """Refuse an unknown registry name when the config is read, not when training reaches that model."""
    try:
        get_entry(name, kind)
    except ModelError as err:
        raise ConfigError(f"{where}: {err}") from None


def check(condition: bool, message: str) -> None:
    """Refuse a configuration with `message` unless `condition` holds (the sections' validate methods)."""
    if not condition:
        raise ConfigError(message)


def load_preset(name: str) -> dict[str, Any]:
    """A preset is the union of the YAML files in presets/<name>/ (one file per method or stage family).

    Two files may both contribute to `by_dataset`, but a top-level section belongs to one file only.
    """
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    merged: dict[str, Any] = {}
    folder = resources.files("privdistill.presets").joinpath(name)
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".yaml"):
            continue
        part = yaml.safe_load(entry.read_text()) or {}
        for section, block in part.items():
            if section == "by_dataset":
                for dataset, sections in (block or {}).items():
                    target = merged.setdefault("by_dataset", {}).setdefault(dataset, {})
                    for sec, values in (sections or {}).items():
                        target.setdefault(sec, {}).update(values or {})
            elif section in merged:
                raise ConfigError(f"preset {name}: section {section!r} is defined twice (second time in {entry.name})")
            else:
                merged[section] = block
    return merged


def load_yaml_file(path: str | Path | None, *, what: str = "config file",
                   holds: str = "sections") -> dict[str, Any]:
    """A YAML mapping from `path` ({} for None), or a ConfigError naming `what` the file is."""
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        hint = ""
        if what == "config file" and not path.exists() and path.suffix not in (".yaml", ".yml"):
            hint = (" (--config reads a YAML file of your own; a method's measured configurations are its recipes: "
                    "--recipe NAME, listed by `privdistill recipes METHOD`; one value: --set section.key=value)")
        raise ConfigError(f"{what} {path} " + ("is a directory, not a YAML file" if path.is_dir()
                                              else "does not exist") + hint)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{what} {path} is not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a mapping of {holds}, got {type(data).__name__}")
    return data


class CommandLineText(str):
    """A value as typed after `--set section.key=`: read by the type of the field it sets (a `str` field keeps
    the text as typed, so `--set dpdfd.variant=no` is the string "no", not YAML's False), never parsed twice."""


_NULL_TEXT = ("", "null", "Null", "NULL", "~")


def parse_overrides(items: list[str] | None) -> dict[str, dict[str, Any]]:
    """['baseline.epochs=3', 'run.seed=1'] -> {'baseline': {'epochs': '3'}, 'run': {'seed': '1'}}, the values
    kept as CommandLineText until the section's dataclass says what type they are."""
    out: dict[str, dict[str, Any]] = {}
    for item in items or []:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        key, value = item.split("=", 1)
        section, field_name = key.split(".", 1)
        out.setdefault(section.strip(), {})[field_name.strip()] = CommandLineText(value)
    return out


def normalize_overrides(overrides: list[str] | dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Overrides in any of their three forms -> {section: {key: value}}:

    * command-line strings ``["dgd.queries=1300"]`` (values read by the field's type, see CommandLineText);
    * typed values by dotted key ``{"dgd.queries": 1300}`` (the Python API: no detour through text);
    * typed values by section ``{"dgd": {"queries": 1300}}``.
    """
    if not overrides:
        return {}
    if isinstance(overrides, (list, tuple)):
        return parse_overrides(list(overrides))
    out: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        if "." in key:
            section, field_name = key.split(".", 1)
            out.setdefault(section, {})[field_name] = value
        elif isinstance(value, dict):
            out.setdefault(key, {}).update(value)
        else:
            raise ConfigError(f"override {key!r} needs the form section.key (e.g. dgd.queries)")
    return out


def _read_text(text: CommandLineText, hint: Any) -> Any:
    """Command-line text -> the value it means for a field of type `hint`."""
    allowed = typing.get_args(hint) if typing.get_origin(hint) in _UNIONS else (hint,)
    if text in _NULL_TEXT and (type(None) in allowed or hint is Any):
        return None
    if str in allowed:
        return str(text)
    try:
        return yaml.safe_load(text) if text != "" else None
    except yaml.YAMLError:
        return str(text)


# --------------------------------------------------------------------------------------------- resolve
def _layers(base: dict[str, Any], dataset: str | None, user: dict[str, Any], overrides: dict[str, dict[str, Any]],
            recipe: list[dict[str, Any]] | None = None):
    layers = [base]
    if dataset:
        layers.append((base.get("by_dataset") or {}).get(dataset, {}))
    layers += recipe or []  # recipes/__init__.py: between the preset and the user's own values
    layers.append(user)
    if dataset:
        layers.append((user.get("by_dataset") or {}).get(dataset, {}))
    layers.append(overrides)
    return layers


def build_section(cls: type[T], values: dict[str, Any], section: str) -> T:
    """Instantiate a section dataclass from a mapping, coercing types and rejecting unknown keys."""
    values = _drop_retired(cls, values, section)
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in section {section!r}; valid keys: {sorted(known)}")
    kwargs = {k: _coerce(v, hints[k], f"{section}.{k}") for k, v in values.items()}
    obj = cls(**kwargs)
    if hasattr(obj, "validate"):
        try:
            obj.validate()
        except ConfigError as err:
            raise ConfigError(f"{section}: {err}") from None
    return obj


_UNIONS = (typing.Union, types.UnionType)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    if isinstance(value, CommandLineText):
        value = _read_text(value, hint)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if value is None:
        if type(None) in args or hint is Any:
            return None
        raise ConfigError(f"{where} cannot be empty")
    if origin in _UNIONS:
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, where)
            except ConfigError:
                pass
        raise ConfigError(f"{where}: {value!r} does not fit {hint}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            value = [value]
        inner = args[0] if args else Any
        seq = [_coerce(v, inner, where) for v in value]
        return tuple(seq) if origin is tuple else seq
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            try:
                return int(str(value))
            except ValueError:
                raise ConfigError(f"{where} must be an integer, got {value!r}") from None
        return int(value)
    if hint is float:
        if isinstance(value, bool):  # YAML reads yes/no/on/off as booleans: float(True) would pass as 1.0
            raise ConfigError(f"{where} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where} must be a number, got {value!r}") from None
    if hint is str:
        return str(value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return build_section(hint, value, where)
    return value


def resolve_sections(sections: dict[str, type], *, preset: str, dataset: str | None = None,
                     config_file: str | Path | None = None, overrides: list[str] | dict | None = None,
                     recipe: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Resolve every requested section; returns {name: dataclass instance}."""
    base = load_preset(preset)
    user = load_yaml_file(config_file)
    _check_user_sections(user, sections, base, config_file)
    parsed = normalize_overrides(overrides)
    stray = sorted(set(parsed) - set(sections))
    if stray:
        raise ConfigError(f"--set names unknown section(s) {stray}; this command has {sorted(sections)}")
    merged: dict[str, dict[str, Any]] = {name: {} for name in sections}
    for layer in _layers(base, dataset, user, parsed, recipe):
        for name in sections:
            block = layer.get(name) or {}
            if not isinstance(block, dict):
                raise ConfigError(f"section {name!r} must be a mapping, got {block!r}")
            merged[name].update(block)
    return {name: build_section(cls, merged[name], name) for name, cls in sections.items()}


def chosen_values(*, preset: str, dataset: str | None = None, config_file: str | Path | None = None,
                  overrides: list[str] | dict | None = None,
                  recipe: list[dict[str, Any]] | None = None) -> tuple[dict[str, dict[str, Any]], set[str]]:
    """(the preset's own values by section, the "section.key"s chosen for this run): chosen are those the
    preset's `by_dataset` block, the recipe (measured as they are), the user's --config file or --set gives.
    methods/sizing.py fits only the others to the data: a value someone chose is never changed behind their back."""
    base = load_preset(preset)
    layers = _layers(base, dataset, load_yaml_file(config_file), normalize_overrides(overrides), recipe)
    chosen = {f"{section}.{key}" for layer in layers[1:] for section, block in layer.items()
              if section != "by_dataset" and isinstance(block, dict) for key in block}
    own: dict[str, dict[str, Any]] = {}
    for layer in layers[:2]:  # the preset and its block for this dataset: what the preset's values were set for
        for section, block in layer.items():
            if section != "by_dataset" and isinstance(block, dict):
                own.setdefault(section, {}).update(block)
    return own, chosen


def _check_user_sections(user: dict[str, Any], sections: dict[str, type], base: dict[str, Any],
                         config_file: str | Path | None) -> None:
    """A --config file may carry sections for other commands (the preset `base` does), but a section no
    command has is a typo that would otherwise be ignored silently."""
    known = set(base) | set(sections)
    per_dataset = user.get("by_dataset") or {}
    if not isinstance(per_dataset, dict):
        raise ConfigError(f"{config_file}: by_dataset must map dataset names to sections")
    for where, block in [("", user)] + [(f"by_dataset.{d}.", b or {}) for d, b in per_dataset.items()]:
        if not isinstance(block, dict):
            raise ConfigError(f"{config_file}: {where.rstrip('.')} must be a mapping of sections")
        stray = sorted(k for k in block if k not in known and not (where == "" and k == "by_dataset"))
        if stray:
            others = sorted(known - set(sections) - {"by_dataset"})
            raise ConfigError(f"{config_file}: unknown section(s) {[where + k for k in stray]}; this command "
                              f"reads {sorted(sections)}, other commands {others}")


# Options that left the package (docs/research-log.md, "Code that left the package"): {class: {option: (the value the
# code always uses now, the option it followed)}}. config.yaml and stage keys still record each at that value
# (to_plain), so older runs resume and their stages are found; --config / --set may give that value, no other.
RETIRED: dict[str, dict[str, tuple[Any, str]]] = {
    "DPDFDConfig": {"granularity": ("per_sample", "batch_size"), "teacher_loss": ("dkd", "operation"),
                    "student_loss": ("l2", "dkd_beta"), "student_optimizer": ("adam", "student_model")},
    "DGDConfig": {"cluster_members": (100, "spread_pool")},
    "DPSourceConfig": {"delta_share": (0.5, "share"), "momentum": (0.9, "lr"), "max_grad_norm": (0.1, "momentum")},
    "GeneratorTraining": {"adversarial_student": ("paper-cnn", "adversarial_weight"),
                          "adversarial_lr": (1e-3, "adversarial_student")},
    "InversionConfig": {"start": ("blank", "l2_weight"), "start_noise": (0.1, "start")},
    "PATEStudentConfig": {"vat_xi": (1e-2, "vat_eps")},
    "SRRConfig": {"optimizer": ("adam", "batch_size"), "momentum": (0.9, "lr"), "weight_decay": (0.0, "momentum"),
                  "finetune": ("kd", "student_ema"), "keep_synthetic": (False, "eval_every_stages")},
    "StudentConfig": {"perturbation": ("adversarial", "normal"), "xi": (1e-2, "normal_eps")},
    "TeacherTraining": {"stratified": (False, "lr_schedule"), "partition_seed": (0, "chunk_size")},
    "VAETraining": {"kl_weight": (1.0, "lr")},
}


def _drop_retired(cls: type, values: dict[str, Any], section: str) -> dict[str, Any]:
    """`values` without the retired options (RETIRED), each checked to be at the value the code always uses."""
    retired = RETIRED.get(cls.__name__, {})
    for key in sorted(set(values) & set(retired)):
        fixed = retired[key][0]
        if _coerce(values[key], type(fixed), f"{section}.{key}") != fixed:
            raise ConfigError(f"{section}.{key} is retired: always {fixed} (docs/research-log.md, options removed)")
    return {k: v for k, v in values.items() if k not in retired}


def keyed_config(cfg) -> dict:
    """A config section as it enters a stage key (engine/stages.py) or a run's config.yaml: every field, set or
    not. When options are added or change meaning, the stage versions (engine/stages.py: VERSIONS) and the
    config.yaml format (engine/run.py: CONFIG_VERSION) are bumped, so that stages cached and runs started before
    are not taken for the new ones."""
    return to_plain(cfg)


def to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        plain = [(f.name, to_plain(getattr(obj, f.name))) for f in fields(obj)]
        for name, (value, after) in RETIRED.get(type(obj).__name__, {}).items():  # in their old places
            plain.insert([k for k, _ in plain].index(after) + 1, (name, value))
        return dict(plain)
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj
