"""A ScatterNet's fixed (data-independent) transform of a set of images: what the `features` stage caches (DP-SGD on
ScatterNet features, engine/stages.py)."""

from __future__ import annotations

import torch
from torch import nn

from privdistill.data.dataset import to_float
from privdistill.engine.augment import augment_batch
from privdistill.engine.context import Env


def fixed_features(model: nn.Module, images: torch.Tensor, env: Env, batch_size: int = 1000, augment: str = "none",
                   stream: int = 0) -> torch.Tensor:
    """`model.scatter(images)` in batches, on the CPU (float32); with `augment`, of augmented images drawn from a
    fixed public seed (`stream`, the batch), not the run's: the cached features are the same for every run."""
    model.to(env.device)
    with torch.no_grad():
        return torch.cat([model.scatter(env.place_batch(augment_batch(
            to_float(images[i:i + batch_size]), augment, torch.Generator().manual_seed(1_000_003 * stream + i))
        )).float().cpu() for i in range(0, len(images), batch_size)])
