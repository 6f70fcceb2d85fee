import pytest

from privdistill.config import (
    RETIRED,
    ClassifierTraining,
    RunOptions,
    build_section,
    parse_overrides,
    resolve_sections,
)
from privdistill.errors import ConfigError

SECTIONS = {"run": RunOptions, "baseline": ClassifierTraining}


def test_precedence_preset_dataset_file_cli(tmp_path):
    quick = resolve_sections(SECTIONS, preset="quick", dataset="mnist")
    fmnist = resolve_sections(SECTIONS, preset="quick", dataset="fashion-mnist")
    assert fmnist["baseline"].epochs > quick["baseline"].epochs, "by_dataset block applies"
    user = tmp_path / "c.yaml"
    user.write_text("baseline:\n  epochs: 2\n  lr: 0.01\n")
    cfg = resolve_sections(SECTIONS, preset="quick", dataset="fashion-mnist", config_file=user,
                           overrides=["baseline.lr=0.5", "run.seed=7"])
    assert cfg["baseline"].epochs == 2 and cfg["baseline"].lr == 0.5 and cfg["run"].seed == 7


@pytest.mark.parametrize("override,message", [
    ("baseline.batch_size=0", "batch_size must be >= 1"),
    ("baseline.lr=-1", "lr must be > 0"),
    ("baseline.epochs=abc", "must be a number"),
    ("baseline.colour=red", "unknown key"),
    ("teachers.n=3", "unknown section"),
    ("baseline.lr_schedule=zigzag", "unknown lr_schedule"),
    ("run.precision=fp8", "unknown 'fp8'"),
    ("run.seed=99999999999999999999", "run.seed must lie in"),
    ("run.seed=-1", "run.seed must lie in"),
    ("baseline.lr=yes", "must be a number, got True"),
])
def test_impossible_values_are_clear_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        resolve_sections(SECTIONS, preset="quick", overrides=[override])


def test_bad_preset_and_files(tmp_path):
    with pytest.raises(ConfigError, match="unknown preset"):
        resolve_sections(SECTIONS, preset="fast")
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_sections(SECTIONS, preset="quick", config_file=tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("baseline: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        resolve_sections(SECTIONS, preset="quick", config_file=bad)
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_overrides(["epochs=3"])


def test_config_file_sections_of_other_commands_pass_but_typos_are_refused(tmp_path):
    shared = tmp_path / "shared.yaml"
    shared.write_text("baseline:\n  epochs: 2\ndgd:\n  queries: 10\n"
                      "by_dataset:\n  mnist:\n    srr:\n      epsilon: 1\n")
    assert resolve_sections(SECTIONS, preset="quick", config_file=shared)["baseline"].epochs == 2
    for text, where in [("baselines:\n  epochs: 2\n", "'baselines'"),
                        ("by_dataset:\n  mnist:\n    nosection:\n      a: 3\n", "by_dataset.mnist.nosection")]:
        typo = tmp_path / "typo.yaml"
        typo.write_text(text)
        with pytest.raises(ConfigError, match=f"unknown section.*{where}"):
            resolve_sections(SECTIONS, preset="quick", config_file=typo)


@pytest.mark.parametrize("module,cls,key", [
    ("dgd", "StudentConfig", "model"), ("dpdfd", "DPDFDConfig", "student_model"),
    ("pate", "PATEStudentConfig", "model"), ("srr", "SRRConfig", "student_model"),
])
def test_unknown_student_model_is_refused_when_the_config_is_read(module, cls, key):
    import importlib

    section = getattr(importlib.import_module(f"privdistill.methods.{module}"), cls)
    with pytest.raises(ConfigError, match="unknown classifier model 'nosuchnet'; available: .*paper-cnn"):
        build_section(section, {key: "nosuchnet"}, "student")


def test_command_line_text_is_read_by_the_type_of_the_field_it_sets():
    from dataclasses import dataclass
    from typing import Optional

    @dataclass
    class Section:
        variant: Optional[str] = None
        name: str = ""
        flag: bool = False
        count: int = 0
        rate: float = 0.0
        limit: Optional[float] = 1.0

    text = parse_overrides(["s.variant=no", "s.name=1e-3", "s.flag=no", "s.count=3", "s.rate=1e-5", "s.limit=null"])
    built = build_section(Section, text["s"], "s")
    assert built == Section(variant="no", name="1e-3", flag=False, count=3, rate=1e-5, limit=None)
    assert parse_overrides(["s.variant="])["s"]["variant"] == "" and build_section(
        Section, parse_overrides(["s.variant="])["s"], "s").variant is None


def test_typed_overrides_reach_the_sections_as_given():
    from privdistill.config import normalize_overrides

    assert normalize_overrides({"baseline.epochs": 3, "run": {"seed": 1}}) == {"baseline": {"epochs": 3},
                                                                               "run": {"seed": 1}}
    resolved = resolve_sections({"baseline": ClassifierTraining}, preset="quick",
                                overrides={"baseline.model": "small-cnn", "baseline.epochs": 0.5})
    assert resolved["baseline"].model == "small-cnn" and resolved["baseline"].epochs == 0.5


def test_config_reads_a_file_of_ones_own_and_a_name_points_to_the_recipes(tmp_path, monkeypatch):
    """`--config` takes a YAML file; a bare name that is no file (the named configurations it once took, or any
    typo) is refused with a pointer to --recipe and --set, on the command line too."""
    import re

    from typer.testing import CliRunner

    from privdistill.cli import get_app
    from privdistill.cli.options import ConfigFile

    monkeypatch.chdir(tmp_path)
    for name in ("adversarial", "adversarial+staged-prior"):
        with pytest.raises(ConfigError, match=rf"config file {re.escape(name)} does not exist \(--config reads a "
                                              r"YAML file of your own; .* --recipe NAME, listed by `privdistill "
                                              r"recipes METHOD`"):
            resolve_sections(SECTIONS, preset="quick", config_file=name)
    with pytest.raises(ConfigError, match=r"missing.yaml does not exist$"):  # a file's path: no more to say
        resolve_sections(SECTIONS, preset="quick", config_file="missing.yaml")
    result = CliRunner().invoke(get_app(), ["dpsgd", "-d", "mnist", "-e", "1", "--config", "scatternet"])
    assert isinstance(result.exception, ConfigError) and "--recipe NAME" in str(result.exception)  # main() prints it
    assert "--recipe" in ConfigFile.__metadata__[0].help


def test_every_option_of_every_section_counts_in_its_key():
    """A stage's key and a run's config.yaml hold every option of a section, set or not (config.keyed_config):
    none is left out while at its default. An option added later bumps the stage versions (engine/stages.py:
    VERSIONS) and the config.yaml format (engine/run.py: CONFIG_VERSION) instead."""
    import dataclasses

    from privdistill.config import keyed_config
    from privdistill.methods.dgd import DGDMethod
    from privdistill.methods.dpdfd import DPDFDMethod
    from privdistill.methods.dpsgd import DPSGDMethod
    from privdistill.methods.pate import PATEMethod
    from privdistill.methods.runner import Budget
    from privdistill.methods.srr import SRRMethod

    classes = {Budget, RunOptions} | {cls for method in (DGDMethod, DPDFDMethod, DPSGDMethod, PATEMethod, SRRMethod)
                                      for cls in method.sections.values()}
    for cls in classes:
        assert not hasattr(cls, "KEYED_WHEN_SET"), cls.__name__
        retired = set(RETIRED.get(cls.__name__, {}))
        assert set(keyed_config(cls())) == {f.name for f in dataclasses.fields(cls)} | retired, cls.__name__


def test_a_retired_option_keeps_its_place_in_the_key_and_is_refused_at_any_other_value(tmp_path):
    """An option that left the package (config.RETIRED) is still recorded at the value the code always uses, where
    it was (so that runs started before resume and their stages are found); asking for another value is refused."""
    from privdistill.audits.inversion import InversionConfig
    from privdistill.config import keyed_config

    assert list(keyed_config(InversionConfig()))[4:6] == ["l2_weight", "start"]
    assert keyed_config(InversionConfig())["start"] == "blank"
    sections = {"run": RunOptions, "inversion": InversionConfig}
    (tmp_path / "old.yaml").write_text("inversion:\n  start: blank\n")  # the value it had: accepted
    resolve_sections(sections, preset="quick", config_file=tmp_path / "old.yaml", overrides=["inversion.start=blank"])
    with pytest.raises(ConfigError, match="inversion.start is retired: always blank"):
        resolve_sections(sections, preset="quick", overrides=["inversion.start=grey"])


@pytest.mark.parametrize("delta,message", [(0.0, "must lie in"), (1.0, "must lie in"), (1e-30, "below 1e-12")])
def test_a_budget_refuses_a_delta_no_accountant_can_price(delta, message):
    """δ 1e-30 passed validation and failed in the calibration with "no noise multiplier reaches ε" (the PLD's
    tails are truncated near 1e-15, so every ε there reads inf): refused when the budget is read."""
    from privdistill.errors import ConfigError
    from privdistill.methods.runner import Budget

    with pytest.raises(ConfigError, match=message):
        Budget(epsilon=1.0, delta=delta).validate()
    Budget(epsilon=1.0, delta=1e-12).validate()
