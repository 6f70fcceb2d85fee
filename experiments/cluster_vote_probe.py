"""Can the teachers read DGD's synthetic samples? Per sample, and per cluster (each teacher's majority over a
cluster's members: one vote a teacher a cluster, so a cluster query has the sensitivity of one ordinary query).

The stages are those of a `privdistill dgd -d D` run (the default recipe, or --set overrides such as
generator.adversarial_weight=0 for class-targeted prototypes); the pool is clustered (k-means, k = --k) in the space
of the non-private baseline's class probabilities; --members samples of each cluster are read by every teacher.
Reported against the baseline's label (the generator's source: what the sample was made to be), evaluation only:
each teacher's agreement per sample, the plurality's per sample, and per cluster the plurality of the teachers'
per-cluster majorities, plus how concentrated those votes are (the top class's share of the teachers).

    flock /tmp/privdistill-cpu.lock .venv/bin/python experiments/cluster_vote_probe.py mnist \
        --set generator.adversarial_weight=0 --set dgd.num_synthetic=60000 \
        --out docs/diagnostics/cluster-votes-mnist-prototypes.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from sklearn.cluster import KMeans

from privdistill.data.dataset import to_float
from privdistill.engine.query_selection import read_features

sys.path.insert(0, str(Path(__file__).parent))
from few_label_proxy_dgd import dgd_stages  # noqa: E402  (experiments/ is not a package)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--k", type=int, default=48)
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--pool", type=int, default=20_000)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    t0 = time.time()
    overrides = {"budget.epsilon": 1.0, "run.plan_check": "warn", **dict(o.split("=", 1) for o in args.overrides)}
    prep, baseline, teachers, _, pool = dgd_stages(args.dataset, overrides, f"runs/probe-cluster-votes-{args.dataset}",
                                                   args.pool)
    env = prep.env
    probs = read_features(baseline, pool, env, project_to=8, rng=torch.Generator())[0].softmax(1)
    reference = probs.argmax(1)
    km = KMeans(n_clusters=args.k, n_init=1, random_state=0).fit(probs.double().numpy())
    labels = torch.as_tensor(km.labels_).long()
    gen = torch.Generator().manual_seed(1)
    chosen, owner = [], []
    for c in range(args.k):
        members = (labels == c).nonzero().squeeze(1)
        take = members[torch.randperm(len(members), generator=gen)[:args.members]]
        chosen.append(take)
        owner += [c] * len(take)
    idx, owner = torch.cat(chosen), torch.tensor(owner)
    # [teachers, n] per batch -> [samples, teachers]
    preds = torch.cat([teachers.predictions(env.place_batch(to_float(x))).cpu() for x in torch.split(pool[idx], 200)],
                      dim=1).T
    k_classes = prep.data.num_classes
    per_teacher = (preds == reference[idx].unsqueeze(1)).float().mean(0)  # [teachers]
    votes = torch.nn.functional.one_hot(preds, k_classes).sum(1)  # [samples, K]
    plurality = votes.argmax(1)
    clusters = []
    for c in range(args.k):
        rows = preds[owner == c]  # [members, teachers]
        majority = torch.mode(rows, dim=0).values  # each teacher's label for the cluster
        hist = torch.bincount(majority, minlength=k_classes)
        truth = torch.mode(reference[idx][owner == c]).values
        clusters.append({"cluster": c, "baseline_label": int(truth), "plurality": int(hist.argmax()),
                         "top_share": round(float(hist.max()) / len(majority), 3),
                         "sample_plurality_right": round(float((plurality[owner == c] == truth).float().mean()), 3)})
    out = {"dataset": args.dataset, "overrides": args.overrides, "k": args.k, "members": args.members,
           "teacher_agreement_per_sample": {"mean": round(float(per_teacher.mean()), 4),
                                            "best": round(float(per_teacher.max()), 4)},
           "plurality_agreement_per_sample": round(float((plurality == reference[idx]).float().mean()), 4),
           "plurality_top_share_per_sample": round(float((votes.max(1).values / preds.shape[1]).mean()), 4),
           "cluster_plurality_right": round(sum(c["plurality"] == c["baseline_label"] for c in clusters) / args.k, 4),
           "cluster_top_share": round(sum(c["top_share"] for c in clusters) / args.k, 4),
           "clusters": clusters, "seconds": round(time.time() - t0)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "clusters"}, indent=1))


if __name__ == "__main__":
    main()
