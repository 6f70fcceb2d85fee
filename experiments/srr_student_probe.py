"""Probe (issue 25): which student learns most from the labels an SRR run released on synthetic samples?

SRR's data-free Fashion-MNIST cell at ε = 1 is held by what its paper CNN student makes of the released labels:
66 % of them are right, and a CNN that fits the wrong ones loses accuracy (twice the epochs cost 4.6 points). A
student whose features are fixed (the ScatterNet's scattering, projected on the dead-leaves prior, the DP-SGD
recipe's model) has only a linear head to fit: it cannot memorise wrong labels, and its features were not shaped
by the generator's off-manifold samples. This probe reads a finished SRR run's release (each stage's synthetic
inputs, the labels recorded in its privacy ledger and the candidate sets) and trains students on all of it at
once, the same way for each kind, testing each on the real test set. Post-processing of the release: no ε spent.

    python experiments/srr_student_probe.py RUN_DIR fashion-mnist '[{"student": "scatter", "epochs": 10},
        {"student": "cnn", "epochs": 4}]'

Keys: student ("scatter": scatter-multiscale-prior-linear's features, a linear head; "cnn": the paper CNN), loss
("likelihood", the run's post-processing of the release, or "ce" on the released label as if it were right),
epochs, lr (Adam; 1e-3), batch (256), seed (0). With `--teacher DIR` (the run's teacher, a stage or run directory)
a setting may ask for "labels": "teacher" (the teacher's argmax on the same samples, no mechanism: the ceiling).
With `--precompute` it only computes and caches the scatter features of every stage saved so far, and stops.
The curve is the test accuracy after each epoch (compared on the test set: a probe, priced by no ε).
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

from privdistill.data import load_data
from privdistill.data.dataset import to_float
from privdistill.engine.cache import StageCache
from privdistill.engine.context import Env
from privdistill.engine.run import RunDir
from privdistill.engine.stages import Stages, fixed_features
from privdistill.engine.trainer import predict_logits
from privdistill.models import create_model
from privdistill.privacy.events import event_from_dict
from privdistill.privacy.ledger import PrivacyLedger
from privdistill.privacy.mechanisms import released_label_likelihood


def release(run: Path) -> tuple[list[Path], torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """The stages labelled so far (a run may still train): their synthetic input files, the inputs, released labels
    and candidate sets, stage after stage, and the per-label ε."""
    budget = yaml.safe_load((run / "config.yaml").read_text())["config"]["budget"]
    if budget["accounting"] != "paper":  # (the strict accounting splits the target over the labels)
        raise SystemExit("this probe reads runs whose per-label epsilon is the target: --accounting paper")
    ledger = PrivacyLedger(run, accounting="paper", delta=float(budget["delta"]))

    def refuse():
        raise RuntimeError("a probe never draws labels")

    spends = [r for r in ledger.records() if r["kind"] == "spend"]
    labels = [torch.as_tensor(ledger.spend(r["key"], event_from_dict(r["event"]), refuse)).long() for r in spends]
    stages = range(1, len(spends) + 1)
    files = [run / "synthetic" / f"stage-{i:04d}.pt" for i in stages]
    images = [torch.load(path, weights_only=True) for path in files]
    sets = [torch.load(run / "label-sets" / f"stage-{i:04d}.pt", weights_only=True) for i in stages]
    epsilon = float(budget["epsilon"])
    return files, torch.cat(images), torch.cat(labels), torch.cat(sets), epsilon


def stage_features(path: Path, scatter, stages: Stages, env: Env) -> torch.Tensor:
    """The student's fixed features of one stage's synthetic inputs, flattened, cached beside the run (minutes each:
    `--precompute` fills the cache while the run still trains)."""
    saved = path.parent.parent / "student-probe" / path.name
    if saved.is_file():
        return torch.load(saved, weights_only=True)
    if not bool(scatter.prior_fitted):  # (fits or loads the prior projection once, not once per stage)
        stages.scatter_prior(scatter)
    features = fixed_features(scatter, torch.load(path, weights_only=True), env).flatten(1)
    saved.parent.mkdir(exist_ok=True)
    torch.save(features, saved)
    return features


def train(c: dict, x: torch.Tensor, targets: torch.Tensor, xt: torch.Tensor, yt: torch.Tensor, model) -> list:
    """Adam over (x, targets) in seeded epochs; targets [n] (cross-entropy) or [n, K] log-likelihoods."""
    torch.manual_seed(c.get("seed", 0))
    opt = torch.optim.Adam(model.parameters(), c.get("lr", 1e-3))
    curve, b = [], c.get("batch", 256)
    for _ in range(c["epochs"]):
        model.train()
        for idx in torch.randperm(len(x)).split(b):
            logits = model(x[idx]).float()
            t = targets[idx]
            loss = F.cross_entropy(logits, t) if t.dim() == 1 else \
                -torch.logsumexp(F.log_softmax(logits, 1) + t, 1).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            predicted = torch.cat([model(xt[i:i + 1000]).argmax(1) for i in range(0, len(xt), 1000)])
        curve.append(round(float((predicted == yt).float().mean()), 4))
    return curve


def main() -> None:
    warnings.simplefilter("ignore")
    run, dataset, settings = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    teacher_dir = sys.argv[sys.argv.index("--teacher") + 1] if "--teacher" in sys.argv else None
    data, env = load_data(dataset), Env.cpu()
    scatter = create_model("scatter-multiscale-prior-linear", kind="classifier", in_channels=data.channels,
                           num_classes=data.num_classes, image_size=data.image_size[0])
    stages = Stages(StageCache(), env, data, RunDir("/tmp/privdistill-srr-student-probe"))
    if "--precompute" in sys.argv:  # while the run trains: the features of every stage saved so far, then stop
        for path in sorted((run / "synthetic").glob("stage-*.pt")):
            stage_features(path, scatter, stages, env)
        return
    files, images, released, sets, epsilon = release(run)
    likelihood = released_label_likelihood(sets, released, epsilon=epsilon).clamp(min=1e-300).log().float()
    teacher_labels = None
    if teacher_dir:
        teacher = RunDir(teacher_dir).load_weights("model", device=env.device).eval()
        teacher_labels = predict_logits(teacher, images, env).argmax(1).cpu()
    inputs = {}
    for c in settings:
        started = time.time()
        if c["student"] not in inputs:  # the scattering features once (minutes); the CNN reads the images
            if c["student"] == "scatter":
                test = stages.features(scatter)[1].flatten(1)  # (fits or loads the prior projection first)
                inputs["scatter"] = (torch.cat([stage_features(path, scatter, stages, env) for path in files]), test)
            else:
                inputs["cnn"] = (to_float(images), to_float(data.test.images))
        x, xt = inputs[c["student"]]
        if len(x) != len(released):
            raise SystemExit(f"{len(x)} inputs for {len(released)} released labels: stale features in "
                             f"{run / 'student-probe'}?")
        if c.get("labels") == "teacher":
            targets = teacher_labels
        else:
            targets = likelihood if c.get("loss", "likelihood") == "likelihood" else released
        torch.manual_seed(c.get("seed", 0))
        model = (torch.nn.Linear(x.shape[1], data.num_classes) if c["student"] == "scatter" else
                 create_model("paper-cnn", kind="classifier", in_channels=data.channels,
                              num_classes=data.num_classes, image_size=data.image_size[0]))
        curve = train(c, x, targets, xt, data.test.labels, model)
        right = teacher_labels is not None and round(float((released == teacher_labels).float().mean()), 4)
        print(json.dumps({"run": str(run), "dataset": dataset, **c, "labels_n": len(released),
                          "released_right": right, "accuracy": curve[-1], "curve": curve,
                          "seconds": round(time.time() - started)}), flush=True)


if __name__ == "__main__":
    main()
