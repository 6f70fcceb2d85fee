"""The non-private baseline: the classifier trained directly on all private data.

It is the accuracy every private method is compared with, and in DGD/DPDFD/SRR it is also the fixed
classifier that data-free generators learn from (a pathway no ε covers: see the privacy reports). It is
trained as the cached `baseline` stage, so `train baseline` and every method needing the same baseline
share one training.
"""

from __future__ import annotations

from typing import Any

from privdistill.config import ClassifierTraining
from privdistill.engine import evaluate
from privdistill.engine.cache import StageCache
from privdistill.engine.stages import Stages
from privdistill.engine.trainer import train_classifier
from privdistill.methods.common import RunRequest, finish_run, prepare_run


def train_baseline(request: RunRequest, *, cache: bool = True) -> dict[str, Any]:
    prep = prepare_run("baseline", request, {"baseline": ClassifierTraining})
    cfg: ClassifierTraining = prep.sections["baseline"]
    model, stage = Stages(StageCache(enabled=cache), prep.env, prep.data, prep.run).baseline(cfg)
    accuracy = evaluate(model, prep.data.test, prep.env)
    prep.run.save_weights("model", model)
    info = stage.info()
    return finish_run(prep, request, method="baseline", wall_seconds=info["wall_seconds"],
                      test_accuracy=round(accuracy, 4), baseline_accuracy=round(accuracy, 4),
                      epsilon_paper=None, epsilon_strict=None, delta=None,
                      privacy="none: trained directly on the private data", model=cfg.model,
                      train_size=len(prep.data.train), test_size=len(prep.data.test), baseline_stage=stage.ref())


def train_audit_control(request: RunRequest) -> dict[str, Any]:
    """A positive control for the membership audits: a classifier trained ONLY on the audit's members, long
    enough to overfit them (section `audit_control`).

    Every audited model of a dataset shares one member/non-member split; at the quick scale the attacks find
    little in any of them, the non-private baseline included. Audited like the others, this model says whether
    that is the attack's weakness or the models' privacy: an attack that cannot tell its members (which it
    memorised) from non-members is too weak at this scale to speak for anything.
    """
    from privdistill.audits.membership import AuditConfig, audit_split
    from privdistill.models import create_model

    prep = prepare_run("audit-control", request, {"audit": AuditConfig, "audit_control": ClassifierTraining})
    cfg: ClassifierTraining = prep.sections["audit_control"]
    data = prep.data
    split = audit_split(data, prep.sections["audit"])
    members = data.train.subset(split.members, name=f"{data.train.name} (the audit's {len(split.members)} members)")
    model = create_model(cfg.model, kind="classifier", in_channels=data.channels, num_classes=data.num_classes,
                         image_size=data.image_size[0])
    result = train_classifier(model, members, cfg=cfg, env=prep.env, run=prep.run, test=data.test,
                              description="audit control")
    prep.run.save_weights("model", model)
    prep.run.remove_checkpoint()
    return finish_run(prep, request, method="audit-control", wall_seconds=result.wall_seconds,
                      test_accuracy=round(evaluate(model, data.test, prep.env), 4),
                      train_accuracy=round(evaluate(model, members, prep.env), 4),
                      epsilon_paper=None, epsilon_strict=None, delta=None,
                      privacy="none: a positive control for the membership audit, trained only on its members",
                      model=cfg.model, train_size=len(members), test_size=len(data.test), audit_split=split.digest())
