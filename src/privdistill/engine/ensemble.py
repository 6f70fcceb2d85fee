"""Teacher ensembles: n classifiers trained on n disjoint partitions, and their batched votes.

The vectorised trainer stacks the teachers' parameters (`torch.func.stack_module_state`) and runs one
`vmap(functional_call)` step for a chunk of teachers, each on its own batch (many small networks one after the other
waste a GPU). Adam is element-wise, so one Adam over stacked parameters is exactly n independent Adams; the plain
loop trainer is the reference, giving the same teachers for equal seeds (up to summation order).
"""

from __future__ import annotations

import copy
import json
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from privdistill.atomic import atomic_torch_save, atomic_write_bytes
from privdistill.config import check, check_augment
from privdistill.data.dataset import ImageDataset, to_float
from privdistill.data.partition import missing_classes, partition_indices
from privdistill.engine import streams
from privdistill.engine.augment import augment_batch
from privdistill.engine.context import Env
from privdistill.engine.optim import make_optimizer, set_lr
from privdistill.engine.progress import progress_bar
from privdistill.engine.run import safetensors_bytes
from privdistill.errors import ConfigError, DataError, ModelError
from privdistill.models import create_model
from privdistill.privacy.vote_noise import vote_noise_note


class EnsembleWarning(UserWarning):
    """A teacher ensemble that trains, but worse than it could (e.g. partitions missing classes)."""


_BUFFER_PREFIX = "buffer:"  # marks buffers among a trained chunk's stacked tensors (the loop trainer keeps them)


@dataclass
class TeacherTraining:
    """Config section `teachers`. Paper (DGD Sec. IV): 250 teachers, Adam, batch 128, 3000 iterations,
    lr 0.05 decaying linearly to 0."""

    num_teachers: int = 250
    model: str = "paper-cnn"
    steps: int = 3000  # iterations per teacher
    batch_size: int = 128
    lr: float = 0.05
    lr_schedule: str = "linear"  # linear | constant
    # auto: vectorised on CUDA, the plain loop on a CPU, where oneDNN runs vmap's convolutions slowly (benchmarks.md)
    trainer: str = "auto"  # auto | vectorized | loop
    chunk_size: int = 0  # teachers per vectorised step; 0: automatic (memory-bounded)
    # each teacher's batches augmented (its own stream): on MNIST affine copies make teachers that read synthetic
    # samples alike (DGD's default recipe; docs/research-log.md, "Synthesis engine"). Off: the papers' teachers.
    augment: str = "none"  # one of config.AUGMENTATIONS (engine/augment.py)

    def validate(self) -> None:
        check_augment(self.augment, "teachers.augment")
        check(self.num_teachers >= 1, f"num_teachers must be >= 1, got {self.num_teachers}")
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ConfigError("steps, batch_size and lr must be positive")
        check(self.trainer in ("auto", "vectorized", "loop"),
              f"trainer must be auto, vectorized or loop, got {self.trainer!r}")
        check(self.lr_schedule in ("linear", "constant"),
              f"lr_schedule must be linear or constant, got {self.lr_schedule!r}")
        check(self.chunk_size >= 0, "chunk_size must be >= 0")


# ------------------------------------------------------------------------------------------ the ensemble
class TeacherEnsemble(nn.Module):
    """n teachers of one architecture with stacked parameters [n, ...]; `votes(x)` counts their argmaxes."""

    def __init__(self, base: nn.Module, params: dict[str, torch.Tensor],
                 buffers: dict[str, torch.Tensor] | None = None):
        super().__init__()
        # a list keeps the template out of state_dict; eval: BatchNorm teachers vote with their running statistics
        self.base = [copy.deepcopy(base).eval().to("meta")]
        self.names = list(params)
        for i, name in enumerate(self.names):
            self.register_buffer(f"p{i}", params[name].detach())
        self.buffer_names = list(buffers or {})
        for i, name in enumerate(self.buffer_names):
            self.register_buffer(f"b{i}", buffers[name].detach())
        self.registry_name = getattr(base, "registry_name", "")
        self.registry_kwargs = dict(getattr(base, "registry_kwargs", {}))

    @property
    def num_teachers(self) -> int:
        return int(getattr(self, "p0").shape[0])

    def stacked(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        params = {n: getattr(self, f"p{i}") for i, n in enumerate(self.names)}
        buffers = {n: getattr(self, f"b{i}") for i, n in enumerate(self.buffer_names)}
        return params, buffers

    @torch.no_grad()
    def logits(self, x: torch.Tensor, *, chunk: int = 50, vectorized: bool | None = None) -> torch.Tensor:
        """[n, B, K] logits of every teacher on the same batch x [B, C, H, W].

        vmap on CUDA; on the CPU a plain loop over teachers, which oneDNN runs faster than vmap's batched
        convolutions (docs/benchmarks.md). Callers choose the precision with their autocast context."""
        params, buffers = self.stacked()
        if vectorized is None:
            vectorized = x.device.type != "cpu"
        if not vectorized:
            # one real module, each teacher's weights copied in: faster on oneDNN than functional_call on the views
            layout = torch.channels_last if x.ndim == 4 and x.is_contiguous(memory_format=torch.channels_last) \
                else torch.contiguous_format
            module = self._scratch_module(x.device, layout)
            out = []
            for i in range(self.num_teachers):
                module.load_state_dict({**{k: v[i] for k, v in params.items()},
                                        **{k: v[i] for k, v in buffers.items()}})
                out.append(module(x).float())
            return torch.stack(out)
        base = self.base[0]

        def one(p, b, inputs):
            return functional_call(base, (p, b), (inputs,))

        out = []
        for start in range(0, self.num_teachers, chunk):
            p = {k: v[start:start + chunk] for k, v in params.items()}
            b = {k: v[start:start + chunk] for k, v in buffers.items()}
            out.append(vmap(one, in_dims=(0, 0, None))(p, b, x).float())
        return torch.cat(out)

    def _scratch_module(self, device: torch.device, layout: torch.memory_format) -> nn.Module:
        key = (str(device), str(layout))
        cached = getattr(self, "_scratch", None)
        if cached is None or cached[0] != key:
            module = create_model(self.registry_name, **self.registry_kwargs) if self.registry_name \
                else copy.deepcopy(self.base[0]).to_empty(device="cpu")
            # no grad: autocast caches its casts of grad-requiring leaves, which would keep teacher 0's weights
            module = module.to(device).eval().requires_grad_(False)
            if layout == torch.channels_last:
                module = module.to(memory_format=torch.channels_last)
            self._scratch = (key, module)
        return self._scratch[1]

    @torch.no_grad()
    def predictions(self, x: torch.Tensor, *, chunk: int = 50) -> torch.Tensor:
        """[n, B] predicted label of every teacher (n teachers, B inputs)."""
        return self.logits(x, chunk=chunk).argmax(-1)

    @torch.no_grad()
    def votes(self, x: torch.Tensor, *, num_classes: int | None = None, chunk: int = 50) -> torch.Tensor:
        """counts[B, K]: how many teachers vote for each class, for the whole ensemble in one pass."""
        preds = self.predictions(x, chunk=chunk)
        k = num_classes or int(self.base[0].classifier.out_features)
        return F.one_hot(preds, k).sum(0)

    def iter_votes(self, images: torch.Tensor, env: Env, *, batch: int = 500) -> Iterator[torch.Tensor]:
        """Vote counts [b, K] on the CPU for stored (uint8) `images`, `batch` images at a time on env's device:
        how DGD, PATE and the synthesis engine query an ensemble (a caller may stop early, e.g. a privacy filter)."""
        for start in range(0, len(images), batch):
            yield self.votes(env.place_batch(to_float(images[start:start + batch]))).cpu()

    def member(self, i: int) -> nn.Module:
        """Teacher i as an ordinary module (for inspection, audits and the reference loop)."""
        if not self.registry_name:
            raise ModelError("this ensemble was built from an unregistered model; cannot rebuild a member")
        model = create_model(self.registry_name, **self.registry_kwargs)
        params, buffers = self.stacked()
        model.load_state_dict({k: v[i] for k, v in {**params, **buffers}.items()})
        return model

    def save(self, path: str | Path, metadata: dict | None = None) -> None:
        params, buffers = self.stacked()
        tensors = {f"param.{k}": v.detach().cpu().contiguous() for k, v in params.items()}
        tensors.update({f"buffer.{k}": v.detach().cpu().contiguous() for k, v in buffers.items()})
        meta = {"registry_name": self.registry_name, "registry_kwargs": json.dumps(self.registry_kwargs),
                "num_teachers": str(self.num_teachers), **{k: str(v) for k, v in (metadata or {}).items()}}
        atomic_write_bytes(path, safetensors_bytes(tensors, meta))

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu") -> "TeacherEnsemble":
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(str(path), device=str(device))
        base = create_model(meta["registry_name"], **json.loads(meta["registry_kwargs"]))
        params = {k[6:]: v for k, v in tensors.items() if k.startswith("param.")}
        buffers = {k[7:]: v for k, v in tensors.items() if k.startswith("buffer.")}
        return cls(base, params, buffers).to(device)


# -------------------------------------------------------------------------------------------- training
def make_partitions(train: ImageDataset, cfg: TeacherTraining) -> list[torch.Tensor]:
    if cfg.num_teachers > len(train):
        raise DataError(f"{cfg.num_teachers} teachers need at least {cfg.num_teachers} training examples; "
                        f"{train.name} has {len(train)}")
    parts = partition_indices(len(train), cfg.num_teachers, seed=0)
    smallest = min(len(p) for p in parts)
    if smallest < cfg.batch_size:
        raise ConfigError(f"teachers.batch_size {cfg.batch_size} exceeds the smallest partition ({smallest} "
                          f"examples with {cfg.num_teachers} teachers); lower it or use fewer teachers")
    return parts


def padded_partitions(parts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The partitions as rows of one tensor [n, largest size] (zero-padded), and their sizes [n]."""
    sizes = torch.tensor([len(p) for p in parts])
    padded = torch.zeros(len(parts), int(sizes.max()), dtype=torch.long)
    for i, p in enumerate(parts):
        padded[i, :len(p)] = p
    return padded, sizes


def plan_teachers(train: ImageDataset, cfg: TeacherTraining, *, distribution: str, scale: float, option: str,
                  threshold: float | None = None, sigma1: float | None = None) -> str:
    """Checks of a teacher ensemble's plan, run before anything trains: the partitions can be made, and what the
    vote noise leaves of a unanimous vote (a note; a VoteNoiseWarning when it leaves little)."""
    make_partitions(train, cfg)
    return vote_noise_note(cfg.num_teachers, train.num_classes, distribution=distribution, scale=scale, option=option,
                           threshold=threshold, sigma1=sigma1)


def _init_teachers(cfg: TeacherTraining, train: ImageDataset, count: int, first: int, env: Env) -> list[nn.Module]:
    models = []
    for i in range(first, first + count):
        torch.manual_seed(env.generator(streams.TEACHER_INIT, i).initial_seed())
        models.append(create_model(cfg.model, kind="classifier", in_channels=train.channels,
                                   num_classes=train.num_classes, image_size=train.image_size[0]))
    return models


def _epoch_orders(sizes: torch.Tensor, rng_ids: torch.Tensor, epoch: int, env: Env) -> torch.Tensor:
    """[m, max size]: a seeded permutation of each teacher's own partition for this epoch.

    Derived from (seed, teacher id, epoch) alone, so a teacher sees the same batches whether it is trained
    alone, in any chunk, or inside a client actor."""
    orders = torch.zeros(len(sizes), int(sizes.max()), dtype=torch.long)
    for row, (size, tid) in enumerate(zip(sizes.tolist(), rng_ids.tolist())):
        orders[row, :size] = torch.randperm(size, generator=env.generator(streams.TEACHER_EPOCH, tid, epoch))
    return orders


def _steps_per_epoch(sizes: torch.Tensor, batch: int) -> int:
    # Every teacher of a run uses the same epoch length (smallest partition // batch), so that all
    # teachers stay in step whatever the chunking; partitions differ in size by at most one.
    return max(1, int(sizes.min()) // batch)


class _BatchPlan:
    """Positions of each step's batch inside each teacher's partition, recomputed once per epoch."""

    def __init__(self, sizes: torch.Tensor, rng_ids: torch.Tensor, batch: int, per_epoch: int, env: Env):
        self.sizes, self.rng_ids, self.batch, self.per_epoch, self.env = sizes, rng_ids, batch, per_epoch, env
        self._epoch, self._orders = None, None

    def positions(self, step: int) -> torch.Tensor:
        epoch, pos = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._orders = epoch, _epoch_orders(self.sizes, self.rng_ids, epoch, self.env)
        return self._orders[:, pos * self.batch:(pos + 1) * self.batch]


def _perturb(x: torch.Tensor, cfg: TeacherTraining, rng_ids: torch.Tensor, step: int, env: Env) -> torch.Tensor:
    """Each teacher's batch [m, B, C, H, W] augmented (teachers.augment) from its own stream (teacher id, step): the
    same whether it is trained alone or in any chunk."""
    if cfg.augment == "none":
        return x
    return torch.stack([augment_batch(row, cfg.augment, env.generator(streams.TEACHER_AUGMENT, tid, step))
                        for row, tid in zip(x, rng_ids.tolist())])


def _gather(train: ImageDataset, partitions: torch.Tensor, positions: torch.Tensor, env: Env):
    """Images [m, B, C, H, W] and labels [m, B]: row r of `positions` indexes partition row r."""
    idx = torch.gather(partitions, 1, positions)  # [m, B] dataset indices
    x = to_float(train.images[idx.flatten()])
    x = x.view(*idx.shape, *x.shape[1:])
    return x.to(env.device, non_blocking=True), train.labels[idx].to(env.device, non_blocking=True)


# a teacher's batch, in pixels, up to which vmap's grouped convolutions beat the loop on a CPU, where the loop pays
# one dispatch per tiny step (timings: research log, "Notes that left the code: engine/ensemble.py")
VMAP_CPU_PIXELS = 2048


def auto_trainer(cfg: TeacherTraining, train: ImageDataset, env: Env, *, has_buffers: bool) -> str:
    """teachers.trainer=auto: vectorised on CUDA, and on a CPU for batches small enough that the loop's per-step
    overhead dominates; the loop for models with buffers (BatchNorm), which vmap cannot update."""
    if has_buffers:
        return "loop"
    h, w = train.image_size
    small = min(cfg.batch_size, len(train) // cfg.num_teachers) * h * w <= VMAP_CPU_PIXELS
    return "vectorized" if env.device.type == "cuda" or small else "loop"


def auto_chunk_size(cfg: TeacherTraining, train: ImageDataset, env: Env) -> int:
    """Teachers per vectorised step: bounded by activation memory (about 1 MiB per image for the paper CNN at
    28x28, scaled by image area; research log), all teachers at once when they fit."""
    if cfg.chunk_size > 0:
        return min(cfg.chunk_size, cfg.num_teachers)
    h, w = train.image_size
    per_image = 1024 * 1024 * (h * w) / (28 * 28) * (3 if cfg.model.startswith("resnet") else 1)
    if env.device.type == "cuda":
        budget = torch.cuda.mem_get_info(env.device)[0] * 0.5
    else:
        budget = 4 * 1024**3  # CPU: keep the working set modest; bigger chunks do not run faster here
    return max(1, min(cfg.num_teachers, int(budget // (per_image * cfg.batch_size))))


def resolve_trainer(cfg: TeacherTraining, train: ImageDataset, env: Env) -> tuple[TeacherTraining, nn.Module]:
    """The trainer a run uses (``auto`` resolved) and the untrained template teacher; a model with buffers is
    refused the vectorised trainer. Local and Ray training both decide here, so they train alike."""
    template = _init_teachers(cfg, train, 1, 0, env)[0]
    has_buffers = any(True for _ in template.buffers())
    if cfg.trainer == "auto":
        cfg = replace(cfg, trainer=auto_trainer(cfg, train, env, has_buffers=has_buffers))
    if cfg.trainer == "vectorized" and has_buffers:
        raise ModelError(f"{cfg.model} has buffers (BatchNorm running statistics), which vmap cannot update; "
                         "set teachers.trainer=loop for it")
    return cfg, template


def gather_chunks(template: nn.Module, chunks: list[dict[str, torch.Tensor]]) -> "TeacherEnsemble":
    """One ensemble from trained chunks in teacher order (the loop trainer's buffers split from the parameters)."""
    stacked = {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}
    buffers = {k[len(_BUFFER_PREFIX):]: stacked.pop(k) for k in list(stacked) if k.startswith(_BUFFER_PREFIX)}
    return TeacherEnsemble(template, stacked, buffers)


def train_chunk(train: ImageDataset, cfg: TeacherTraining, env: Env, padded: torch.Tensor, sizes: torch.Tensor,
                ids: torch.Tensor, bar) -> dict[str, torch.Tensor]:
    """Teachers `ids` (consecutive) freshly initialised and trained by `cfg.trainer` (resolved: resolve_trainer),
    their stacked weights on the CPU. Local training and each Ray task call this, so they train alike."""
    models = _init_teachers(cfg, train, len(ids), int(ids[0]), env)
    trainer = _train_chunk_vectorized if cfg.trainer == "vectorized" else _train_chunk_loop
    params = trainer(models, train, padded[ids], sizes[ids], ids, cfg, env, bar,
                     per_epoch=_steps_per_epoch(sizes, cfg.batch_size))
    return {k: v.detach().cpu() for k, v in params.items()}


def train_teachers(train: ImageDataset, cfg: TeacherTraining, env: Env, *, checkpoint_dir: Path | None = None,
                   parts: list[torch.Tensor] | None = None) -> tuple[TeacherEnsemble, dict]:
    """Train cfg.num_teachers teachers on disjoint partitions of `train`.

    Returns the ensemble and statistics (time, teachers per minute, partition facts). With a
    checkpoint directory, finished chunks are saved atomically and skipped on resume.
    """
    parts = parts if parts is not None else make_partitions(train, cfg)
    lacking = missing_classes(train.labels, parts, train.num_classes)
    if lacking:
        first = next(iter(lacking.items()))
        warnings.warn(f"{len(lacking)} of {cfg.num_teachers} partitions lack some class (partition {first[0]} has no "
                      f"example of class(es) {first[1]}): those teachers can never vote for it; the others' plurality "
                      "still can (fewer teachers, each on more records, if the released labels come out poor).",
                      EnsembleWarning, stacklevel=2)
    padded, sizes = padded_partitions(parts)
    cfg, template = resolve_trainer(cfg, train, env)
    chunk = auto_chunk_size(cfg, train, env) if cfg.trainer == "vectorized" else 1
    started = time.perf_counter()
    chunks: list[dict[str, torch.Tensor]] = []
    with progress_bar(cfg.num_teachers * cfg.steps, f"{cfg.num_teachers} teachers ({cfg.trainer})",
                      enabled=env.progress) as bar:
        for first in range(0, cfg.num_teachers, chunk):
            ids = torch.arange(first, min(first + chunk, cfg.num_teachers))
            saved = checkpoint_dir / f"teachers-{first:05d}.pt" if checkpoint_dir else None
            if saved is not None and saved.is_file():
                chunks.append(torch.load(saved, map_location="cpu", weights_only=True))
                bar.advance(len(ids) * cfg.steps)
                continue
            params = train_chunk(train, cfg, env, padded, sizes, ids, bar)
            if saved is not None:
                atomic_torch_save(saved, params)
            chunks.append(params)
    wall = time.perf_counter() - started
    ensemble = gather_chunks(template, chunks)
    stats = {"num_teachers": cfg.num_teachers, "trainer": cfg.trainer, "chunk_size": chunk,
             "wall_seconds": round(wall, 3), "teachers_per_minute": round(cfg.num_teachers / max(wall, 1e-9) * 60, 2),
             "partition_sizes": [int(sizes.min()), int(sizes.max())], "partitions_missing_classes": len(lacking)}
    return ensemble, stats


def _train_chunk_vectorized(models, train, partitions, sizes, rng_ids, cfg: TeacherTraining, env: Env, bar, *,
                            per_epoch: int) -> dict:
    """Train m teachers at once: `partitions` [m, P] / `sizes` [m] are theirs, `rng_ids` their identities."""
    params, buffers = stack_module_state(models)
    params = {k: v.to(env.device).detach().requires_grad_(True) for k, v in params.items()}
    base = copy.deepcopy(models[0]).to("meta")

    def loss_one(p, x, y):
        logits = functional_call(base, (p,), (x,))
        return F.cross_entropy(logits.float(), y)

    batched_loss = vmap(loss_one, in_dims=(0, 0, 0))
    optimizer = make_optimizer(params.values(), "adam", lr=cfg.lr)
    plan = _BatchPlan(sizes, rng_ids, cfg.batch_size, per_epoch, env)
    for step in range(cfg.steps):
        set_lr(optimizer, cfg.lr, cfg.lr_schedule, step, cfg.steps)
        x, y = _gather(train, partitions, plan.positions(step), env)
        x = _perturb(x, cfg, rng_ids, step, env)
        with env.autocast():
            # Sum over teachers: each teacher's gradient is that of its own mean loss.
            loss = batched_loss(params, x, y).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        bar.advance(len(rng_ids), loss=float(loss.detach()) / len(rng_ids))
    return params


def _train_chunk_loop(models, train, partitions, sizes, rng_ids, cfg: TeacherTraining, env: Env, bar, *,
                      per_epoch: int) -> dict:
    """Reference trainer: one teacher after the other, same batches and schedule as the vectorised one."""
    trained = []
    for row, model in enumerate(models):
        model = env.place(model)
        optimizer = make_optimizer(model.parameters(), "adam", lr=cfg.lr)
        plan = _BatchPlan(sizes[row:row + 1], rng_ids[row:row + 1], cfg.batch_size, per_epoch, env)
        for step in range(cfg.steps):
            set_lr(optimizer, cfg.lr, cfg.lr_schedule, step, cfg.steps)
            x, y = _gather(train, partitions[row:row + 1], plan.positions(step), env)
            x = _perturb(x, cfg, rng_ids[row:row + 1], step, env)
            with env.autocast():
                logits = model(env.place_batch(x[0]))
            loss = F.cross_entropy(logits.float(), y[0])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            bar.advance(1, loss=float(loss.detach()))
        trained.append(model)
    params, buffers = stack_module_state(trained)  # buffers: BatchNorm running statistics, kept for voting
    return {**params, **{_BUFFER_PREFIX + k: v for k, v in buffers.items()}}


@torch.no_grad()
def ensemble_accuracy(ensemble: TeacherEnsemble, data: ImageDataset, env: Env, *, laplace_scale: float | None = None,
                      batch_size: int = 500, seed: int = 0) -> dict[str, float]:
    """Accuracy of the plurality vote (and of the Laplace noisy vote with scale b) on `data`, plus the mean
    accuracy of individual teachers. Evaluation only: no privacy is spent on a test set."""
    correct = noisy_correct = member_correct = 0.0
    gen = torch.Generator().manual_seed(seed)
    for start in range(0, len(data), batch_size):
        x, y = data.batch(torch.arange(start, min(start + batch_size, len(data))), env.device)
        with env.autocast():
            preds = ensemble.predictions(env.place_batch(x) if x.ndim == 4 else x).cpu()
        y = y.cpu()
        member_correct += float((preds == y[None]).float().sum()) / ensemble.num_teachers
        counts = F.one_hot(preds, data.num_classes).sum(0).float()
        correct += float((counts.argmax(1) == y).sum())
        if laplace_scale:
            noise = _laplace(counts.shape, laplace_scale, gen)
            noisy_correct += float(((counts + noise).argmax(1) == y).sum())
    n = len(data)
    out = {"ensemble_accuracy": correct / n, "mean_teacher_accuracy": member_correct / n}
    if laplace_scale:
        out["noisy_ensemble_accuracy"] = noisy_correct / n
        out["laplace_scale"] = laplace_scale
    return out


def _laplace(shape, scale: float, gen: torch.Generator) -> torch.Tensor:
    u = torch.rand(shape, generator=gen, dtype=torch.float64) - 0.5
    return (-scale * torch.sign(u) * torch.log1p(-2 * u.abs())).float()
