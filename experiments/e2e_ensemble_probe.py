"""Probe (issue 26): does an end-to-end SRR run's student carry anything its DP teacher lacks?

An `--privacy end-to-end` SRR run releases a student distilled from a DP teacher (`RUN/dp-source`) through synthetic
samples; both are DP as a whole under the run's one strict ε, so any mixture of their answers is post-processing
(no further ε). This prints the test accuracy of w * student + (1 - w) * teacher softmax for a few weights, and how
often the two disagree. If no mixture beats the teacher, the student adds nothing a user of the teacher lacks.

    python experiments/e2e_ensemble_probe.py runs/srr-fmnist-eps3-e2e-multiscale-prior-soft-n180k fashion-mnist
"""

from __future__ import annotations

import json
import sys

from privdistill.data import load_data
from privdistill.engine.context import Env
from privdistill.engine.run import RunDir
from privdistill.engine.trainer import predict_logits


def main() -> None:
    run_dir, dataset = sys.argv[1], sys.argv[2]
    test = load_data(dataset).test
    student = RunDir(run_dir).load_weights("student").eval()
    teacher = RunDir(f"{run_dir}/dp-source").load_weights("model").eval()
    env = Env.cpu()
    p_student, p_teacher = (predict_logits(m, test.images, env).softmax(1) for m in (student, teacher))
    row = {"run": run_dir, "dataset": dataset,
           "disagreement": round(float((p_student.argmax(1) != p_teacher.argmax(1)).float().mean()), 4)}
    for w in (0.0, 0.25, 0.5, 0.75, 1.0):  # the student's weight in the mixture: 0 is the teacher alone
        mixed = w * p_student + (1 - w) * p_teacher
        row[f"accuracy_student_weight_{w}"] = round(float((mixed.argmax(1) == test.labels).float().mean()), 4)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
