"""The probe that chose `--config adversarial` (issue 24): what a synthetic set teaches, for generator
objectives added one at a time, on the Fashion-MNIST BN baseline.

A DAFL generator (width 64, batch 128, Adam 1e-3) is trained against a fixed BN classifier with, as asked:
class targets (`--cond`), BatchNorm-statistics matching (`--bn W`, DeepInversion), the batch-entropy term
(`--ent W`), and DFAD's student in the loop (`--adv W`: the generator is rewarded for the L1 distance between
the source's and an online student's predictions; the student learns the source's soft answers on each
batch). Samples from 20 % of training onward are kept (the bank), and 60,000 more are drawn from the final
generator; each set, labelled by the classifier's argmax, trains a fresh paper CNN for 3 epochs, whose test
accuracy is the set's ceiling (`ceiling` for the bank, `final_ceiling` for the final generator). Evaluation
only: no private image is read, nothing is released. The engine's own loop (`generator.adversarial_weight`)
does the same per step; this script exists to compare the objectives cheaply.

    flock /tmp/privdistill-cpu.lock python experiments/adversarial_probe.py --teacher RUN_DIR --cond --bn 3 --adv 3 \\
        --steps 800 --out docs/diagnostics/adversarial-probe-fashion-mnist.jsonl
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from privdistill.data import load_data
from privdistill.data.dataset import to_float, to_uint8
from privdistill.engine import Env, RunDir, evaluate
from privdistill.engine.datafree import BatchNormStatistics, disagreement, distillation_loss
from privdistill.engine.synthesis import ceiling_accuracy
from privdistill.models import create_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--teacher", required=True, help="run directory of a trained BN classifier (model.safetensors)")
    p.add_argument("--dataset", default="fashion-mnist")
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--student-lr", type=float, default=1e-3)
    p.add_argument("--cond", action="store_true", help="class targets (a conditional generator)")
    p.add_argument("--bn", type=float, default=0.0, help="weight of the BatchNorm-statistics term")
    p.add_argument("--ent", type=float, default=0.0, help="weight of the batch-entropy (class balance) term")
    p.add_argument("--adv", type=float, default=0.0, help="weight of the student-in-the-loop disagreement")
    p.add_argument("--bank", type=int, default=60000, help="samples of the bank kept for the ceiling")
    p.add_argument("--bank-from", type=float, default=0.2, help="share of training after which samples are kept")
    p.add_argument("--epochs", type=float, default=3.0, help="the ceiling student's epochs")
    p.add_argument("--out", help="append the result as one JSON line to this file")
    a = p.parse_args()

    torch.manual_seed(0)
    env = Env(device="cpu", precision="fp32", seed=0, progress=False)
    data = load_data(a.dataset, None)
    k = data.num_classes
    teacher = RunDir.existing(a.teacher).load_weights("model", device="cpu").eval()
    for q in teacher.parameters():
        q.requires_grad_(False)
    generator = create_model("dafl-generator", kind="generator", latent_dim=100, out_channels=data.channels,
                             image_size=data.image_size[0], width=a.width, **({"num_classes": k} if a.cond else {}))
    student = create_model("paper-cnn", kind="classifier", in_channels=data.channels, num_classes=k,
                           image_size=data.image_size[0])
    g_opt = torch.optim.Adam(generator.parameters(), lr=a.lr)
    s_opt = torch.optim.Adam(student.parameters(), lr=a.student_lr)
    bn = BatchNormStatistics(teacher)

    def draw(n: int) -> torch.Tensor:
        return generator.sample_latent(n) if a.cond else torch.randn(n, 100)

    bank, started = [], time.time()
    for step in range(a.steps):
        z = draw(a.batch)
        x = generator(z)
        logits = teacher(x)
        bn_term = bn.pop()
        targets = generator.latent_labels(z) if a.cond else logits.argmax(1)
        loss = F.cross_entropy(logits, targets) + a.bn * bn_term
        if a.ent:
            mean_p = F.softmax(logits, 1).mean(0)
            loss = loss + a.ent * (mean_p * mean_p.clamp_min(1e-12).log()).sum()
        if a.adv:
            loss = loss - a.adv * disagreement(logits, student(x))
        g_opt.zero_grad()
        loss.backward()
        g_opt.step()
        if a.adv:
            imitation = distillation_loss(student(x.detach()), logits.detach())
            s_opt.zero_grad()
            imitation.backward()
            s_opt.step()
        if step >= a.bank_from * a.steps:
            bank.append(to_uint8(x.detach().clamp(-1, 1)))
        if step % 100 == 0 or step == a.steps - 1:
            print(step, round(float(loss.detach()), 3), f"{time.time() - started:.0f}s", flush=True)
    generator_seconds = time.time() - started

    def labelled(images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            labels = torch.cat([teacher(to_float(images[i:i + 1000])).argmax(1) for i in range(0, len(images), 1000)])
        bn.pop()
        return labels

    images = torch.cat(bank)
    images = images[torch.randperm(len(images))[:a.bank]]
    with torch.no_grad():
        generator.train()  # batch statistics, as while it was trained
        final = torch.cat([to_uint8(generator(draw(500)).clamp(-1, 1)) for _ in range(0, 60000, 500)])
    labels, final_labels = labelled(images), labelled(final)
    result = {**vars(a), "generator_seconds": round(generator_seconds),
              "online_student": round(evaluate(student.eval(), data.test, env), 4) if a.adv else None,
              "ceiling": round(ceiling_accuracy(images, labels, data.test, env, k, a.epochs), 4),
              "final_ceiling": round(ceiling_accuracy(final, final_labels, data.test, env, k, a.epochs), 4),
              "bank_class_counts": torch.bincount(labels, minlength=k).tolist()}
    print(json.dumps(result), flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
