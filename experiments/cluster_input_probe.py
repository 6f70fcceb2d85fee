"""What the teachers are shown for a cluster vote: DGD's pool is clustered in the baseline's class probabilities
(k = one a class), and each teacher votes once a cluster on (a) its majority label over 100 random members (the
default), (b) the cluster's mean image, (c) its majority over the mean images of 20 sub-clusters, (d) its majority over
Gaussian-blurred members. Every input is computed from public synthetic samples only, so each rule costs what one
query a cluster costs. Reported without noise and at the strict-ε σ: the votes each cluster's baseline class gets,
and how many clusters the (lift) assignment names as the baseline does. Evaluation only: nothing is released.

    flock /tmp/privdistill-cpu.lock .venv/bin/python experiments/cluster_input_probe.py fashion-mnist \
        --out docs/diagnostics/cluster-inputs-fashion-mnist.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from sklearn.cluster import KMeans

from privdistill.data.dataset import to_float
from privdistill.engine.few_label import cluster_votes, name_clusters, reader_probabilities
from privdistill.privacy import calibration
from privdistill.privacy.events import GaussianQueries

sys.path.insert(0, str(Path(__file__).parent))
from few_label_proxy_dgd import dgd_stages  # noqa: E402  (experiments/ is not a package)


def name_clusters_lift(histograms: torch.Tensor) -> torch.Tensor:
    """name_clusters on each class's votes against its mean over the clusters (the teachers' bias taken out)."""
    hist = torch.as_tensor(histograms).double().clamp(min=1)
    hist = torch.log(hist / hist.mean(0, keepdim=True))
    return name_clusters(hist - hist.min())


def majority_histogram(teachers, images: torch.Tensor, env, classes: int) -> np.ndarray:
    """[K] how many teachers name each class as their majority over `images`: the engine's cluster vote, all of
    `images` one cluster."""
    one = torch.zeros(len(images), dtype=torch.long)
    return cluster_votes(teachers, images, one, 1, classes, env, members=len(images))[0].numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--pool", type=int, default=20_000)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--blur", type=float, default=1.0)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    t0 = time.time()
    overrides = {"budget.epsilon": args.epsilon, "run.plan_check": "warn",
                 **dict(o.split("=", 1) for o in args.overrides)}
    prep, baseline, teachers, _, pool = dgd_stages(args.dataset, overrides, f"runs/probe-cluster-inputs-{args.dataset}",
                                                   args.pool)
    env, classes = prep.env, prep.data.num_classes
    probs = reader_probabilities(baseline, pool, env)
    reference = probs.argmax(1)
    km = KMeans(n_clusters=classes, n_init=3, random_state=0).fit(probs)
    sigma = calibration.calibrate_noise(GaussianQueries(sigma=40.0, count=classes), target_epsilon=args.epsilon,
                                        delta=prep.sections["budget"].delta)
    gen = torch.Generator().manual_seed(1)
    rules = ("members", "mean", "sub-means", "blurred")
    hist = {r: np.zeros((classes, classes)) for r in rules}
    truth = np.zeros(classes, dtype=np.int64)
    for c in range(classes):
        inside = np.flatnonzero(km.labels_ == c)
        truth[c] = np.bincount(reference[inside], minlength=classes).argmax()
        members = pool[torch.as_tensor(inside)]
        some = members[torch.randperm(len(members), generator=gen)[:100]]
        hist["members"][c] = majority_histogram(teachers, some, env, classes)
        hist["mean"][c] = majority_histogram(teachers, to_float(members).mean(0, keepdim=True), env, classes)
        sub = KMeans(n_clusters=20, n_init=1, random_state=0).fit(probs[inside]).labels_
        means = torch.stack([to_float(members[torch.as_tensor(sub == s)]).mean(0)
                             for s in range(20) if (sub == s).any()])
        hist["sub-means"][c] = majority_histogram(teachers, means, env, classes)
        hist["blurred"][c] = majority_histogram(teachers, TF.gaussian_blur(to_float(some), [5, 5], [args.blur]), env,
                                                classes)
    out = {"dataset": args.dataset, "epsilon": args.epsilon, "sigma": round(sigma, 2), "baseline_class": truth.tolist(),
           "rules": {}}
    for r in rules:
        h = hist[r]
        row = {"votes_for_baseline_class": [int(h[c, truth[c]]) for c in range(classes)],
               "histograms": h.astype(int).tolist()}
        for lift in (False, True):
            name = name_clusters_lift if lift else name_clusters
            clean = float((name(torch.as_tensor(h)).numpy() == truth).mean())
            noisy = [float((name(torch.as_tensor(h) + sigma * torch.randn(h.shape, generator=torch.Generator()
                                                                          .manual_seed(100 + d)).double()).numpy()
                            == truth).mean()) for d in range(args.draws)]
            row[f"clusters_right{'_lift' if lift else ''}"] = {"clean": clean, "noisy_mean": round(np.mean(noisy), 3)}
        out["rules"][r] = row
        print(r, {k: v for k, v in row.items() if k != "histograms"}, flush=True)
    out["seconds"] = round(time.time() - t0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
