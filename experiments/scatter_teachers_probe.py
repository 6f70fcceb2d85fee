"""Probe (issue 24, teachers' side): do teachers that share a fixed, data-independent representation read
synthetic samples alike where paper-CNN teachers do not?

DGD's 250 paper-CNN teachers, each trained on its own 1/250 of the data, agree with the baseline on a third of the
generator's samples (docs/research-log.md, DGD finding 6): each learns its own features from 240 images and
extrapolates its own way off the data. Here every teacher is a linear head on the same scattering transform
(kymatio, J = 2, L = 8, GroupNorm; models/scatternet.py), trained on the same partitions. The transform is fixed,
so the teachers differ only in a linear map and should extrapolate far more alike. The heads are trained
together, vectorised (one batched matmul for all 250), full batch.

Reports the plurality's accuracy on the real test set and, for each synthetic stage given, its agreement with
the baseline's labels (the labels the samples were made for). Evaluation only: nothing is released, no ε spent.

    flock /tmp/privdistill-cpu.lock python experiments/scatter_teachers_probe.py --baseline STAGE_DIR --wd 1e-2 \
        [--synthetic STAGE_DIR ...] [--generator STAGE_DIR ... --cnn-teachers STAGE_DIR] \
        --out docs/diagnostics/scatter-teachers-mnist.json

With --generator, it also draws --queries samples from each generator and trains a paper-CNN student on each of
their labellings alone (the baseline's; the scattering heads' plurality, clean and with Laplace noise on the counts;
the paper-CNN teachers' likewise): what each label channel teaches, measured on the real test set. The students
read the heads of the last --wd value.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from privdistill.config import ClassifierTraining, RunOptions
from privdistill.data import load_data
from privdistill.data.dataset import ImageDataset, to_float
from privdistill.engine import Env, RunDir
from privdistill.engine.datafree import generate
from privdistill.engine.ensemble import TeacherEnsemble, TeacherTraining, make_partitions
from privdistill.engine.trainer import evaluate, train_classifier
from privdistill.models import create_model
from privdistill.models.scatternet import ScatterNet


def scatter_all(net: ScatterNet, images: torch.Tensor, batch: int = 1000) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([net.scatter(to_float(images[i:i + batch])).flatten(1)
                          for i in range(0, len(images), batch)])


def train_heads(x: torch.Tensor, y: torch.Tensor, classes: int, *, steps: int, lr: float, wd: float,
                seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Multinomial logistic regression per teacher, all at once: x [T, n, d], y [T, n] -> W [T, d, K], b [T, K]."""
    g = torch.Generator().manual_seed(seed)
    t, _, d = x.shape
    w = (torch.randn(t, d, classes, generator=g) * 0.01).requires_grad_()
    b = torch.zeros(t, 1, classes, requires_grad=True)
    opt = torch.optim.Adam([w, b], lr=lr)
    for _ in range(steps):
        logits = torch.bmm(x, w) + b
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, classes), y.reshape(-1)) * t
        loss = loss + wd * (w ** 2).sum() / 2
        opt.zero_grad()
        loss.backward()
        opt.step()
    return w.detach(), b.detach()


def votes(w: torch.Tensor, b: torch.Tensor, feats: torch.Tensor, classes: int) -> torch.Tensor:
    """Vote histogram [n, K] of the heads on features [n, d]."""
    preds = (torch.einsum("nd,tdk->tnk", feats, w) + b).argmax(-1)  # [T, n]
    return torch.nn.functional.one_hot(preds, classes).sum(0)


def student_accuracy(images: torch.Tensor, labels: torch.Tensor, data, env: Env, steps: int) -> float:
    """A paper-CNN student trained on (images, labels) alone, its real test accuracy."""
    torch.manual_seed(0)
    model = create_model("paper-cnn", kind="classifier", in_channels=data.train.channels,
                         num_classes=data.train.num_classes, image_size=data.train.image_size[0])
    train = ImageDataset(images, labels, data.train.num_classes, name="probe")
    cfg = ClassifierTraining(steps=steps, batch_size=64, lr=1e-3, eval_every_epochs=1e9)
    train_classifier(model, train, cfg=cfg, env=env)
    return evaluate(model, data.test, env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--baseline", required=True, help="run or stage directory of the baseline")
    ap.add_argument("--synthetic", nargs="*", default=[], help="synthetic stage directories")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--teachers", type=int, default=250)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--wd", type=float, nargs="+", default=[1e-3])
    ap.add_argument("--generator", nargs="*", default=[], help="generator stages: students on their queries")
    ap.add_argument("--queries", type=int, default=1300, help="queries a student learns from (DGD's budget)")
    ap.add_argument("--student-steps", type=int, default=500)
    ap.add_argument("--laplace", type=float, default=40.0, help="Laplace scale on the vote counts (DGD quick: 40)")
    ap.add_argument("--cnn-teachers", help="teachers stage of paper-CNN teachers to compare with")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    torch.set_num_threads(2)
    env = Env.from_options(RunOptions(precision="fp32", progress=False))
    data = load_data(args.dataset, None, seed=0)
    net = ScatterNet(data.train.channels, data.train.num_classes, data.train.image_size[0]).eval()
    t0 = time.perf_counter()
    train_f = scatter_all(net, data.train.images)
    test_f = scatter_all(net, data.test.images)
    print(f"features {train_f.shape} in {time.perf_counter() - t0:.0f} s", flush=True)
    parts = make_partitions(data.train, TeacherTraining(num_teachers=args.teachers, batch_size=1))
    n = min(len(p) for p in parts)
    x = torch.stack([train_f[p[:n]] for p in parts])
    y = torch.stack([data.train.labels[p[:n]] for p in parts]).long()
    baseline = RunDir.existing(args.baseline).load_weights("model", device=env.device).eval()
    samples = {}
    for s in args.synthetic:
        imgs = next(iter(load_file(str(Path(s) / "synthetic.safetensors")).values()))[:args.samples]
        with torch.no_grad():
            base = torch.cat([baseline(to_float(imgs[i:i + 500])).argmax(-1) for i in range(0, len(imgs), 500)])
        samples[s] = (scatter_all(net, imgs), base)
    rows = []
    for wd in args.wd:
        t0 = time.perf_counter()
        w, b = train_heads(x, y, data.train.num_classes, steps=args.steps, lr=args.lr, wd=wd, seed=0)
        secs = time.perf_counter() - t0
        k = data.train.num_classes
        test_votes = votes(w, b, test_f, k)
        each = ((torch.einsum("nd,tdk->tnk", test_f, w) + b).argmax(-1) == data.test.labels).float().mean(1)
        row = {"wd": wd, "train_seconds": round(secs, 1), "teacher_test_accuracy_mean": round(float(each.mean()), 4),
               "plurality_test_accuracy": round(float((test_votes.argmax(1) == data.test.labels).float().mean()), 4),
               "synthetic": {}}
        for s, (f, base) in samples.items():
            v = votes(w, b, f, k)
            row["synthetic"][Path(s).name] = {
                "plurality_agrees_with_baseline": round(float((v.argmax(1) == base).float().mean()), 4),
                "mean_top_vote_share": round(float(v.max(1).values.float().mean() / args.teachers), 4)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    k = data.train.num_classes
    students = {}
    cnn = TeacherEnsemble.load(Path(args.cnn_teachers) / "teachers.safetensors") if args.cnn_teachers else None
    for g in args.generator:
        generator = RunDir.existing(g).load_weights("generator", device=env.device).eval()
        imgs = generate(generator, args.queries, env)
        with torch.no_grad():
            base = baseline(to_float(imgs)).argmax(-1)
        f = scatter_all(net, imgs)
        noise = torch.distributions.Laplace(0.0, args.laplace)
        torch.manual_seed(1)
        channels = {"baseline": base}
        v = votes(w, b, f, k)
        channels["scatter_plurality"] = v.argmax(1)
        channels["scatter_noisy"] = (v + noise.sample(v.shape)).argmax(1)
        if cnn is not None:
            with torch.no_grad(), env.autocast():
                cv = torch.cat([cnn.votes(to_float(imgs[i:i + 500]), num_classes=k) for i in range(0, len(imgs), 500)])
            channels["cnn_plurality"] = cv.argmax(1)
            channels["cnn_noisy"] = (cv + noise.sample(cv.shape)).argmax(1)
        res = {}
        for name, labels in channels.items():
            res[name] = {"agrees_with_baseline": round(float((labels == base).float().mean()), 4),
                         "student_test_accuracy": round(student_accuracy(imgs, labels, data, env,
                                                                         args.student_steps), 4)}
            print(Path(g).name, name, json.dumps(res[name]), flush=True)
        students[Path(g).name] = res
    out = {"dataset": args.dataset, "students": students, "queries": args.queries,
           "student": f"paper-cnn, {args.student_steps} steps of 64, Adam 1e-3", "laplace": args.laplace,
           "teachers": args.teachers, "partition_size": n, "steps": args.steps,
           "lr": args.lr, "baseline": args.baseline, "rows": rows,
           "note": "evaluation only: reads the non-private baseline and private labels; nothing released"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
