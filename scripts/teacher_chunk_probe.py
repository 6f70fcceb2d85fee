"""Time the teacher-ensemble trainer at the paper preset's shapes (250 paper CNNs, batch 128) on a CUDA GPU:
vectorised in one chunk of 250, in chunks of 50, and the plain loop, each projected to 3000 steps.
Usage (on a GPU machine): python scripts/teacher_chunk_probe.py
"""

import time
from dataclasses import replace

import torch

from privdistill.data.builtin import load_builtin
from privdistill.engine import device as dev
from privdistill.engine.context import Env
from privdistill.engine.ensemble import TeacherTraining, train_teachers


def timed(train, cfg: TeacherTraining, env: Env) -> float:
    train_teachers(train, replace(cfg, steps=5), env)  # warm-up: cuDNN picks its kernels
    torch.cuda.synchronize()
    start = time.perf_counter()
    train_teachers(train, cfg, env)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    dev.seed_everything(0)
    train = load_builtin("mnist").train
    env = Env(device=torch.device("cuda"), precision="bf16", progress=False)
    base = TeacherTraining(num_teachers=250, steps=40, batch_size=128, lr=0.05, trainer="vectorized")
    for name, cfg in [("vectorized chunk 250", replace(base, chunk_size=250)),
                      ("vectorized chunk 50", replace(base, chunk_size=50)),
                      ("loop, 5 teachers", replace(base, num_teachers=5, trainer="loop"))]:
        seconds = timed(train, cfg, env)
        per_step = seconds / cfg.steps * (250 / cfg.num_teachers)  # one step of all 250 teachers
        print(f"{name}: {seconds:.1f} s for {cfg.steps} steps of {cfg.num_teachers} teachers -> "
              f"{per_step * 1000:.0f} ms per step of all 250; 3000 steps ~ {per_step * 3000 / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
