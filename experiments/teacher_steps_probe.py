"""Does training DGD's teachers longer make them read the synthetic pool as the baseline does? The quick preset
trains each of the 250 teachers for 270 steps, the paper for 3,000. This trains the first `--teachers` partitions'
teachers (the recipe's own partitions, model and augmentation) for each of `--steps` and reports their accuracy on
the real test set, their agreement with the baseline on the synthetic pool, per baseline class, and how often they
call the pool's shoes (Fashion-MNIST classes 5, 7, 9) "bag" (8). Evaluation only: nothing is released.

    flock /tmp/privdistill-cpu.lock .venv/bin/python experiments/teacher_steps_probe.py fashion-mnist \
        [--partitions 50] --steps 270 3000 --out docs/diagnostics/teacher-steps-fashion-mnist.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from privdistill.data.dataset import to_float
from privdistill.engine.ensemble import make_partitions, train_teachers
from privdistill.engine.few_label import reader_probabilities

sys.path.insert(0, str(Path(__file__).parent))
from few_label_proxy_dgd import dgd_stages  # noqa: E402  (experiments/ is not a package)


def predictions(ensemble, images: torch.Tensor, env) -> torch.Tensor:
    return torch.cat([ensemble.predictions(env.place_batch(to_float(b))).cpu() for b in torch.split(images, 500)], 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--teachers", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=0, help="split the data this many ways (0: the recipe's 250)")
    ap.add_argument("--steps", type=int, nargs="+", default=[270, 3000])
    ap.add_argument("--pool", type=int, default=5_000)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    t0 = time.time()
    prep, baseline, _, _, pool = dgd_stages(args.dataset, {"budget.epsilon": 1.0, "run.plan_check": "warn"},
                                            f"runs/probe-teacher-steps-{args.dataset}", args.pool)
    env, data, classes = prep.env, prep.data, prep.data.num_classes
    cfg = prep.sections["teachers"]
    cfg = replace(cfg, num_teachers=args.partitions) if args.partitions else cfg
    parts = make_partitions(data.train, cfg)[:args.teachers]
    reference = torch.as_tensor(reader_probabilities(baseline, pool, env).argmax(1))
    test_x, test_y = data.test.images[:2000], data.test.labels[:2000]
    rows = []
    for steps in args.steps:
        started = time.time()
        ensemble, _ = train_teachers(data.train, replace(cfg, num_teachers=args.teachers, steps=steps), env,
                                     parts=parts)
        on_test = predictions(ensemble, test_x, env)
        on_pool = predictions(ensemble, pool, env)
        agree = on_pool == reference
        row = {"steps": steps, "train_seconds": round(time.time() - started),
               "test_accuracy_mean": round(float((on_test == test_y).float().mean()), 4),
               "pool_agreement_mean": round(float(agree.float().mean()), 4),
               "pool_agreement_by_baseline_class": [round(float(agree[:, reference == c].float().mean()), 3)
                                                    for c in range(classes)]}
        if args.dataset == "fashion-mnist":
            shoes = torch.isin(reference, torch.tensor([5, 7, 9]))
            row["shoes_called_bag"] = round(float((on_pool[:, shoes] == 8).float().mean()), 4)
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {"dataset": args.dataset, "teachers": args.teachers, "partitions": cfg.num_teachers, "teacher_config": {
        "model": cfg.model, "augment": cfg.augment, "batch_size": cfg.batch_size, "lr": cfg.lr,
        "partition_size": int(np.mean([len(p) for p in parts]))}, "rows": rows, "seconds": round(time.time() - t0)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
