"""`privdistill teachers train`: a teacher ensemble on disjoint partitions, and its accuracy.

The ensemble accuracy on the test set (plurality vote, and Laplace noisy vote) is an evaluation: it spends
no privacy budget on the private training data, but it also is not a released model.
"""

from __future__ import annotations

import time
from typing import Any

from privdistill.engine.cache import StageCache
from privdistill.engine.distributed import train_teachers_ray
from privdistill.engine.ensemble import TeacherTraining, ensemble_accuracy
from privdistill.engine.stages import TEACHER_EVAL_LAPLACE_SCALE, Stages
from privdistill.methods.common import RunRequest, finish_run, prepare_run


def train_teachers_workflow(request: RunRequest, *, laplace_scale: float | None = TEACHER_EVAL_LAPLACE_SCALE,
                            cache: bool = True, ray_address: str | None = None) -> dict[str, Any]:
    """Train (or reuse) the ensemble; with `ray_address` ("local", "auto" or "ray://...") train it as Ray tasks."""
    prep = prepare_run("teachers", request, {"teachers": TeacherTraining})
    cfg: TeacherTraining = prep.sections["teachers"]
    started = time.perf_counter()
    if ray_address:
        ensemble, info = train_teachers_ray(prep.data.train, cfg, prep.env,
                                            address=None if ray_address == "local" else ray_address)
        ensemble.save(prep.run.path / "teachers.safetensors")
        stage_ref = {"stage": "teachers", "path": str(prep.run.path / "teachers.safetensors"), "reused": False}
    else:
        stages = Stages(StageCache(enabled=cache), prep.env, prep.data, prep.run)
        ensemble, stage = stages.teachers(cfg)
        info, stage_ref = stage.info(), stage.ref()
    keys = ("ensemble_accuracy", "mean_teacher_accuracy", "noisy_ensemble_accuracy", "laplace_scale")
    # the stage key includes the seed, so its recorded noisy vote used this run's seed
    if not ray_address and info.get("laplace_scale") == laplace_scale and all(k in info for k in keys):
        accuracy = {k: info[k] for k in keys}  # measured when the stage was built: one pass over the test set
    else:
        accuracy = ensemble_accuracy(ensemble, prep.data.test, prep.env, laplace_scale=laplace_scale,
                                     seed=prep.env.seed)
    return finish_run(prep, request, method="teachers", wall_seconds=time.perf_counter() - started,
                      test_accuracy=round(accuracy["ensemble_accuracy"], 4), epsilon_paper=None, epsilon_strict=None,
                      delta=None, privacy="evaluation only: the ensemble is not released and no query was answered",
                      num_teachers=cfg.num_teachers, trainer=info.get("trainer", cfg.trainer), teachers_stage=stage_ref,
                      variant=f"n{cfg.num_teachers}",
                      training_seconds=info.get("wall_seconds"), teachers_per_minute=info.get("teachers_per_minute"),
                      **{k: round(v, 4) if isinstance(v, float) else v for k, v in accuracy.items()})
