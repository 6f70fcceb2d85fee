"""Model inversion (Fredrikson et al. 2015; DGD Fig. 9 / DPDFD Fig. 5): for each class, gradient ascent on the
INPUT of a released classifier to maximise its confidence in that class, from a blank start, with total-variation
and L2 priors; a model that memorised its images tends to give recognisable ones, a private one noise-like patterns.

    x = tanh(w)  (images stay in [-1, 1]),   w ← Adam on   CE(f(x), c) + λ_tv TV(x) + λ_l2 mean(((x + 1) / 2)²)

Reported per class: the final confidence, and the Pearson correlation with the class's mean training image.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.data.dataset import ImageDataset, to_float
from privdistill.engine import streams
from privdistill.engine.context import Env
from privdistill.errors import ConfigError


@dataclass
class InversionConfig:
    """Config section `inversion`."""

    steps: int = 400
    lr: float = 0.05
    restarts: int = 4  # images per class (rows of the grid)
    tv_weight: float = 0.05
    l2_weight: float = 0.01

    def validate(self) -> None:
        if self.steps < 1 or self.restarts < 1 or self.lr <= 0:
            raise ConfigError("inversion.steps and restarts must be >= 1, lr > 0")
        if self.tv_weight < 0 or self.l2_weight < 0:
            raise ConfigError("inversion weights must be >= 0")


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Per-image anisotropic total variation (mean absolute difference of neighbouring pixels)."""
    dh = (x[..., 1:, :] - x[..., :-1, :]).abs().flatten(1).mean(1)
    dw = (x[..., :, 1:] - x[..., :, :-1]).abs().flatten(1).mean(1)
    return dh + dw


def invert(model: nn.Module, *, num_classes: int, shape: tuple[int, int, int], cfg: InversionConfig,
           env: Env) -> tuple[torch.Tensor, torch.Tensor]:
    """(images [restarts, K, C, H, W] in [-1, 1], confidence [restarts, K]) for every class at once."""
    model = model.float().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    device = next(model.parameters()).device
    n = cfg.restarts * num_classes
    target = torch.arange(num_classes).repeat(cfg.restarts).to(device)
    g = env.generator(streams.INVERSION_START)
    base = torch.full((n, *shape), float(torch.atanh(torch.tensor(-0.9))))
    w = (base + 0.1 * torch.randn(n, *shape, generator=g)).to(device).requires_grad_(True)  # noise std 0.1 (tanh space)
    optimizer = torch.optim.Adam([w], lr=cfg.lr)
    for _ in range(cfg.steps):
        x = torch.tanh(w)
        loss = F.cross_entropy(model(x).float(), target, reduction="none")
        loss = loss + cfg.tv_weight * total_variation(x) + cfg.l2_weight * ((x + 1) / 2).pow(2).flatten(1).mean(1)
        optimizer.zero_grad(set_to_none=True)
        loss.sum().backward()
        optimizer.step()
    with torch.no_grad():
        x = torch.tanh(w)
        conf = F.softmax(model(x).float(), dim=1).gather(1, target[:, None]).squeeze(1)
    return x.detach().cpu().view(cfg.restarts, num_classes, *shape), conf.cpu().view(cfg.restarts, num_classes)


def class_means(train: ImageDataset) -> torch.Tensor:
    """Mean training image per class [K, C, H, W] in [-1, 1]."""
    sums = torch.zeros(train.num_classes, *train.images.shape[1:])
    for start in range(0, len(train), 10000):
        x = to_float(train.images[start:start + 10000])
        sums.index_add_(0, train.labels[start:start + 10000], x)
    return sums / train.class_counts().clamp(min=1).view(-1, 1, 1, 1)


def correlation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pearson correlation between flattened images, broadcast over leading dimensions."""
    a = a.flatten(-3) - a.flatten(-3).mean(-1, keepdim=True)
    b = b.flatten(-3) - b.flatten(-3).mean(-1, keepdim=True)
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1) + 1e-12)


def save_inversion_grid(images: torch.Tensor, path: str | Path, *, scale: int = 2) -> Path:
    """One column per class, one row per restart."""
    from torchvision.utils import save_image

    restarts, k = images.shape[:2]
    grid = images.reshape(restarts * k, *images.shape[2:])
    if scale > 1:
        grid = F.interpolate(grid, scale_factor=scale, mode="nearest")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_image((grid + 1) / 2, str(path), nrow=k, padding=2, pad_value=1.0)
    return path


def inversion_audit(model: nn.Module, train: ImageDataset, cfg: InversionConfig, env: Env,
                    out_png: str | Path) -> dict[str, Any]:
    shape = tuple(train.images.shape[1:])
    images, conf = invert(model, num_classes=train.num_classes, shape=shape, cfg=cfg, env=env)
    corr = correlation(images, class_means(train)[None])  # [restarts, K]
    path = save_inversion_grid(images, out_png)
    return {"grid": str(path), "restarts": cfg.restarts, "steps": cfg.steps,
            "mean_confidence": round(float(conf.mean()), 4),
            "mean_correlation_with_class_mean": round(float(corr.mean()), 4),
            "per_class_correlation": [round(float(c), 4) for c in corr.mean(0)],
            "per_class_confidence": [round(float(c), 4) for c in conf.mean(0)]}
