"""The cheap proxy of the synthesis engine (issue 24): how do DGD-like teachers read a generator's samples?

Trains (or reuses, through the stage cache) the generator a configuration asks for (`--set generator.…`, the
same keys as every method), draws its synthetic set (verified and balanced if asked), and measures on
`--samples` of them what DGD's label channel depends on: the share on which the plurality of `--readers`
teachers, each trained like a quick DGD teacher on its own 1/250 of the private data, gives the label the
samples were synthesised for (`agreement_with_source`); the share on which they give the baseline's label;
their pairwise agreement; the class balance; and, with `--ceiling`, the ceiling (test accuracy of a student
trained only on 10,000 samples labelled by the source). Evaluation only: nothing is released, no ε is spent.

    flock /tmp/privdistill-cpu.lock python experiments/synthesis_proxy.py --dataset mnist --config synthesis.yaml \
        --ceiling --out docs/diagnostics/synthesis-proxy-mnist-synthesis.json

(synthesis.yaml: a `generator` section, e.g. the bench matrix's `synthesis` set lines as YAML.)
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
from privdistill.engine.datafree import GeneratorTraining
from privdistill.engine.ensemble import TeacherTraining, make_partitions, train_teachers
from privdistill.engine.stages import Stages, file_digest
from privdistill.engine.synthesis import label_balance, read_labels, source_labels, synthesis_quality


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--config", help="a YAML file with a generator section")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="section.key=value (generator.…)")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--readers", type=int, default=10)
    ap.add_argument("--ceiling", action="store_true")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    sections = resolve_sections({"run": RunOptions, "baseline": ClassifierTraining, "generator": GeneratorTraining,
                                 "teachers": TeacherTraining}, preset="quick", dataset=args.dataset,
                                config_file=args.config, overrides=args.overrides + ["run.progress=false"])
    env = Env.from_options(sections["run"])
    data = load_data(args.dataset, None, seed=0)
    gcfg: GeneratorTraining = sections["generator"]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        stages = Stages(StageCache(), env, data, RunDir.open(Path(tmp) / "run", config={}))
        baseline, baseline_stage = stages.baseline(sections["baseline"])
        key = file_digest(baseline_stage.path / "model.safetensors")
        t0 = time.perf_counter()
        generator, gen_stage = stages.generator(baseline, key, gcfg)
        generator_seconds = time.perf_counter() - t0
        n = max(args.samples, 10000 if args.ceiling else 0)
        pool, pool_stage, source = stages.synthetic_set(generator, gen_stage, n, baseline, key, gcfg)
    sample = pool[:args.samples]
    teachers_cfg = replace(sections["teachers"], trainer="loop")
    parts = make_partitions(data.train, teachers_cfg)[:args.readers]
    readers, _ = train_teachers(data.train, replace(teachers_cfg, num_teachers=args.readers), env, parts=parts)
    by_source, by_baseline = source_labels(source, sample, env), read_labels(baseline, sample, env)
    plurality = read_labels(readers, sample, env)
    each = torch.stack([readers.member(i).eval()(env.place_batch(to_float(sample))).argmax(1).cpu()
                        for i in range(args.readers)])
    pairwise = torch.stack([(each[i] == each[j]).float().mean() for i in range(len(each))
                            for j in range(i + 1, len(each))])
    row = {"dataset": args.dataset, "config": args.config, "overrides": args.overrides, "samples": len(sample),
           "readers": f"{args.readers} quick DGD teachers (1/{teachers_cfg.num_teachers} of the data each)",
           "agreement_with_source": round(float((plurality == by_source).float().mean()), 4),
           "agreement_with_baseline": round(float((plurality == by_baseline).float().mean()), 4),
           "each_reader_with_source": round(float((each == by_source).float().mean()), 4),
           "readers_pairwise": round(float(pairwise.mean()), 4),
           "source_equals_baseline": round(float((by_source == by_baseline).float().mean()), 4),
           "class_balance": round(label_balance(by_source, data.num_classes), 4),
           "generator_stage": gen_stage.key, "generator_reused": gen_stage.reused,
           "generator_minutes": round(generator_seconds / 60, 2),
           "synthetic_stage": pool_stage.info(), "device": env.describe()}
    if args.ceiling:
        row["ceiling"] = synthesis_quality(pool[:10000], source, env, num_classes=data.num_classes,
                                           ceiling_test=data.test)["ceiling"]
    row["minutes"] = round((time.perf_counter() - started) / 60, 2)
    print(json.dumps(row, indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(row, indent=1) + "\n")


if __name__ == "__main__":
    main()
