"""Cheap proxy for DGD's few-label student: does DGD's own synthetic pool cluster by class, in which feature space,
and how far do k noisy teacher answers go when spread over it?

The pool, the baseline the generator was fitted to and the 250 teachers are the stages a `privdistill dgd -d D -e ε`
run of the default recipe caches (run that first: the generator is the expensive part). A random subsample of the
pool (--pool) stands for it. The synthetic samples have no true label: the reference is the non-private
baseline's label (the class the generator's source sees; evaluation only, nothing here is released). For each
feature space (`scatter`: normalised ScatterNet -> PCA, data-independent; `baseline`: the baseline's backbone
features through a fixed random projection -> PCA, the model the default recipe's query rule already reads;
`logits`: its class probabilities), each
k and each query rule (random; medoids: k-means medoids in that space), the GNMax σ that k queries cost at the
strict ε is calibrated, the queries are answered by the real teachers' votes plus Gaussian noise (plain torch
noise: an evaluation), the answers are spread by LabelSpreading, and reported: the answers' agreement with the
reference, the spread labels' agreement over the pool, the share of the pool whose k-means cluster's majority
reference label is its own (how well the space clusters by class at this k), and a linear head on the embedding
trained on the spread labels and scored on the REAL test set (embedded with the pool's PCA).

    flock /tmp/privdistill-cpu.lock .venv/bin/python experiments/few_label_proxy_dgd.py mnist \
        --k 10 27 48 100 300 1000 --out docs/diagnostics/few-label-dgd-mnist.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA

from privdistill.engine.cache import StageCache
from privdistill.engine.features import fixed_features
from privdistill.engine.few_label import READER_PROJECTION, medoid_queries, spread_labels
from privdistill.engine.query_selection import read_features
from privdistill.engine.stages import Stages, file_digest
from privdistill.methods.common import RunRequest, prepare_run
from privdistill.methods.dgd import DGDMethod
from privdistill.methods.runner import Budget
from privdistill.models.scatternet import ScatterNet
from privdistill.privacy import calibration
from privdistill.privacy.events import GaussianQueries


def dgd_stages(dataset: str, overrides: dict, run_dir: str, pool_size: int):
    """The stages a `privdistill dgd -d DATASET` run with `overrides` caches (built here if absent): the prepared run,
    the baseline, the teachers, the whole synthetic pool, and a fixed random `pool_size` of it."""
    prep = prepare_run("dgd", RunRequest(dataset=dataset, overrides=overrides, run_dir=run_dir),
                       {"budget": Budget, **DGDMethod.sections})
    sec = prep.sections
    stages = Stages(StageCache(enabled=True), prep.env, prep.data, prep.run)
    baseline, bstage = stages.baseline(sec["baseline"])
    generator, gstage = stages.generator(baseline, file_digest(bstage.path / "model.safetensors"), sec["generator"])
    full, _ = stages.synthetic(generator, gstage, sec["dgd"].num_synthetic or len(prep.data.train))
    teachers, _ = stages.teachers(sec["teachers"])
    pool = full[torch.randperm(len(full), generator=torch.Generator().manual_seed(0))[:pool_size]]
    return prep, baseline, teachers, full, pool


def embed(space: str, pool: torch.Tensor, test: torch.Tensor, baseline, env, dims: int) -> tuple[np.ndarray, ...]:
    if space == "logits":  # the baseline's class probabilities: its own labels, nearly
        def read(x: torch.Tensor) -> torch.Tensor:
            return read_features(baseline, x, env, project_to=8, rng=torch.Generator())[0].softmax(1)
        a, b = read(pool), read(test)
        return _standardise(a.double().numpy(), b.double().numpy())
    if space == "scatter":
        net = ScatterNet(pool.shape[1], 2, tuple(pool.shape[2:]))
        a, b = fixed_features(net, pool, env).flatten(1), fixed_features(net, test, env).flatten(1)
    else:
        a = read_features(baseline, pool, env, project_to=READER_PROJECTION, rng=torch.Generator().manual_seed(0))[1]
        b = read_features(baseline, test, env, project_to=READER_PROJECTION, rng=torch.Generator().manual_seed(0))[1]
    pca = PCA(dims, random_state=0, svd_solver="randomized").fit(a.double().numpy())
    return _standardise(pca.transform(a.double().numpy()), pca.transform(b.double().numpy()))


def _standardise(za: np.ndarray, zb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m, s = za.mean(0), za.std(0) + 1e-8
    return (za - m) / s, (zb - m) / s


def linear_head(x: np.ndarray, soft: torch.Tensor, xt: np.ndarray, yt: torch.Tensor, steps: int = 1500) -> float:
    torch.manual_seed(0)
    x, xt = torch.as_tensor(x).float(), torch.as_tensor(xt).float()
    head = torch.nn.Linear(x.shape[1], soft.shape[1])
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (256,))
        loss = -(soft[idx] * F.log_softmax(head(x[idx]), 1)).sum(1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float((head(xt).argmax(1) == yt).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--pool", type=int, default=20_000)
    ap.add_argument("--k", type=int, nargs="+", default=[10, 27, 48, 100, 300, 1000])
    ap.add_argument("--spaces", nargs="+", default=["scatter", "baseline"])
    ap.add_argument("--rules", nargs="+", default=["random", "medoids"])
    ap.add_argument("--pca", type=int, default=64)
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="section.key=value for the stages (e.g. generator.adversarial_weight=0)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    t0 = time.time()
    overrides = {"budget.epsilon": args.epsilon, "run.plan_check": "warn",
                 **dict(o.split("=", 1) for o in args.overrides)}
    prep, baseline, teachers, full_pool, pool = dgd_stages(args.dataset, overrides,
                                                           f"runs/proxy-few-label-dgd-{args.dataset}", args.pool)
    env = prep.env
    reference = read_features(baseline, pool, env, project_to=8, rng=torch.Generator().manual_seed(0))[0].argmax(1)
    test = prep.data.test
    k_classes = prep.data.num_classes
    print(f"stages ready ({time.time() - t0:.0f} s): pool {len(full_pool)} -> {len(pool)}; reference classes "
          f"{torch.bincount(reference, minlength=k_classes).tolist()}", flush=True)

    rows, spaces = [], {}
    for space in args.spaces:
        z, zt = embed(space, pool, test.images, baseline, env, args.pca)
        ceiling = linear_head(z, F.one_hot(reference, k_classes).float(), zt, test.labels.long())
        spaces[space] = {"every_reference_label_linear_test": round(ceiling, 4)}
        print(f"{space}: embedded ({time.time() - t0:.0f} s); linear head on every reference label: {ceiling:.4f}",
              flush=True)
        gen = torch.Generator().manual_seed(0)
        for k in args.k:
            sigma = calibration.calibrate_noise(GaussianQueries(sigma=40.0, count=k), target_epsilon=args.epsilon,
                                                delta=args.delta, accounting="strict")
            km = KMeans(n_clusters=k, n_init=1, random_state=0).fit(z)
            majority = torch.zeros(k, dtype=torch.long)
            for c in range(k):
                members = reference[torch.as_tensor(km.labels_ == c)]
                majority[c] = torch.bincount(members, minlength=k_classes).argmax() if len(members) else 0
            purity = float((majority[torch.as_tensor(km.labels_).long()] == reference).float().mean())
            for rule in args.rules:
                t = time.time()
                idx = (torch.randperm(len(z), generator=gen)[:k] if rule == "random" else medoid_queries(z, k))
                votes = torch.cat(list(teachers.iter_votes(pool[idx], env))).double()
                answers = (votes + sigma * torch.randn(votes.shape, generator=gen, dtype=torch.float64)).argmax(1)
                dist = spread_labels(z, idx, answers, k_classes)
                row = {"space": space, "k": k, "rule": rule, "sigma": round(sigma, 2),
                       "cluster_purity": round(purity, 4),
                       "plurality_agrees_reference": round(float((votes.argmax(1) == reference[idx]).float().mean()),
                                                           4),
                       "answers_agree_reference": round(float((answers == reference[idx]).float().mean()),
                                                        4),
                       "spread_agree_reference": round(float((dist.argmax(1) == reference).float().mean()), 4),
                       "linear_test": round(linear_head(z, dist, zt, test.labels.long()), 4),
                       "seconds": round(time.time() - t, 1)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"method": "dgd", "dataset": args.dataset, "epsilon": args.epsilon,
                                    "delta": args.delta, "pool": len(pool), "pool_full": len(full_pool),
                                    "pca": args.pca, "overrides": args.overrides, "spaces": spaces, "rows": rows,
                                    "seconds": round(time.time() - t0)}, indent=1) + "\n")


if __name__ == "__main__":
    main()
