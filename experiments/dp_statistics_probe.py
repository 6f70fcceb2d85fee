"""Probe (issues 24 and 26): can a generator fitted to a DP source make samples that teach, if it also matches
feature statistics estimated under DP?

A DP-SGD ScatterNet model (`privdistill dpsgd --config scatternet`) has no BatchNorm layer, so DeepInversion's
BN-statistics prior (the adversarial overlay's generator) has nothing to match, and a generator fitted to the
DP model alone makes samples that teach a student 17 % (DGD end to end, docs/research-log.md). Here the mean and
variance of each of the source's 3,969 normalised scattering features over the private training set are
released once by the Gaussian mechanism (privacy.mechanisms.gaussian_feature_statistics: replace-one L2
sensitivity 2), carried by an identity BatchNorm layer (engine.datafree.WithFeatureStatistics) so the engine's
BN-statistics loss matches them, and the adversarial overlay's generator is fitted to the source. This probe chose
the design of `srr --privacy end-to-end` (docs/research-log.md, "Strict end to end").
Reported: the ceiling (a paper CNN trained 3 epochs only on samples labelled by the DP source) against the
source's own test accuracy. Evaluation only: nothing here is released (the statistics' ε is printed, not spent).

    flock /tmp/privdistill-cpu.lock python experiments/dp_statistics_probe.py --source runs/probe-src-mnist \
        --dataset mnist --noise 30 --out /tmp/probe.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from privdistill.config import RunOptions, resolve_sections
from privdistill.data import load_data
from privdistill.engine import Env, RunDir
from privdistill.engine.datafree import GeneratorTraining, WithFeatureStatistics, generate, train_generator
from privdistill.engine.stages import fixed_features
from privdistill.engine.synthesis import synthesis_quality
from privdistill.engine.trainer import evaluate
from privdistill.privacy.accounting import pld_poisson_gaussian_replace_one
from privdistill.privacy.mechanisms import SQUARE_CLIP, gaussian_feature_statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, required=True, help="a privdistill dpsgd run directory (scatter-linear)")
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--noise", type=float, default=30.0, help="noise multiplier of the statistics (0: none)")
    ap.add_argument("--config", default="adversarial")
    ap.add_argument("--square-clip", type=float, default=SQUARE_CLIP)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    sections = resolve_sections({"run": RunOptions, "generator": GeneratorTraining}, preset="quick",
                                dataset=args.dataset, config_file=args.config,
                                overrides=args.overrides + ["run.progress=false"])
    env = Env.from_options(sections["run"])
    data = load_data(args.dataset, None, seed=0)
    source = RunDir(args.source).load_weights("model").eval()
    row = {"dataset": args.dataset, "source": str(args.source), "noise_multiplier": args.noise,
           "source_test_accuracy": round(evaluate(source, data.test, env), 4)}
    t0 = time.perf_counter()
    feats = fixed_features(source, data.train.images, env).flatten(1)
    if args.noise > 0:
        mean, var = gaussian_feature_statistics(feats, noise_multiplier=args.noise, square_clip=args.square_clip,
                                                generator=torch.Generator().manual_seed(1))
        # one DP-SGD step at q = 1 (replace-one PLD), as the ledger prices it
        row["statistics_epsilon_at_1e-5"] = round(pld_poisson_gaussian_replace_one(args.noise, 1.0, 1, 1e-5), 4)
    else:
        mean, var = feats.mean(0), feats.var(0, unbiased=False)
    row["statistics_error"] = {"mean": round(float((mean - feats.mean(0)).abs().mean()), 4),
                               "var": round(float((var - feats.var(0, unbiased=False)).abs().mean()), 4)}
    fitted_to = WithFeatureStatistics(source, mean, var)
    gcfg: GeneratorTraining = sections["generator"]
    t1 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        generator, stats = train_generator(fitted_to, gcfg, env, channels=data.channels,
                                           image_size=data.image_size[0], run=RunDir.open(Path(tmp) / "g", config={}),
                                           num_classes=data.num_classes)
    row["generator_minutes"] = round((time.perf_counter() - t1) / 60, 2)
    row["generator_final"] = stats["final"]
    pool = generate(generator, args.samples, env)
    row.update(synthesis_quality(pool, source, env, num_classes=data.num_classes, ceiling_test=data.test))
    row["minutes"] = round((time.perf_counter() - t0) / 60, 2)
    row["generator_overrides"] = args.overrides
    print(json.dumps(row))
    args.out.write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    main()
