"""How good is a synthetic set? Teacher's view of it, and what a student learns from it alone."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from privdistill.data.dataset import to_float, to_uint8
from privdistill.engine.context import Env
from privdistill.engine.datafree import generate
from privdistill.engine.trainer import predict_logits


def teacher_view(classifier: nn.Module, images: torch.Tensor, env: Env, num_classes: int) -> dict:
    """Class histogram of the classifier's predictions, its entropy, and the mean confidence."""
    probs = torch.softmax(predict_logits(classifier, images, env), dim=1)
    labels = probs.argmax(1)
    hist = torch.bincount(labels, minlength=num_classes).float()
    freq = hist / hist.sum()
    entropy = float(-(freq[freq > 0] * freq[freq > 0].log()).sum())
    return {"class_histogram": hist.long().tolist(), "histogram_entropy_nats": round(entropy, 4),
            "histogram_entropy_normalised": round(entropy / math.log(num_classes), 4),
            "mean_confidence": round(float(probs.max(1).values.mean()), 4)}


def save_grid(images: torch.Tensor, labels: torch.Tensor | None, path: str | Path, *, per_class: int = 10,
              num_classes: int = 10) -> Path:
    """A PNG grid of synthetic samples, one row per (predicted) class when labels are given."""
    from torchvision.utils import save_image

    if labels is not None:
        rows = []
        for k in range(num_classes):
            idx = torch.nonzero(labels == k).flatten()[:per_class]
            row = to_float(images[idx])
            if len(row) < per_class:  # pad missing samples with black
                row = torch.cat([row, -torch.ones(per_class - len(row), *images.shape[1:])])
            rows.append(row)
        grid = torch.cat(rows)
    else:
        grid = to_float(images[: per_class * num_classes])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # small images (28 px digits, 8 px sklearn digits) are upscaled by an integer factor to at least 56 px, with
    # nearest-neighbour so that every pixel stays a sharp block: a browser shows native-size grids as a smudge
    factor = max(1, -(-56 // grid.shape[-1]))
    if factor > 1:
        grid = torch.nn.functional.interpolate(grid.float(), scale_factor=factor, mode="nearest")
    save_image((grid + 1) / 2, str(path), nrow=per_class, padding=factor)
    return path


def save_generator_grid(generator: nn.Module, labeller: nn.Module, path: str | Path, env: Env,
                        num_classes: int) -> None:
    """A grid of 500 generator samples, rows by `labeller`'s prediction (DPDFD passes its student: no teacher
    access, no privacy cost). The labeller reads the generator's raw float output, as a student saw it in
    training; the grid shows the same samples clamped to [-1, 1] (an output-BatchNorm generator exceeds that
    range). Without torchvision, no grid."""
    try:
        samples = generate(generator, 500, env, stream=1, quantise=False)
        save_grid(to_uint8(samples), predict_logits(labeller, samples, env).argmax(1), path, num_classes=num_classes)
    except ImportError:
        pass
