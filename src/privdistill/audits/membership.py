"""Membership inference against a released classifier: a loss-threshold attack and LiRA (Carlini et al.,
"Membership inference attacks from first principles", IEEE S&P 2022), on one member/non-member split
shared by every model of a dataset.

The split (`audit_split`): members a seeded subset of the private training set outside the held-out "public"
slice (private data of every audited model), non-members an equal seeded subset of the test set.

Attacks (higher score = "member")
    loss         -CE(model(x), y)                      (Yeom et al. 2018; no shadow models)
    lira-online  log N(φ; μ_in, σ_in²) - log N(φ; μ_out, σ_out²)
    lira-offline (φ - μ_out) / σ_out                  (one-sided test against the OUT distribution)
    φ = log p_y - log(1 - p_y), computed stably from the logits as z_y - logsumexp_{k≠y} z_k.

Shadow models (cached stage `shadows`, one set per dataset): each audit example is IN exactly half of them, every
other training example in each with probability 1/2; below 64 shadows the variances are global (LiRA's "fixed
variance"). They train directly, a mismatch for the distilled students on purpose (do their outputs on private
records look like those of a model that saw them?); research log, "Notes that left the code: audits/membership.py".
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import norm
from torch import nn

from privdistill.atomic import atomic_torch_save
from privdistill.audits.metrics import attack_metrics
from privdistill.config import ClassifierTraining, check, to_plain
from privdistill.data.dataset import DataSplits, ImageDataset, to_float
from privdistill.engine import streams
from privdistill.engine.cache import Stage, StageCache
from privdistill.engine.context import Env
from privdistill.engine.holdout import holdout_size, public_indices
from privdistill.engine.run import RunDir
from privdistill.engine.trainer import evaluate, train_classifier
from privdistill.errors import ConfigError
from privdistill.models import create_model

SHADOWS_VERSION = "1"


@dataclass
class AuditConfig:
    """Config section `audit`."""

    members: int = 2000
    nonmembers: int = 2000
    holdout: float = 1 / 6  # the public slice (as pate.holdout / dgd.holdout) that members avoid; 0: none
    split_seed: int = 0  # seed of the split AND of the public slice it avoids (the runs' default seed)
    shadows: int = 16  # 0: no LiRA (loss attack only)
    fix_variance: bool = True  # global σ_in / σ_out (LiRA with few shadows)
    bootstrap: int = 200  # bootstrap resamples for the 95 % intervals (0: none)
    mia: bool = True
    inversion: bool = True

    def validate(self) -> None:
        check(self.members >= 1 and self.nonmembers >= 1, "audit.members and audit.nonmembers must be >= 1")
        if self.holdout < 0:
            raise ConfigError("audit.holdout must be >= 0")
        if self.holdout >= 1:
            self.holdout = int(self.holdout)  # a count: recorded as before (10000, not 10000.0)
        check(self.shadows >= 0 and self.shadows % 2 == 0, "audit.shadows must be 0 (loss attack only) or an even "
              "number (each example is IN for half of them)")
        check(self.bootstrap >= 0, "audit.bootstrap must be >= 0")


@dataclass
class AuditSplit:
    members: torch.Tensor  # indices into the training set
    nonmembers: torch.Tensor  # indices into the test set

    def images(self, data: DataSplits) -> torch.Tensor:
        return torch.cat([data.train.images[self.members], data.test.images[self.nonmembers]])

    def labels(self, data: DataSplits) -> torch.Tensor:
        return torch.cat([data.train.labels[self.members], data.test.labels[self.nonmembers]])

    def is_member(self) -> np.ndarray:
        return np.r_[np.ones(len(self.members), bool), np.zeros(len(self.nonmembers), bool)]

    def digest(self) -> str:
        h = hashlib.sha256(self.members.numpy().tobytes() + b"|" + self.nonmembers.numpy().tobytes())
        return h.hexdigest()[:16]


def audit_split(data: DataSplits, cfg: AuditConfig) -> AuditSplit:
    """The member/non-member split of a dataset: a function of (dataset sizes, cfg) only."""
    n_train, n_test = len(data.train), len(data.test)
    excluded = torch.zeros(n_train, dtype=torch.bool)
    if 0 < cfg.holdout and holdout_size(cfg.holdout, n_train) < n_train:
        excluded[public_indices(n_train, cfg.holdout, cfg.split_seed)] = True
    candidates = torch.nonzero(~excluded).flatten()
    if cfg.members > len(candidates) or cfg.nonmembers > n_test:
        raise ConfigError(f"audit needs {cfg.members} members (of {len(candidates)} private training examples) and "
                          f"{cfg.nonmembers} non-members (of {n_test} test examples); lower audit.members/nonmembers")
    env = Env.cpu(seed=cfg.split_seed)
    order = torch.randperm(len(candidates), generator=env.generator(streams.MEMBERSHIP_SPLIT, 0))
    members = candidates[order[:cfg.members]]
    nonmembers = torch.randperm(n_test, generator=env.generator(streams.MEMBERSHIP_SPLIT, 1))[:cfg.nonmembers]
    return AuditSplit(members.sort().values, nonmembers.sort().values)


# ------------------------------------------------------------------------------------------- scoring
@torch.no_grad()
def model_outputs(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, device: torch.device | str = "cpu",
                  batch_size: int = 1000) -> dict[str, np.ndarray]:
    """Per-example loss and logit-scaled confidence φ, in fp32 (the same scoring for targets and shadows)."""
    was_training = model.training
    model.eval()
    losses, phis, correct = [], [], []
    for start in range(0, len(images), batch_size):
        x = to_float(images[start:start + batch_size]).to(device)
        y = labels[start:start + batch_size].to(device)
        z = model(x).float()
        losses.append(F.cross_entropy(z, y, reduction="none").cpu())
        phis.append(logit_confidence(z, y).cpu())
        correct.append((z.argmax(1) == y).cpu())
    model.train(was_training)
    return {"loss": torch.cat(losses).numpy().astype(np.float64), "phi": torch.cat(phis).numpy().astype(np.float64),
            "correct": torch.cat(correct).numpy()}


def logit_confidence(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """φ = log(p_y / (1 - p_y)) = z_y - logsumexp_{k≠y} z_k, stable for confident models."""
    z_y = logits.gather(1, labels[:, None]).squeeze(1)
    others = logits.scatter(1, labels[:, None], float("-inf"))
    return z_y - torch.logsumexp(others, dim=1)


# ------------------------------------------------------------------------------------------- shadows
def _assignment(n_shadows: int, n_audit: int, n_rest: int, env: Env) -> tuple[torch.Tensor, torch.Tensor]:
    """in_audit [S, A]: each audit example IN for exactly S/2 shadows; in_rest [S, R]: Bernoulli(1/2)."""
    g = env.generator(streams.MEMBERSHIP_ASSIGN, 0)
    ranks = torch.rand(n_audit, n_shadows, generator=g).argsort(dim=1).argsort(dim=1)  # a permutation per example
    in_audit = (ranks < n_shadows // 2).T.contiguous()
    in_rest = torch.rand(n_shadows, n_rest, generator=env.generator(streams.MEMBERSHIP_ASSIGN, 1)) < 0.5
    return in_audit, in_rest


def shadow_stage(data: DataSplits, split: AuditSplit, cfg: AuditConfig, shadow_cfg: ClassifierTraining, env: Env,
                 cache: StageCache, private_dir) -> Stage:
    """Train (or reuse) the shadow models of a dataset; the stage stores their scores on the audit examples
    (`shadows.pt`: phi [S, A], loss [S, A], in_mask [S, A], test accuracy per shadow), not their weights."""
    audit_images, audit_labels = split.images(data), split.labels(data)
    is_member = torch.zeros(len(data.train), dtype=torch.bool)
    is_member[split.members] = True
    rest = torch.nonzero(~is_member).flatten()  # training examples outside the audit set
    score_env = Env(device=env.device, precision="fp32", seed=env.seed, progress=False)

    def build(run: RunDir) -> dict:
        in_audit, in_rest = _assignment(cfg.shadows, len(audit_images), len(rest), env)
        phis, losses, accs, seconds = [], [], [], 0.0
        for i in range(cfg.shadows):
            done = run.path / f"shadow-{i}.pt"
            if done.is_file():  # resume: shadows already trained
                rec = torch.load(done, weights_only=False)
            else:
                started = time.perf_counter()
                sub = rest[in_rest[i]]
                images = torch.cat([data.train.images[sub], audit_images[in_audit[i]]])
                labels = torch.cat([data.train.labels[sub], audit_labels[in_audit[i]]])
                train = ImageDataset(images, labels, data.num_classes, name=f"shadow {i}")
                seed = int(env.generator(streams.MEMBERSHIP_SHADOW_SEED, i).initial_seed() % (2 ** 31))
                shadow_env = Env(device=env.device, precision=env.precision, seed=seed, progress=env.progress)
                torch.manual_seed(seed)
                model = create_model(shadow_cfg.model, kind="classifier", in_channels=data.channels,
                                     num_classes=data.num_classes, image_size=data.image_size[0])
                train_classifier(model, train, cfg=shadow_cfg, env=shadow_env, run=run,
                                 checkpoint=f"shadow-{i}-checkpoint", description=f"shadow {i + 1}/{cfg.shadows}")
                model = model.float().to(env.device).to(memory_format=torch.contiguous_format)
                out = model_outputs(model, audit_images, audit_labels, score_env.device)
                rec = {"phi": out["phi"], "loss": out["loss"], "train_size": len(train),
                       "test_accuracy": evaluate(model, data.test, env), "seconds": time.perf_counter() - started}
                atomic_torch_save(done, rec)
                run.remove_checkpoint(f"shadow-{i}-checkpoint")
            phis.append(rec["phi"])
            losses.append(rec["loss"])
            accs.append(rec["test_accuracy"])
            seconds += rec["seconds"]
        atomic_torch_save(run.path / "shadows.pt", {"phi": np.stack(phis), "loss": np.stack(losses),
                                                    "in_mask": in_audit.numpy(), "test_accuracy": np.array(accs)})
        for leftover in run.path.glob("shadow-*.pt"):
            leftover.unlink()
        return {"shadows": cfg.shadows, "mean_test_accuracy": round(float(np.mean(accs)), 4),
                "mean_train_size": int(in_rest.sum(1).float().mean() + len(audit_images) // 2),
                "wall_seconds": round(seconds, 1), "device": env.describe()}

    material = {"train": data.train.fingerprint(), "test": data.test.fingerprint(), "split": split.digest(),
                "shadows": cfg.shadows, "config": to_plain(shadow_cfg), "seed": env.seed, "precision": env.precision}
    return cache.get_or_build("shadows", SHADOWS_VERSION, material, build, private_dir=private_dir)


def load_shadows(stage: Stage) -> dict[str, np.ndarray]:
    return torch.load(stage.path / "shadows.pt", weights_only=False)


def lira_scores(target_phi: np.ndarray, shadow_phi: np.ndarray, in_mask: np.ndarray, *,
                fix_variance: bool = True) -> dict[str, np.ndarray]:
    """Online and offline LiRA scores of each audit example (higher = more likely a member)."""
    in_mask = np.asarray(in_mask, dtype=bool)
    shadow_phi = np.asarray(shadow_phi, dtype=float)
    if shadow_phi.shape != in_mask.shape or shadow_phi.shape[1] != len(target_phi):
        raise ValueError("shadow scores, IN mask and target scores disagree in shape")
    with np.errstate(invalid="ignore", divide="ignore"):
        ins = np.where(in_mask, shadow_phi, np.nan)
        outs = np.where(~in_mask, shadow_phi, np.nan)
        mu_in, mu_out = np.nanmean(ins, axis=0), np.nanmean(outs, axis=0)
        if fix_variance:
            sd_in = np.full_like(mu_in, np.nanstd(ins - mu_in))
            sd_out = np.full_like(mu_out, np.nanstd(outs - mu_out))
        else:
            sd_in, sd_out = np.nanstd(ins, axis=0), np.nanstd(outs, axis=0)
    # examples never IN (or OUT) would have no estimate: fall back to the global one
    mu_in = np.where(np.isfinite(mu_in), mu_in, np.nanmean(ins))
    mu_out = np.where(np.isfinite(mu_out), mu_out, np.nanmean(outs))
    sd_in = np.maximum(np.nan_to_num(sd_in, nan=1.0), 1e-3)
    sd_out = np.maximum(np.nan_to_num(sd_out, nan=1.0), 1e-3)
    online = norm.logpdf(target_phi, mu_in, sd_in) - norm.logpdf(target_phi, mu_out, sd_out)
    offline = (target_phi - mu_out) / sd_out
    return {"online": online, "offline": offline}


def membership_audit(model: nn.Module, data: DataSplits, split: AuditSplit, cfg: AuditConfig,
                     shadows: dict[str, np.ndarray] | None, device: torch.device | str = "cpu") -> dict[str, Any]:
    """Every attack's metrics and per-example scores against `model` (fp32 scoring)."""
    model = model.float().to(device).to(memory_format=torch.contiguous_format)
    out = model_outputs(model, split.images(data), split.labels(data), device)
    labels = split.is_member()
    scores = {"loss": -out["loss"]}
    if shadows is not None:
        lira = lira_scores(out["phi"], shadows["phi"], shadows["in_mask"], fix_variance=cfg.fix_variance)
        scores["lira-online"] = lira["online"]
        scores["lira-offline"] = lira["offline"]
    attacks = {name: attack_metrics(s, labels, bootstrap=cfg.bootstrap, seed=cfg.split_seed)
               for name, s in scores.items()}
    headline = "lira-online" if "lira-online" in attacks else "loss"
    return {"headline_attack": headline, "attacks": attacks, "scores": scores, "is_member": labels,
            "accuracy_members": round(float(out["correct"][labels].mean()), 4),
            "accuracy_nonmembers": round(float(out["correct"][~labels].mean()), 4),
            "mean_loss_members": round(float(out["loss"][labels].mean()), 4),
            "mean_loss_nonmembers": round(float(out["loss"][~labels].mean()), 4)}
