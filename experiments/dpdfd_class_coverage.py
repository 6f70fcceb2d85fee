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

import torch

from privdistill.data.builtin import load_builtin
from privdistill.engine.run import RunDir


def recall_per_class(run: Path, test) -> list[float]:
    model = RunDir(run).load_weights("student").eval()
    predictions = []
    with torch.no_grad():
        for start in range(0, len(test), 1000):
            x, _ = test.batch(torch.arange(start, min(start + 1000, len(test))))
            predictions.append(model(x).argmax(1))
    predicted, labels = torch.cat(predictions), test.labels
    return [float((predicted[labels == k] == k).float().mean()) for k in range(int(labels.max()) + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    test = load_builtin(args.dataset).test
    rows = []
    for run in args.runs:
        summary = json.loads((run / "summary.json").read_text())
        recall = recall_per_class(run, test)
        rows.append({"run": str(run), "test_accuracy": summary["test_accuracy"],
                     "entropy": {h["step"]: round(h["lg_entropy"], 4) for h in summary.get("history", [])
                                 if "lg_entropy" in h},
                     "recall": [round(r, 4) for r in recall], "worst_class": int(min(range(len(recall)),
                                                                                    key=recall.__getitem__))})
        row = rows[-1]
        print(f"{run}: {100 * row['test_accuracy']:.2f} %, entropy {row['entropy']} (ln K = "
              f"{math.log(len(recall)):.3f}), worst class {row['worst_class']} recall "
              f"{min(recall):.3f}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
