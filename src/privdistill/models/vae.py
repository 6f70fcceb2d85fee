"""Convolutional VAE with latent size c (DGD: c = 32), in the style of TNAR's (Yu et al., CVPR 2019).

Encoder: conv4x4/2 (32) -> conv4x4/2 (64) -> FC 256 -> (mu, logvar); decoder mirrors it and ends in tanh,
so reconstructions live in [-1, 1] like the images. `decode` is what the tangent perturbations go through.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.models.registry import register_model


class ConvVAE(nn.Module):
    def __init__(self, in_channels: int = 1, image_size: int | tuple[int, int] = 28, latent_dim: int = 32,
                 width: int = 32, hidden: int = 256):
        super().__init__()
        h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
        self.image_shape = (in_channels, h, w)
        self.latent_dim = latent_dim
        self.pad_h, self.pad_w = (-h) % 4, (-w) % 4  # pad to a multiple of 4 for two stride-2 stages
        self.grid = ((h + self.pad_h) // 4, (w + self.pad_w) // 4)
        flat = 2 * width * self.grid[0] * self.grid[1]
        self.encoder = nn.Sequential(
            nn.Conv2d(in_channels, width, 4, stride=2, padding=1), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(width, 2 * width, 4, stride=2, padding=1), nn.BatchNorm2d(2 * width),
            nn.LeakyReLU(0.2, inplace=True), nn.Flatten(), nn.Linear(flat, hidden), nn.LeakyReLU(0.2, inplace=True),
        )
        self.to_mu = nn.Linear(hidden, latent_dim)
        self.to_logvar = nn.Linear(hidden, latent_dim)
        self.width = width
        self.decoder_fc = nn.Sequential(nn.Linear(latent_dim, hidden), nn.ReLU(inplace=True),
                                        nn.Linear(hidden, flat), nn.ReLU(inplace=True))
        self.decoder = nn.Sequential(
            nn.ConvTranspose2d(2 * width, width, 4, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.ConvTranspose2d(width, in_channels, 4, stride=2, padding=1), nn.Tanh(),
        )

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pad_h or self.pad_w:
            x = F.pad(x, (0, self.pad_w, 0, self.pad_h), value=-1.0)
        hidden = self.encoder(x)
        return self.to_mu(hidden), self.to_logvar(hidden)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        x = self.decoder_fc(z).view(z.shape[0], 2 * self.width, *self.grid)
        x = self.decoder(x)
        return x[:, :, : self.image_shape[1], : self.image_shape[2]]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, logvar = self.encode(x)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar) if self.training else mu
        return self.decode(z), mu, logvar


def vae_loss(recon: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """Negative ELBO per example: squared error (Gaussian likelihood) + KL(q(z|x) || N(0, I))."""
    rec = F.mse_loss(recon, x, reduction="sum") / x.shape[0]
    kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / x.shape[0]
    return rec + kl


@register_model("conv-vae", kind="vae", description="convolutional VAE, latent size c (DGD: 32)")
def conv_vae(in_channels: int = 1, image_size: int = 28, latent_dim: int = 32) -> ConvVAE:
    return ConvVAE(in_channels, image_size, latent_dim)
