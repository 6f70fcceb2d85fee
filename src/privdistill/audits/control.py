"""The membership audits' positive control: a classifier trained only on the audit's members.

It lives with the audits (not with the methods) because it is part of auditing: it says whether an attack is
strong enough at this scale to speak for any model (see `train_audit_control`).
"""

from __future__ import annotations

from typing import Any

from privdistill.audits.membership import AuditConfig, audit_split
from privdistill.config import ClassifierTraining
from privdistill.engine import evaluate
from privdistill.engine.trainer import train_classifier
from privdistill.methods.common import RunRequest, finish_run, prepare_run
from privdistill.models import create_model


def train_audit_control(request: RunRequest) -> dict[str, Any]:
    """A positive control for the membership audits: a classifier trained ONLY on the audit's members, long
    enough to overfit them (section `audit_control`).

    At the quick scale the attacks find little in any audited model, the baseline included: this one says whether
    that is the attack's weakness (it cannot find members the model memorised) or the models' privacy."""
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
