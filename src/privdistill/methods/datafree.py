"""`privdistill generator train --teacher RUN_DIR`: a data-free generator as a standalone workflow.

Trains a generator against a fixed teacher (no private image is read), writes N synthetic samples and a
sample grid, and measures their quality: the teacher's class histogram and confidence on them, and the
real-test-set accuracy of a student trained ONLY on synthetic samples labelled by the teacher. That
student has no privacy guarantee: it is the ceiling that the private methods' students approach.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from privdistill.atomic import atomic_write_json
from privdistill.config import ClassifierTraining, RunOptions, resolve_sections, to_plain
from privdistill.data import ImageDataset, load_data
from privdistill.engine import Env, RunDir, evaluate, record_result, streams, train_classifier
from privdistill.engine.cache import StageCache
from privdistill.engine.datafree import GeneratorTraining, generate
from privdistill.engine.ensemble import TeacherEnsemble
from privdistill.engine.stages import Stages, file_digest
from privdistill.engine.synthesis import CEILING_EPOCHS, synthesis_quality
from privdistill.engine.synthetic import save_grid, teacher_view
from privdistill.engine.trainer import predict_logits
from privdistill.errors import ConfigError, RunError
from privdistill.models import create_model


@dataclass
class GeneratorRequest:
    teacher: str  # a run directory holding model.safetensors (e.g. from `train baseline`)
    preset: str = "quick"
    config_file: str | None = None
    overrides: list[str] | dict | None = None
    run_dir: str | None = None
    resume: bool = False
    record: bool = False
    cache: bool = True
    results_dir: str = "results"
    variant: str | None = None  # names the recorded result (generator-<dataset>-<variant>.json) beside the papers'


def train_generator_workflow(req: GeneratorRequest) -> dict[str, Any]:
    teacher_run = RunDir.existing(req.teacher)
    if not teacher_run.has_weights("model"):
        raise RunError(f"{req.teacher} holds no model.safetensors: give the run directory of a trained classifier")
    teacher_cfg = teacher_run.config()
    dataset = teacher_cfg.get("dataset")
    if not dataset:
        raise RunError(f"{req.teacher}/config.yaml does not say which dataset the teacher was trained on")
    sections = resolve_sections({"run": RunOptions, "generator": GeneratorTraining,
                                 "synthetic_student": ClassifierTraining},
                                preset=req.preset, dataset=dataset, config_file=req.config_file,
                                overrides=req.overrides)
    env = Env.from_options(sections["run"])
    data = load_data(dataset, sections["run"].data_root)
    cfg: GeneratorTraining = sections["generator"]
    n = cfg.num_samples or len(data.train)
    config = {"method": "generator", "dataset": dataset, "preset": req.preset, "teacher": str(req.teacher),
              **to_plain(sections)}
    run = RunDir.open(req.run_dir or f"{sections['run'].runs_dir}/generator-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}",
                      config=config, resume=req.resume)
    started = time.perf_counter()
    stages = Stages(StageCache(enabled=req.cache), env, data, run)

    teacher = env.place(teacher_run.load_weights("model", device=env.device)).eval()
    teacher_key = file_digest(teacher_run.path / "model.safetensors")
    teacher_accuracy = evaluate(teacher, data.test, env)
    generator, gen_stage = stages.generator(teacher, teacher_key, cfg)
    images, syn_stage = stages.synthetic(generator, gen_stage, n)

    view = teacher_view(teacher, images, env, data.num_classes)
    teacher_labels = predict_logits(teacher, images, env).argmax(1)
    quality = synthesis_quality(images[:2000], teacher, env, num_classes=data.num_classes)
    save_grid(images, teacher_labels, run.path / "samples.png", num_classes=data.num_classes)
    run.save_weights("generator", generator)
    from safetensors.torch import save_file

    save_file({"images": images}, str(run.path / "synthetic.safetensors"))

    # The quality check: a student that never sees a real image, labelled by the (non-private) teacher.
    student_cfg: ClassifierTraining = sections["synthetic_student"]
    synthetic = ImageDataset(images, teacher_labels, data.num_classes, name=f"synthetic {dataset}")
    # its own stream: the same student whether the generator was trained in this process or came from the cache
    torch.manual_seed(env.generator(streams.SYNTHESIS_CEILING).initial_seed())
    student = create_model(student_cfg.model, kind="classifier", in_channels=data.channels,
                           num_classes=data.num_classes, image_size=data.image_size[0])
    train_classifier(student, synthetic, cfg=student_cfg, env=env, run=run, test=data.test,
                     checkpoint="student-checkpoint", description="student on synthetic data")
    student_accuracy = evaluate(student, data.test, env)
    run.save_weights("student", student)
    wall = time.perf_counter() - started
    summary = run.write_summary(
        method="generator", dataset=dataset, preset=req.preset, test_accuracy=round(student_accuracy, 4),
        baseline_accuracy=round(teacher_accuracy, 4), epsilon_paper=None, epsilon_strict=None, delta=None,
        privacy="none: generator trained against a non-private teacher, student labelled by that teacher",
        wall_seconds=round(wall, 1), device=env.describe(), loss=cfg.loss, num_samples=n,
        generator_stage=gen_stage.ref(), synthetic_stage=syn_stage.ref(), generator_stats=gen_stage.info(),
        synthetic_quality=view, synthesis_quality={**quality, "ceiling": round(student_accuracy, 4)}, source="teacher",
        **({"variant": req.variant} if req.variant else {}))
    if req.record:
        summary["recorded_as"] = str(record_result(summary, results_dir=req.results_dir))
    return summary


def resolve_source(recorded: str, cache: StageCache, env: Env) -> nn.Module | None:
    """The classifier a cached generator stage was fitted to, from the key its stage recorded: a baseline stage's key
    (SRR's teacher, DGD's baseline) or its weights' digest (`generator train --teacher RUN`), looked up among the
    cached baselines. None if not in the cache."""
    stage = cache.root / f"baseline-{recorded}"
    if (stage / "model.safetensors").is_file():
        return env.place(RunDir(stage).load_weights("model", device=env.device)).eval()
    for path in sorted(cache.root.glob("baseline-*/model.safetensors")):
        if file_digest(path) == recorded:
            return env.place(RunDir(path.parent).load_weights("model", device=env.device)).eval()
    return None


def load_reader(path: str, env: Env) -> Any:
    """A model that reads synthetic samples: a run or stage directory with model.safetensors (a classifier) or
    teachers.safetensors (an ensemble, read by its plurality vote)."""
    directory = Path(path)
    if (directory / "model.safetensors").is_file():
        return env.place(RunDir(directory).load_weights("model", device=env.device)).eval()
    if (directory / "teachers.safetensors").is_file():
        return TeacherEnsemble.load(directory / "teachers.safetensors", env.device)
    raise RunError(f"{path} holds neither model.safetensors nor teachers.safetensors: give the directory of a "
                   "trained classifier (a run or a cached baseline stage) or of a teacher ensemble")


def generator_quality(stage: str, *, dataset: str, source: str | None = None, readers: dict[str, str] | None = None,
                      samples: int = 2000, ceiling: bool = False, ceiling_labels: str = "hard",
                      ceiling_epochs: float | None = None, out: str | None = None,
                      data_root: str | None = None, seed: int = 0) -> dict[str, Any]:
    """The quality of any generator stage (a cache key such as generator-1a2b…, or its directory): class balance
    under the model it was fitted to, agreement of other readers with that model's labels, optionally the
    ceiling, and a sample grid. Evaluation only: non-private models read the samples, no ε is spent."""
    started = time.perf_counter()
    if not ceiling and ceiling_epochs is not None:
        raise ConfigError("--ceiling-epochs shapes the ceiling student: add --ceiling")
    cache = StageCache()
    directory = Path(stage) if Path(stage).is_dir() else cache.root / stage
    if not directory.is_dir() and (cache.root / f"generator-{stage}").is_dir():  # the bare key a summary shows
        directory = cache.root / f"generator-{stage}"
    if not (directory / "generator.safetensors").is_file():
        raise RunError(f"{stage}: no generator stage there (give a key from `privdistill cache ls` or a directory "
                       "holding generator.safetensors)")
    run = RunDir(directory)
    recorded = (run.config() or {}).get("classifier", "")
    env = Env.from_options(RunOptions(seed=seed, precision="fp32", progress=False))
    data = load_data(dataset, data_root)
    fitted_to = load_reader(source, env) if source else resolve_source(recorded, cache, env)
    if fitted_to is None:
        raise RunError(f"the model {directory.name} was fitted to ({recorded or 'not recorded'}) is not in the "
                       f"stage cache {cache.root}: pass --source with its directory")
    generator = run.load_weights("generator", device=env.device).eval()
    images = generate(generator, samples, env)
    if tuple(images.shape[1:]) != (data.channels, *data.image_size):
        raise RunError(f"the generator makes {tuple(images.shape[1:])} images but {dataset} has "
                       f"{(data.channels, *data.image_size)}: give the dataset the generator was trained for")
    quality = synthesis_quality(images, fitted_to, env, num_classes=data.num_classes,
                                readers={name: load_reader(p, env) for name, p in (readers or {}).items()},
                                ceiling_test=data.test if ceiling else None, ceiling_labels=ceiling_labels,
                                ceiling_epochs=CEILING_EPOCHS if ceiling_epochs is None else ceiling_epochs)
    target = Path(out or f"generator-quality-{directory.name}")
    grid = save_grid(images, predict_logits(fitted_to, images, env).argmax(1), target / "samples.png",
                     num_classes=data.num_classes)
    report = {"stage": directory.name, "fitted_to": source or recorded, "dataset": dataset, "seed": seed,
              "device": env.describe(), "wall_seconds": round(time.perf_counter() - started, 1),
              **quality, "grid": str(grid),
              "note": "evaluation only: non-private models read the samples (and the real test set for the "
                      "ceiling); not covered by any epsilon"}
    atomic_write_json(target / "quality.json", report)
    return report
