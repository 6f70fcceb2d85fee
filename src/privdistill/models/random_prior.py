"""A data-independent preconditioner for DP-SGD on ScatterNet features: whitening fitted to images of a random
process ("dead leaves"), so it reads no private data and costs no privacy.

Why: DP-SGD's isotropic noise on a linear head over 3,969 correlated scattering coefficients converges slowly along
the low-variance directions; whitening conditions the problem and truncating drops dimensions where the noise costs
more than the signal pays. Whitening estimated from the private data under DP is too noisy in 3,969 dimensions
(research log, "Notes that left the code: models/random_prior.py").

Following Tang et al. 2023 (DP-RandP) and Baradad et al. 2021, the process is the dead-leaves model (Matheron 1968;
Lee, Mumford & Huang 2001), drawn from a fixed public seed; the whitening is the principal directions of their
scattering features, kept to `dims`, unit variance. Reading chosen (the papers pre-train a network; a linear head
needs only a linear map): ellipses or rectangles of radius 1-10 pixels, 4-15 on a dark background, intensities
uniform in [-1, 1], one colour per shape and channel; `texture` (textured()) follows Baradad et al.'s finding
that textured dead leaves are the better prior.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

#: the public seed of the random-process images (any fixed value: it is part of the released transform's name)
PRIOR_SEED = 20_231_001
#: the textured process's (`dead-leaves-textured`) largest per-image texture amplitude (intensities span [-1, 1])
PRIOR_TEXTURE = 0.5


def dead_leaves(n: int, *, channels: int = 1, size: tuple[int, int] = (28, 28), seed: int = PRIOR_SEED,
                shapes: tuple[int, int] = (4, 16), max_radius: float = 10.0, texture: float = 0.0,
                batch: int = 4096) -> torch.Tensor:
    """`n` dead-leaves images [n, channels, H, W] in [-1, 1]: shapes drawn one over another (the later ones occlude
    the earlier ones) on a background of -1. With `texture` > 0 the shapes are textured (see textured()).
    Deterministic in `seed`; no data is read; texture = 0 draws exactly the untextured images."""
    g = torch.Generator().manual_seed(seed)
    texture_g = torch.Generator().manual_seed(seed + 1)  # its own stream: the shapes are the untextured ones
    h, w = size
    yy, xx = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    out = []
    for start in range(0, n, batch):
        m = min(batch, n - start)
        images = torch.full((m, channels, h, w), -1.0)
        count = torch.randint(shapes[0], shapes[1], (m,), generator=g)
        for j in range(int(count.max())):
            live = count > j
            cy, cx = torch.rand(m, generator=g) * h, torch.rand(m, generator=g) * w
            ry = 1 + torch.rand(m, generator=g) * (max_radius - 1)
            rx = 1 + torch.rand(m, generator=g) * (max_radius - 1)
            ellipse = torch.rand(m, generator=g) < 0.5
            value = torch.rand(m, channels, generator=g) * 2 - 1
            dy = (yy[None] - cy[:, None, None]) / ry[:, None, None]
            dx = (xx[None] - cx[:, None, None]) / rx[:, None, None]
            inside = torch.where(ellipse[:, None, None], dy ** 2 + dx ** 2 <= 1, (dy.abs() <= 1) & (dx.abs() <= 1))
            inside = (inside & live[:, None, None])[:, None]  # [m, 1, H, W]
            images = torch.where(inside, value[:, :, None, None].expand_as(images), images)
        out.append(textured(images, texture, texture_g) if texture > 0 else images)
    return torch.cat(out)


def textured(images: torch.Tensor, amplitude: float, generator: torch.Generator) -> torch.Tensor:
    """Dead leaves with texture (Baradad et al. 2021 found textured shapes a better random-process prior than flat
    ones): every pixel off the background moved by a smooth random field (white noise averaged over 5 x 5 pixels,
    scaled to peak 1) times an amplitude drawn per image, uniform in [0, `amplitude`]. Reading chosen: one field per
    image rather than per shape (a shape's own texture would need its mask kept); clipped to [-1, 1]."""
    m, channels, h, w = images.shape
    noise = torch.randn(m, channels, h, w, generator=generator)
    field = F.avg_pool2d(F.pad(noise, (2, 2, 2, 2), mode="reflect"), 5, stride=1)
    field = field / field.abs().amax((1, 2, 3), keepdim=True).clamp_min(1e-12)
    strength = amplitude * torch.rand(m, 1, 1, 1, generator=generator)
    return (images + strength * field * (images > -1)).clamp(-1, 1)


def unit_rows(features: torch.Tensor) -> torch.Tensor:
    """Each row of `features` [m, d] scaled to norm 1: what whitening_projection fits and what its map is applied
    to (ScatterNet.scatter), so both sides read the same scale."""
    features = features.float()
    return features / features.norm(dim=1, keepdim=True).clamp_min(1e-12)


def whitening_projection(features: torch.Tensor, dims: int, shrink: float = 0.0) -> torch.Tensor:
    """A [d, dims] map z = u @ P from unit-norm features u (features [m, d], each row scaled to norm 1 here) onto
    their `dims` leading principal directions (uncentred second moment), each scaled to unit variance on these
    features, then all scaled so that the projected features' median norm is sqrt(d): the norm of a GroupNorm'd
    ScatterNet feature vector, which the DP-SGD recipe's clip norm and rate were chosen on. Exact eigenvectors below
    8,192 dimensions, a randomised SVD above. `shrink` > 0 whitens only partly: 1 / sqrt(λ + shrink · mean λ)."""
    m, d = features.shape
    if not 0 < dims <= min(m, d):
        raise ValueError(f"whitening dims must lie in [1, {min(m, d)}], got {dims}")
    u = unit_rows(features)
    if m < d:  # fewer images than coefficients (a small prior): the same eigenvectors from the m x d rows' SVD,
        # without the d x d eigendecomposition (tens of seconds at d = 5,733 on 2 cores)
        _, singular, vh = torch.linalg.svd(u.double(), full_matrices=False)
        eigenvalues, vectors = singular[:dims] ** 2, vh[:dims].T
    elif d <= 8192:  # the moment accumulated in float64 chunks: no float64 copy of all m rows
        moment = torch.zeros(d, d, dtype=torch.float64)
        for i in range(0, m, 8192):
            moment += u[i:i + 8192].double().T @ u[i:i + 8192].double()
        eigenvalues, vectors = torch.linalg.eigh(moment)
        eigenvalues, vectors = eigenvalues.flip(0)[:dims], vectors.flip(1)[:, :dims]
    else:
        _, singular, v = torch.svd_lowrank(u, q=min(dims + 64, m, d), niter=4)
        eigenvalues, vectors = singular[:dims].double() ** 2, v[:, :dims].double()
    if shrink:
        eigenvalues = eigenvalues + shrink * eigenvalues.mean()
    projection = (vectors / (eigenvalues.clamp_min(1e-12) / m).sqrt()).float()
    return projection * (math.sqrt(d) / (u @ projection).norm(dim=1).median())
