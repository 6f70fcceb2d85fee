"""Probe (issue 26): the linear head released by one-shot DP mechanisms instead of DP-SGD, on the whitening probe's
features. DP-SGD's strict ε = 3 cell on Fashion-MNIST is held by its steps (docs/research-log.md, "Where strict
ε = 3 is lost"); these mechanisms take no steps at all, so they test whether the steps can be skipped:

- "output": output perturbation of L2-regularised ERM (Chaudhuri, Monteleoni & Sarwate 2011). The head θ minimises
  (1/n) Σ CE(θ [z, 1], y) + (λ/2) ||θ||² with every row [z, 1] of norm sqrt(2) (z scaled to unit norm, a fixed
  per-example map), so each example's gradient has norm at most L = 2 and the minimiser's replace-one sensitivity
  is 2L / (nλ). L-BFGS in float64 runs until the gradient norm is below `tol` (the run stops with an error if it is
  not); the approximate minimiser then lies within tol / λ of the exact one on either of two neighbouring datasets,
  so 2 tol / λ is added to the sensitivity.
  Gaussian noise on θ, calibrated on dp-accounting's replace-one PLD ε of one Gaussian release.
- "least-squares": DP sufficient statistics (Sheffet 2017; Mehta et al. 2023's DP-LS): Σ x xᵀ and Σ x yᵀ of rows
  x = [z, 1] / sqrt(2) of unit norm and one-hot y, released together by one Gaussian mechanism (replace-one
  sensitivity sqrt(2 + 2) = 2, dp-accounting's unit: ||x xᵀ - x' x'ᵀ||² = 2 - 2 (x·x')² and ||x yᵀ - x' y'ᵀ||² =
  2 - 2 (x·x')(y·y'), where the bias coordinate keeps x·x' >= 0), then ridge regression with ridge λ
  (post-processing).

Noise draws `draws` (3) per setting; "eps" lists the strict targets (and 0: no noise, the ceiling at that λ).
Keys beyond the whitening probe's feature keys (features, prior, k, m; `project`): mechanism, lam, tol (1e-7).

    python experiments/dp_erm_probe.py fashion-mnist \\
        '[{"mechanism": "output", "features": "prior", "prior": "dead-leaves-textured", "k": 800, "m": 100000,
           "lam": 1e-3, "eps": [0, 3]}]' --fine
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import dpsgd_whitening_probe as probe  # noqa: E402  (the features and their projections)


def unit_rows_with_bias(z: torch.Tensor) -> torch.Tensor:
    """[z / ||z||, 1] / sqrt(2): every row of norm exactly 1, whatever the image (the bound both mechanisms need)."""
    return torch.cat([z / z.norm(dim=1, keepdim=True), torch.ones(len(z), 1)], 1).double() / math.sqrt(2)


def regularised_logistic(x: torch.Tensor, y: torch.Tensor, lam: float, tol: float) -> tuple[torch.Tensor, float]:
    theta = torch.zeros(10, x.shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([theta], lr=1, max_iter=500, tolerance_grad=1e-14, tolerance_change=1e-16,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(x @ theta.T, y) + lam / 2 * theta.pow(2).sum()
        loss.backward()
        return loss

    for _ in range(100):  # until the gradient bound the sensitivity uses holds
        opt.step(closure)
        if theta.grad.norm() <= tol:
            break
    closure()
    if theta.grad.norm() > tol:  # the sensitivity below assumes it: no release without it
        raise RuntimeError(f"L-BFGS stopped at gradient norm {float(theta.grad.norm()):.2e} > tol {tol:.0e}")
    return theta.detach(), float(theta.grad.norm())


def release(c: dict, x, xt, y, yt) -> dict:
    n, d = x.shape
    lam, row = c["lam"], {}
    if c["mechanism"] == "output":
        # rows of norm 1 here: [z, 1] / sqrt(2), so L = sqrt(2) (||softmax - onehot|| <= sqrt(2) times ||x|| = 1)
        tol = c.get("tol", 1e-7)
        theta, g = regularised_logistic(x, y, lam, tol)
        sensitivity = 2 * math.sqrt(2) / (n * lam) + 2 * tol / lam
        row.update(gradient_norm=g, sensitivity=sensitivity, theta_norm=round(float(theta.norm()), 3))
    else:
        moment, cross = x.T @ x, x.T @ F.one_hot(y, 10).double()
    for eps in c.get("eps", [0, 3]):
        accuracies = []
        # one Gaussian release at ε (replace-one, dp-accounting's unit: sensitivity 2): the whitening probe's
        # calibration of one step at sampling rate 1
        z = probe.calibrate(eps, 1.0, 1, 0.0) if eps else 0.0
        for draw in range(c.get("draws", 3) if eps else 1):
            g = torch.Generator().manual_seed(draw)
            if c["mechanism"] == "output":
                head = theta + torch.randn(theta.shape, generator=g, dtype=torch.float64) * z * sensitivity / 2
            else:  # one Gaussian release of both statistics, sensitivity 2 = the accountant's unit: noise std z
                noise = torch.randn(d, d, generator=g, dtype=torch.float64) * z
                a = moment + torch.triu(noise) + torch.triu(noise, 1).T
                b = cross + torch.randn(d, 10, generator=g, dtype=torch.float64) * z
                head = torch.linalg.solve(a + lam * torch.eye(d, dtype=torch.float64), b).T
            accuracies.append(round(float(((xt @ head.T).argmax(1) == yt).double().mean()), 4))
        row[f"eps{eps}"] = accuracies
    return row


def main() -> None:
    warnings.simplefilter("ignore")
    dataset, settings = sys.argv[1], json.loads(sys.argv[2])
    data, model, features, test_features = probe.scattering_features(dataset, fine="--fine" in sys.argv[3:])
    u, ut = (f / f.norm(dim=1, keepdim=True) for f in (features, test_features))
    for c in settings:
        started = time.time()
        z, zt = (u, ut) if c["features"] == "raw" else probe.project(c, u, ut, model, data)
        row = release(c, unit_rows_with_bias(z), unit_rows_with_bias(zt), data.train.labels, data.test.labels)
        print(json.dumps({"dataset": dataset, **c, **row, "seconds": round(time.time() - started)}), flush=True)


if __name__ == "__main__":
    main()
