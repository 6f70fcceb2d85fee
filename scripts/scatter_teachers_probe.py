"""Probe (issue 24): would DGD's teachers read the data better as linear heads on fixed ScatterNet features?

Each of DGD's 250 teachers learns from 240 private images. A CNN that small extrapolates arbitrarily (Fashion-MNIST:
each quick teacher 75 % on real test images, their plurality 81.5 %), and augmentation lowers it there. A linear
head on a fixed, data-independent transform (the scattering of Tramèr & Boneh 2021, normalised per example) has
far fewer ways to overfit 240 images. This script computes the scattering of every train and test image once,
fits one ridge-regression head per partition of the teacher stage (the same partitions: `partition_indices`, seed 0)
on one-hot targets, all heads at once in the dual form, and reports each head's and their
plurality's accuracy on the real test set. Evaluation only: it reads private labels and releases nothing.

    flock /tmp/privdistill-cpu.lock python scripts/scatter_teachers_probe.py --dataset fashion-mnist \
        --ridge 1e-3 1e-2 1e-1 --out docs/diagnostics/scatter-teachers-fashion-mnist.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from privdistill.config import RunOptions
from privdistill.data import load_data
from privdistill.data.partition import partition_indices
from privdistill.engine import Env
from privdistill.engine.stages import fixed_features
from privdistill.models import create_model


def ridge_heads(x: torch.Tensor, y: torch.Tensor, classes: int, ridge: float) -> torch.Tensor:
    """One ridge-regression head per partition on one-hot targets (a least-squares classifier), solved in its dual
    form because each partition has far fewer examples than features: x [T, n, D], y [T, n] -> weights [T, D, K]
    (the caller appends a constant feature for the bias)."""
    gram = torch.bmm(x, x.transpose(1, 2))  # [T, n, n]
    factor = torch.linalg.cholesky(gram + ridge * x.shape[1] * torch.eye(x.shape[1]))
    dual = torch.cholesky_solve(F.one_hot(y, classes).float(), factor)  # [T, n, K]
    return torch.bmm(x.transpose(1, 2), dual)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--model", default="scatter-linear", help="a ScatterNet with a linear head (its features)")
    ap.add_argument("--teachers", type=int, default=250)
    ap.add_argument("--ridge", type=float, nargs="+", default=[1e-3, 1e-2, 1e-1])
    ap.add_argument("--feature-cache", type=Path, help="directory to keep the features in between runs")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    env = Env.from_options(RunOptions(precision="auto", progress=False))
    data = load_data(args.dataset, None, seed=0)
    t0 = time.perf_counter()
    model = create_model(args.model, kind="classifier", in_channels=data.train.channels,
                         num_classes=data.train.num_classes, image_size=data.train.image_size[0])
    if getattr(model, "prior", "none") != "none":
        model.fit_prior()
    cached = args.feature_cache / f"{args.dataset}-{args.model}.pt" if args.feature_cache else None
    if cached is not None and cached.is_file():
        train_f, test_f = torch.load(cached)
    else:
        with_bias = lambda f: torch.cat([f.flatten(1), torch.ones(len(f), 1)], 1)  # noqa: E731
        train_f = with_bias(fixed_features(model, data.train.images, env))
        test_f = with_bias(fixed_features(model, data.test.images, env))
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            torch.save((train_f, test_f), cached)
    feature_seconds = time.perf_counter() - t0
    parts = partition_indices(len(data.train), args.teachers, seed=0)
    size = min(len(p) for p in parts)  # equal partitions here (60,000 / 250); trim any remainder
    idx = torch.stack([p[:size] for p in parts])
    x, y = train_f[idx], data.train.labels[idx]
    rows = []
    for ridge in args.ridge:
        t1 = time.perf_counter()
        w = ridge_heads(x, y, data.train.num_classes, ridge)
        preds = torch.stack([(test_f @ w[t]).argmax(1) for t in range(len(w))])  # [T, N_test]
        counts = F.one_hot(preds, data.train.num_classes).sum(0)
        row = {"model": args.model, "head": "ridge", "ridge": ridge,
               "train_seconds": round(time.perf_counter() - t1, 1),
               "teacher_test_accuracy_mean": round(float((preds == data.test.labels).float().mean()), 4),
               "plurality_test_accuracy": round(float((counts.argmax(1) == data.test.labels).float().mean()), 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {"dataset": args.dataset, "teachers": args.teachers, "partition_size": size,
           "feature_dim": int(train_f.shape[1]), "feature_seconds": round(feature_seconds, 1),
           "device": env.describe(), "rows": rows,
           "note": "evaluation only: reads private labels; nothing released"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
