"""The student loop of DGD and PATE: a TrainingLoop (engine/loop.py, iterated and updated the same way, from
`student-checkpoint`) with Adam, the papers' linear decay and test evaluation; `finish()` gives (student, stats).

History entries hold the evaluated step's own parts (`mean_parts=False`), so DGD's and PATE's summaries stay as
they were.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from privdistill.config import check, check_model_name
from privdistill.data.dataset import ImageDataset
from privdistill.engine.context import Env
from privdistill.engine.loop import TrainingLoop, sample_batch  # noqa: F401 - sample_batch: dgd/pate import it here
from privdistill.engine.optim import make_optimizer, make_schedule
from privdistill.engine.run import RunDir
from privdistill.engine.trainer import evaluate

CHECKPOINT = "student-checkpoint"


@dataclass
class StudentTraining:
    """What every semi-supervised student's config has (DGD's `student`, PATE's `pate_student` extend it)."""

    model: str = "paper-cnn"
    steps: int = 500
    batch_size: int = 128  # labelled samples per step (all of them when fewer)
    unlabeled_batch_size: int = 128
    lr: float = 1e-3  # Adam, linear decay to 0
    eval_every: int = 100
    checkpoint_every: int = 50

    def validate(self) -> None:
        check(min(self.steps, self.batch_size, self.unlabeled_batch_size, self.eval_every, self.checkpoint_every) >= 1,
              "steps, batch sizes, eval_every and checkpoint_every must be >= 1")
        check(self.lr > 0, f"lr must be > 0, got {self.lr}")
        check_model_name(self.model, "model")


class StudentLoop:
    """Adam + linear lr decay + periodic test evaluation, metrics log and atomic checkpoints."""

    def __init__(self, student: nn.Module, *, lr: float, steps: int, env: Env, title: str, log_stage: str,
                 eval_every: int, checkpoint_every: int, run: RunDir | None = None, test: ImageDataset | None = None,
                 round_parts: bool = False):
        self.student = env.place(student).train()
        optimizer = make_optimizer(self.student.parameters(), "adam", lr=lr)
        evaluate_student = (lambda: {"test_accuracy": evaluate(self.student, test, env)}) if test is not None else None
        self.loop = TrainingLoop(steps=steps, env=env, run=run, checkpoint=CHECKPOINT, title=title,
                                 log_stage=log_stage, modules={"student": self.student},
                                 optimizers={"student": optimizer},
                                 schedules={"student": make_schedule(optimizer, "linear", steps)},
                                 eval_every=eval_every, checkpoint_every=checkpoint_every, evaluate=evaluate_student,
                                 round_parts=4 if round_parts else None, mean_parts=False)

    def __iter__(self) -> Iterator[int]:
        return iter(self.loop)

    def update(self, loss: torch.Tensor, parts: dict[str, float]) -> None:
        self.loop.update(loss, parts)

    def finish(self, **extra) -> tuple[nn.Module, dict]:
        result = self.loop.finish()
        return self.student.eval(), {"steps": result.steps, **extra, "wall_seconds": round(result.wall_seconds, 1),
                                     "history": result.history[-3:]}
