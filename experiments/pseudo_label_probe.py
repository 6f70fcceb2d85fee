"""Probe (issue 24): what do a DGD student's confident answers on the unqueried synthetic samples say?

For each released DGD student (run directories), on the first `--samples` unqueried samples of the run's pool
(the DGD split redrawn from the run's seed): the share the student answers with at least `--threshold` of its
probability (what `student.objective=pseudo-label` would learn), and how often its answer (all, and the
confident ones) equals the 250 teachers' noiseless plurality and the non-private baseline's label. Evaluation
only: it reads the private teachers and the baseline, so nothing it prints is covered by any ε or released.

    flock /tmp/privdistill-cpu.lock python experiments/pseudo_label_probe.py RUN [RUN ...] --synthetic STAGE \
        --teachers STAGE --baseline STAGE --queries 2547 --out docs/diagnostics/pseudo-label-probe-mnist.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from privdistill.engine import streams
from privdistill.engine.context import Env
from privdistill.engine.ensemble import TeacherEnsemble
from privdistill.engine.run import RunDir
from privdistill.engine.trainer import predict_logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="DGD run directories (student.safetensors)")
    ap.add_argument("--synthetic", required=True, help="synthetic stage directory (the runs' pool)")
    ap.add_argument("--teachers", required=True, help="teachers stage directory")
    ap.add_argument("--baseline", required=True, help="baseline stage directory (model.safetensors)")
    ap.add_argument("--queries", type=int, required=True, help="how many of the pool the runs queried")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--threshold", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0, help="the runs' seed (their DGD split)")
    ap.add_argument("--out")
    args = ap.parse_args()
    env = Env.cpu(seed=args.seed)
    pool = next(iter(load_file(str(Path(args.synthetic) / "synthetic.safetensors")).values()))
    perm = torch.randperm(len(pool), generator=env.generator(streams.DGD_SPLIT))  # as DGDMethod.train splits
    images = pool[perm[args.queries:args.queries + args.samples]]
    teachers = TeacherEnsemble.load(Path(args.teachers) / "teachers.safetensors", env.device)
    plurality = torch.cat(list(teachers.iter_votes(images, env))).argmax(1)
    baseline = RunDir(args.baseline).load_weights("model").eval()
    baseline_label = predict_logits(baseline, images, env).argmax(1)
    rows = []
    for run in args.runs:
        probs = predict_logits(RunDir(run).load_weights("student").eval(), images, env).softmax(1)
        confidence, answer = probs.max(1)
        sure = confidence >= args.threshold

        def share(mask, reference):
            return round(float((answer[mask] == reference[mask]).float().mean()), 4) if mask.any() else None

        everything = torch.ones_like(sure)
        rows.append({"run": run, "summary_accuracy": json.loads((Path(run) / "summary.json").read_text())
                     .get("test_accuracy"), "confident_share": round(float(sure.float().mean()), 4),
                     "answer_eq_plurality": share(everything, plurality), "answer_eq_baseline": share(everything,
                                                                                                     baseline_label),
                     "confident_eq_plurality": share(sure, plurality), "confident_eq_baseline": share(sure,
                                                                                                      baseline_label)})
        print(json.dumps(rows[-1]))
    out = {"samples": len(images), "threshold": args.threshold, "queries": args.queries,
           "plurality_eq_baseline": round(float((plurality == baseline_label).float().mean()), 4), "rows": rows,
           "note": "evaluation only: reads the private teachers and the non-private baseline; not covered by any ε"}
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
