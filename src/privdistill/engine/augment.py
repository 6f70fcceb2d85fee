"""Batch augmentations, vectorised (no Python loop over images), driven by an explicit generator."""

from __future__ import annotations

import math

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


def random_affine(x: torch.Tensor, generator: torch.Generator, degrees: float = 10.0, scale: float = 0.1,
                  max_shift: int = 2) -> torch.Tensor:
    """Rotate each image by up to `degrees`, rescale it by up to `scale` and translate it by up to `max_shift`
    pixels (one bilinear resampling, black (-1) outside): the small deformations a digit or garment keeps its
    class under. A ScatterNet is nearly invariant to shifts of a few pixels but not to rotations, so these copies
    differ in its features where shifted ones hardly do."""
    b, _, h, w = x.shape
    u = torch.rand(b, 4, generator=generator) * 2 - 1  # uniform in [-1, 1]: angle, scale, dx, dy
    angle, zoom = u[:, 0] * math.radians(degrees), 1 + u[:, 1] * scale
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    theta = torch.stack([torch.stack([cos, -sin, u[:, 2] * 2 * max_shift / w], 1),
                         torch.stack([sin, cos, u[:, 3] * 2 * max_shift / h], 1)], 1).to(x)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    # grid_sample fills with 0; shifting to [0, 2] first makes that fill black (-1) after shifting back
    return F.grid_sample(x + 1, grid, mode="bilinear", padding_mode="zeros", align_corners=False) - 1


def augment_batch(x: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    if kind == "none":
        return x
    if kind == "affine":
        return random_affine(x, generator)
    if kind == "flip-shift":
        x = random_flip(x, generator)
    return random_shift(x, 2, generator)
