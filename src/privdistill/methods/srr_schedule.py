"""How SRR spreads its N labels and its student's steps over the T stages (`StageSchedule`): part of SRR's plan
(methods/srr.py), and read by methods/sizing.py to refit the student's epochs to a small dataset. Sizing runs in
methods/common.prepare_run, below the run skeleton (methods/runner.py) that SRR's other modules import, so the
schedule is kept apart from them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from privdistill.errors import ConfigError

if TYPE_CHECKING:
    from privdistill.methods.srr_plan import SRRConfig


def stage_sizes(total: int, stages: int, first_fraction: float = 0.0) -> list[int]:
    """N samples split as evenly as possible over T stages (earlier stages take the remainder); with
    `first_fraction` > 0, stage 1 takes that share and the other stages split the rest (Ghazi et al.'s
    multi-stage training gives its first, prior-less stage a larger share)."""
    if stages > total:
        raise ConfigError(f"{stages} stages need at least {stages} samples, got {total}")
    if first_fraction > 0 and stages > 1:
        first = min(max(1, round(first_fraction * total)), total - (stages - 1))
        return [first] + stage_sizes(total - first, stages - 1)
    base, extra = divmod(total, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


@dataclass
class StageSchedule:
    """How the N labels and the student's steps spread over the T stages."""

    sizes: list[int]  # labels drawn at each stage
    steps: list[int]  # student steps at each stage
    batch: list[int]  # student batch size at each stage

    @classmethod
    def of(cls, cfg: SRRConfig, total: int) -> "StageSchedule":
        sizes = stage_sizes(total, cfg.stages, cfg.first_stage_fraction)
        # the student trains on the stage's samples, or (cumulative) on all samples labelled so far
        seen = [sum(sizes[:i + 1]) if cfg.student_data == "cumulative" else n for i, n in enumerate(sizes)]
        batch = [min(cfg.batch_size, m) for m in seen]
        steps = [max(1, math.ceil(cfg.epochs_per_stage * math.ceil(m / b))) for m, b in zip(seen, batch)]
        return cls(sizes, steps, batch)
