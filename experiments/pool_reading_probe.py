"""Which synthetic pool do DGD's teachers read as the model it was fitted to reads it? DGD's default pool (the
adversarial generator fitted to the baseline) against SRR's default pool (a generator fitted to SRR's non-private
teacher by BatchNorm statistics): per sample, how often each of DGD's 250 teachers, and their plurality, gives the
label of the model the pool was fitted to, and of the other model. Evaluation only: nothing is released. Both
methods' stages must be cached (run `privdistill dgd -d D -e 1` and `privdistill srr -d D -e 1 --accounting paper`).

    flock /tmp/privdistill-cpu.lock .venv/bin/python experiments/pool_reading_probe.py fashion-mnist \
        --out docs/diagnostics/pool-reading-fashion-mnist.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from privdistill.data.dataset import to_float
from privdistill.engine.cache import StageCache
from privdistill.engine.stages import Stages
from privdistill.methods.common import RunRequest, prepare_run
from privdistill.methods.runner import Budget
from privdistill.methods.srr import SRRMethod

sys.path.insert(0, str(Path(__file__).parent))
from few_label_proxy_dgd import dgd_stages  # noqa: E402  (experiments/ is not a package)


def labels(model, images: torch.Tensor, env) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return torch.cat([model(env.place_batch(to_float(b))).argmax(1).cpu() for b in torch.split(images, 500)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset")
    ap.add_argument("--pool", type=int, default=5_000)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    t0 = time.time()
    prep, baseline, teachers, _, dgd_pool = dgd_stages(args.dataset, {"budget.epsilon": 1.0,
                                                                      "run.plan_check": "warn"},
                                                       f"runs/probe-pool-reading-{args.dataset}", args.pool)
    env = prep.env
    srr_prep = prepare_run("srr", RunRequest(dataset=args.dataset, overrides={
        "budget.epsilon": 1.0, "budget.accounting": "paper", "run.plan_check": "warn"},
        run_dir=f"runs/probe-pool-reading-srr-{args.dataset}"), {"budget": Budget, **SRRMethod.sections})
    stages = Stages(StageCache(enabled=True), srr_prep.env, srr_prep.data, srr_prep.run)
    srr_teacher, tstage = stages.baseline(srr_prep.sections["srr_teacher"])
    generator, gstage = stages.generator(srr_teacher, tstage.key, srr_prep.sections["srr_generator"])
    srr_pool, _ = stages.synthetic(generator, gstage, args.pool)
    rows = {}
    for name, pool, fitted_to, other in (("dgd-adversarial", dgd_pool, baseline, srr_teacher),
                                         ("srr-bn-statistics", srr_pool, srr_teacher, baseline)):
        source, second = labels(fitted_to, pool, env), labels(other, pool, env)
        votes = torch.cat([teachers.predictions(env.place_batch(to_float(b))).cpu()
                           for b in torch.split(pool, 500)], dim=1)  # [teachers, n]
        plurality = torch.mode(votes, dim=0).values
        rows[name] = {
            "each_teacher_agrees_with_its_source": round(float((votes == source).float().mean()), 4),
            "plurality_agrees_with_its_source": round(float((plurality == source).float().mean()), 4),
            "plurality_vote_share": round(float((votes == plurality).float().mean()), 4),
            "other_model_agrees_with_its_source": round(float((second == source).float().mean()), 4),
            "source_class_shares": torch.bincount(source, minlength=prep.data.num_classes).div(len(source)).round(
                decimals=3).tolist(),
            "plurality_by_source_class": [round(float((plurality[source == c] == c).float().mean()), 3)
                                          if (source == c).any() else None for c in range(prep.data.num_classes)]}
        print(name, json.dumps(rows[name]), flush=True)
    out = {"dataset": args.dataset, "pool": args.pool, "rows": rows, "seconds": round(time.time() - t0)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
