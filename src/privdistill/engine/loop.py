"""The one resumable training loop: every training in privdistill runs through it.

    loop = TrainingLoop(steps=T, env=env, run=run, checkpoint="student-checkpoint", title="DGD student",
                        modules={"student": student}, optimizers={"student": opt},
                        schedules={"student": make_schedule(opt, "linear", T)},
                        eval_every=100, checkpoint_every=50, evaluate=lambda: {"test_accuracy": ...})
    for step in loop:                 # restores the last checkpoint first, then yields the steps still to run
        loss, parts = ...             # every random draw derives from (seed, step): see engine/streams.py
        loop.update(loss, parts)      # backward, optimiser and schedule step, then `loop.record(parts)`
    result = loop.finish()            # LoopResult(steps, wall_seconds, history); writes the final checkpoint

Several models: `loop.optimize(loss, name=...)` for each, then `loop.record(parts)`. Checkpoints hold everything the
loop was given and `loop.extra`, so a run killed and resumed ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from privdistill.engine.context import Env
from privdistill.engine.progress import progress_bar
from privdistill.engine.run import RunDir


@dataclass
class LoopResult:
    steps: int  # steps done in all (this invocation and the ones it resumed)
    wall_seconds: float  # training time of all invocations
    history: list[dict] = field(default_factory=list)


def sample_batch(n: int, size: int, generator: torch.Generator) -> torch.Tensor:
    """A batch of indices drawn with replacement, or the whole set (shuffled) when it is smaller than the batch."""
    if n <= size:
        return torch.randperm(n, generator=generator)
    return torch.randint(0, n, (size,), generator=generator)


class TrainingLoop:
    def __init__(self, *, steps: int, env: Env, title: str, modules: dict[str, nn.Module],
                 optimizers: dict[str, torch.optim.Optimizer] | None = None,
                 schedules: dict[str, Any] | None = None, run: RunDir | None = None,
                 checkpoint: str = "checkpoint", log_stage: str | None = None, eval_every: int = 0,
                 evaluate: Callable[[], dict[str, Any]] | None = None, checkpoint_every: int = 0,
                 save_rng: bool = False, round_parts: int | None = None, extra: dict[str, Any] | None = None,
                 entry_fields: Callable[[int], dict[str, Any]] | None = None, mean_parts: bool = True):
        self.steps, self.env, self.title, self.run = steps, env, title, run
        self.modules, self.optimizers, self.schedules = modules, optimizers or {}, schedules or {}
        self.checkpoint, self.log_stage = checkpoint, log_stage or title
        self.eval_every, self.checkpoint_every, self.evaluate = eval_every, checkpoint_every, evaluate
        self.save_rng, self.round_parts = save_rng, round_parts
        self.entry_fields = entry_fields
        # False: an entry holds the parts of its own step, not their mean since the last entry (StudentLoop's
        # entries, which predate window means)
        self.mean_parts = mean_parts
        self.extra: dict[str, Any] = dict(extra or {})
        self.start, self.elapsed, self.history = 0, 0.0, []
        self._sums: dict[str, float] = {}  # the window since the last entry: sums of the parts, and steps
        self._count, self._step, self._bar = 0, 0, None
        state = run.load_checkpoint(checkpoint) if run is not None else None
        if state is not None:
            self._restore(state)
        self._t0 = time.perf_counter()

    # ------------------------------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[int]:
        with progress_bar(self.steps, self.title, enabled=self.env.progress, completed=self.start) as self._bar:
            for step in range(self.start, self.steps):
                self._step = step
                yield step

    @property
    def step(self) -> int:
        """The 0-based step being run."""
        return self._step

    def update(self, loss: torch.Tensor, parts: dict[str, float] | None = None, *, name: str | None = None) -> None:
        """One optimiser step on `loss` (the only optimiser, or `name`), its schedule's step, then `record`."""
        self.optimize(loss, name=name)
        self.record({"loss": float(loss.detach())} if parts is None else parts, loss=float(loss.detach()))

    def optimize(self, loss: torch.Tensor, *, name: str | None = None) -> None:
        """One optimiser step on `loss` and its schedule's step, without booking the step: for loops that update
        several models in one step and then call `record` once. Gradients left on that optimiser's parameters
        by another model's loss are dropped first."""
        name = name or next(iter(self.optimizers))
        optimizer = self.optimizers[name]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if name in self.schedules:
            self.schedules[name].step()

    def record(self, parts: dict[str, float], *, loss: float | None = None) -> None:
        """Book one finished step: window means, evaluation and log, checkpoint, progress bar."""
        if not self.mean_parts:
            self._sums, self._count = {}, 0
        for key, value in parts.items():
            self._sums[key] = self._sums.get(key, 0.0) + float(value)
        self._count += 1
        done = self._step + 1
        if (self.eval_every and done % self.eval_every == 0) or done == self.steps:
            means = {k: v / self._count for k, v in self._sums.items()}
            if self.round_parts is not None:
                means = {k: round(v, self.round_parts) for k, v in means.items()}
            fields = self.entry_fields(done) if self.entry_fields is not None else {}
            entry = {"step": done, **fields, **means, **(self.evaluate() if self.evaluate is not None else {})}
            self._sums, self._count = {}, 0
            self.history.append(entry)
            if self.run is not None:
                self.run.log(stage=self.log_stage, **entry)
        if self.checkpoint_every and done % self.checkpoint_every == 0 and done < self.steps:
            self.save(done)
        if self._bar is not None:
            last = self.history[-1] if self.history else {}
            self._bar.advance(1, loss=loss, acc=last.get("test_accuracy"))

    # ------------------------------------------------------------------------------------ checkpoints
    def save(self, done: int | None = None) -> None:
        """Write the checkpoint now, as after `done` steps (default: the step just finished)."""
        if self.run is None:
            return
        done = self._step + 1 if done is None else done
        state = {"step": done, "elapsed": self.wall_seconds(), "history": self.history, "extra": self.extra,
                 "window": (self._sums, self._count),
                 "modules": {k: m.state_dict() for k, m in self.modules.items() if m is not None},
                 "optimizers": {k: o.state_dict() for k, o in self.optimizers.items() if o is not None},
                 "schedules": {k: s.state_dict() for k, s in self.schedules.items() if s is not None}}
        if self.save_rng:
            state["torch_rng"] = torch.get_rng_state()
            if self.env.device.type == "cuda":  # draws made on the device (randn_like) use the device's generator
                state["cuda_rng"] = torch.cuda.get_rng_state(self.env.device)
        self.run.save_checkpoint(state, self.checkpoint)

    def _restore(self, state: dict[str, Any]) -> None:
        for group, target in (("modules", self.modules), ("optimizers", self.optimizers),
                              ("schedules", self.schedules)):
            for key, obj in target.items():
                if obj is not None and key in state[group]:
                    obj.load_state_dict(state[group][key])
        self.start, self.elapsed, self.history = state["step"], state["elapsed"], state["history"]
        self.extra.update(state.get("extra") or {})
        self._sums, self._count = state.get("window", ({}, 0))
        self._step = self.start
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and self.env.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.env.device)

    def wall_seconds(self) -> float:
        return self.elapsed + time.perf_counter() - self._t0

    def finish(self, done: int | None = None) -> LoopResult:
        """The result after `done` steps (default: all), with the final checkpoint written, so that resuming a
        finished run trains nothing (a loop stopped early, e.g. by its budget, passes the steps it did)."""
        done = self.steps if done is None else done
        if self.run is not None:
            self.save(done)
        return LoopResult(steps=done, wall_seconds=self.wall_seconds(), history=self.history)
