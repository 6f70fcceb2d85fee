"""Issue 24: data-free generators beyond the papers' losses (class targets, the student in the loop) and what their
samples are worth (quality measures), on fabricated data and on cases whose answer is known."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from privdistill.data import ImageDataset, load_data
from privdistill.engine import Env
from privdistill.engine.cache import StageCache
from privdistill.engine.datafree import GeneratorTraining, train_generator
from privdistill.engine.loop import TrainingLoop
from privdistill.engine.run import RunDir
from privdistill.engine.stages import Stages
from privdistill.engine.synthesis import label_balance, synthesis_quality
from privdistill.errors import ConfigError
from privdistill.models import create_model


class Fixed(nn.Module):
    """A classifier whose logits are a fixed function of the image mean: class = which of K bins it falls in."""

    def __init__(self, k: int = 4, shift: float = 0.0):
        super().__init__()
        self.k, self.shift = k, shift
        self.scale = nn.Parameter(torch.tensor(20.0))

    def features(self, x):
        return x.float().flatten(1).mean(1, keepdim=True)  # in [-1, 1]

    def classifier(self, m):
        centres = torch.linspace(-0.75, 0.75, self.k, device=m.device)[None]
        return -self.scale * (m + self.shift - centres).abs()

    def forward(self, x):
        return self.classifier(self.features(x))


def test_label_balance_and_quality_on_known_answers():
    env = Env.cpu()
    assert label_balance(torch.tensor([0, 1, 2, 3]), 4) == pytest.approx(1.0)
    assert label_balance(torch.tensor([2, 2, 2, 2]), 4) == pytest.approx(0.0, abs=1e-9)
    # images whose mean falls in each of the 4 bins of `Fixed`, 25 each
    levels = torch.tensor([-0.75, -0.25, 0.25, 0.75]).repeat_interleave(25)
    images = ((levels[:, None, None, None].expand(100, 1, 4, 4) + 1) * 127.5).round().to(torch.uint8)
    source = Fixed()
    same, shifted = Fixed(), Fixed(shift=0.5)  # shifted reads bins 0, 1 as 1, 2 and bins 2, 3 as 3
    q = synthesis_quality(images, source, env, num_classes=4, readers={"same": same, "shifted": shifted})
    assert q["class_counts"] == [25, 25, 25, 25] and q["class_balance"] == pytest.approx(1.0)
    assert q["agreement_with_same"] == 1.0 and q["agreement_with_shifted"] == pytest.approx(0.25)


def test_soft_targets_teach_the_whole_answer():
    """train_classifier(soft_targets=...): one-hot targets train exactly as the integer labels do; a fixed
    distribution is learned as that distribution (hard labels make the model sure of the argmax); a wrong shape
    is refused. The soft ceiling of synthesis_quality records which labels its student read."""
    from privdistill.config import ClassifierTraining
    from privdistill.engine.trainer import train_classifier

    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (64, 1, 4, 4), generator=g, dtype=torch.uint8)
    data = ImageDataset(images, torch.zeros(64, dtype=torch.long), 3, name="tiny")
    cfg = ClassifierTraining(model="small-cnn", epochs=20, batch_size=16, lr=0.05, lr_schedule="constant",
                             eval_every_epochs=1e9)

    def trained(soft):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
        train_classifier(model, data, cfg=cfg, env=Env.cpu(), soft_targets=soft)
        return model

    one_hot = F.one_hot(data.labels, 3).float()
    assert torch.allclose(trained(None)[1].weight, trained(one_hot)[1].weight, atol=1e-6)
    target = torch.tensor([0.6, 0.3, 0.1])
    x = images.float() / 127.5 - 1
    soft_model, hard_model = trained(target.expand(64, 3).clone()), trained(None)
    with torch.no_grad():
        soft_answer, hard_answer = (m(x).softmax(1).mean(0) for m in (soft_model, hard_model))
    assert torch.allclose(soft_answer, target, atol=0.05) and hard_answer[0] > 0.95
    with pytest.raises(ConfigError, match="soft_targets"):
        trained(torch.ones(64, 4) / 4)

    levels = torch.tensor([-0.75, -0.25, 0.25, 0.75]).repeat_interleave(25)
    bins = ((levels[:, None, None, None].expand(100, 1, 4, 4) + 1) * 127.5).round().to(torch.uint8)
    test = ImageDataset(bins, torch.arange(4).repeat_interleave(25), 4, name="test")
    q = synthesis_quality(bins, Fixed(), Env.cpu(), num_classes=4, ceiling_test=test, ceiling_epochs=1,
                          ceiling_model="small-cnn", ceiling_labels="soft")
    assert q["ceiling_training"]["labels"] == "soft" and 0 <= q["ceiling"] <= 1
    with pytest.raises(ConfigError, match="hard or soft"):
        synthesis_quality(bins, Fixed(), Env.cpu(), num_classes=4, ceiling_test=test, ceiling_labels="logits")


def test_generator_quality_command_reads_any_generator_stage(tiny_npz, tmp_path, monkeypatch):
    """`privdistill generator quality STAGE` finds the baseline a cached stage was fitted to, and measures class
    balance, another reader's agreement and a grid; a stage whose source is gone asks for --source."""
    import shutil

    from typer.testing import CliRunner

    from privdistill.cli import get_app
    from privdistill.config import ClassifierTraining

    monkeypatch.setenv("PRIVDISTILL_CACHE", str(tmp_path / "cache"))
    data = load_data(f"npz:{tiny_npz}")
    stages = Stages(StageCache(tmp_path / "cache"), Env.cpu(), data, RunDir.open(tmp_path / "run", config={}))
    baseline, baseline_stage = stages.baseline(ClassifierTraining(model="small-cnn", steps=5, batch_size=16))
    _, stage = stages.generator(baseline, baseline_stage.key,
                                GeneratorTraining(loss="dgd", rounds=1, steps_per_round=2, batch_size=16, width=16))
    out = tmp_path / "quality"
    result = CliRunner().invoke(get_app(), ["generator", "quality", f"generator-{stage.key}", "-d", f"npz:{tiny_npz}",
                                      "--samples", "40", "--reader", f"again={baseline_stage.path}", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "quality.json").read_text())
    # another seed draws other samples and trains another ceiling student
    other = CliRunner().invoke(get_app(), ["generator", "quality", f"generator-{stage.key}", "-d", f"npz:{tiny_npz}",
                                     "--samples", "40", "--seed", "1", "--out", str(tmp_path / "other"),
                                     "--ceiling", "--ceiling-epochs", "0.5"])
    assert other.exit_code == 0, other.output
    reseeded = json.loads((tmp_path / "other" / "quality.json").read_text())
    assert reseeded["ceiling_training"] == {"model": "paper-cnn", "epochs": 0.5, "labels": "hard"}
    assert 0 <= reseeded["ceiling"] <= 1 and "ceiling" not in report
    alone = CliRunner().invoke(get_app(), ["generator", "quality", f"generator-{stage.key}", "-d", f"npz:{tiny_npz}",
                                     "--ceiling-epochs", "2"])
    assert alone.exit_code != 0 and "add --ceiling" in str(alone.exception)
    assert (report["seed"], reseeded["seed"]) == (0, 1)
    assert report["samples"] == 40 and sum(report["class_counts"]) == 40 and 0 <= report["class_balance"] <= 1
    assert report["agreement_with_again"] == 1.0, "the baseline read again gives its own labels"
    assert (out / "samples.png").is_file()
    assert report["fitted_to"] == baseline_stage.key and "not covered by any epsilon" in report["note"]
    shutil.rmtree(baseline_stage.path)
    # the bare key (as a summary's `stages` shows it) finds the stage too
    result = CliRunner().invoke(get_app(), ["generator", "quality", stage.key, "-d", f"npz:{tiny_npz}"])
    assert result.exit_code != 0 and "--source" in str(result.exception)
    result = CliRunner().invoke(get_app(), ["generator", "quality", "generator-nosuchkey", "-d", f"npz:{tiny_npz}"])
    assert result.exit_code != 0 and "no generator stage" in str(result.exception)


def test_privacy_reports_name_what_the_generator_was_fitted_to_as_uncovered():
    """The model a generator is fitted to read the private data without noise: DGD's and SRR's reports put it on the
    uncovered pathways, never on a covered one."""
    from privdistill.methods.dgd_plan import dgd_pathways
    from privdistill.methods.srr_plan import srr_pathways

    fitted_to = "non-private baseline classifier"
    for pathways in (dgd_pathways(fitted_to=fitted_to), srr_pathways(fitted_to=fitted_to)):
        uncovered = [p.via for p in pathways["student"] + pathways["generator"] if not p.covered]
        assert uncovered and all(fitted_to in via for via in uncovered if "generator" in via)
        assert all(fitted_to not in p.via for p in pathways["student"] if p.covered)


def test_class_targets_make_a_generator_draw_the_class_it_is_asked_for():
    """generator.class_targets: a conditional generator whose one-hot term aims at the class each input asks
    for; after training, the source reads most samples as their target (chance: 1/4)."""
    from privdistill.engine.datafree import generate

    env = Env.cpu(seed=0)
    source = Fixed()
    cfg = GeneratorTraining(loss="dgd", alpha=0.0, beta=0.0, rounds=4, steps_per_round=25, batch_size=32,
                            width=16, latent_dim=8, lr=0.01, lr_decay=1.0, class_targets=True)
    with pytest.raises(ConfigError, match="class_targets"):
        train_generator(source, cfg, env, channels=1, image_size=8)
    generator, stats = train_generator(source, cfg, env, channels=1, image_size=8, num_classes=4)
    assert generator.num_classes == 4 and generator.latent_dim == 12
    targets = torch.arange(4).repeat(50)
    z = generator.sample_latent(200, generator=torch.Generator().manual_seed(3), labels=targets)
    assert torch.equal(generator.latent_labels(z), targets)
    images = generate(generator, 200, env, latents=z)
    read = source(images.float() / 127.5 - 1).argmax(1)
    assert float((read == targets).float().mean()) > 0.6, "samples are read as the class they were made for"


def test_teacher_augmentation_is_per_teacher_and_counts_in_the_stage_key(tiny_npz):
    """teachers.augment: the loop and vectorised trainers augment each teacher's batches alike (its own stream), the
    augmentation changes what is learnt, and the teachers' stage key holds it, set or not."""
    from privdistill.config import keyed_config
    from privdistill.engine.ensemble import TeacherTraining, train_teachers

    data = load_data(f"npz:{tiny_npz}")
    env = Env.cpu(seed=0)
    base = dict(num_teachers=2, model="small-cnn", steps=4, batch_size=8, lr=0.01)
    plain, _ = train_teachers(data.train, TeacherTraining(**base, trainer="loop"), env)
    shifted = {t: train_teachers(data.train, TeacherTraining(**base, trainer=t, augment="shift"), env)[0]
               for t in ("loop", "vectorized")}
    x = data.test.images[:20].float() / 127.5 - 1
    loop_out, vec_out = (shifted[t].member(1).eval()(x) for t in ("loop", "vectorized"))
    assert torch.allclose(loop_out, vec_out, atol=1e-4), "the same augmented batches in both trainers"
    assert not torch.allclose(plain.member(1).eval()(x), loop_out, atol=1e-4)
    assert keyed_config(TeacherTraining(**base))["augment"] == "none"
    assert keyed_config(TeacherTraining(**base, augment="shift"))["augment"] == "shift"
    with pytest.raises(ConfigError, match="augment"):
        TeacherTraining(augment="rotate").validate()


def test_a_run_started_before_every_option_was_recorded_is_refused_with_its_reason(tmp_path):
    """config.yaml records every option, set or not (format 2). A run an earlier version wrote (no config_version:
    options added later were left out while unset) is not resumed as if its configuration differed: the refusal
    says which version wrote it and what to do. Where the recorded configuration is the same (a stage's build
    directory, whose key holds its configuration) it resumes."""
    import yaml

    from privdistill.config import keyed_config
    from privdistill.engine.run import CONFIG_VERSION
    from privdistill.errors import RunError

    new = keyed_config(GeneratorTraining())
    assert new["class_targets"] is False and new["adversarial_weight"] == 0.0
    old = {k: v for k, v in new.items() if k not in ("class_targets", "adversarial_weight")}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"command": "privdistill dgd", "config": {"generator": old}}))
    (run_dir / "metrics.jsonl").write_text("{}\n")  # not abandoned: it had begun training
    with pytest.raises(RunError, match=rf"another version of privdistill.*format 1; this one writes {CONFIG_VERSION}"):
        RunDir.open(run_dir, config={"generator": new}, resume=True)
    assert RunDir.open(run_dir, config={"generator": old}, resume=True).config() == {"generator": old}

    fresh = tmp_path / "fresh"
    RunDir.open(fresh, config={"generator": new}).log(step=1)
    assert yaml.safe_load((fresh / "config.yaml").read_text())["config_version"] == CONFIG_VERSION
    RunDir.open(fresh, config={"generator": keyed_config(GeneratorTraining())}, resume=True)
    with pytest.raises(RunError, match="differs in generator.class_targets"):
        RunDir.open(fresh, config={"generator": keyed_config(GeneratorTraining(class_targets=True))}, resume=True)


def test_adversarial_student_disagreement_and_training(tmp_path, monkeypatch):
    """generator.adversarial_weight (DFAD): the disagreement is 0 for equal predictions and 2 for opposite sure
    ones, its gradient reaches the images; in a generator run the student in the loop learns the source (its
    imitation loss falls) and the run resumes to the same generator."""
    from privdistill.engine.datafree import disagreement, distillation_loss

    sure = torch.tensor([[20.0, -20.0], [-20.0, 20.0]])
    assert float(disagreement(sure, sure)) == pytest.approx(0.0, abs=1e-6)
    assert float(disagreement(sure, sure.flip(1))) == pytest.approx(2.0, abs=1e-6)
    assert float(distillation_loss(sure, sure)) == pytest.approx(0.0, abs=1e-6)
    x = torch.rand(8, 1, 8, 8, requires_grad=True)
    student = create_model("paper-cnn", kind="classifier", in_channels=1, num_classes=4, image_size=8)
    disagreement(Fixed()(x), student(x)).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0

    base = dict(loss="dgd", rounds=6, steps_per_round=10, batch_size=32, width=16, latent_dim=8, lr=0.01,
                lr_decay=1.0, adversarial_weight=1.0)
    with pytest.raises(ConfigError, match="adversarial"):
        train_generator(Fixed(), GeneratorTraining(**base), Env.cpu(), channels=1, image_size=8)
    cfg = GeneratorTraining(**base, checkpoint_every=10)
    reference_run = RunDir(tmp_path / "reference")
    reference_run.path.mkdir()
    reference, _ = train_generator(Fixed(), cfg, Env.cpu(seed=0), channels=1, image_size=8, num_classes=4,
                                   run=reference_run)
    history = [json.loads(line) for line in (reference_run.path / "metrics.jsonl").read_text().splitlines()]
    imitation = [h["imitation"] for h in history if "imitation" in h]
    assert len(imitation) == 6 and all(math.isfinite(h["disagreement"]) for h in history if "disagreement" in h)
    assert imitation[-1] < 0.5 * imitation[0], "the student in the loop learns the source's answers"

    real_record = TrainingLoop.record

    def crash(self, parts, **kw):  # killed at step 25, after the step-20 checkpoint
        if self.step == 25:
            raise KeyboardInterrupt("simulated crash")
        return real_record(self, parts, **kw)

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    monkeypatch.setattr(TrainingLoop, "record", crash)
    with pytest.raises(KeyboardInterrupt):
        train_generator(Fixed(), cfg, Env.cpu(seed=0), channels=1, image_size=8, num_classes=4, run=run)
    monkeypatch.setattr(TrainingLoop, "record", real_record)
    resumed, _ = train_generator(Fixed(), cfg, Env.cpu(seed=0), channels=1, image_size=8, num_classes=4, run=run)
    for a, b in zip(reference.state_dict().values(), resumed.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), atol=1e-6), "resume ends with the uninterrupted generator"
    with pytest.raises(ConfigError, match="adversarial_weight"):
        GeneratorTraining(adversarial_weight=-1.0).validate()


def test_the_adversarial_generator_runs_srr_end_to_end(tiny_npz, tmp_path, monkeypatch):
    """The adversarial generator (recipes/__init__.py: ADVERSARIAL_GENERATOR) is DGD's default recipe's, with a BN
    baseline, and SRR's end-to-end recipe's (BN statistics, class targets, the student in the loop), and an SRR run
    with it trains that generator: its stage logs the disagreement and the student's imitation loss."""
    import json

    from privdistill.config import ClassifierTraining, resolve_sections
    from privdistill.methods.common import RunRequest
    from privdistill.methods.srr import run_srr
    from privdistill.recipes import ADVERSARIAL_GENERATOR, recipe_layers

    for dataset in ("mnist", "fashion-mnist"):
        dgd = resolve_sections({"baseline": ClassifierTraining, "generator": GeneratorTraining}, preset="quick",
                               dataset=dataset, recipe=recipe_layers("dgd", "default", dataset, 9.34))
        srr = resolve_sections({"srr_generator": GeneratorTraining}, preset="quick", dataset=dataset,
                               recipe=recipe_layers("srr", "end-to-end", dataset, 1.0))
        assert dgd["baseline"].model == "paper-cnn-bn"
        # DGD's Fashion-MNIST default fits its pool by BatchNorm statistics alone (recipes/dgd.py, test_recipes)
        for cfg in ([dgd["generator"]] if dataset == "mnist" else []) + [srr["srr_generator"]]:
            cfg.validate()
            assert cfg.loss == "srr" and cfg.class_targets and cfg.adversarial_weight > 0 and cfg.total_steps == 1200

    monkeypatch.setenv("PRIVDISTILL_CACHE", str(tmp_path / "cache"))
    adversarial = [f"srr_generator.{key}={value}" for key, value in ADVERSARIAL_GENERATOR.items()]
    run_srr(RunRequest(dataset=f"npz:{tiny_npz}", run_dir=str(tmp_path / "srr"), overrides=adversarial + [
                                  "run.precision=fp32", "run.progress=false", "run.threads=1", "run.plan_check=warn",
                                  "srr_teacher.steps=10", "srr_teacher.batch_size=32", "srr_generator.rounds=2",
                                  "srr_generator.steps_per_round=3", "srr_generator.batch_size=16",
                                  "srr_generator.width=16", "srr.stages=2", "srr.num_samples=40", "srr.batch_size=16",
                                  "srr.epochs_per_stage=1", "srr.finetune_steps=1", "budget.epsilon=2",
                                  "budget.accounting=paper"]))
    [stage] = list((tmp_path / "cache").glob("generator-*"))
    logged = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    assert [entry["step"] for entry in logged] == [3, 6]
    assert all(math.isfinite(entry["disagreement"]) and math.isfinite(entry["imitation"]) for entry in logged)


def test_generator_train_records_an_engine_variant_beside_the_papers_row(tiny_npz, tmp_path, monkeypatch):
    """`privdistill generator train --config adversarial.yaml --variant adversarial --record` (a config file of
    one's own: the adversarial generator) writes its own result file (generator-<dataset>-adversarial.json) instead
    of replacing the papers' generator row, and the generator table names the variant; the stage's log holds the
    student-in-the-loop terms."""
    import yaml
    from typer.testing import CliRunner

    from privdistill.bench.report import generator_table
    from privdistill.cli import get_app
    from privdistill.recipes import ADVERSARIAL_GENERATOR

    monkeypatch.chdir(tmp_path)
    (tmp_path / "adversarial.yaml").write_text(yaml.safe_dump({"generator": ADVERSARIAL_GENERATOR}))
    monkeypatch.setenv("PRIVDISTILL_CACHE", str(tmp_path / "cache"))
    runner, fast = CliRunner(), ["--precision", "fp32", "--no-progress"]
    result = runner.invoke(get_app(), ["train", "baseline", "-d", f"npz:{tiny_npz}", "--run-dir", "teacher", *fast,
                                       "--set", "baseline.model=paper-cnn-bn", "--set", "baseline.epochs=2",
                                       "--set", "baseline.batch_size=32"])
    assert result.exit_code == 0, result.output
    small = ["generator.rounds=2", "generator.steps_per_round=3", "generator.batch_size=16", "generator.width=16",
             "generator.num_samples=64", "synthetic_student.epochs=1"]
    result = runner.invoke(get_app(), ["generator", "train", "--teacher", "teacher", "--config", "adversarial.yaml",
                                       "--variant", "adversarial", "--record", "--run-dir", "gen", *fast,
                                       *[arg for item in small for arg in ("--set", item)]])
    assert result.exit_code == 0, result.output
    recorded = json.loads((tmp_path / "results" / "quick" / "generator-npz-tiny-adversarial.json").read_text())
    assert recorded["variant"] == "adversarial" and recorded["loss"] == "srr"
    assert math.isfinite(recorded["generator_stats"]["final"]["disagreement"])
    recorded["_file"] = "results/quick/generator-npz-tiny-adversarial.json"
    assert "| srr (adversarial) |" in generator_table([recorded])
    # again: the generator and its samples come from the cache, and the student trained on them is the same
    sets = [arg for item in small for arg in ("--set", item)]
    result = runner.invoke(get_app(), ["generator", "train", "--teacher", "teacher", "--config", "adversarial.yaml",
                                       "--run-dir", "gen-again", *fast, *sets])
    assert result.exit_code == 0, result.output
    again = json.loads((tmp_path / "gen-again" / "summary.json").read_text())
    assert again["generator_stage"]["reused"] and again["test_accuracy"] == recorded["test_accuracy"]
    first, second = (RunDir.existing(tmp_path / name).load_weights("student") for name in ("gen", "gen-again"))
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))


def test_a_generator_fitted_to_a_baseline_stage_finds_it_by_its_key(tmp_path):
    """SRR's and DGD's generator stages record the baseline stage's key (a `generator train` stage, the weights'
    digest): `generator quality` finds the source either way."""
    from privdistill.engine.stages import file_digest
    from privdistill.methods.datafree import resolve_source

    cache = StageCache(tmp_path / "cache")
    stage = RunDir(cache.root / "baseline-0123456789abcdef")
    stage.path.mkdir(parents=True)
    model = create_model("small-cnn", kind="classifier", in_channels=1, num_classes=4, image_size=8)
    stage.save_weights("model", model)
    env = Env.cpu()
    by_key = resolve_source("0123456789abcdef", cache, env)
    by_digest = resolve_source(file_digest(stage.path / "model.safetensors"), cache, env)
    x = torch.rand(2, 1, 8, 8)
    assert by_key is not None and by_digest is not None and torch.equal(by_key(x), by_digest(x))
    assert resolve_source("fedcba9876543210", cache, env) is None
