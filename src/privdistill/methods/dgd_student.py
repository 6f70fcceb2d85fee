"""DGD's semi-supervised student (Ge et al. 2023, Eq. 1, 5, 6).

    Eq. 1   min  CE(φs(x̂s), l)  +  ‖h(x̂)−h(x̂⊥)‖² + ‖h(x̂)−h(x̂∥)‖²  −  H(φs(x̂))
            over the labelled queries (x̂s, l) and triples decoded from the noisy latent codes of the rest

Our readings of Eq. 1, 5 and 6 are in methods/dgd.py's docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.data.dataset import ImageDataset
from privdistill.engine import RunDir, streams
from privdistill.engine.context import Env
from privdistill.engine.manifold import ManifoldPerturber, PerturbationConfig
from privdistill.engine.student_loop import StudentLoop, StudentTraining, sample_batch
from privdistill.errors import ConfigError


@dataclass
class StudentConfig(StudentTraining):
    """Config section `student`: semi-supervised student learning (DGD: 500 iterations, lr 1e-3 -> 0)."""

    entropy_weight: float = 1.0
    unsupervised: bool = True  # False: the "supervised part only" ablation
    tangent: bool = True
    normal: bool = True
    tangent_eps: float = 1.0
    normal_eps: float = 2.0

    @property
    def reads_latent_codes(self) -> bool:  # Eq. 1's unlabelled part: the VAE and its noisy latent codes
        return self.unsupervised


def train_student(student: nn.Module, labelled: ImageDataset, codes: torch.Tensor, vae: nn.Module | None,
                  cfg: StudentConfig, env: Env, *, run: RunDir | None = None, test: ImageDataset | None = None,
                  vote_share: torch.Tensor | None = None) -> tuple[nn.Module, dict]:
    """Semi-supervised student (DGD Eq. 1): CE on the labelled queries + tangent/normal/entropy energy on
    decoded latent codes.
    Given the released noisy `vote_share` [queries, classes] (`dgd.release=histogram`), the supervised term is
    the squared error between the student's softmax and it instead of CE (methods/dgd.py says why).
    Resumable from `student-checkpoint`."""
    if vote_share is not None and tuple(vote_share.shape) != (len(labelled), labelled.num_classes):
        raise ConfigError(f"vote_share must be [{len(labelled)}, {labelled.num_classes}], got "
                          f"{tuple(vote_share.shape)}")
    loop = StudentLoop(student, lr=cfg.lr, steps=cfg.steps, env=env, title="DGD student", log_stage="student",
                       eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every, run=run, test=test)
    student = loop.student
    perturber = ManifoldPerturber(vae, PerturbationConfig(cfg.tangent_eps, cfg.normal_eps),
                                  autocast=env.autocast) if vae is not None else None
    codes = codes.to(env.device)
    use_codes = cfg.unsupervised and len(codes) > 0 and perturber is not None
    for step in loop:
        idx = sample_batch(len(labelled), cfg.batch_size, env.generator(streams.DGD_LABELLED, step))
        x, y = labelled.batch(idx)
        with env.autocast():
            logits = student(env.place_batch(x)).float()
        if vote_share is None:
            loss = F.cross_entropy(logits, y.to(env.device))
            parts = {"ce": float(loss.detach())}
        else:
            loss = (logits.softmax(1) - vote_share[idx].to(env.device)).square().sum(1).mean()
            parts = {"share_sq_error": float(loss.detach())}
        if use_codes:
            gen = env.generator(streams.DGD_PERTURB, step)
            z = codes[sample_batch(len(codes), cfg.unlabeled_batch_size,
                                   env.generator(streams.DGD_UNLABELLED, step)).to(env.device)]
            with torch.no_grad(), env.autocast():
                x_hat = env.place_batch(perturber.decode(z).float())
                clean = student.features(x_hat).float()
            # Perturbations first (the power iterations run their own mixed precision; the decoder's
            # Jacobian stays in fp32), then the energies under autocast.
            x_par = env.place_batch(perturber.tangent(student, z, x_hat, gen).float()) if cfg.tangent else None
            x_perp = env.place_batch(perturber.normal(student, z, x_hat, gen).float()) if cfg.normal else None
            with env.autocast():
                for name, perturbed in (("tangent", x_par), ("normal", x_perp)):
                    if perturbed is not None:
                        energy = (student.features(perturbed).float() - clean).pow(2).flatten(1).mean()
                        loss = loss + energy
                        parts[name] = float(energy.detach())
                # entropy MINIMISATION (TNAR/VAT; the text: "more determinate predictions"). Eq. 6 prints
                # +Σ φ log φ, i.e. minus the entropy, which minimised would push predictions to uniform.
                log_probs = F.log_softmax(student(x_hat).float(), dim=1)
                entropy = -(log_probs.exp() * log_probs).sum(1).mean()
                loss = loss + cfg.entropy_weight * entropy
                parts["entropy"] = float(entropy.detach())
        loop.update(loss, parts)
    return loop.finish()
