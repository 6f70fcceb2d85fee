"""Supervised classifier training and evaluation, resumable step by step.

Everything random in a step is derived from (seed, epoch) or (seed, step) (see `Env.generator`), so a run
killed at any point and resumed from its last checkpoint replays exactly the same batches, augmentations
and updates as an uninterrupted run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.config import ClassifierTraining
from privdistill.data.dataset import ImageDataset, to_float
from privdistill.engine import streams
from privdistill.engine.augment import augment_batch
from privdistill.engine.context import Env
from privdistill.engine.loop import TrainingLoop
from privdistill.engine.optim import make_optimizer, make_schedule  # srr.py still imports make_schedule from here
from privdistill.engine.run import RunDir
from privdistill.errors import ConfigError


@dataclass
class TrainResult:
    test_accuracy: float | None
    steps: int
    wall_seconds: float
    history: list[dict] = field(default_factory=list)


def total_steps(cfg: ClassifierTraining, n: int) -> int:
    if cfg.steps > 0:
        return cfg.steps
    return max(1, math.ceil(cfg.epochs * max(1, n // cfg.batch_size)))


def batch_indices(n: int, batch_size: int, step: int, env: Env) -> torch.Tensor:
    """Indices of batch `step`: epochs are seeded permutations, so any step can be recomputed alone."""
    per_epoch = max(1, n // batch_size)  # drop the last partial batch: every step sees a full batch
    epoch, pos = divmod(step, per_epoch)
    perm = torch.randperm(n, generator=env.generator(streams.TRAINER_EPOCH, epoch))
    return perm[pos * batch_size: (pos + 1) * batch_size] if n >= batch_size else perm


@torch.no_grad()
def predict_logits(model: nn.Module, images: torch.Tensor, env: Env, batch_size: int = 1000) -> torch.Tensor:
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, len(images), batch_size):
        x = env.place_batch(to_float(images[start:start + batch_size]))
        with env.autocast():
            out.append(model(x).float().cpu())
    model.train(was_training)
    return torch.cat(out) if out else torch.empty(0)


def accuracy(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, env: Env, batch_size: int = 1000) -> float:
    """Top-1 accuracy of `model` on `inputs` (images, or any tensor the model reads, e.g. fixed features)."""
    if len(inputs) == 0:
        return float("nan")
    logits = predict_logits(model, inputs, env, batch_size)
    return float((logits.argmax(1) == labels).float().mean())


def evaluate(model: nn.Module, data: ImageDataset, env: Env, batch_size: int = 1000) -> float:
    """Top-1 accuracy on `data`."""
    return accuracy(model, data.images, data.labels, env, batch_size)


def train_classifier(model: nn.Module, train: ImageDataset, *, cfg: ClassifierTraining, env: Env,
                     run: RunDir | None = None, test: ImageDataset | None = None, checkpoint: str = "checkpoint",
                     description: str = "train", soft_targets: torch.Tensor | None = None) -> TrainResult:
    """Train `model` on `train` (in place). With a run directory, checkpoints atomically every
    `cfg.checkpoint_every` steps and resumes from the last checkpoint if one exists. `soft_targets` [N, classes]
    (class probabilities, e.g. a teacher's softmax) replace the integer labels in the loss: cross-entropy to a
    distribution, i.e. distillation of the whole answer instead of its argmax."""
    if soft_targets is not None and tuple(soft_targets.shape) != (len(train), train.num_classes):
        raise ConfigError(f"soft_targets must be [{len(train)}, {train.num_classes}], got {tuple(soft_targets.shape)}")
    model = env.place(model).train()
    optimizer = make_optimizer(model.parameters(), cfg.optimizer, lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay)
    steps = total_steps(cfg, len(train))
    per_epoch = max(1, len(train) // cfg.batch_size)
    loop = TrainingLoop(steps=steps, env=env, run=run, checkpoint=checkpoint, title=description,
                        log_stage=description, modules={"model": model}, optimizers={"model": optimizer},
                        schedules={"model": make_schedule(optimizer, cfg.lr_schedule, steps)},
                        eval_every=max(1, int(round(cfg.eval_every_epochs * per_epoch))),
                        checkpoint_every=cfg.checkpoint_every, save_rng=True,
                        entry_fields=lambda done: {"epoch": round(done / per_epoch, 3)},
                        evaluate=(lambda: {"test_accuracy": evaluate(model, test, env)}) if test is not None else None)
    for step in loop:
        idx = batch_indices(len(train), cfg.batch_size, step, env)
        x, y = train.batch(idx)
        if soft_targets is not None:
            y = soft_targets[idx]
        x = augment_batch(x, cfg.augment, env.generator(streams.TRAINER_AUGMENT, step))
        x, y = env.place_batch(x), y.to(env.device)
        with env.autocast():
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y, label_smoothing=cfg.label_smoothing)
        loop.update(loss, {"train_loss": float(loss.detach())})
    result = loop.finish()
    final = result.history[-1].get("test_accuracy") if result.history else None
    return TrainResult(test_accuracy=final, steps=steps, wall_seconds=result.wall_seconds, history=result.history)
