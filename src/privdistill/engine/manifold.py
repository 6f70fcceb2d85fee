"""Perturbation regularisers of the semi-supervised students: tangent and normal perturbations of decoded samples
(TNAR, Yu et al. CVPR 2019), used by DGD's student, and virtual adversarial training (VAT, Miyato et al. 2018),
used by PATE's.

For x̂ = dec(z): tangent x̂∥ = dec(z + η), a move ALONG the learned manifold; normal x̂⊥ = x̂ + r with r ⊥ span(J),
J = ∂dec/∂z (exact, `torch.func.jacfwd` under `vmap`), a move OFF it. Directions are adversarial (one power
iteration, TNAR; the DGD text draws them at random); the distance is DGD's Eq. 6: squared L2 between backbone features.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import jacfwd, vmap


def feature_distance(student: nn.Module, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample squared L2 distance between backbone features (DGD Eq. 6)."""
    return (student.features(a).float() - student.features(b).float()).pow(2).flatten(1).sum(1)


def _unit(v: torch.Tensor) -> torch.Tensor:
    flat = v.flatten(1)
    return (flat / (flat.norm(dim=1, keepdim=True) + 1e-12)).view_as(v)


def decoder_tangent_basis(decoder: nn.Module, z: torch.Tensor) -> torch.Tensor:
    """Orthonormal basis Q [B, D, c] of each decoding's tangent space span(∂dec/∂z).

    `decoder` is a VAE in eval mode (its `decode` is differentiated; its weights are constants here)."""

    def decode_one(code: torch.Tensor) -> torch.Tensor:
        return decoder.decode(code[None]).flatten()

    with torch.autocast(device_type=z.device.type, enabled=False):  # QR needs fp32
        jac = vmap(jacfwd(decode_one))(z.float())  # [B, D, c]
        q, _ = torch.linalg.qr(jac, mode="reduced")
    return q


def project_normal(d: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Remove the tangent component: d - Q Qᵀ d, per sample (d: [B, C, H, W], basis [B, D, c])."""
    flat = d.flatten(1).unsqueeze(2)  # [B, D, 1]
    tangent = basis @ (basis.transpose(1, 2) @ flat)
    return (flat - tangent).squeeze(2).view_as(d)


@dataclass
class PerturbationConfig:
    tangent_eps: float = 1.0  # L2 size of the latent perturbation η
    normal_eps: float = 2.0  # L2 size of the input-space perturbation r (images in [-1, 1])
    xi: float = 1e-2  # finite-difference step of the power iteration


class ManifoldPerturber:
    """Builds (x̂, x̂∥, x̂⊥) triples from latent codes, given the current student."""

    def __init__(self, decoder: nn.Module, cfg: PerturbationConfig,
                 autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):
        self.decoder = decoder.eval().requires_grad_(False)
        self.cfg = cfg
        self.autocast = autocast

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder.decode(z)

    def tangent(self, student: nn.Module, z: torch.Tensor, x_hat: torch.Tensor,
                generator: torch.Generator) -> torch.Tensor:
        eta = _unit(torch.randn(z.shape, generator=generator).to(z.device))
        with self.autocast():
            eta = self._power_step(student, x_hat, eta, lambda e: self.decode(z + self.cfg.xi * e))
        with torch.no_grad():
            return self.decode(z + self.cfg.tangent_eps * eta)

    def normal(self, student: nn.Module, z: torch.Tensor, x_hat: torch.Tensor,
               generator: torch.Generator) -> torch.Tensor:
        basis = decoder_tangent_basis(self.decoder, z)
        d = _unit(project_normal(torch.randn(x_hat.shape, generator=generator).to(x_hat.device), basis))
        with self.autocast():
            d = self._power_step(student, x_hat, d, lambda r: x_hat + self.cfg.xi * r,
                                 project=lambda g: project_normal(g.float(), basis))
        return (x_hat + self.cfg.normal_eps * d).detach()

    @staticmethod
    def _power_step(student, x_hat, direction, perturbed, project=None):
        """One power iteration: the direction of steepest feature change from x̂, as a unit vector."""
        direction = direction.detach().requires_grad_(True)
        was_training = student.training
        student.eval()  # BatchNorm (if any) must not see these probes as a training batch
        distance = feature_distance(student, x_hat.detach(), perturbed(direction)).sum()
        (grad,) = torch.autograd.grad(distance, direction)
        student.train(was_training)
        if project is not None:
            grad = project(grad)
        return _unit(grad.detach())


def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """Mean KL(p || q) between the softmaxes of two logit batches (p held fixed)."""
    p = F.softmax(p_logits, dim=1)
    return (p * (F.log_softmax(p_logits, dim=1) - F.log_softmax(q_logits, dim=1))).sum(1).mean()


def vat_loss(model: nn.Module, x: torch.Tensor, logits: torch.Tensor, *, eps: float, xi: float,
             generator: torch.Generator, autocast=None) -> torch.Tensor:
    """Virtual adversarial loss (Miyato et al. 2018): KL between the prediction at x and at x + r_adv, r_adv
    the direction (one power iteration) that changes the prediction most, of L2 norm `eps`."""
    autocast = autocast or contextlib.nullcontext
    clean = logits.detach().float()
    d = _unit(torch.randn(x.shape, generator=generator).to(x.device)).requires_grad_(True)
    # The power iteration's finite difference is below bf16/fp16 resolution on saturated pixels: under autocast
    # x + xi*d rounds back to x and the KL and its gradient vanish. Probe in fp32, from an fp32 reference.
    with torch.autocast(device_type=x.device.type, enabled=False):
        with torch.no_grad():
            reference = model(x).float()
        dist = _kl(reference, model(x + xi * d).float())
    (grad,) = torch.autograd.grad(dist, d)
    r_adv = eps * _unit(grad.detach())
    with autocast():
        return _kl(clean, model(x + r_adv).float())
