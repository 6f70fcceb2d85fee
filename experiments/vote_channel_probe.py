"""Probe (issue 24): which vote channel teaches DGD's student most from a generator's samples at one strict ε?

DGD's Laplace votes (1300 queries, b = 40) and DGD+'s Gaussian ones (GNMax, σ = 40: 2547 queries at the same
strict ε 9.34) label random synthetic samples, most of which the 250 teachers split on: the noise then flips many
labels. PATE 2018's Confident-GNMax answers only the samples on which the noisy top vote clears a threshold, and
its checks are cheap (σ1 = 150). This script draws a pool from a generator stage, counts the votes of a cached
teacher stage, and for each channel releases labels through the real mechanism (privacy/mechanisms.py) until
the strict ε of the channel reaches the target, then trains a paper-CNN student on the labelled samples alone
(DGD's student without its unsupervised terms) and reports its real test accuracy. Evaluation only: nothing is
released (the votes are the private teachers', read here for a simulation).

    flock /tmp/privdistill-cpu.lock python experiments/vote_channel_probe.py --generator STAGE --teachers STAGE \
        --pool 10000 --epsilon 9.34 --out docs/diagnostics/vote-channel-probe-mnist.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from privdistill.config import ClassifierTraining, RunOptions
from privdistill.data import load_data
from privdistill.data.dataset import ImageDataset, to_float
from privdistill.engine import Env, RunDir
from privdistill.engine.datafree import generate
from privdistill.engine.ensemble import TeacherEnsemble
from privdistill.engine.trainer import evaluate, train_classifier
from privdistill.models import create_model
from privdistill.privacy import mechanisms
from privdistill.privacy.accounting import epsilon
from privdistill.privacy.events import ConfidentGaussianQueries, GaussianQueries, LaplaceQueries


def student_accuracy(images, labels, data, env: Env, steps: int, seed: int = 0) -> float:
    torch.manual_seed(seed)
    model = create_model("paper-cnn", kind="classifier", in_channels=data.train.channels,
                         num_classes=data.train.num_classes, image_size=data.train.image_size[0])
    cfg = ClassifierTraining(steps=steps, batch_size=128, lr=1e-3, eval_every_epochs=1e9)
    train_classifier(model, ImageDataset(images, labels, data.train.num_classes, name="probe"), cfg=cfg, env=env)
    return evaluate(model, data.test, env)


def largest_prefix(event_of, n_max: int, target: float, delta: float) -> int:
    """The most queries n <= n_max whose event (event_of(n)) stays within the strict target ε (bisection)."""
    lo, hi = 0, n_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if epsilon(event_of(mid), delta=delta).value <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--generator", required=True)
    ap.add_argument("--teachers", required=True, help="teachers stage directory (teachers.safetensors)")
    ap.add_argument("--baseline", help="baseline stage: report how often each channel's labels equal its labels")
    ap.add_argument("--pool", type=int, default=10000)
    ap.add_argument("--epsilon", type=float, default=9.34, help="strict ε of the vote channel")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--thresholds", type=float, nargs="*", default=[150.0, 200.0])
    ap.add_argument("--sigma1", type=float, default=150.0)
    ap.add_argument("--sigma2", type=float, default=40.0)
    ap.add_argument("--sigmas", type=float, nargs="*", default=[], help="more GNMax sigmas to compare")
    ap.add_argument("--channels", nargs="*", default=["lnmax", "gnmax", "confident"],
                    help="lnmax, gnmax, confident, confident-filter (with confident: the same budget under a filter)")
    ap.add_argument("--cache", type=Path, help="file keeping the pool and its votes between calls")
    ap.add_argument("--student-steps", type=int, default=500)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    env = Env.from_options(RunOptions(precision="auto", progress=False))
    data = load_data(args.dataset, None, seed=0)
    k = data.train.num_classes
    num_teachers = TeacherEnsemble.load(Path(args.teachers) / "teachers.safetensors").num_teachers
    if args.cache is not None and args.cache.is_file():  # the pool and its votes from an earlier call
        pool, votes = torch.load(args.cache).values()
    else:
        generator = RunDir.existing(args.generator).load_weights("generator", device=env.device).eval()
        pool = generate(generator, args.pool, env)
        ensemble = TeacherEnsemble.load(Path(args.teachers) / "teachers.safetensors", env.device)
        t0 = time.perf_counter()
        with torch.no_grad(), env.autocast():  # place_batch: channels-last, as DGD's own aggregation
            votes = torch.cat([ensemble.votes(env.place_batch(to_float(pool[i:i + 500])), num_classes=k).cpu()
                               for i in range(0, len(pool), 500)])
        print(f"votes of {num_teachers} teachers on {len(pool)} samples in {time.perf_counter() - t0:.0f} s",
              flush=True)
        if args.cache is not None:
            torch.save({"pool": pool, "votes": votes}, args.cache)
    base = None
    if args.baseline:
        baseline = RunDir.existing(args.baseline).load_weights("model", device=env.device).eval()
        with torch.no_grad():
            base = torch.cat([baseline(to_float(pool[i:i + 500])).argmax(-1) for i in range(0, len(pool), 500)])
    plurality = votes.argmax(1)
    rng = torch.Generator().manual_seed(7)
    rows = []

    def record(name, idx, labels, event):
        eps = epsilon(event, delta=args.delta).value
        row = {"channel": name, "queries_labelled": len(idx), "strict_epsilon": round(eps, 3),
               "labels_equal_plurality": round(float((labels == plurality[idx]).float().mean()), 4),
               "mean_top_vote_share": round(float(votes[idx].max(1).values.float().mean() / num_teachers), 4),
               "student_test_accuracy": round(student_accuracy(pool[idx], labels, data, env, args.student_steps), 4)}
        if base is not None:
            row["labels_equal_baseline"] = round(float((labels == base[idx]).float().mean()), 4)
        rows.append(row)
        print(json.dumps(row), flush=True)

    order = torch.randperm(len(pool), generator=rng)

    def gnmax_row(sigma: float, name: str) -> None:
        n = largest_prefix(lambda m: GaussianQueries(sigma=sigma, count=max(m, 1)), len(pool), args.epsilon, args.delta)
        idx = order[:n]
        record(name, idx, mechanisms.gnmax(votes[idx], sigma=sigma, generator=rng),
               GaussianQueries(sigma=sigma, count=n))

    if "lnmax" in args.channels:
        n = largest_prefix(lambda m: LaplaceQueries(scale=40.0, count=max(m, 1)), len(pool), args.epsilon, args.delta)
        idx = order[:n]
        record("lnmax b=40 (DGD)", idx, mechanisms.lnmax(votes[idx], scale=40.0, generator=rng),
               LaplaceQueries(scale=40.0, count=n))
    if "gnmax" in args.channels:
        gnmax_row(args.sigma2, f"gnmax sigma={args.sigma2:g} (DGD+)")
    for sigma in args.sigmas:
        gnmax_row(sigma, f"gnmax sigma={sigma:g}")
    for threshold in args.thresholds if "confident" in args.channels else []:
        labels, answered = mechanisms.confident_gnmax(votes[order], threshold=threshold, sigma1=args.sigma1,
                                                      sigma2=args.sigma2, generator=rng)
        answered_before = torch.cumsum(answered.long(), 0)

        def event(m, threshold=threshold):
            m = max(m, 1)
            return ConfidentGaussianQueries(threshold=threshold, sigma1=args.sigma1, sigma2=args.sigma2, count=m,
                                         answered=int(answered_before[m - 1]))

        checks = largest_prefix(event, len(pool), args.epsilon, args.delta)
        keep = answered[:checks]
        record(f"confident-gnmax T={threshold:g} sigma1={args.sigma1:g} sigma2={args.sigma2:g} "
               f"({checks} checks)", order[:checks][keep], labels[:checks][keep], event(checks))
        if "confident-filter" in args.channels:  # the same worst-case count as an RDP filter's budget
            labels, answered, asked, _ = mechanisms.filtered_confident_gnmax(
                votes[order], threshold=threshold, sigma1=args.sigma1, sigma2=args.sigma2, filter_budget=checks,
                generator=rng)
            keep = answered[:asked]
            record(f"confident-gnmax under an RDP filter T={threshold:g} sigma1={args.sigma1:g} "
                   f"sigma2={args.sigma2:g} (budget {checks}, {asked} checks)", order[:asked][keep],
                   labels[:asked][keep], ConfidentGaussianQueries(threshold=threshold, sigma1=args.sigma1,
                                                               sigma2=args.sigma2, count=asked,
                                                               answered=int(keep.sum()), filter_budget=checks))
    out = {"dataset": args.dataset, "generator": args.generator, "teachers": args.teachers, "pool": len(pool),
           "target_strict_epsilon": args.epsilon, "delta": args.delta, "device": env.describe(),
           "student": f"paper-cnn, {args.student_steps} steps of 128, Adam 1e-3, labelled queries only",
           "rows": rows, "note": "evaluation only: simulates each channel on the private teachers' votes"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
