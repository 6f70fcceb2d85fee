import pytest

from privdistill.config import ClassifierTraining, RunOptions, build_section, parse_overrides, resolve_sections
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


def test_named_overlays_compose_with_plus(tmp_path, monkeypatch):
    """`--config adversarial+staged-prior`: both overlays apply, a later one's keys win, and a part that does not
    exist is named in the error."""
    import pytest

    from privdistill.config import resolve_sections
    from privdistill.engine.datafree import GeneratorTraining
    from privdistill.errors import ConfigError
    from privdistill.methods.srr import SRRConfig

    monkeypatch.chdir(tmp_path)
    sections = {"srr": SRRConfig, "srr_generator": GeneratorTraining}
    both = resolve_sections(sections, preset="quick", dataset="fashion-mnist", config_file="adversarial+staged-prior")
    assert both["srr"].stages == 2 and both["srr"].loss == "likelihood"  # staged-prior
    assert both["srr_generator"].adversarial_weight == 3.0 and both["srr_generator"].class_targets  # adversarial
    (tmp_path / "mine.yaml").write_text("srr:\n  stages: 3\n")
    later = resolve_sections(sections, preset="quick", config_file="staged-prior+mine.yaml")
    assert later["srr"].stages == 3 and later["srr"].loss == "likelihood"
    with pytest.raises(ConfigError, match="nosuch.yaml does not exist"):
        resolve_sections(sections, preset="quick", config_file="staged-prior+nosuch.yaml")


@pytest.mark.parametrize("overlay, dataset, changed", [
    # teachers trained on affine copies at rate 0.005 (digits only)
    ("affine-teachers", "mnist", {"augment": "affine", "lr": 0.005}),
    # closed-form ridge heads on the fixed ScatterNet transform
    ("scatter-teachers", "fashion-mnist", {"model": "scatter-linear", "fit": "ridge", "ridge": 0.01}),
])
def test_teacher_overlays_change_only_the_teachers_training(overlay, dataset, changed):
    """`--config adversarial+<overlay>` (issue 24) sets exactly its teacher fields: every other teacher field (their
    number, partitions, steps) stays the preset's, and the generator stays the adversarial overlay's."""
    from dataclasses import asdict

    from privdistill.config import resolve_sections
    from privdistill.engine.datafree import GeneratorTraining
    from privdistill.engine.ensemble import TeacherTraining

    sections = {"teachers": TeacherTraining, "generator": GeneratorTraining}
    plain = resolve_sections(sections, preset="quick", dataset=dataset, config_file="adversarial")
    both = resolve_sections(sections, preset="quick", dataset=dataset, config_file=f"adversarial+{overlay}")
    assert both["generator"] == plain["generator"]
    assert asdict(both["teachers"]) == {**asdict(plain["teachers"]), **changed}
    assert both["teachers"] != plain["teachers"]


def test_the_histogram_cover_overlay_is_the_recorded_cells_sets():
    """`--config adversarial+affine-teachers+histogram-cover` resolves to exactly the `--set` flags of the recorded
    best DGD+ cells (docs/research-log.md, "Releasing the noisy vote histogram"), and leaves the teachers and the
    generator alone."""
    from privdistill.config import resolve_sections
    from privdistill.engine.datafree import GeneratorTraining
    from privdistill.engine.ensemble import TeacherTraining
    from privdistill.methods.dgd import DGDConfig
    from privdistill.methods.dgd_student import StudentConfig

    sections = {"dgd": DGDConfig, "student": StudentConfig, "teachers": TeacherTraining,
                "generator": GeneratorTraining}
    recorded = {"dgd.query_selection": "diverse", "dgd.num_synthetic": 240000, "dgd.release": "histogram",
                "student.unsupervised": False}
    by_hand = resolve_sections(sections, preset="quick", dataset="mnist", config_file="adversarial+affine-teachers",
                               overrides=recorded)
    named = resolve_sections(sections, preset="quick", dataset="mnist",
                             config_file="adversarial+affine-teachers+histogram-cover")
    assert named == by_hand
    plain = resolve_sections(sections, preset="quick", dataset="mnist", config_file="adversarial+affine-teachers")
    assert named["dgd"] != plain["dgd"] and named["dgd"].release == "histogram"
    assert named["teachers"] == plain["teachers"] and named["generator"] == plain["generator"]


def test_the_config_help_names_every_packaged_overlay():
    from importlib import resources

    from privdistill.cli.options import ConfigFile

    help_text = ConfigFile.__metadata__[0].help
    names = [p.name[:-5] for p in resources.files("privdistill.presets").joinpath("overlays").iterdir()
             if p.name.endswith(".yaml")]
    assert names and all(name in help_text for name in names), names


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
        assert set(keyed_config(cls())) == {f.name for f in dataclasses.fields(cls)}, cls.__name__
