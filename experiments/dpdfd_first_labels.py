"""Diagnostic for DPDFD's Fashion-MNIST collapse (issue 6): which classes does the teacher give the samples of
a freshly initialised generator, with and without DAFL's output BatchNorm?

DPDFD trains its generator against the student only (the teacher is read through the noisy gradients alone),
so the classes the teacher assigns to the FIRST samples are the only labels the student hears until the
generator has moved. A tanh-last generator starts with near-constant grey images; this script shows how the
teacher labels them. Evaluation only: reads the non-private baseline, spends no ε, releases nothing.

    python experiments/dpdfd_first_labels.py --teacher runs/baseline-fashion-mnist-quick \
        --out docs/diagnostics/dpdfd-first-labels-fashion-mnist.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from privdistill.engine import RunDir
from privdistill.engine.datafree import GeneratorTraining, build_generator


def first_labels(teacher: torch.nn.Module, *, output_norm: bool, seed: int, samples: int, width: int) -> dict:
    torch.manual_seed(seed)
    generator = build_generator(GeneratorTraining(width=width), channels=1, image_size=28, output_norm=output_norm)
    generator.train()  # BatchNorm on batch statistics, as in DPDFD's loop
    with torch.no_grad():
        x = generator(torch.randn(samples, generator.latent_dim))
        labels = teacher(x).argmax(1)
    counts = torch.bincount(labels, minlength=10)
    return {"seed": seed, "output_norm": output_norm, "pixel_std": round(float(x.std()), 3),
            "teacher_label_counts": counts.tolist(), "classes_present": int((counts > 0).sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", required=True, help="run directory with model.safetensors (e.g. a baseline)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=256, help="one DPDFD batch")
    parser.add_argument("--width", type=int, default=64, help="generator width (the quick preset's)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    teacher = RunDir.existing(args.teacher).load_weights("model").eval()
    rows = [first_labels(teacher, output_norm=norm, seed=seed, samples=args.samples, width=args.width)
            for norm in (False, True) for seed in range(args.seeds)]
    for row in rows:
        print(row)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"teacher": args.teacher, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
