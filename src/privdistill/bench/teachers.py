"""Teachers per minute: the vectorised (vmap) and the plain-loop trainer, side by side in one run."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch

from privdistill.atomic import atomic_write_json
from privdistill.config import RunOptions
from privdistill.data import load_data
from privdistill.engine import Env
from privdistill.engine.ensemble import TeacherTraining, train_teachers


def bench_teachers(dataset: str = "mnist", *, num_teachers: int = 250, steps: int = 10, batch_size: int = 128,
                   model: str = "paper-cnn", trainers: tuple[str, ...] = ("vectorized", "loop"),
                   full_steps: int = 3000, device: str = "auto", precision: str = "auto", chunk_size: int = 0,
                   output: str | Path | None = None) -> dict:
    """Train the same `num_teachers` teachers for `steps` iterations with each trainer and report the rate.

    `full_steps` projects the time of a full schedule (the paper's 3000 iterations) from the measured rate."""
    env = Env.from_options(RunOptions(device=device, precision=precision, progress=False))
    data = load_data(dataset)
    rows = []
    for trainer in trainers:
        cfg = TeacherTraining(num_teachers=num_teachers, model=model, steps=steps, batch_size=batch_size, lr=1e-3,
                              trainer=trainer, chunk_size=chunk_size)
        if env.device.type == "cuda":  # untimed warm-up: cuDNN autotunes its kernels on the first steps
            train_teachers(data.train, replace(cfg, steps=min(5, steps)), env)
            torch.cuda.synchronize()
        started = time.perf_counter()
        _, stats = train_teachers(data.train, cfg, env)
        if env.device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - started
        samples = num_teachers * steps * batch_size
        rows.append({"trainer": trainer, "wall_seconds": round(wall, 2), "samples_per_second": round(samples / wall),
                     "teacher_steps_per_second": round(num_teachers * steps / wall, 1),
                     "teachers_per_minute_at_full_schedule": round(num_teachers / (wall * full_steps / steps) * 60, 2),
                     "projected_full_schedule_minutes": round(wall * full_steps / steps / 60, 1),
                     "chunk_size": stats["chunk_size"]})
    result = {"dataset": dataset, "num_teachers": num_teachers, "steps_measured": steps, "full_steps": full_steps,
              "batch_size": batch_size, "model": model, "device": env.describe(), "rows": rows}
    if output:
        atomic_write_json(output, result)
    return result
