"""The bookkeeping every semi-supervised student loop shares (DGD, PATE): resumable steps.

A method writes only its loss; `StudentLoop` does the rest the same way for all of them:

    loop = StudentLoop(student, lr=cfg.lr, steps=cfg.steps, title="DGD student", log_stage="student", ...)
    for step in loop:                     # restores the checkpoint first; sets lr = lr0 * (1 - step/steps)
        loss, parts = ...                 # every random draw derives from (seed, step)
        loop.update(loss, parts)          # backward, optimiser step, eval/log, atomic checkpoint, progress
    student, stats = loop.finish()

Because every random draw of a step derives from (seed, step), a run killed at any point and resumed from
its last checkpoint replays exactly the same updates as an uninterrupted one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch
from torch import nn

from privdistill.data.dataset import ImageDataset
from privdistill.engine.context import Env
from privdistill.engine.progress import progress_bar
from privdistill.engine.run import RunDir
from privdistill.engine.trainer import evaluate

CHECKPOINT = "student-checkpoint"


def sample_batch(n: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """A batch of indices drawn with replacement, or the whole set (shuffled) when it is smaller than the batch."""
    if n <= size:
        return torch.randperm(n, generator=generator)
    return torch.randint(0, n, (size,), generator=generator)


def linear_decay(step: int, steps: int) -> float:
    """The papers' schedule: lr0 · (1 − step/steps), reaching 0 at the last step."""
    return max(0.0, 1.0 - step / max(1, steps))


class StudentLoop:
    """Adam + linear lr decay + periodic test evaluation, metrics log and atomic checkpoints."""

    def __init__(self, student: nn.Module, *, lr: float, steps: int, env: Env, title: str, log_stage: str,
                 eval_every: int, checkpoint_every: int, run: RunDir | None = None, test: ImageDataset | None = None,
                 round_parts: bool = False):
        self.student = env.place(student).train()
        self.optimizer = torch.optim.Adam(self.student.parameters(), lr=lr)
        self.lr, self.steps, self.env, self.run, self.test = lr, steps, env, run, test
        self.title, self.log_stage, self.round_parts = title, log_stage, round_parts
        self.eval_every, self.checkpoint_every = eval_every, checkpoint_every
        self.start, self.elapsed, self.history = 0, 0.0, []
        state = run.load_checkpoint(CHECKPOINT) if run is not None else None
        if state is not None:
            self.student.load_state_dict(state["student"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.start, self.elapsed, self.history = state["step"], state["elapsed"], state["history"]
        self._t0 = time.perf_counter()
        self._bar = None

    def __iter__(self) -> Iterator[int]:
        with progress_bar(self.steps, self.title, enabled=self.env.progress, completed=self.start) as self._bar:
            for step in range(self.start, self.steps):
                for group in self.optimizer.param_groups:
                    group["lr"] = self.lr * linear_decay(step, self.steps)
                self._step = step
                yield step

    def update(self, loss: torch.Tensor, parts: dict[str, float]) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        done = self._step + 1
        if done % self.eval_every == 0 or done == self.steps:
            entry = {"step": done, **({k: round(v, 4) for k, v in parts.items()} if self.round_parts else parts)}
            if self.test is not None:
                entry["test_accuracy"] = evaluate(self.student, self.test, self.env)
            self.history.append(entry)
            if self.run is not None:
                self.run.log(stage=self.log_stage, **entry)
        if self.run is not None and done % self.checkpoint_every == 0 and done < self.steps:
            self.run.save_checkpoint({"student": self.student.state_dict(), "optimizer": self.optimizer.state_dict(),
                                      "step": done, "elapsed": self.wall_seconds(), "history": self.history},
                                     CHECKPOINT)
        last = self.history[-1] if self.history else {}
        self._bar.advance(1, loss=float(loss.detach()), acc=last.get("test_accuracy"))

    def wall_seconds(self) -> float:
        return self.elapsed + time.perf_counter() - self._t0

    def finish(self, **extra) -> tuple[nn.Module, dict]:
        return self.student.eval(), {"steps": self.steps, **extra, "wall_seconds": round(self.wall_seconds(), 1),
                                     "history": self.history[-3:]}
