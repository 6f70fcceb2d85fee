"""The cached stages methods are composed of: baseline, teachers, generator, synthetic set.

Each returns the trained object and its :class:`Stage` (where it lives, its key, whether it was reused).
Stage keys hash the dataset fingerprint, the stage's configuration, the seed, the precision and the keys
of upstream stages, so any run needing the same stage reuses it (see `engine.cache`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from privdistill.atomic import atomic_write_json, file_sha256
from privdistill.config import ClassifierTraining, keyed_config
from privdistill.data.dataset import DataSplits
from privdistill.engine.cache import Stage, StageCache
from privdistill.engine.context import Env
from privdistill.engine.datafree import GeneratorTraining, class_balance, generate, train_generator, warn_if_collapsed
from privdistill.engine.ensemble import TeacherEnsemble, TeacherTraining, ensemble_accuracy, train_teachers
from privdistill.engine.features import fixed_features
from privdistill.engine.run import RunDir
from privdistill.engine.trainer import evaluate, train_classifier
from privdistill.engine.vae import VAETraining, train_vae
from privdistill.models import create_model

# Laplace scale of the noisy-vote accuracy every teacher stage reports (DGD's 2/ε0; evaluation only).
TEACHER_EVAL_LAPLACE_SCALE = 40.0

# Bump a stage's version when what it computes, or what its key holds, changes: old cache entries are then never
# found (they are rebuilt). A key holds every field of the stage's configuration, set or not (config.keyed_config).
# What each version changed: docs/research-log.md, "Notes that left the code".
VERSIONS = {"baseline": "1", "teachers": "3", "generator": "3", "synthetic": "3", "vae": "1", "features": "2",
            "scatter-prior": "1"}


def file_digest(path: str | Path) -> str:
    """A file's key for the stage cache: the first 16 hex digits of its SHA-256."""
    return file_sha256(path)[:16]


@dataclass
class Stages:
    cache: StageCache
    env: Env
    data: DataSplits
    run: RunDir  # the run using the stages (private stage directory when the cache is disabled)

    def __post_init__(self) -> None:
        self._fingerprint = None

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = self.data.train.fingerprint()
        return self._fingerprint

    def _material(self, cfg, source: dict, **extra) -> dict:
        """A trained stage's key material: what it is trained on (`source`), its configuration, seed, precision."""
        return {**source, "config": keyed_config(cfg), "seed": self.env.seed, "precision": self.env.precision, **extra}

    def _get(self, name: str, material: dict, build) -> Stage:
        return self.cache.get_or_build(name, VERSIONS[name], material, build, private_dir=self.run.path / "stages")

    # ---------------------------------------------------------------------------------------- stages
    def baseline(self, cfg: ClassifierTraining) -> tuple[nn.Module, Stage]:
        """The non-private classifier on all of the private training set."""
        data = self.data

        def build(run: RunDir) -> dict:
            model = create_model(cfg.model, kind="classifier", in_channels=data.channels, num_classes=data.num_classes,
                                 image_size=data.image_size[0])
            result = train_classifier(model, data.train, cfg=cfg, env=self.env, run=run, test=data.test,
                                      description="baseline")
            run.save_weights("model", model)
            run.remove_checkpoint()
            return {"test_accuracy": round(evaluate(model, data.test, self.env), 4),
                    "wall_seconds": round(result.wall_seconds, 1), "steps": result.steps, "device": self.env.describe()}

        stage = self._get("baseline", self._material(cfg, {"data": self.fingerprint}), build)
        model = stage.run.load_weights("model", device=self.env.device)
        return self.env.place(model).eval(), stage

    def teachers(self, cfg: TeacherTraining) -> tuple[TeacherEnsemble, Stage]:
        """n teachers on disjoint partitions of the private training set."""
        def build(run: RunDir) -> dict:
            saved = run.path / "teachers.safetensors"
            stats_file = run.path / "training.json"
            if saved.is_file():  # trained before an interruption during evaluation: not trained twice
                ensemble = TeacherEnsemble.load(saved, self.env.device)
                stats = json.loads(stats_file.read_text()) if stats_file.is_file() else {
                    "num_teachers": ensemble.num_teachers, "wall_seconds": None, "teachers_per_minute": None,
                    "note": "weights kept from an interrupted build; its training time was not recorded"}
            else:
                ensemble, stats = train_teachers(self.data.train, cfg, self.env, checkpoint_dir=run.path)
                ensemble.save(saved)
                atomic_write_json(stats_file, stats)
                for leftover in run.path.glob("teachers-*.pt"):
                    leftover.unlink()
            # plurality and Laplace noisy vote (DGD's b = 2/ε0 = 40) in one pass over the test set
            return {**stats, **ensemble_accuracy(ensemble.to(self.env.device), self.data.test, self.env,
                                                 laplace_scale=TEACHER_EVAL_LAPLACE_SCALE, seed=self.env.seed)}

        stage = self._get("teachers", self._material(cfg, {"data": self.fingerprint}), build)
        return TeacherEnsemble.load(stage.path / "teachers.safetensors", self.env.device), stage

    def generator(self, classifier: nn.Module, classifier_key: str, cfg: GeneratorTraining) -> tuple[nn.Module, Stage]:
        """A data-free generator trained against the fixed `classifier` (identified by `classifier_key`)."""
        channels, size = self.data.channels, self.data.image_size[0]

        def build(run: RunDir) -> dict:
            gen, stats = train_generator(classifier, cfg, self.env, channels=channels, image_size=size, run=run,
                                         num_classes=self.data.num_classes)
            run.save_weights("generator", gen)
            run.remove_checkpoint("generator-checkpoint")
            return {**stats, "class_balance": class_balance(stats["final"], self.data.num_classes),
                    "source": classifier_key}

        material = self._material(cfg, {"classifier": classifier_key}, shape=[channels, size])
        stage = self._get("generator", material, build)
        # checked on every use, so a cached collapsed generator warns again (stages made before the check too)
        warn_if_collapsed(stage.info().get("final", {}), self.data.num_classes, f"generator stage {stage.key}")
        return stage.run.load_weights("generator", device=self.env.device), stage

    def synthetic(self, generator: nn.Module, generator_stage: Stage, n: int) -> tuple[torch.Tensor, Stage]:
        """n synthetic images (uint8) from the generator. No labels are stored with them: labels must come from a
        privacy mechanism (votes, randomized response, noisy gradients), never from this stage."""
        def build(run: RunDir) -> dict:
            save_file({"images": generate(generator, n, self.env)}, str(run.path / "synthetic.safetensors"))
            return {"num_samples": n}

        stage = self._get("synthetic", {"generator": generator_stage.key, "n": n, "seed": self.env.seed}, build)
        return load_file(str(stage.path / "synthetic.safetensors"))["images"], stage

    def teachers_on(self, train, cfg: TeacherTraining) -> tuple[TeacherEnsemble, Stage]:
        """Teachers on another training set than the run's (e.g. the private part when a slice is held out)."""
        def build(run: RunDir) -> dict:
            ensemble, stats = train_teachers(train, cfg, self.env, checkpoint_dir=run.path)
            ensemble.save(run.path / "teachers.safetensors")
            for leftover in run.path.glob("teachers-*.pt"):
                leftover.unlink()
            return {**stats, **ensemble_accuracy(ensemble.to(self.env.device), self.data.test, self.env)}

        stage = self._get("teachers", self._material(cfg, {"data": train.fingerprint()}), build)
        return TeacherEnsemble.load(stage.path / "teachers.safetensors", self.env.device), stage

    def features(self, model: nn.Module, augment: str = "none", copies: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """A fixed feature transform's output (a ScatterNet's `scatter`, named by its `transform_id`) on the train
        and test images: a public per-example function, computed once per dataset (about a minute for MNIST on 2
        cores) and shared by every model with the same transform. With `copies` > 1 the training features are
        [N, copies, ...]: the images as they are, then `augment`ed copies (fixed public streams, one per copy).
        A ScatterNet with a prior gets its projection first (scatter_prior), so the model the caller releases
        carries it whether the features are computed now or read from the cache."""
        if getattr(model, "prior", "none") != "none":
            self.scatter_prior(model)

        def build(run: RunDir) -> dict:
            train = plain = fixed_features(model, self.data.train.images, self.env)  # copy 0: the images as they are
            if copies > 1:  # filled in place: stacking a list of copies would hold them all twice
                train = torch.empty((len(plain), copies, *plain.shape[1:]))
                train[:, 0] = plain
                for k in range(1, copies):
                    train[:, k] = fixed_features(model, self.data.train.images, self.env, augment=augment, stream=k)
            save_file({"train": train,
                       "test": fixed_features(model, self.data.test.images, self.env)},
                      str(run.path / "features.safetensors"))
            return {"transform": model.transform_id, "augment": augment, "copies": copies}

        material = {"data": self.fingerprint, "test": self.data.test.fingerprint(), "transform": model.transform_id,
                    "copies": copies, "augment": augment if copies > 1 else "none"}  # one copy: the images as they are
        stage = self._get("features", material, build)
        saved = load_file(str(stage.path / "features.safetensors"))
        return saved["train"], saved["test"]

    def scatter_prior(self, model: nn.Module) -> None:
        """Fill a ScatterNet's prior projection (models/random_prior.py), cached by its transform: it reads no data
        (dead-leaves images from a public seed), so one stage serves every dataset of the same image shape."""
        def build(run: RunDir) -> dict:
            started = time.perf_counter()
            model.fit_prior()
            save_file({"projection": model.prior_projection.detach().cpu().contiguous()},
                      str(run.path / "projection.safetensors"))
            return {"transform": model.transform_id, "build_seconds": round(time.perf_counter() - started, 1)}

        stage = self._get("scatter-prior", {"transform": model.transform_id}, build)
        with torch.no_grad():
            model.prior_projection.copy_(load_file(str(stage.path / "projection.safetensors"))["projection"])
            model.prior_fitted.fill_(True)

    def vae(self, images: torch.Tensor, images_key: str, cfg: VAETraining) -> tuple[nn.Module, Stage]:
        """A VAE fitted to `images` (synthetic samples, identified by their stage key)."""
        def build(run: RunDir) -> dict:
            model, stats = train_vae(images, cfg, self.env, run=run)
            run.save_weights("vae", model)
            run.remove_checkpoint("vae-checkpoint")
            return stats

        stage = self._get("vae", self._material(cfg, {"images": images_key}), build)
        return stage.run.load_weights("vae", device=self.env.device).eval(), stage

