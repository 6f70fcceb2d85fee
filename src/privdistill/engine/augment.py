"""Batch augmentations, vectorised (no Python loop over images), driven by an explicit generator."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_shift(x: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Translate each image by up to `max_shift` pixels in each direction, filling with black (-1)."""
    if max_shift <= 0:
        return x
    b, c, h, w = x.shape
    padded = F.pad(x, (max_shift,) * 4, value=-1.0)
    dy = torch.randint(0, 2 * max_shift + 1, (b,), generator=generator).to(x.device)
    dx = torch.randint(0, 2 * max_shift + 1, (b,), generator=generator).to(x.device)
    rows = (dy[:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    batch = torch.arange(b, device=x.device)[:, None, None, None]
    chans = torch.arange(c, device=x.device)[None, :, None, None]
    return padded[batch, chans, rows, cols]


def random_flip(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    flip = (torch.rand(x.shape[0], generator=generator) < 0.5).to(x.device)
    return torch.where(flip[:, None, None, None], x.flip(-1), x)


def augment_batch(x: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    if kind == "none":
        return x
    if kind == "flip-shift":
        x = random_flip(x, generator)
    return random_shift(x, 2, generator)
