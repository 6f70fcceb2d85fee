"""Diagnostic for DGD's label channel (issue 5): do teachers trained longer agree more with the baseline on
the generator's samples?

DGD queries 250 teachers, each trained on 240 private images, on samples of a generator fitted to the baseline
alone. At the quick preset the teachers' plurality agrees with the baseline on only ~35 % of those samples.
This script trains a few teachers on the first partitions of the quick teacher stage at several training
lengths and reports, per length, each teacher's accuracy on the real test set and its agreement with the
baseline on synthetic samples. Evaluation only: nothing here is released and no ε is spent (it reads the
non-private baseline and the private labels freely).

    flock /tmp/privdistill-cpu.lock python experiments/teacher_agreement.py \
        --baseline runs/baseline-mnist-quick --synthetic ~/.cache/privdistill/stages/synthetic-<key> \
        --steps 90 300 900 --teachers 10 [--augment none affine] --out docs/diagnostics/teacher-agreement-mnist.json
    (--generator DIR instead of --synthetic samples another generator, e.g. SRR's BatchNorm-statistics one.
    Without --baseline and samples it reports only the teachers' accuracy, and their plurality's, on real test
    images: `--dataset fashion-mnist --steps 90 --augment none shift flip-shift affine`.)
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from privdistill.config import RunOptions
from privdistill.data import load_data
from privdistill.data.dataset import to_float
from privdistill.engine import Env, RunDir
from privdistill.engine.datafree import generate
from privdistill.engine.ensemble import TeacherTraining, make_partitions, train_teachers


def _predict(model_or_ensemble, images: torch.Tensor, env: Env, *, ensemble: bool) -> torch.Tensor:
    out = []
    with torch.no_grad():
        for start in range(0, len(images), 500):
            x = env.place_batch(to_float(images[start:start + 500]))
            if ensemble:
                out.append(model_or_ensemble.predictions(x).cpu())  # [n, b]
            else:
                out.append(model_or_ensemble(x).argmax(-1).cpu())
    return torch.cat(out, dim=-1)


def _synthetic_agreement(synth_pred: torch.Tensor, base_synth: torch.Tensor) -> dict:
    """Each teacher's agreement with the baseline, and with each other teacher, on the synthetic samples."""
    agree = (synth_pred == base_synth).float().mean(1)
    pairwise = torch.stack([(synth_pred[i] == synth_pred[j]).float().mean()
                            for i in range(len(synth_pred)) for j in range(i + 1, len(synth_pred))])
    return {"agreement_with_baseline_on_synthetic_mean": round(float(agree.mean()), 4),
            "agreement_with_baseline_on_synthetic_min_max": [round(float(v), 4) for v in agree.aminmax()],
            "teacher_teacher_agreement_on_synthetic_mean": round(float(pairwise.mean()), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--baseline", help="run directory of the baseline the generator was fitted to (without it: the "
                                       "teachers on real test images only)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--synthetic", help="synthetic stage directory (synthetic.safetensors)")
    src.add_argument("--generator", help="generator stage or run directory (generator.safetensors) to sample from")
    ap.add_argument("--samples", type=int, default=2000, help="synthetic samples to compare on")
    ap.add_argument("--teachers", type=int, default=10, help="teachers per training length (first partitions)")
    ap.add_argument("--partitions", type=int, default=250, help="the stage's number of teachers (partition size)")
    ap.add_argument("--steps", type=int, nargs="+", default=[90, 900])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--augment", nargs="+", default=["none"],
                    help="teachers' augmentations (engine/augment.py names): a row per augmentation and length")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if (args.synthetic or args.generator) and not args.baseline:
        ap.error("--synthetic / --generator need --baseline: agreement on synthetic samples is with the baseline")

    env = Env.from_options(RunOptions(precision="auto", progress=False))
    data = load_data(args.dataset, None, seed=0)
    test_images, test_labels = data.test.images, data.test.labels
    baseline = synthetic = None
    if args.baseline:
        baseline = RunDir.existing(args.baseline).load_weights("model", device=env.device).eval()
        base_test = _predict(baseline, test_images, env, ensemble=False)
    if args.synthetic:
        synthetic = next(iter(load_file(str(Path(args.synthetic) / "synthetic.safetensors")).values()))[:args.samples]
    elif args.generator:
        generator = RunDir.existing(args.generator).load_weights("generator", device=env.device).eval()
        synthetic = generate(generator, args.samples, env)
    if synthetic is not None:
        base_synth = _predict(baseline, synthetic, env, ensemble=False)

    full = TeacherTraining(num_teachers=args.partitions, model="paper-cnn", steps=1, batch_size=args.batch_size,
                           lr=args.lr, lr_schedule="linear", trainer="loop")
    parts = make_partitions(data.train, full)[:args.teachers]
    rows = []
    for augment, steps in [(a, s) for a in args.augment for s in args.steps]:
        cfg = replace(full, num_teachers=args.teachers, steps=steps, augment=augment)
        t0 = time.perf_counter()
        ensemble, _ = train_teachers(data.train, cfg, env, parts=parts)
        seconds = time.perf_counter() - t0
        test_pred = _predict(ensemble, test_images, env, ensemble=True)      # [n, N_test]
        plurality = torch.mode(test_pred, dim=0).values
        row = {"augment": augment, "steps": steps,
               "epochs_per_teacher": round(steps * args.batch_size / len(parts[0]), 1),
               "train_seconds": round(seconds, 1),
               "teacher_test_accuracy_mean": round(float((test_pred == test_labels).float().mean()), 4),
               "plurality_test_accuracy": round(float((plurality == test_labels).float().mean()), 4)}
        if baseline is not None:
            row["agreement_with_baseline_on_test_mean"] = round(float((test_pred == base_test).float().mean()), 4)
        if synthetic is not None:
            row |= _synthetic_agreement(_predict(ensemble, synthetic, env, ensemble=True), base_synth)
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {"dataset": args.dataset, "baseline": args.baseline, "samples_from": args.synthetic or args.generator,
           "samples": 0 if synthetic is None else int(len(synthetic)), "teachers": args.teachers,
           "partition_size": len(parts[0]), "batch_size": args.batch_size, "lr": args.lr, "device": env.describe(),
           "rows": rows, "note": "evaluation only: reads the non-private baseline and private labels; nothing released"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
