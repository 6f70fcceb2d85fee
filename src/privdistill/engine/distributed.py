"""Teacher ensembles beyond one machine, on Ray (optional extra: `pip install 'privdistill[ray]'`).

Scale-out (`train_teachers_ray`): chunks of teachers are trained as Ray tasks on whatever cluster
`ray.init(address=...)` joins; the coordinator gathers the weights into one `TeacherEnsemble`. Each chunk
uses the same derived seeds as local training, so the teachers equal the local ones.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict

import torch

from privdistill.data.dataset import ImageDataset
from privdistill.engine import device as dev
from privdistill.engine import ensemble as ens
from privdistill.engine.context import Env
from privdistill.engine.ensemble import TeacherEnsemble, TeacherTraining, make_partitions
from privdistill.errors import ConfigError, PrivdistillError

RAY_HINT = "Ray is an optional extra: install it with `pip install 'privdistill[ray]'` (or `pip install ray`)."


def require_ray():
    try:
        import ray
    except ImportError as err:
        raise PrivdistillError(f"this feature needs Ray, which is not installed. {RAY_HINT}") from err
    return ray


def connect(address: str | None = None, *, num_cpus: int | None = None):
    """Join a cluster (`address="auto"` or "ray://host:port"), or start a local one."""
    if address and not (address in ("auto", "local") or re.fullmatch(r"(ray://)?[\w.\-]+:\d+", address)):
        raise ConfigError(f"--ray {address!r}: give auto, local, ray://host:port or host:port")
    ray = require_ray()
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, "log_to_driver": False, "ignore_reinit_error": True}
        if address:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=num_cpus, **kwargs)
    return ray


def _train_chunk_task(images, labels, num_classes, cfg_dict, ids, parts_padded, sizes, env_spec):
    """Runs inside a Ray worker: train teachers `ids` exactly as the local trainer would."""
    cfg = TeacherTraining(**cfg_dict)
    device = dev.select_device("auto")  # the worker's own device: on a GPU its own automatic precision
    env = Env(device=device,
              precision=env_spec["precision"] if device.type == "cpu" else dev.resolve_precision("auto", device),
              seed=env_spec["seed"], deterministic=env_spec["deterministic"], progress=False)
    bar = type("NoBar", (), {"advance": lambda self, *a, **k: None})()
    return ens.train_chunk(ImageDataset(images, labels, num_classes), cfg, env, parts_padded, sizes, ids, bar)


def train_teachers_ray(train: ImageDataset, cfg: TeacherTraining, env: Env, *, address: str | None = None,
                       chunk_size: int = 0, num_cpus: int | None = None) -> tuple[TeacherEnsemble, dict]:
    """Train the ensemble as Ray tasks (one task per chunk of teachers) and gather it on the coordinator."""
    ray = connect(address, num_cpus=num_cpus)
    padded, sizes = ens.padded_partitions(make_partitions(train, cfg))
    # decided here, not in the tasks: a task would read trainer=auto as the loop, and chunk differently
    cfg, template = ens.resolve_trainer(cfg, train, env)
    chunk = chunk_size or max(1, -(-cfg.num_teachers // max(1, int(ray.cluster_resources().get("CPU", 1)))))
    started = time.perf_counter()
    images_ref, labels_ref = ray.put(train.images), ray.put(train.labels)
    env_spec = {"precision": env.precision, "seed": env.seed, "deterministic": env.deterministic}
    remote = ray.remote(num_cpus=1)(_train_chunk_task)
    futures = [remote.remote(images_ref, labels_ref, train.num_classes, asdict(cfg),
                             torch.arange(first, min(first + chunk, cfg.num_teachers)), padded, sizes, env_spec)
               for first in range(0, cfg.num_teachers, chunk)]
    chunks = ray.get(futures)
    wall = time.perf_counter() - started
    stats = {"num_teachers": cfg.num_teachers, "trainer": f"ray/{cfg.trainer}", "chunk_size": chunk,
             "ray_tasks": len(futures), "wall_seconds": round(wall, 1),
             "teachers_per_minute": round(cfg.num_teachers / max(wall, 1e-9) * 60, 2)}
    return ens.gather_chunks(template, chunks), stats

