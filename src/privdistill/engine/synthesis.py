"""The data-free synthesis engine beyond the papers' literal generator losses (composable by config).

The papers fit a generator to ONE classifier (the baseline). Its samples sit where that classifier is
confident, far from the data manifold, and models trained on little data (DGD's 250 teachers) read them
arbitrarily: at the quick preset the teachers' plurality gives the baseline's label on 28 % of them. The
parts here aim at samples that many models read alike (DeepInversion names "images on which multiple models
are confident" as the open problem; the measured lead in shared/docs/synthesis-probe.md: 36 % -> 81 % when the
generator is fitted to six independently trained models instead of one):

* `SourceEnsemble`: the generator is fitted to the mean prediction of k classifiers, each trained on its own
  disjoint part of the private training set (`generator.source_models`). The ensemble's "logits" are
  log p̄ (p̄ the mean softmax), so every loss of engine/datafree.py applies unchanged: one-hot CE on its
  argmax, class balance of p̄, the activation terms on the members' concatenated features, BatchNorm
  statistics summed over the members.
* image priors (DeepInversion): total variation and L2 of the images (`generator.tv_weight`, `l2_weight`).
* class targets (`generator.class_targets`): a class-conditional generator, told which class each sample is
  for; the one-hot term aims at that class, so every class is drawn as often as asked.
* contrastive diversity (`generator.diversity_weight`; CMI's instance discrimination, simplified to the batch):
  two randomly shifted views of each sample must be told apart from the other samples in the source's feature
  space, which pushes the samples of one class apart instead of onto one confident mode.
* a student in the loop (`generator.adversarial_weight`; DFAD, Fang et al. 2019): a student learns the
  source's answers on the samples while the generator is rewarded for samples on which the two still differ,
  so the samples move to where the source's knowledge has not yet been passed on instead of staying on the
  few prototypes the source is surest of.
* sample verification (`generator.verify`, `generator.balance`): the synthetic set keeps the samples on which
  at least a share `verify` of the source models agree with the ensemble's label (and, with class targets,
  with the class asked for), and an equal number per label, so that every class is covered.
* `synthesis_quality`: what a synthetic set is worth, measured: the source labels' class balance, the share
  of samples on which other models (independently trained, the DGD teachers' plurality) give the source
  label, and the ceiling (the test accuracy of a student trained only on the samples, labelled by the source).

The loss terms among these (image priors, contrastive diversity, the student in the loop) are in
engine/datafree.py, next to the papers' terms that `train_generator` adds them to; this module holds what is built
around the generator: the source ensemble, sample verification and the quality measures.

Privacy: the source models are trained on the private data and nothing is privatised on their way to the
generator; under the papers' accounting they sit on the same uncovered pathway as the baseline (the privacy
reports say so), and the strict accounting covers the privatised channels only, as before.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.config import ClassifierTraining
from privdistill.data.dataset import ImageDataset, to_float
from privdistill.engine import streams
from privdistill.engine.augment import with_augmented_copies
from privdistill.engine.context import Env
from privdistill.engine.datafree import generate, logits_and_features
from privdistill.engine.ensemble import TeacherEnsemble
from privdistill.engine.trainer import evaluate, predict_logits, train_classifier
from privdistill.errors import ConfigError
from privdistill.models import create_model

CEILING_EPOCHS = 3.0  # the ceiling student's epochs unless asked otherwise (`generator quality --ceiling-epochs`)


class SourceEnsemble(nn.Module):
    """k frozen classifiers read as one: forward(x) = log of their mean softmax (a valid logit vector:
    softmax(log p̄) = p̄ and argmax = the ensemble's label)."""

    def __init__(self, members: list[nn.Module]):
        super().__init__()
        if len(members) < 2:
            raise ConfigError("a source ensemble needs at least 2 models")
        self.members = nn.ModuleList(members)
        for p in self.parameters():
            p.requires_grad_(False)

    def member_logits(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([m(x).float() for m in self.members])  # [k, B, K]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _log_mean_softmax(self.member_logits(x))

    def logits_and_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [logits_and_features(m, x) for m in self.members]
        logits = torch.stack([lg.float() for lg, _ in pairs])
        return _log_mean_softmax(logits), torch.cat([f.float().flatten(1) for _, f in pairs], dim=1)

    @torch.no_grad()
    def agreement(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the ensemble's label [B], the share of members whose own label equals it [B])."""
        logits = self.member_logits(x)
        label = _log_mean_softmax(logits).argmax(1)
        return label, (logits.argmax(2) == label[None]).float().mean(0)


def _log_mean_softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.logsumexp(F.log_softmax(logits, dim=-1), dim=0) - math.log(logits.shape[0])


def source_labels(source: nn.Module, images: torch.Tensor, env: Env, batch_size: int = 500) -> torch.Tensor:
    """The label the source model (a classifier or a SourceEnsemble) gives each uint8 image."""
    return predict_logits(source, images, env, batch_size).argmax(1)


@torch.no_grad()
def verified_samples(generator: nn.Module, source: nn.Module, n: int, env: Env, *, num_classes: int,
                     verify: float = 0.0, balance: bool = False, max_rounds: int = 50,
                     batch_size: int = 500) -> tuple[torch.Tensor, dict[str, Any]]:
    """n uint8 samples of `generator` that pass verification: with `verify` > 0 (a SourceEnsemble), at least that
    share of the source models agree with the ensemble's label; with `balance`, n / K samples per label.
    A class-conditional generator (generator.class_targets) is asked for the classes still short, and a sample
    is kept only if the source reads it as the class it was made for.
    Candidates are drawn from stream SYNTHETIC (round, batch); refused with a clear message when `max_rounds`
    rounds of n candidates do not fill the set (the generator does not cover a class)."""
    if verify and not isinstance(source, SourceEnsemble):
        raise ConfigError("generator.verify needs generator.source_models >= 2 (models that can agree)")
    quota = _quotas(n, num_classes) if balance else None
    kept: list[torch.Tensor] = []
    counts = torch.zeros(num_classes, dtype=torch.long)
    drawn = 0
    conditional = bool(getattr(generator, "num_classes", 0))
    for round_ in range(max_rounds):
        targets = None
        if conditional:  # ask for the classes still short, in proportion to what each lacks
            need = (torch.tensor(quota) - counts).clamp_min(0) if quota is not None else torch.ones(num_classes)
            rng = env.generator(streams.SYNTHETIC, 1000 + round_)
            targets = torch.multinomial(need.float(), n, replacement=True, generator=rng)
            images = generate(generator, n, env, batch_size=batch_size,
                              latents=generator.sample_latent(n, generator=rng, labels=targets))
        else:
            images = generate(generator, n, env, batch_size=batch_size, stream=1000 + round_)
        drawn += len(images)
        x = env.place_batch(to_float(images))
        if isinstance(source, SourceEnsemble):
            labels, share = zip(*(source.agreement(x[i:i + batch_size]) for i in range(0, len(x), batch_size)))
            labels, share = torch.cat(labels).cpu(), torch.cat(share).cpu()
        else:
            labels, share = source_labels(source, images, env), torch.ones(len(images))
        ok = share >= verify
        if targets is not None:  # a sample made for one class and read as another is not kept
            ok &= labels == targets
        for image, label, keep in zip(images, labels.tolist(), ok.tolist()):
            if not keep or (quota is not None and counts[label] >= quota[label]):
                continue
            kept.append(image)
            counts[label] += 1
            if len(kept) == n:
                break
        if len(kept) == n:
            break
    if len(kept) < n:
        missing = [k for k in range(num_classes) if quota is not None and counts[k] < quota[k]]
        raise ConfigError(f"{drawn} generated candidates gave only {len(kept)} of {n} verified samples"
                          + (f" (classes short: {missing})" if missing else "")
                          + ": lower generator.verify, turn off generator.balance or train the generator longer")
    return torch.stack(kept), {"candidates": drawn, "acceptance": round(n / drawn, 4),
                               "class_counts": counts.tolist(), "verify": verify, "balance": balance}


def ranked_samples(generator: nn.Module, source: nn.Module, n: int, env: Env, *, num_classes: int, keep: float,
                   batch_size: int = 500) -> tuple[torch.Tensor, dict[str, Any]]:
    """n uint8 samples of a class-conditional `generator`, n / K per class: for each class, quota / `keep`
    candidates made for it, of which the quota the source ensemble reads most alike as that class is kept
    (ranked by the share of members whose label is the class, then by the ensemble's probability of it).
    Unlike a threshold (`verified_samples`) it always fills every class at a known cost, also for a class that
    the members seldom agree on, whose samples are then the least bad ones (the stats say how many members
    agreed on the kept samples of each class). Each class's candidates are drawn from stream SYNTHETIC
    (2000 + class), the shuffle from (3000)."""
    if not isinstance(source, SourceEnsemble) or not getattr(generator, "num_classes", 0):
        raise ConfigError("generator.verify_keep needs source models (generator.source_models >= 2) and a "
                          "class-conditional generator (generator.class_targets)")
    kept, agreed, quotas = [], [], _quotas(n, num_classes)
    for label, quota in enumerate(quotas):
        if not quota:  # (fewer samples than classes; None keeps the stats' list indexed by class)
            agreed.append(None)
            continue
        count = math.ceil(quota / keep)
        rng = env.generator(streams.SYNTHETIC, 2000 + label)
        targets = torch.full((count,), label, dtype=torch.long)
        images = generate(generator, count, env, batch_size=batch_size,
                          latents=generator.sample_latent(count, generator=rng, labels=targets))
        shares, probs = [], []
        with torch.no_grad():
            for start in range(0, count, batch_size):
                logits = source.member_logits(env.place_batch(to_float(images[start:start + batch_size])))
                shares.append((logits.argmax(2) == label).float().mean(0).cpu())
                probs.append(_log_mean_softmax(logits)[:, label].exp().cpu())
        share, prob = torch.cat(shares), torch.cat(probs)
        # the probability breaks ties only: it is scaled below one member's step of the share
        best = (share + prob / (len(source.members) + 1)).topk(quota).indices
        kept.append(images[best])
        agreed.append(float(share[best].mean()))
    # shuffled: the set is read in order by its users (a first slice for the quality measures, a first split)
    order = torch.randperm(n, generator=env.generator(streams.SYNTHETIC, 3000))
    return torch.cat(kept)[order], {"candidates": sum(math.ceil(q / keep) for q in quotas),
                             "verify_keep": keep, "class_counts": quotas,
                             "kept_members_agreeing": [None if a is None else round(a, 4) for a in agreed]}


def _quotas(n: int, num_classes: int) -> list[int]:
    base, extra = divmod(n, num_classes)
    return [base + (1 if k < extra else 0) for k in range(num_classes)]


def label_balance(labels: torch.Tensor, num_classes: int) -> float:
    """Entropy of the label histogram as a share of ln K (1: every class equally often)."""
    p = torch.bincount(labels.long(), minlength=num_classes).double()
    p = p / p.sum().clamp_min(1)
    return float(-(p * torch.log(p.clamp_min(1e-12))).sum() / math.log(num_classes))


def synthesis_quality(images: torch.Tensor, source: nn.Module, env: Env, *, num_classes: int,
                      readers: dict[str, Any] | None = None, ceiling_test: ImageDataset | None = None,
                      ceiling_epochs: float = CEILING_EPOCHS, ceiling_model: str = "paper-cnn",
                      ceiling_labels: str = "hard", ceiling_copies: int = 1) -> dict[str, Any]:
    """What a synthetic set is worth (evaluation only: it reads non-private models, no ε is spent).

    ``readers``: other models by name (a classifier, or a TeacherEnsemble read by its plurality vote); for each,
    the share of samples on which it gives the source's label (``agreement_with_<name>``). With
    ``ceiling_test``, the ceiling: the test accuracy of a fresh ``ceiling_model`` trained only on the samples
    labelled by the source: its argmax (``ceiling_labels="hard"``) or its softmax (``"soft"``); with
    ``ceiling_copies`` K, on the samples and K - 1 copies of them shifted by up to 2 pixels, each copy labelled by
    the source on its own (what SRR's `label_copies` releases: more labels near each sample)."""
    if ceiling_labels not in ("hard", "soft"):
        raise ConfigError(f"ceiling labels must be hard or soft, got {ceiling_labels!r}")
    if ceiling_copies < 1:
        raise ConfigError(f"ceiling copies must be >= 1, got {ceiling_copies}")
    answers = predict_logits(source, images, env).float()  # read once: the labels, and the soft ceiling's targets
    labels = answers.argmax(1)
    out: dict[str, Any] = {"samples": len(images), "class_balance": round(label_balance(labels, num_classes), 4),
                           "class_counts": torch.bincount(labels, minlength=num_classes).tolist()}
    for name, reader in (readers or {}).items():
        out[f"agreement_with_{name}"] = round(float((read_labels(reader, images, env) == labels).float().mean()), 4)
    if ceiling_test is not None:
        taught, taught_answers = images, answers
        if ceiling_copies > 1:  # (SYNTHESIS_CEILING, 1): the copies' shifts; the bare stream seeds the student
            taught = with_augmented_copies(images, ceiling_copies, "shift", env.generator(streams.SYNTHESIS_CEILING, 1))
            copies = taught[len(images):]
            taught_answers = torch.cat([answers, predict_logits(source, copies, env).float()])
        soft = taught_answers.softmax(1) if ceiling_labels == "soft" else None
        out["ceiling"] = round(ceiling_accuracy(taught, taught_answers.argmax(1), ceiling_test, env, num_classes,
                                                ceiling_epochs, ceiling_model, soft_targets=soft), 4)
        out["ceiling_training"] = {"model": ceiling_model, "epochs": ceiling_epochs, "labels": ceiling_labels,
                                   **({"copies": ceiling_copies} if ceiling_copies > 1 else {})}
    return out


def synthesis_agreement(images: torch.Tensor, source: nn.Module, baseline: nn.Module, teachers: Any, env: Env,
                        num_classes: int) -> dict[str, Any]:
    """How a teacher ensemble reads synthetic samples (DGD's label channel), evaluation only: the share on which
    its plurality gives the label the samples were synthesised for (`agreement_with_source`: the source
    model's, the baseline or the source ensemble) and the baseline's label (`agreement_with_baseline`)."""
    by_source, by_baseline, plurality = (read_labels(m, images, env) for m in (source, baseline, teachers))
    return {"samples": len(images), "class_balance": round(label_balance(by_source, num_classes), 4),
            "agreement_with_source": round(float((plurality == by_source).float().mean()), 4),
            "agreement_with_baseline": round(float((plurality == by_baseline).float().mean()), 4),
            "note": "evaluation only: reads the teachers' noiseless plurality and the non-private source models; "
                    "not covered by any epsilon"}


def query_label_agreement(reference_model: nn.Module, images: torch.Tensor, labels: torch.Tensor, votes: Any,
                          env: Env) -> dict[str, float]:
    """How often released (noisy) labels, and the plurality of `votes` when given, equal the label a reference
    model (DGD: the generator's own discriminator) gives the same samples; evaluation only."""
    reference = source_labels(reference_model, images, env)
    out = {"noisy_label": round(float((labels == reference).float().mean()), 4)}
    if votes is not None:
        out["plurality"] = round(float((torch.as_tensor(votes).argmax(1) == reference).float().mean()), 4)
    return out


def read_labels(reader: Any, images: torch.Tensor, env: Env) -> torch.Tensor:
    """A model's labels for uint8 images: a TeacherEnsemble's plurality vote, or a classifier's argmax."""
    if isinstance(reader, TeacherEnsemble):
        return torch.cat(list(reader.iter_votes(images, env))).argmax(1)
    return source_labels(reader, images, env)


def ceiling_accuracy(images: torch.Tensor, labels: torch.Tensor, test: ImageDataset, env: Env, num_classes: int,
                     epochs: float = CEILING_EPOCHS, model_name: str = "paper-cnn",
                     soft_targets: torch.Tensor | None = None) -> float:
    """The test accuracy of a fresh `model_name` trained `epochs` only on `images` with `labels` (Adam 1e-3,
    batch 128): what a synthetic set labelled by its source teaches about the real data. With `soft_targets`
    (the source's class probabilities) the student learns the source's whole answer instead of its argmax: what
    the samples teach a method whose channel carries more than a label (DPDFD's output gradients, a DP source's
    free soft labels), against what they teach a label channel (DGD's votes, SRR's responses)."""
    torch.manual_seed(env.generator(streams.SYNTHESIS_CEILING).initial_seed())
    model = create_model(model_name, kind="classifier", in_channels=images.shape[1], num_classes=num_classes,
                         image_size=images.shape[-1])
    data = ImageDataset(images, labels, num_classes, name="synthetic samples (source labels)")
    cfg = ClassifierTraining(model=model_name, epochs=epochs, batch_size=128, lr=1e-3, eval_every_epochs=1e9)
    quiet = Env(device=env.device, precision=env.precision, seed=env.seed, progress=False)
    train_classifier(model, data, cfg=cfg, env=quiet, description="synthesis ceiling", soft_targets=soft_targets)
    return evaluate(model, test, env)
