"""Teacher ensembles beyond one machine, on Ray (optional extra: `pip install 'privdistill[ray]'`).

Two deployments:

1. Scale-out (`train_teachers_ray`): chunks of teachers are trained as Ray tasks on whatever cluster
   `ray.init(address=...)` joins; the coordinator gathers the weights into one `TeacherEnsemble`. Each chunk
   uses the same derived seeds as local training, so the teachers equal the local ones.

2. Distributed clients (DGD Sec. III-E, `ClientEnsemble`): each client is a Ray actor that loads ITS OWN
   partition inside the actor (the coordinator sends a dataset reference and index list, never images),
   trains its teacher there, and only ever answers with votes (one predicted label per query). Neither
   images nor weights leave an actor: the actor exposes no method that returns them.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F

from privdistill.data import load_data
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


def _env_spec(env: Env) -> dict:
    return {"precision": env.precision, "seed": env.seed, "deterministic": env.deterministic}


def _remote_env(spec: dict) -> Env:
    device = dev.select_device("auto")
    return Env(device=device,
               precision=spec["precision"] if device.type == "cpu" else dev.resolve_precision("auto", device),
               seed=spec["seed"], deterministic=spec["deterministic"], progress=False)


def _train_chunk_task(images, labels, num_classes, cfg_dict, ids, parts_padded, sizes, env_spec):
    """Runs inside a Ray worker: train teachers `ids` exactly as the local trainer would."""
    cfg = TeacherTraining(**cfg_dict)
    env = _remote_env(env_spec)
    train = ImageDataset(images, labels, num_classes)
    models = ens._init_teachers(cfg, train, len(ids), int(ids[0]), env)
    bar = type("NoBar", (), {"advance": lambda self, *a, **k: None})()
    trainer = ens._train_chunk_vectorized if cfg.trainer == "vectorized" else ens._train_chunk_loop
    params = trainer(models, train, parts_padded[ids], sizes[ids], ids, cfg, env, bar,
                     per_epoch=ens._steps_per_epoch(sizes, cfg.batch_size))
    return {k: v.detach().cpu() for k, v in params.items()}


def train_teachers_ray(train: ImageDataset, cfg: TeacherTraining, env: Env, *, address: str | None = None,
                       chunk_size: int = 0, num_cpus: int | None = None) -> tuple[TeacherEnsemble, dict]:
    """Train the ensemble as Ray tasks (one task per chunk of teachers) and gather it on the coordinator."""
    ray = connect(address, num_cpus=num_cpus)
    parts = make_partitions(train, cfg)
    sizes = torch.tensor([len(p) for p in parts])
    padded = torch.zeros(len(parts), int(sizes.max()), dtype=torch.long)
    for i, p in enumerate(parts):
        padded[i, :len(p)] = p
    chunk = chunk_size or max(1, -(-cfg.num_teachers // max(1, int(ray.cluster_resources().get("CPU", 1)))))
    started = time.perf_counter()
    images_ref, labels_ref = ray.put(train.images), ray.put(train.labels)
    remote = ray.remote(num_cpus=1)(_train_chunk_task)
    futures = [remote.remote(images_ref, labels_ref, train.num_classes, asdict(cfg),
                             torch.arange(first, min(first + chunk, cfg.num_teachers)), padded, sizes, _env_spec(env))
               for first in range(0, cfg.num_teachers, chunk)]
    chunks = ray.get(futures)
    wall = time.perf_counter() - started
    template = ens._init_teachers(cfg, train, 1, 0, env)[0]
    stacked = {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}
    stats = {"num_teachers": cfg.num_teachers, "trainer": f"ray/{cfg.trainer}", "chunk_size": chunk,
             "ray_tasks": len(futures), "wall_seconds": round(wall, 1),
             "teachers_per_minute": round(cfg.num_teachers / max(wall, 1e-9) * 60, 2)}
    return TeacherEnsemble(template, stacked), stats


# ------------------------------------------------------------------------------------ distributed clients
class TeacherClient:
    """A data holder: loads its own partition, trains its teacher locally, answers queries with votes only."""

    def __init__(self, client_id: int, dataset: str, data_root: str | None, indices: list[int], cfg_dict: dict,
                 env_spec: dict):
        full = load_data(dataset, data_root).train  # loaded inside the actor, on the client's side
        self._data = full.subset(torch.as_tensor(indices))  # private: never returned by any method
        self._cfg = TeacherTraining(**{**cfg_dict, "num_teachers": 1})
        self._env = _remote_env(env_spec)
        self._id = client_id
        self._model = None

    def train(self) -> dict:
        idx = torch.arange(len(self._data))
        sizes = torch.tensor([len(idx)])
        models = ens._init_teachers(self._cfg, self._data, 1, self._id, self._env)
        bar = type("NoBar", (), {"advance": lambda self, *a, **k: None})()
        params = ens._train_chunk_loop(models, self._data, idx[None], sizes, torch.tensor([self._id]), self._cfg,
                                       self._env, bar, per_epoch=ens._steps_per_epoch(sizes, self._cfg.batch_size))
        model = models[0]
        model.load_state_dict({k: v[0] for k, v in params.items()})
        self._model = model.eval()
        return {"client": self._id, "examples": len(self._data)}

    @torch.no_grad()
    def vote(self, x: torch.Tensor) -> torch.Tensor:
        """The client's predicted label for each query (its only output)."""
        if self._model is None:
            raise RuntimeError("train() first")
        return self._model(x.to(self._env.device)).argmax(1).cpu()


class ClientEnsemble:
    """The coordinator's view of the clients: it can query votes, nothing else."""

    def __init__(self, clients: list, num_classes: int):
        self.clients = clients
        self.num_classes = num_classes

    @classmethod
    def launch(cls, dataset: str, train: ImageDataset, cfg: TeacherTraining, env: Env, *, data_root: str | None = None,
               address: str | None = None, num_cpus: int | None = None) -> "ClientEnsemble":
        """One actor per partition. The coordinator computes the (seeded) partition index lists only."""
        ray = connect(address, num_cpus=num_cpus)
        if cfg.num_teachers > 64 and not address:
            raise ConfigError(f"{cfg.num_teachers} client actors on a local Ray instance would each load the "
                              "dataset; join a cluster with --ray-address or use fewer clients")
        parts = make_partitions(train, cfg)
        actor = ray.remote(num_cpus=0.5)(TeacherClient)
        clients = [actor.remote(i, dataset, data_root, parts[i].tolist(), asdict(cfg), _env_spec(env))
                   for i in range(cfg.num_teachers)]
        ray.get([c.train.remote() for c in clients])
        return cls(clients, train.num_classes)

    def votes(self, x: torch.Tensor) -> torch.Tensor:
        """counts[B, K]: each client's vote on every query, aggregated on the coordinator."""
        ray = require_ray()
        preds = torch.stack(ray.get([c.vote.remote(x) for c in self.clients]))
        return F.one_hot(preds, self.num_classes).sum(0)

    def shutdown(self) -> None:
        ray = require_ray()
        for c in self.clients:
            ray.kill(c)
