"""PATE's student (Papernot et al. 2018, Sec. 4; methods/pate.py): cross-entropy on the labelled public images
(the answered queries, or with `labels=spread` every public image with its spread label) + virtual adversarial
training (Miyato et al. 2018) and entropy minimisation on the whole public slice."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.data.dataset import ImageDataset, to_float
from privdistill.engine import RunDir, streams
from privdistill.engine.context import Env
from privdistill.engine.manifold import vat_loss
from privdistill.engine.student_loop import StudentLoop, StudentTraining, sample_batch
from privdistill.errors import ConfigError

STUDENT_LABELS = ("answers", "spread")
# VAT's finite-difference step of the power iteration. Miyato et al. print 1e-6; with this CNN (logits O(1)) a step
# that small is lost in fp32 rounding: the "adversarial" direction changes the prediction less than a random one.
# At 1e-2 it changes it ~70x more (tests/test_pate.py)
VAT_XI = 1e-2


@dataclass
class PATEStudentConfig(StudentTraining):
    """Config section `pate_student`: supervised on the answers + VAT and entropy minimisation on the public slice."""

    steps: int = 1500
    batch_size: int = 64
    eval_every: int = 250
    checkpoint_every: int = 100
    vat_weight: float = 1.0
    vat_eps: float = 2.0  # L2 radius of the adversarial perturbation (images in [-1, 1])
    entropy_weight: float = 1.0  # VAT + EntMin (Miyato et al. 2018, Sec. 4)
    labels: str = "answers"  # answers: CE on the answered queries | spread: on the whole slice, answers spread

    def validate(self) -> None:
        super().validate()
        if self.vat_eps < 0 or self.vat_weight < 0 or self.entropy_weight < 0:
            raise ConfigError("pate_student VAT parameters must be >= 0")
        if self.labels not in STUDENT_LABELS:
            raise ConfigError(f"pate_student.labels must be one of {STUDENT_LABELS}, got {self.labels!r}")


def train_student(student: nn.Module, labelled: ImageDataset, unlabelled: torch.Tensor, cfg: PATEStudentConfig,
                  env: Env, *, run: RunDir | None = None, test: ImageDataset | None = None) -> tuple[nn.Module, dict]:
    """CE on `labelled` + VAT + entropy minimisation on `unlabelled` (uint8 images); resumable from
    `student-checkpoint` (every random draw derives from (seed, step))."""
    loop = StudentLoop(student, lr=cfg.lr, steps=cfg.steps, env=env, title="PATE student", log_stage="pate-student",
                       eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every, run=run, test=test,
                       round_parts=True)
    student = loop.student
    for step in loop:
        x, y = labelled.batch(sample_batch(len(labelled), cfg.batch_size, env.generator(streams.PATE_LABELLED, step)))
        with env.autocast():
            loss = F.cross_entropy(student(env.place_batch(x)).float(), y.to(env.device))
        parts = {"ce": float(loss.detach())}
        idx = sample_batch(len(unlabelled), cfg.unlabeled_batch_size, env.generator(streams.PATE_UNLABELLED, step))
        xu = env.place_batch(to_float(unlabelled[idx]))
        with env.autocast():
            logits_u = student(xu).float()
        vat = vat_loss(student, xu, logits_u, eps=cfg.vat_eps, xi=VAT_XI,
                       generator=env.generator(streams.PATE_VAT, step), autocast=env.autocast)
        probs = F.softmax(logits_u, dim=1)
        entropy = -(probs * F.log_softmax(logits_u, dim=1)).sum(1).mean()
        loss = loss + cfg.vat_weight * vat + cfg.entropy_weight * entropy
        parts.update(vat=float(vat.detach()), entropy=float(entropy.detach()))
        loop.update(loss, parts)
    return loop.finish(labelled=len(labelled), unlabelled=len(unlabelled))
