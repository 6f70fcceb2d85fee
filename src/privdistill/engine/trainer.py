"""Supervised classifier training and evaluation, resumable step by step.

Everything random in a step is derived from (seed, epoch) or (seed, step) (see `Env.generator`), so a run
killed at any point and resumed from its last checkpoint replays exactly the same batches, augmentations
and updates as an uninterrupted run.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.config import ClassifierTraining
from privdistill.data.dataset import ImageDataset, to_float
from privdistill.engine import streams
from privdistill.engine.augment import augment_batch
from privdistill.engine.context import Env
from privdistill.engine.progress import progress_bar
from privdistill.engine.run import RunDir


@dataclass
class TrainResult:
    test_accuracy: float | None
    steps: int
    wall_seconds: float
    history: list[dict] = field(default_factory=list)


def make_optimizer(model: nn.Module, cfg: ClassifierTraining) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def make_schedule(optimizer: torch.optim.Optimizer, kind: str, total_steps: int):
    """The papers' schedule is linear decay to 0 over all iterations."""
    if kind == "linear":
        factor = lambda step: max(0.0, 1.0 - step / max(1, total_steps))  # noqa: E731
    elif kind == "cosine":
        factor = lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, total_steps) / max(1, total_steps)))  # noqa: E731
    else:
        factor = lambda step: 1.0  # noqa: E731
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


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


def evaluate(model: nn.Module, data: ImageDataset, env: Env, batch_size: int = 1000) -> float:
    """Top-1 accuracy on `data`."""
    if len(data) == 0:
        return float("nan")
    logits = predict_logits(model, data.images, env, batch_size)
    return float((logits.argmax(1) == data.labels).float().mean())


def train_classifier(model: nn.Module, train: ImageDataset, *, cfg: ClassifierTraining, env: Env,
                     run: RunDir | None = None, test: ImageDataset | None = None, checkpoint: str = "checkpoint",
                     description: str = "train", log_prefix: str = "") -> TrainResult:
    """Train `model` on `train` (in place). With a run directory, checkpoints atomically every
    `cfg.checkpoint_every` steps and resumes from the last checkpoint if one exists."""
    model = env.place(model)
    model.train()
    optimizer = make_optimizer(model, cfg)
    steps = total_steps(cfg, len(train))
    schedule = make_schedule(optimizer, cfg.lr_schedule, steps)
    per_epoch = max(1, len(train) // cfg.batch_size)
    eval_every = max(1, int(round(cfg.eval_every_epochs * per_epoch)))

    start_step, elapsed, history = 0, 0.0, []
    state = run.load_checkpoint(checkpoint) if run is not None else None
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        start_step, elapsed, history = state["step"], state["elapsed"], state["history"]
        torch.set_rng_state(state["torch_rng"])

    def save(step: int) -> None:
        if run is None:
            return
        run.save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "schedule": schedule.state_dict(), "step": step,
                             "elapsed": elapsed + time.perf_counter() - t0, "history": history,
                             "torch_rng": torch.get_rng_state()}, checkpoint)

    t0 = time.perf_counter()
    running_loss = 0.0
    with progress_bar(steps, description, enabled=env.progress, completed=start_step) as bar:
        for step in range(start_step, steps):
            idx = batch_indices(len(train), cfg.batch_size, step, env)
            x, y = train.batch(idx)
            x = augment_batch(x, cfg.augment, env.generator(streams.TRAINER_AUGMENT, step))
            x, y = env.place_batch(x), y.to(env.device)
            with env.autocast():
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y, label_smoothing=cfg.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            running_loss += float(loss.detach())
            done = step + 1
            if done % eval_every == 0 or done == steps:
                entry = {"step": done, "epoch": round(done / per_epoch, 3),
                         "train_loss": running_loss / max(1, done % eval_every or eval_every)}
                running_loss = 0.0
                if test is not None:
                    entry["test_accuracy"] = evaluate(model, test, env)
                history.append(entry)
                if run is not None:
                    run.log(stage=log_prefix or description, **entry)
            if done % cfg.checkpoint_every == 0 and done < steps:
                save(done)
            bar.advance(1, loss=float(loss.detach()), acc=history[-1].get("test_accuracy") if history else None)
    wall = elapsed + time.perf_counter() - t0
    final = history[-1].get("test_accuracy") if history else None
    if run is not None:
        save(steps)
    return TrainResult(test_accuracy=final, steps=steps, wall_seconds=wall, history=history)
