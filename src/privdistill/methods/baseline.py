"""The non-private baseline: the classifier trained directly on all private data.

It is the accuracy every private method is compared with, and in DGD/DPDFD/SRR it is also the fixed
discriminator that the data-free generator learns from (a pathway no ε covers: see the privacy reports).
"""

from __future__ import annotations

from typing import Any

from privdistill.config import ClassifierTraining
from privdistill.engine import evaluate, train_classifier
from privdistill.methods.common import RunRequest, finish_run, prepare_run
from privdistill.models import create_model


def train_baseline(request: RunRequest) -> dict[str, Any]:
    prep = prepare_run("baseline", request, {"baseline": ClassifierTraining})
    cfg: ClassifierTraining = prep.sections["baseline"]
    data = prep.data
    model = create_model(cfg.model, kind="classifier", in_channels=data.channels, num_classes=data.num_classes,
                         image_size=data.image_size[0])
    result = train_classifier(model, data.train, cfg=cfg, env=prep.env, run=prep.run, test=data.test,
                              description=f"baseline {prep.dataset}")
    accuracy = evaluate(model, data.test, prep.env)
    prep.run.save_weights("model", model)
    return finish_run(prep, request, method="baseline", wall_seconds=result.wall_seconds,
                      test_accuracy=round(accuracy, 4), baseline_accuracy=round(accuracy, 4),
                      epsilon_paper=None, epsilon_strict=None, delta=None,
                      privacy="none: trained directly on the private data", model=cfg.model, steps=result.steps,
                      train_size=len(data.train), test_size=len(data.test))
