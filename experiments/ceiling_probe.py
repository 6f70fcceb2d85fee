"""What holds a generator's ceiling down (issue 24): one generator stage, several ceiling students.

The ceiling (test accuracy of a student trained only on synthetic samples labelled by the source model) mixes
three things: what the samples hold, what the labels carry, and the student's own noise. Each regime below
changes one of them, on the same generator and source:

    hard        60,000 samples, the source's argmax (what a label channel carries: DGD's votes, SRR's responses)
    soft        the same samples, the source's softmax (what the samples hold for a channel that carries more)
    fresh       a new draw of 60,000 samples every epoch (3 x 60,000 in all): is the sample count the limit?
    fresh-soft  both
    aug-soft    the 60,000 samples, each shifted by up to 2 pixels every step, relabelled by the source (softmax)
    aug-hard    the same, relabelled by the source's argmax (more hard labels, each on a nearby point)
    shift-hard  the 60,000 samples shifted every step, each keeping its one argmax label (a student-side
                augmentation that needs no new label: SRR's `srr.augment: shift`)
    confident-hard  the 60,000 of 3 x 60,000 samples on which the source is most confident, argmax (TA-DFKD's
                verification: are the labels of ambiguous samples what costs the hard-label ceiling?)

The student is the paper CNN, Adam 1e-3 at a constant rate, batch 128, 3 epochs (`generator quality` decays the
rate linearly; compare rows of one script, not across); `--student MODEL` names another registered classifier
(e.g. scatter-multiscale-prior-linear, a linear head on fixed scattering features: does a student with a fixed,
data-independent representation carry what it learns on synthetic samples to real images better?).
Evaluation only: no private image is read but the test set, nothing is released. One JSON line per regime:

    flock /tmp/privdistill-cpu.lock python experiments/ceiling_probe.py generator-c7aabe888541b1ff fashion-mnist \\
        hard,soft,fresh,fresh-soft,aug-soft >> docs/diagnostics/ceiling-probe-fashion-mnist.jsonl
"""

from __future__ import annotations

import json
import sys
import time
import warnings

import torch
import torch.nn.functional as F

from privdistill.config import RunOptions
from privdistill.data import load_data
from privdistill.data.dataset import to_float
from privdistill.engine import Env, RunDir, evaluate
from privdistill.engine.augment import random_shift
from privdistill.engine.cache import StageCache
from privdistill.engine.datafree import generate
from privdistill.engine.stages import Stages
from privdistill.engine.trainer import predict_logits
from privdistill.methods.datafree import resolve_source
from privdistill.models import create_model

SAMPLES, EPOCHS, BATCH = 60_000, 3, 128
REGIMES = ("hard", "soft", "fresh", "fresh-soft", "aug-soft", "aug-hard", "shift-hard", "confident-hard")


def ceiling(regime: str, generator, source, data, env: Env, student_model: str = "paper-cnn") -> float:
    torch.manual_seed(0)
    soft, fresh, augment = "soft" in regime, regime.startswith("fresh"), regime.startswith(("aug", "shift"))
    relabel = not regime.startswith("shift")  # a shifted copy keeps its sample's label under shift-hard
    student = create_model(student_model, kind="classifier", in_channels=data.channels,
                           num_classes=data.num_classes, image_size=data.image_size[0])
    if getattr(student, "prior", "none") != "none":  # a ScatterNet's dead-leaves projection, from the stage cache
        Stages(StageCache(), env, data, RunDir("/tmp/privdistill-ceiling-probe")).scatter_prior(student)
    student = env.place(student)
    optimizer = torch.optim.Adam(student.parameters(), 1e-3)
    g = torch.Generator().manual_seed(1)
    for epoch in range(EPOCHS):
        if regime == "confident-hard" and epoch == 0:  # three draws, the third of them the source is surest of
            images = torch.cat([generate(generator, SAMPLES, env, stream=k) for k in range(3)])
            answers = predict_logits(source, images, env)
            keep = answers.softmax(1).amax(1).topk(SAMPLES).indices
            images, answers = images[keep], answers[keep]
        elif epoch == 0 or fresh:  # stream `epoch`: each fresh draw is a new set of latent codes
            images = generate(generator, SAMPLES, env, stream=epoch)
            answers = predict_logits(source, images, env)
        student.train()
        for batch in torch.randperm(SAMPLES, generator=g).split(BATCH):
            x, answer = to_float(images[batch]), answers[batch]
            if augment:  # each image moved by up to 2 pixels, as the trainers' `augment: shift`
                x = random_shift(x, 2, g)
                if relabel:
                    with torch.no_grad():
                        answer = source(x)
            target = answer.softmax(1) if soft else answer.argmax(1)
            loss = F.cross_entropy(student(x), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    return evaluate(student, data.test, env)


def main() -> None:
    warnings.simplefilter("ignore")
    args = sys.argv[1:]
    student_model = "paper-cnn"
    if "--student" in args:
        at = args.index("--student")
        student_model = args[at + 1]
        del args[at:at + 2]
    stage, dataset = args[0], args[1]
    regimes = args[2].split(",") if len(args) > 2 else list(REGIMES)
    if unknown := set(regimes) - set(REGIMES):
        sys.exit(f"unknown regimes {sorted(unknown)}; known: {', '.join(REGIMES)}")
    cache = StageCache()
    run = RunDir(cache.root / stage)
    env = Env.from_options(RunOptions(seed=0, precision="fp32", progress=False))
    data = load_data(dataset)
    source = resolve_source((run.config() or {}).get("classifier", ""), cache, env).eval()
    generator = run.load_weights("generator", device=env.device)
    for regime in regimes:
        started = time.time()
        accuracy = ceiling(regime, generator, source, data, env, student_model)
        print(json.dumps({"stage": stage, "dataset": dataset, "regime": regime, "student": student_model,
                          "ceiling": round(accuracy, 4),
                          "seconds": round(time.time() - started)}), flush=True)


if __name__ == "__main__":
    main()
