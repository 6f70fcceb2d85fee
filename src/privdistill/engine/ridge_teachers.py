"""Teachers as ridge-regression heads on a fixed ScatterNet transform (`teachers.fit=ridge`; ours).

DGD's teachers each learn from a few hundred private images (240 at 250 teachers on MNIST). A CNN trained on so few
reads real images poorly: on Fashion-MNIST each quick CNN teacher is 75 % right on the test set and their plurality
81.5 %, and augmentation lowers both. A linear head on a fixed, data-independent transform (the scattering of
Tramèr & Boneh 2021, normalised per example) has far fewer ways to overfit: fitted in closed form, each head is 79 %
right and their plurality 87 % (MNIST: 94.5 / 97.9 %), in seconds where 250 CNNs take half an hour on a CPU. What
their votes teach on synthetic queries is another matter, measured per dataset in docs/research-log.md ("Teachers on a
fixed transform, fitted in closed form").

Each head is the least-squares classifier on its partition's one-hot labels,

    w_t = argmin_w (1/n) ‖X_t w − Y_t‖² + λ ‖w‖²  =  X_tᵀ (X_t X_tᵀ + nλ I)⁻¹ Y_t     (the dual: n ≪ features)

with a constant feature appended for the bias (so the bias is penalised too). Privacy: teacher t reads only its
own partition X_t; the scattering reads no data and the GroupNorm normalises each example alone, so replacing one
record changes one teacher, as the votes' analysis assumes.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.data.dataset import ImageDataset
from privdistill.engine.context import Env
from privdistill.engine.features import fixed_features
from privdistill.errors import ConfigError


def check_ridge_model(model: nn.Module, name: str) -> None:
    """`teachers.fit=ridge` needs a fixed feature transform (`scatter`) feeding a single linear layer, and no
    transform fitted to anything (a prior projection would have to be built first: not supported here)."""
    head = getattr(model, "head", None)
    linear = isinstance(head, nn.Sequential) and [type(m) for m in head] == [nn.Flatten, nn.Linear]
    if not (hasattr(model, "scatter") and linear and getattr(model, "prior", "none") == "none"):
        raise ConfigError(f"teachers.fit=ridge needs a ScatterNet with a plain linear head (scatter-linear); "
                          f"{name} is not one")


def fit_ridge_heads(template: nn.Module, train: ImageDataset, parts: list[torch.Tensor], ridge: float,
                    env: Env) -> tuple[dict[str, torch.Tensor], dict]:
    """Stacked head parameters {"head.1.weight": [T, K, D], "head.1.bias": [T, K]}, one ridge head per partition,
    and the fit's statistics. The transform runs once over the training images."""
    started = time.perf_counter()
    features = fixed_features(template, train.images, env).flatten(1)
    feature_seconds = time.perf_counter() - started
    weights, biases = [], []
    for part in parts:
        x = torch.cat([features[part], torch.ones(len(part), 1)], 1).double()  # float64: the solve is tiny
        gram = x @ x.T
        factor = torch.linalg.cholesky(gram + ridge * len(part) * torch.eye(len(part), dtype=x.dtype))
        w = x.T @ torch.cholesky_solve(F.one_hot(train.labels[part], train.num_classes).double(), factor)
        weights.append(w[:-1].T.float())
        biases.append(w[-1].float())
    stats = {"fit": "ridge", "ridge": ridge, "feature_dim": int(features.shape[1]),
             "feature_seconds": round(feature_seconds, 3)}
    return {"head.1.weight": torch.stack(weights), "head.1.bias": torch.stack(biases)}, stats
