"""Secure noise: every privacy draw made by OpenDP's samplers instead of torch's generators.

What it protects against, beyond a seeded run (``noise_source(seed)``):

* A known seed. Nothing here is seeded: OpenDP draws from the operating system's CSPRNG on every call, and
  nothing that could regenerate the noise is written anywhere (a resumed run reuses the ledger's recorded
  answers, the release itself, or pays again for what it must redraw: DPDFD, methods/dpdfd_plan.py).
* Floating-point attacks (Mironov, CCS 2012; Jin et al. 2022 for the Gaussian and Opacus). Vote counts are
  integers, and get discrete Laplace / discrete Gaussian noise (Canonne, Kamath & Steinke 2020), sampled
  exactly: the output is an integer whose distribution is the one the accountant prices. Real-valued releases
  (DPDFD's gradients, DGD's latent codes, DP-SGD's summed gradients) are rounded to a grid of step 2^k
  (k = ``GRID_EXPONENT``) and get discrete noise on that grid, which OpenDP proves private, instead of a
  textbook sampler whose set of reachable doubles depends on the true value. Randomized response is OpenDP's
  categorical sampler.

What it costs (2-core Xeon, measured): about 10-15 microseconds per noisy coordinate and 80 per randomized
response (torch draws millions per second). A DGD vote of 10,000 queries x 10 classes: ~1.5 s; SRR's 60,000
labels: ~5 s; DPDFD: ~35 ms a step at B = 256, K = 10; DP-SGD: ~0.4 s a step for a 40,000-parameter head.

The accounting does not change: the discrete Laplace with scale b on integer counts is (Δ/b)-DP like the
continuous one, and the discrete Gaussian satisfies the same zCDP/RDP bound as the continuous one at the same
sigma (CKS20, Thm. 4), which is what every accountant here uses (dp-accounting's Gaussian and Laplace events).
Rounding to the grid moves each coordinate by at most 2^(k-1): at k = -40 that is ~5e-13, so the sensitivity
grows by at most sqrt(d) * 2^-40 (~1e-11 for d = 100,000 coordinates), orders of magnitude below every clip
norm used here; ``privacy_map_check`` compares OpenDP's own privacy map with ours (tests/test_secure_noise.py).
"""

from __future__ import annotations

import functools
import math

import torch

from privdistill.errors import PrivacyError

GRID_EXPONENT = -40  # real-valued noise lives on the grid 2^k (module docstring)


@functools.lru_cache(maxsize=1)
def _opendp():
    try:
        import opendp.prelude as dp
    except ImportError as err:  # pragma: no cover - opendp is a core dependency
        raise PrivacyError("secure noise needs OpenDP (pip install opendp)") from err
    dp.enable_features("contrib")
    return dp


@functools.lru_cache(maxsize=256)
def _additive(distribution: str, scale: float, size: int, integer: bool):
    """OpenDP's additive-noise measurement for a vector of `size` coordinates (cached: building one is an FFI
    call). Its metric is the one the distribution is priced in (L1 for Laplace, L2 for Gaussian)."""
    dp = _opendp()
    if integer:
        domain, k = dp.vector_domain(dp.atom_domain(T=int), size=size), None
        metric = dp.l1_distance(T=int) if distribution == "laplace" else dp.l2_distance(T=int)
    else:
        domain, k = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size), GRID_EXPONENT
        metric = dp.l1_distance(T=float) if distribution == "laplace" else dp.l2_distance(T=float)
    make = dp.m.make_laplace if distribution == "laplace" else dp.m.make_gaussian
    return make(domain, metric, scale, k=k)


@functools.lru_cache(maxsize=4096)
def _categorical(categories: tuple[int, ...], keep: float):
    return _opendp().m.make_randomized_response(list(categories), keep, T=int)


class SecureNoise:
    """The privacy noise of a run in secure mode. Pass it wherever a mechanism takes ``generator=``
    (privacy.mechanisms); it has no state and no seed. Draws happen on the CPU; results come back on the
    input's device."""

    device = torch.device("cpu")

    def __repr__(self) -> str:
        return "SecureNoise(OpenDP)"

    def add(self, values: torch.Tensor, *, distribution: str, scale: float) -> torch.Tensor:
        """values + noise, elementwise: discrete noise on the integers for an integer tensor (vote counts), noise
        on the 2^k grid for a floating-point one (decided by the dtype, never by the values: a float tensor that
        happens to hold integers still gets real-valued noise). `scale` is the Laplace b or the Gaussian sigma."""
        if distribution not in ("laplace", "gaussian"):
            raise PrivacyError(f"unknown noise distribution {distribution!r}")
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            raise PrivacyError(f"noise scale must be a positive finite number, got {scale!r}")
        flat = values.detach().reshape(-1).cpu()
        integer = not flat.is_floating_point()
        as_list = flat.long().tolist() if integer else flat.double().tolist()
        noisy = _additive(distribution, float(scale), len(as_list), integer)(as_list)
        out = torch.tensor(noisy, dtype=torch.int64 if integer else torch.float64)
        return out.to(device=values.device, dtype=values.dtype if values.is_floating_point() else torch.int64
                      ).reshape(values.shape)

    def randomized_response(self, in_set: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """k-RR on each row's candidate set (privacy.mechanisms.rr_on_sets): the label is kept with probability
        keep[i] if it is in the set, else another member is drawn uniformly; a label outside the set gives a
        uniform member (OpenDP's RR with keep probability 1/k, from any member, is exactly that)."""
        rows = in_set.cpu()
        out = []
        for members_mask, y, p in zip(rows, labels.cpu().tolist(), keep.cpu().tolist()):
            members = tuple(int(c) for c in torch.nonzero(members_mask).flatten())
            if len(members) == 1:
                out.append(members[0])
            elif y in members:
                out.append(_categorical(members, float(p))(y))
            else:
                out.append(_categorical(members, 1.0 / len(members))(members[0]))
        return torch.tensor(out, dtype=torch.int64, device=labels.device)


def use_secure_noise(optimizer) -> None:
    """DP-SGD in secure mode: an Opacus DPOptimizer's Gaussian noise, N(0, (sigma C)^2) per coordinate of the summed
    clipped gradient, drawn here instead of by torch. Everything else, and so the accounting, stays Opacus's.
    (Opacus's own secure_mode needs torchcsprng, which has no build for current torch.)"""
    from opacus.optimizers.optimizer import _check_processed_flag, _mark_as_processed

    secure = SecureNoise()

    def add_noise() -> None:
        std = optimizer.noise_multiplier * optimizer.max_grad_norm
        for param in optimizer.params:
            _check_processed_flag(param.summed_grad)
            param.grad = secure.add(param.summed_grad, distribution="gaussian", scale=std).view_as(param)
            _mark_as_processed(param.summed_grad)

    optimizer.add_noise = add_noise


def privacy_map_check(distribution: str, scale: float, size: int, sensitivity: float, *, integer: bool) -> float:
    """OpenDP's own privacy figure for one use of the measurement at `sensitivity` (L1 for Laplace: ε; L2 for
    Gaussian: zCDP ρ). The tests compare it with Δ/b and Δ²/(2σ²), the figures the accountants use."""
    measurement = _additive(distribution, float(scale), size, integer)
    return float(measurement.map(int(sensitivity) if integer else float(sensitivity)))
