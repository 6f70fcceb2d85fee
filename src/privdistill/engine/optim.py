"""Optimisers and learning-rate schedules: the one place every training loop gets them from.

    optimizer = make_optimizer(model.parameters(), "adam", lr=1e-3, weight_decay=0.0)
    schedule = make_schedule(optimizer, "linear", total_steps)   # a torch LambdaLR: step() after each update

Schedules are LambdaLRs over `lr_factor`, so their state travels in checkpoints and a resumed loop continues the same
curve; `set_lr` uses the same factor. DAFL's step decay (× 0.1 every 80 rounds) is `make_step_schedule`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from privdistill.errors import ConfigError

OPTIMIZERS = ("adam", "sgd")
SCHEDULES = ("constant", "linear", "cosine")


def make_optimizer(params: Iterable, name: str, *, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                   betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.Optimizer:
    """Adam (with `betas`) or SGD with momentum; `weight_decay` is L2 added to the gradient (torch's)."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    raise ConfigError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


def lr_factor(kind: str, step: int, total: int) -> float:
    """The factor on the initial rate at 0-based `step` of `total`: the papers' linear decay to 0, a cosine
    decay to 0, or constant."""
    if kind == "linear":
        return max(0.0, 1.0 - step / max(1, total))
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(1, total)))
    if kind == "constant":
        return 1.0
    raise ConfigError(f"lr schedule must be one of {SCHEDULES}, got {kind!r}")


def make_schedule(optimizer: torch.optim.Optimizer, kind: str, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    lr_factor(kind, 0, total)  # refuse an unknown kind now, not at the first step
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(kind, step, total))


def step_decay_factor(step: int, every: int, decay: float) -> float:
    """DAFL's step schedule: the factor on the initial rate is `decay` to the number of `every`-step periods
    finished before 0-based `step`."""
    return decay ** (step // every)


def make_step_schedule(optimizer: torch.optim.Optimizer, every: int, decay: float) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR over `step_decay_factor` (not torch's StepLR, which multiplies the rate by `decay` at each
    boundary and so rounds differently from lr0 · decay^k)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step_decay_factor(step, every, decay))


def set_lr(optimizer: torch.optim.Optimizer, base_lr: float, kind: str, step: int, total: int) -> None:
    """Set every group's rate for `step` (loops whose step counter is not the scheduler's)."""
    for group in optimizer.param_groups:
        group["lr"] = base_lr * lr_factor(kind, step, total)


def weight_average(model: torch.nn.Module, decay: float) -> torch.optim.swa_utils.AveragedModel | None:
    """An exponential moving average of `model`'s weights (torch's AveragedModel), or None when
    `decay` is 0. Update it with `average.update_parameters(model)` after each step; `average.module` is the
    averaged model. Averaging the iterates of a DP training run is post-processing: it spends no privacy.

    The decay after n updates is min(decay, (1 + n) / (10 + n)) (TensorFlow's ExponentialMovingAverage with
    num_updates), so an average read early, after fewer than about 1 / (1 - decay) steps, is not dominated by the
    first iterates."""
    if not decay:
        return None
    if not 0 < decay < 1:
        raise ConfigError(f"a weight-average decay must lie in [0, 1), got {decay}")
    swa = torch.optim.swa_utils

    @torch.no_grad()
    def warm_ema(averaged: list[torch.Tensor], current: list[torch.Tensor], updates: torch.Tensor) -> None:
        weight = 1 - min(decay, (1 + float(updates)) / (10 + float(updates)))
        for average, latest in zip(averaged, current):
            average.lerp_(latest, weight)

    return swa.AveragedModel(model, multi_avg_fn=warm_ema, use_buffers=True)
