"""Cheap proxy for the few-label student: how far k *noisy* teacher answers go when the queries are the medoids of
the pool's clusters and the answers are propagated over the pool by label spreading.

For PATE's setting (the pool is the held-out public slice, the teachers are the quick preset's 250 on the private
rest, the stage the `pate` run caches): for each k, the GNMax σ that k queries cost at the strict ε (replace-one,
the project's accountant) is calibrated, the k queries are chosen (random or k-means medoids in a data-independent
feature space: normalised ScatterNet J = 2 coefficients -> PCA), answered by the real teachers' votes plus
Gaussian noise (plain torch noise: an evaluation, nothing is released), propagated by scikit-learn's
LabelSpreading, and a linear student on the scattering coefficients is trained on the propagated labels. Reported
per k: the answers' accuracy, the propagated labels' accuracy on the pool, the student's test accuracy, and the
supervised-only student (the k answers alone).

    flock /tmp/privdistill-cpu.lock .venv/bin/python experiments/few_label_proxy.py pate mnist \
        --epsilon 1 --k 10 27 48 100 200 300 1000 3000 --out docs/diagnostics/few-label-pate-mnist.json
    .venv/bin/python experiments/few_label_proxy.py --plot docs/figures/few-label-pate.png \
        docs/diagnostics/few-label-pate-*.json      # the curves, one panel per file
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from privdistill.engine.cache import StageCache
from privdistill.engine.features import fixed_features
from privdistill.engine.few_label import embed_pool, medoid_queries, spread_labels
from privdistill.engine.holdout import holdout_split
from privdistill.engine.stages import Stages
from privdistill.methods.common import RunRequest, prepare_run
from privdistill.methods.pate import PATEMethod
from privdistill.methods.runner import Budget
from privdistill.models.scatternet import ScatterNet
from privdistill.privacy import calibration
from privdistill.privacy.events import GaussianQueries


def linear_student(x: torch.Tensor, y: torch.Tensor, xt: torch.Tensor, yt: torch.Tensor, *, soft: torch.Tensor | None,
                   epochs: int = 30, seed: int = 0) -> float:
    torch.manual_seed(seed)
    head = torch.nn.Linear(x.shape[1], int(yt.max()) + 1)
    opt = torch.optim.Adam(head.parameters(), lr=1e-3, weight_decay=1e-5)
    n = len(x)
    steps = max(200, epochs * n // 128)
    for step in range(steps):
        idx = torch.randint(0, n, (min(128, n),))
        logits = head(x[idx])
        loss = (-(soft[idx] * logits.log_softmax(1)).sum(1).mean() if soft is not None
                else F.cross_entropy(logits, y[idx]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        return float((head(xt).argmax(1) == yt).float().mean())


def plot(out: Path, files: list[Path]) -> None:
    """One panel per proxy file: test accuracy of the linear student against k, random and medoid queries, with
    the propagated labels' accuracy dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(files), figsize=(5 * len(files), 3.6), squeeze=False)
    for ax, path in zip(axes[0], files):
        doc = json.loads(path.read_text())
        for rule, colour in (("random", "tab:grey"), ("medoids", "tab:blue")):
            rows = [r for r in doc["rows"] if r["rule"] == rule]
            ks = [r["k"] for r in rows]
            ax.plot(ks, [100 * r["student_hard"] for r in rows], "o-", color=colour, label=f"{rule}: student")
            ax.plot(ks, [100 * r["propagated_right"] for r in rows], "--", color=colour, label=f"{rule}: spread labels")
            ax.plot(ks, [100 * r["supervised_only"] for r in rows], ":", color=colour, label=f"{rule}: k labels alone")
        ax.axhline(100 * doc["student_all_true_labels"], color="k", lw=0.8, label="every true label")
        ax.set_xscale("log")
        ax.set_xlabel(f"queries k (GNMax σ calibrated to strict ε {doc['epsilon']:g} for k)")
        ax.set_ylabel("accuracy %")
        ax.set_title(f"{doc['method'].upper()} {doc['dataset']}: pool of {doc['pool']:,}")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--plot":
        return plot(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("method", choices=["pate"])
    ap.add_argument("dataset")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--k", type=int, nargs="+", default=[10, 27, 48, 100, 300, 1000, 3000])
    ap.add_argument("--pca", type=int, default=64)
    ap.add_argument("--neighbours", type=int, default=10)
    ap.add_argument("--alpha", type=float, default=0.2)
    ap.add_argument("--rules", nargs="+", default=["random", "medoids"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    t0 = time.time()
    req = RunRequest(dataset=args.dataset, overrides={"budget.epsilon": args.epsilon, "run.plan_check": "warn"},
                     run_dir=f"runs/proxy-few-label-{args.method}-{args.dataset}-eps{args.epsilon:g}")
    prep = prepare_run("pate", req, {"budget": Budget, **PATEMethod.sections})
    stages = Stages(StageCache(enabled=True), prep.env, prep.data, prep.run)
    private, public = holdout_split(prep.data, prep.sections["pate"].holdout, prep.env)
    teachers, _ = stages.teachers_on(private, prep.sections["teachers"])
    # the 250 teachers' votes on the pool: minutes of CPU, kept for a rerun at another ε
    saved = Path(f"runs/proxy-few-label-{args.method}-{args.dataset}-votes.pt")
    if saved.is_file():
        votes = torch.load(saved)
    else:
        votes = torch.cat(list(teachers.iter_votes(public.images, prep.env))).double()
        torch.save(votes, saved)
    truth = public.labels.long()
    print(f"teachers ready ({time.time() - t0:.0f} s); plurality right on the pool: "
          f"{float((votes.argmax(1) == truth).float().mean()):.4f}", flush=True)

    net = ScatterNet(public.images.shape[1], 10, tuple(public.images.shape[2:]))
    s_pool = fixed_features(net, public.images, prep.env).flatten(1)
    s_test = fixed_features(net, prep.data.test.images, prep.env).flatten(1)
    z = embed_pool(public.images, prep.env, dims=args.pca)  # the package's embedding, queries and spreading
    # the student reads the whole scattering (a linear head, as the DP-SGD default's), standardised on the pool
    m, s = s_pool.mean(0), s_pool.std(0) + 1e-6
    x_pool, x_test = (s_pool - m) / s, (s_test - m) / s
    y_test = prep.data.test.labels.long()
    full = linear_student(x_pool, truth, x_test, y_test, soft=None)
    print(f"features ready ({time.time() - t0:.0f} s); student on all {len(truth)} true labels: {full:.4f}", flush=True)

    rows = []
    gen = torch.Generator().manual_seed(args.seed)
    for k in args.k:
        sigma = calibration.calibrate_noise(GaussianQueries(sigma=40.0, count=k), target_epsilon=args.epsilon,
                                            delta=args.delta, accounting="strict")
        for rule in args.rules:
            t = time.time()
            idx = (torch.randperm(len(z), generator=gen)[:k].numpy() if rule == "random"
                   else medoid_queries(z, k, seed=args.seed).numpy())
            noisy = votes[idx] + sigma * torch.randn(len(idx), votes.shape[1], generator=gen, dtype=torch.float64)
            answers = noisy.argmax(1)
            dist = spread_labels(z, torch.as_tensor(idx), answers, int(truth.max()) + 1,
                                 neighbours=args.neighbours, alpha=args.alpha)
            propagated = dist.argmax(1)
            row = {"k": k, "rule": rule, "sigma": round(sigma, 2), "queries": len(idx),
                   "answers_right": round(float((answers == truth[idx]).float().mean()), 4),
                   "propagated_right": round(float((propagated == truth).float().mean()), 4),
                   "student_hard": round(linear_student(x_pool, propagated, x_test, y_test, soft=None), 4),
                   "student_soft": round(linear_student(x_pool, propagated, x_test, y_test, soft=dist), 4),
                   "supervised_only": round(linear_student(x_pool[idx], answers, x_test, y_test, soft=None), 4),
                   "seconds": round(time.time() - t, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"method": args.method, "dataset": args.dataset, "epsilon": args.epsilon,
                                    "delta": args.delta, "pool": len(z), "pca": args.pca,
                                    "neighbours": args.neighbours, "alpha": args.alpha,
                                    "student_all_true_labels": round(full, 4), "rows": rows,
                                    "seconds": round(time.time() - t0)}, indent=1) + "\n")


if __name__ == "__main__":
    main()
