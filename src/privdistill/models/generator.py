"""The DAFL generator (Chen et al., ICCV 2019), which the three papers build on without giving their own:
linear -> BN -> (2x upsample -> conv3x3 -> BN -> LeakyReLU) x 2 -> conv3x3 -> tanh -> BN(affine=False).

By default tanh is the last layer, so samples lie in [-1, 1] like real images and every model reads both alike.
``output_norm=True`` restores DAFL's final BatchNorm(affine=False): a fresh tanh-last generator trained without the
teacher (DPDFD) emits near-constant grey images a teacher may read as one class, and standardising restores
contrast (research log, DPDFD).
"""

from __future__ import annotations

import torch
from torch import nn

from privdistill.models.registry import register_model


class DAFLGenerator(nn.Module):
    """``num_classes`` > 0: a class-conditional generator (the synthesis engine's class targets, not in the
    papers): its input is the noise followed by a one-hot class, so ``latent_dim`` counts both; draw inputs
    with :meth:`sample_latent` and read their classes back with :meth:`latent_labels`."""

    def __init__(self, latent_dim: int = 100, out_channels: int = 1, image_size: int | tuple[int, int] = 28,
                 width: int = 128, output_norm: bool = False, num_classes: int = 0):
        super().__init__()
        h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
        self.noise_dim, self.num_classes = latent_dim, num_classes
        latent_dim = latent_dim + num_classes
        self.latent_dim = latent_dim
        self.out_shape = (out_channels, h, w)
        self.init_h, self.init_w = (h + 3) // 4, (w + 3) // 4  # upsampled twice, then cropped to (h, w)
        self.project = nn.Sequential(nn.Linear(latent_dim, width * self.init_h * self.init_w))
        self.width = width
        self.body = nn.Sequential(
            nn.BatchNorm2d(width),
            nn.Upsample(scale_factor=2), nn.Conv2d(width, width, 3, stride=1, padding=1),
            nn.BatchNorm2d(width, eps=0.8), nn.LeakyReLU(0.2, inplace=True),
            nn.Upsample(scale_factor=2), nn.Conv2d(width, width // 2, 3, stride=1, padding=1),
            nn.BatchNorm2d(width // 2, eps=0.8), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(width // 2, out_channels, 3, stride=1, padding=1), nn.Tanh(),
        )
        # DAFL's last layer: per-batch standardisation of the output (no learned scale or shift)
        self.output_norm = nn.BatchNorm2d(out_channels, affine=False) if output_norm else None

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        x = self.project(z).view(z.shape[0], self.width, self.init_h, self.init_w)
        x = self.body(x)
        h, w = self.out_shape[1:]
        x = x[:, :, :h, :w]
        return self.output_norm(x) if self.output_norm is not None else x

    def sample_latent(self, n: int, *, generator: torch.Generator | None = None, device: torch.device | str = "cpu",
                      labels: torch.Tensor | None = None) -> torch.Tensor:
        """n inputs: Gaussian noise, and for a conditional generator a one-hot class (`labels`, else uniform)."""
        noise = torch.randn(n, self.noise_dim, generator=generator, device=device)
        if not self.num_classes:
            return noise
        if labels is None:
            labels = torch.randint(self.num_classes, (n,), generator=generator, device=device)
        return torch.cat([noise, nn.functional.one_hot(labels.to(device), self.num_classes).to(noise.dtype)], 1)

    def latent_labels(self, z: torch.Tensor) -> torch.Tensor | None:
        """The classes a conditional generator's inputs ask for (None: unconditional)."""
        return z[:, self.noise_dim:].argmax(1) if self.num_classes else None


@register_model("dafl-generator", kind="generator",
                description="DAFL generator: z (100) -> image in [-1, 1] (output_norm: standardised, as DAFL's)")
def dafl_generator(latent_dim: int = 100, out_channels: int = 1, image_size: int = 28, width: int = 128,
                   output_norm: bool = False, num_classes: int = 0) -> DAFLGenerator:
    return DAFLGenerator(latent_dim, out_channels, image_size, width, output_norm, num_classes)
