"""What a data-free generator's samples are worth, measured (evaluation only: non-private models read them, no ε
is spent): the class balance of the labels its source model gives them, the share on which other models (the DGD
teachers' plurality, the baseline) give the same label, and the ceiling (the test accuracy of a student trained only
on the samples, labelled by the source). The generator's own losses are engine/datafree.py's.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from privdistill.config import ClassifierTraining
from privdistill.data.dataset import ImageDataset
from privdistill.engine import streams
from privdistill.engine.context import Env
from privdistill.engine.ensemble import TeacherEnsemble
from privdistill.engine.trainer import evaluate, predict_logits, train_classifier
from privdistill.errors import ConfigError
from privdistill.models import create_model

CEILING_EPOCHS = 3.0  # the ceiling student's epochs unless asked otherwise (`generator quality --ceiling-epochs`)


def source_labels(source: nn.Module, images: torch.Tensor, env: Env, batch_size: int = 500) -> torch.Tensor:
    """The label the source model gives each uint8 image."""
    return predict_logits(source, images, env, batch_size).argmax(1)


def label_balance(labels: torch.Tensor, num_classes: int) -> float:
    """Entropy of the label histogram as a share of ln K (1: every class equally often)."""
    p = torch.bincount(labels.long(), minlength=num_classes).double()
    p = p / p.sum().clamp_min(1)
    return float(-(p * torch.log(p.clamp_min(1e-12))).sum() / math.log(num_classes))


def synthesis_quality(images: torch.Tensor, source: nn.Module, env: Env, *, num_classes: int,
                      readers: dict[str, Any] | None = None, ceiling_test: ImageDataset | None = None,
                      ceiling_epochs: float = CEILING_EPOCHS, ceiling_model: str = "paper-cnn",
                      ceiling_labels: str = "hard") -> dict[str, Any]:
    """What a synthetic set is worth (evaluation only: it reads non-private models, no ε is spent).

    ``readers``: other models by name (a classifier, or a TeacherEnsemble read by its plurality vote); for each,
    the share of samples on which it gives the source's label (``agreement_with_<name>``). With
    ``ceiling_test``, the ceiling: the test accuracy of a fresh ``ceiling_model`` trained only on the samples
    labelled by the source: its argmax (``ceiling_labels="hard"``) or its softmax (``"soft"``)."""
    if ceiling_labels not in ("hard", "soft"):
        raise ConfigError(f"ceiling labels must be hard or soft, got {ceiling_labels!r}")
    answers = predict_logits(source, images, env).float()  # read once: the labels, and the soft ceiling's targets
    labels = answers.argmax(1)
    out: dict[str, Any] = {"samples": len(images), "class_balance": round(label_balance(labels, num_classes), 4),
                           "class_counts": torch.bincount(labels, minlength=num_classes).tolist()}
    for name, reader in (readers or {}).items():
        out[f"agreement_with_{name}"] = round(float((read_labels(reader, images, env) == labels).float().mean()), 4)
    if ceiling_test is not None:
        soft = answers.softmax(1) if ceiling_labels == "soft" else None
        out["ceiling"] = round(ceiling_accuracy(images, labels, ceiling_test, env, num_classes, ceiling_epochs,
                                                ceiling_model, soft_targets=soft), 4)
        out["ceiling_training"] = {"model": ceiling_model, "epochs": ceiling_epochs, "labels": ceiling_labels}
    return out


def synthesis_agreement(images: torch.Tensor, source: nn.Module, baseline: nn.Module, teachers: Any, env: Env,
                        num_classes: int) -> dict[str, Any]:
    """How a teacher ensemble reads synthetic samples (DGD's label channel), evaluation only: the share on which
    its plurality gives the label the samples were synthesised for (`agreement_with_source`: the source
    model's) and the baseline's label (`agreement_with_baseline`)."""
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
