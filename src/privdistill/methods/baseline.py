"""The non-private baseline: the classifier trained directly on all private data.

It is the accuracy every private method is compared with, and in DGD/DPDFD/SRR it is also the fixed
classifier that data-free generators learn from (a pathway no ε covers: see the privacy reports). It is
trained as the cached `baseline` stage, so `train baseline` and every method needing the same baseline
share one training.
"""

from __future__ import annotations

from typing import Any

from privdistill.config import ClassifierTraining
from privdistill.engine.cache import StageCache
from privdistill.engine.stages import Stages
from privdistill.methods.chance import evaluate_release
from privdistill.methods.common import RunRequest, finish_run, prepare_run


def train_baseline(request: RunRequest, *, cache: bool = True) -> dict[str, Any]:
    prep = prepare_run("baseline", request, {"baseline": ClassifierTraining})
    cfg: ClassifierTraining = prep.sections["baseline"]
    model, stage = Stages(StageCache(enabled=cache), prep.env, prep.data, prep.run).baseline(cfg)
    accuracy, chance = evaluate_release(model, prep.data.test, prep.env)  # and whether it answers at chance
    prep.run.save_weights("model", model)
    info = stage.info()
    return finish_run(prep, request, method="baseline", wall_seconds=info["wall_seconds"],
                      test_accuracy=round(accuracy, 4), baseline_accuracy=round(accuracy, 4),
                      epsilon_paper=None, epsilon_strict=None, delta=None,
                      privacy="none: trained directly on the private data", model=cfg.model,
                      train_size=len(prep.data.train), test_size=len(prep.data.test), baseline_stage=stage.ref(),
                      **chance)
