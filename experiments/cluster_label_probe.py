"""Cheap proxy for labelling DGD's pool by clusters: k-means clusters of the pool in the class probabilities of the
model the generator was fitted to, one noisy vote histogram per cluster (each teacher votes its majority label, or
its label shares, over the cluster's members: one changed teacher moves the histogram by at most sqrt(2) in L2, the
sensitivity of one ordinary query), and the clusters named by an assignment that gives every class at least one
cluster (scipy's linear_sum_assignment). Reported against the baseline's label (evaluation only): the share of
clusters named as the baseline names them and the share of the pool whose cluster's name is its baseline label.

The GNMax σ for k cluster queries is calibrated to the strict ε (--epsilon); the noise is plain torch noise (an
evaluation, nothing is released). Stages as in few_label_proxy_dgd.py (run `privdistill dgd -d D` first).

    flock /tmp/privdistill-cpu.lock .venv/bin/python experiments/cluster_label_probe.py mnist --k 10 20 48 \
        --out docs/diagnostics/cluster-labels-mnist.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.cluster import KMeans

from privdistill.data.dataset import to_float
from privdistill.engine.query_selection import read_features
from privdistill.privacy import calibration
from privdistill.privacy.events import GaussianQueries

sys.path.insert(0, str(Path(__file__).parent))
from few_label_proxy_dgd import dgd_stages  # noqa: E402  (experiments/ is not a package)

from privdistill.engine.few_label import name_clusters  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--k", type=int, nargs="+", default=[10, 20, 48])
    ap.add_argument("--members", type=int, default=100)
    ap.add_argument("--pool", type=int, default=20_000)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--draws", type=int, default=5, help="noise draws per k")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    t0 = time.time()
    overrides = {"budget.epsilon": args.epsilon, "run.plan_check": "warn",
                 **dict(o.split("=", 1) for o in args.overrides)}
    prep, baseline, teachers, _, pool = dgd_stages(args.dataset, overrides, f"runs/probe-cluster-labels-{args.dataset}",
                                                   args.pool)
    env, classes = prep.env, prep.data.num_classes
    probs = read_features(baseline, pool, env, project_to=8, rng=torch.Generator())[0].softmax(1)
    reference = probs.argmax(1).numpy()
    rows = []
    for k in args.k:
        sigma = calibration.calibrate_noise(GaussianQueries(sigma=40.0, count=k), target_epsilon=args.epsilon,
                                            delta=prep.sections["budget"].delta)
        km = KMeans(n_clusters=k, n_init=3, random_state=0).fit(probs.double().numpy())
        gen = torch.Generator().manual_seed(1)
        hard, soft, truth = np.zeros((k, classes)), np.zeros((k, classes)), np.zeros(k, dtype=np.int64)
        for c in range(k):
            members = np.flatnonzero(km.labels_ == c)
            take = torch.as_tensor(members)[torch.randperm(len(members), generator=gen)[:args.members]]
            preds = torch.cat([teachers.predictions(env.place_batch(to_float(x))).cpu()
                               for x in torch.split(pool[take], 200)], dim=1)  # [teachers, members]
            shares = torch.nn.functional.one_hot(preds, classes).float().mean(1)  # [teachers, K]
            hard[c] = torch.bincount(shares.argmax(1), minlength=classes).numpy()
            soft[c] = shares.sum(0).numpy()
            truth[c] = np.bincount(reference[members], minlength=classes).argmax()
        size = np.bincount(km.labels_, minlength=k)
        purity = sum((reference[km.labels_ == c] == truth[c]).sum() for c in range(k)) / len(reference)
        row = {"k": k, "sigma": round(sigma, 2), "purity": round(float(purity), 4)}
        if k <= 20:  # per cluster: its baseline class, size and the teachers' majority votes
            row["clusters"] = [{"baseline": int(truth[c]), "size": int(size[c]), "votes": hard[c].astype(int).tolist()}
                               for c in range(k)]
        for name, hist in (("hard", hard), ("soft", soft)):
            for noisy in (False, True):
                right_c, right_p = [], []
                for d in range(args.draws if noisy else 1):
                    g = torch.Generator().manual_seed(100 + d)
                    h = hist + (sigma * torch.randn(hist.shape, generator=g).numpy() if noisy else 0)
                    h = torch.as_tensor(h)
                    # lift: each class's votes against its mean over the clusters (the teachers' bias taken out)
                    lift = torch.log(h.clamp(min=1) / h.clamp(min=1).mean(0, keepdim=True))
                    for rule, named in (("argmax", h.argmax(1)), ("assign", name_clusters(h)),
                                        ("assign-lift", name_clusters(lift - lift.min()))):
                        named = np.asarray(named)
                        right_c.append((rule, float((named == truth).mean())))
                        right_p.append((rule, float(size[named == truth].sum() / size.sum())))
                for rule in ("argmax", "assign", "assign-lift"):
                    key = f"{name}-{'noisy' if noisy else 'clean'}-{rule}"
                    row[key] = {"clusters_right": round(np.mean([v for r, v in right_c if r == rule]), 4),
                                "pool_right": round(np.mean([v for r, v in right_p if r == rule]), 4)}
        rows.append(row)
        print(json.dumps({key: v for key, v in row.items() if key != "clusters"}), flush=True)
    out = {"dataset": args.dataset, "overrides": args.overrides, "epsilon": args.epsilon, "members": args.members,
           "rows": rows, "seconds": round(time.time() - t0)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
