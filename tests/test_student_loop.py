"""The shared student loop (DGD, PATE): linear decay, batches, and a resume that replays the same updates."""

import torch
from torch import nn

from privdistill.engine import Env, RunDir
from privdistill.engine.optim import lr_factor
from privdistill.engine.student_loop import StudentLoop, sample_batch


def test_linear_decay_reaches_zero_and_sample_batch_covers_small_sets():
    linear = [lr_factor("linear", step, 10) for step in (0, 5, 10)]  # the papers' schedule: lr0 · (1 − step/steps)
    assert linear == [1.0, 0.5, 0.0]
    small = sample_batch(5, 8, torch.Generator().manual_seed(0))
    assert sorted(small.tolist()) == [0, 1, 2, 3, 4]
    assert sample_batch(100, 8, torch.Generator().manual_seed(0)).shape == (8,)


class _Stop(Exception):
    pass


def _train(run: RunDir | None, env: Env, stop_at: int | None = None) -> tuple[nn.Module, dict]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 3, (64,), generator=torch.Generator().manual_seed(2))
    loop = StudentLoop(model, lr=0.05, steps=10, env=env, title="test", log_stage="student", eval_every=5,
                       checkpoint_every=2, run=run)
    for step in loop:
        if step == stop_at:
            raise _Stop
        idx = sample_batch(len(x), 16, env.generator(7, step))
        loss = nn.functional.cross_entropy(loop.student(x[idx]), y[idx])
        loop.update(loss, {"ce": float(loss)})
    return loop.finish()


def test_an_interrupted_loop_resumes_to_the_same_weights(tmp_path):
    env = Env(device=torch.device("cpu"), precision="fp32", seed=3, progress=False)
    reference, stats = _train(None, env)
    assert stats["steps"] == 10 and [h["step"] for h in stats["history"]] == [5, 10]
    assert reference.weight.grad is not None  # the loop really stepped the optimiser

    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    try:
        _train(run, env, stop_at=7)  # killed after the step-6 checkpoint
    except _Stop:
        pass
    resumed, _ = _train(run, env)
    assert torch.allclose(resumed.weight, reference.weight, atol=1e-6)
    assert torch.allclose(resumed.bias, reference.bias, atol=1e-6)
