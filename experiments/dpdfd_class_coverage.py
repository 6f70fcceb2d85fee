"""Whether a DPDFD run lost a class: per run directory, the entropy of the student's mean prediction on the
generator's samples at each evaluation (L_G's "IE" term, logged as lg_entropy; ln 10 = 2.303 for ten balanced
classes, ln 9 = 2.197 with one class never predicted), the released student's test accuracy and its recall of each
class on the test set (evaluation only: no ε spent, nothing released).

    python experiments/dpdfd_class_coverage.py mnist RUN_DIR ... [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from privdistill.config import RunOptions
from privdistill.data.builtin import load_builtin
from privdistill.engine import Env, RunDir
from privdistill.engine.trainer import predict_logits
from privdistill.methods.chance import chance_check


def recall_per_class(run: Path, test, env: Env) -> list[float]:
    """The released student's recall of each class on `test`: the chance check's (methods/chance.py)."""
    predictions = predict_logits(RunDir(run).load_weights("student"), test.images, env).argmax(1)
    return chance_check(predictions, test.labels, test.num_classes)["class_recall"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    test = load_builtin(args.dataset).test
    env = Env.from_options(RunOptions(precision="fp32", progress=False))
    rows = []
    for run in args.runs:
        summary = json.loads((run / "summary.json").read_text())
        recall = recall_per_class(run, test, env)
        rows.append({"run": str(run), "test_accuracy": summary["test_accuracy"],
                     "entropy": {h["step"]: round(h["lg_entropy"], 4) for h in summary.get("history", [])
                                 if "lg_entropy" in h},
                     "recall": recall, "worst_class": min(range(len(recall)), key=recall.__getitem__)})
        row = rows[-1]
        print(f"{run}: {100 * row['test_accuracy']:.2f} %, entropy {row['entropy']} (ln K = "
              f"{math.log(len(recall)):.3f}), worst class {row['worst_class']} recall "
              f"{min(recall):.3f}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
