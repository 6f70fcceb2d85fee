"""Issue 24 probe: how many of the adversarial generator's samples do small-data source models verify, and do
DGD-like readers then read them as the baseline does?

The generator is the one `--config adversarial` fits to the BN baseline (a cached stage). Six source models
(each trained like a quick DGD teacher on its own 1/250 of the private data, another split) and the baseline
read `--candidates` samples, each made for a class; for several agreement thresholds the script prints the
share kept, the kept samples per class, and the share on which the plurality of 10 readers (trained like quick
DGD teachers on the first 10 of the teachers' own parts) gives the baseline's label. Evaluation only: nothing
is released, no ε is spent.

    flock /tmp/privdistill-cpu.lock python experiments/verification_probe.py --dataset mnist \
        --out docs/diagnostics/verification-probe-mnist.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from privdistill.config import ClassifierTraining, RunOptions, resolve_sections
from privdistill.data import load_data
from privdistill.data.dataset import to_float
from privdistill.engine import Env, RunDir
from privdistill.engine.cache import StageCache
from privdistill.engine.datafree import GeneratorTraining, generate
from privdistill.engine.ensemble import TeacherTraining, make_partitions, train_teachers
from privdistill.engine.stages import Stages, file_digest
from privdistill.engine.synthesis import read_labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--candidates", type=int, default=40000)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    sections = resolve_sections({"run": RunOptions, "baseline": ClassifierTraining, "generator": GeneratorTraining,
                                 "teachers": TeacherTraining}, preset="quick", dataset=args.dataset,
                                config_file="adversarial+verified", overrides=["run.progress=false"])
    env, started = Env.from_options(sections["run"]), time.perf_counter()
    data = load_data(args.dataset, None, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        stages = Stages(StageCache(), env, data, RunDir.open(Path(tmp) / "run", config={}))
        baseline, baseline_stage = stages.baseline(sections["baseline"])
        key = file_digest(baseline_stage.path / "model.safetensors")
        generator, gen_stage = stages.generator(baseline, key, sections["generator"])  # fitted to the baseline
        sources, _ = stages.synthesis_source(baseline, key, sections["generator"])
    n, k = args.candidates, data.num_classes
    rng = env.generator(99, 0)
    made_for = torch.randint(0, k, (n,), generator=rng)
    images = generate(generator, n, env, latents=generator.sample_latent(n, generator=rng, labels=made_for))
    read = [sources.agreement(env.place_batch(to_float(images[i:i + 500]))) for i in range(0, n, 500)]
    label, share = torch.cat([r[0].cpu() for r in read]), torch.cat([r[1].cpu() for r in read])
    by_baseline = read_labels(baseline, images, env)
    teachers = replace(sections["teachers"], trainer="loop")
    readers, _ = train_teachers(data.train, replace(teachers, num_teachers=10), env,
                                parts=make_partitions(data.train, teachers)[:10])
    rows = []
    for threshold in (0.0, 4 / 7, 5 / 7, 6 / 7, 1.0):
        kept = (share >= threshold) & (label == made_for)
        if threshold == 0.0:
            kept = torch.ones(n, dtype=torch.bool)
        plurality = read_labels(readers, images[kept][:4000], env)
        rows.append({"members_agreeing_at_least": round(threshold, 3), "kept": round(float(kept.float().mean()), 4),
                     "kept_per_class": torch.bincount(made_for[kept], minlength=k).tolist(),
                     "readers_with_baseline": round(float((plurality == by_baseline[kept][:4000]).float().mean()), 4)})
        print(rows[-1], flush=True)
    out = {"dataset": args.dataset, "generator_stage": gen_stage.key, "candidates": n,
           "sources": sections["generator"].describe_source("baseline"),
           "baseline_reads_class_asked_for": round(float((by_baseline == made_for).float().mean()), 4),
           "rows": rows, "minutes": round((time.perf_counter() - started) / 60, 2), "device": env.describe()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
