"""Data-free generator learning: train a generator against a FIXED classifier, reading no private image.

    L(x) = CE(f(x), argmax f(x)) + α · Σ_k p̄_k log p̄_k + β · A(x),   x = G(z), z ~ N(0, I)

    A(x): dgd   (DGD Eq. 2, α=5, β=0.1):   an L1 activation term on the backbone features;
          dpdfd (DPDFD Eq. 5, α=β=1):      an L2 norm of the backbone features;
          srr   (SRR, α=5, β=10):          BatchNorm-statistics matching (DeepInversion)

Readings chosen: DGD and DPDFD write "+β‖f‖" but their text and DAFL REWARD high activation: −β·mean|f| (dgd),
−β·‖f‖₂/√d (dpdfd; the √d keeps β = 1 on scale for any width). The generator is DAFL's (no paper gives one);
DGD's "200 rounds" follow DAFL's epochs of 120 iterations (`steps_per_round`, `batch_size`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.config import check
from privdistill.data.dataset import to_uint8
from privdistill.engine import streams
from privdistill.engine.context import Env
from privdistill.engine.loop import TrainingLoop
from privdistill.engine.optim import make_optimizer, make_step_schedule, step_decay_factor
from privdistill.engine.run import RunDir
from privdistill.errors import ConfigError, ModelError
from privdistill.models import create_model

LOSS_DEFAULTS = {"dgd": (5.0, 0.1), "dpdfd": (1.0, 1.0), "srr": (5.0, 10.0)}


@dataclass
class GeneratorTraining:
    """Config section `generator`."""

    loss: str = "dgd"  # dgd | dpdfd | srr
    alpha: Optional[float] = None  # None: the paper's value for the chosen loss
    beta: Optional[float] = None
    latent_dim: int = 100
    width: int = 128
    rounds: int = 200
    steps_per_round: int = 120
    batch_size: int = 512
    lr: float = 0.2
    lr_decay_every: int = 80  # rounds
    lr_decay: float = 0.1
    num_samples: int = 0  # synthetic set size; 0: as many as the classifier's training set
    checkpoint_every: int = 100  # steps
    # --- beyond the papers' literal losses (ours; off: the papers' generator): the adversarial synthesis of the
    # recipes (recipes/__init__.py: ADVERSARIAL_GENERATOR; docs/research-log.md, "Samples that teach")
    class_targets: bool = False  # a class-conditional generator: each sample is made for a class it is told
    # a student in the loop (DFAD; a paper CNN, Adam at 1e-3, discarded after the stage, learning the source's soft
    # labels on each fresh batch): reward samples on which it and the source differ
    adversarial_weight: float = 0.0

    def validate(self) -> None:
        check(self.loss in LOSS_DEFAULTS, f"generator.loss must be one of {sorted(LOSS_DEFAULTS)}, got {self.loss!r}")
        check(min(self.rounds, self.steps_per_round, self.batch_size, self.latent_dim, self.width) >= 1,
              "generator rounds, steps_per_round, batch_size, latent_dim and width must be >= 1")
        if self.lr <= 0 or not 0 < self.lr_decay <= 1:
            raise ConfigError("generator.lr must be > 0 and lr_decay in (0, 1]")
        check(self.num_samples >= 0, "generator.num_samples must be >= 0")
        if self.adversarial_weight < 0:
            raise ConfigError("generator.adversarial_weight must be >= 0")

    @property
    def weights(self) -> tuple[float, float]:
        a, b = LOSS_DEFAULTS[self.loss]
        return (a if self.alpha is None else self.alpha, b if self.beta is None else self.beta)

    @property
    def total_steps(self) -> int:
        return self.rounds * self.steps_per_round


# ------------------------------------------------------------------------------------------- features
def logits_and_features(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and backbone features (input of the last linear layer) of any classifier.

    Our classifiers expose `features` and `classifier`; for other modules (a user's torch model), the input
    of the last nn.Linear is captured with a forward hook.
    """
    if hasattr(model, "features") and hasattr(model, "classifier") and callable(model.features):
        feats = model.features(x)
        return model.classifier(feats), feats
    last = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not last:
        raise ModelError("cannot find backbone features: the classifier has no nn.Linear output layer")
    captured = {}
    handle = last[-1].register_forward_hook(lambda mod, inp, out: captured.__setitem__("f", inp[0]))
    try:
        logits = model(x)
    finally:
        handle.remove()
    return logits, captured["f"].flatten(1)


class BatchNormStatistics:
    """Forward hooks on every BatchNorm layer: the distance between a batch's statistics and the layer's
    running statistics (DeepInversion's R_feature), summed over layers."""

    def __init__(self, model: nn.Module):
        self.layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        if not self.layers:
            raise ModelError("the SRR generator loss matches BatchNorm statistics, but this classifier has no "
                             "BatchNorm layer; use a BN network (e.g. paper-cnn-bn, resnet18/34) or another loss")
        self.losses: list[torch.Tensor] = []
        self.handles = [m.register_forward_hook(self._hook) for m in self.layers]

    def _hook(self, module, inputs, output):
        x = inputs[0].float()
        dims = [0] + list(range(2, x.ndim))
        mean, var = x.mean(dims), x.var(dims, unbiased=False)
        self.losses.append(torch.norm(mean - module.running_mean, 2) + torch.norm(var - module.running_var, 2))

    def pop(self) -> torch.Tensor:
        total = torch.stack(self.losses).sum()
        self.losses = []
        return total

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class RecordedStatistics(nn.modules.batchnorm._BatchNorm):
    """A BatchNorm layer that only carries statistics: identity in the forward pass, its running mean and variance
    given (e.g. released under DP, methods/end_to_end.py), so BatchNormStatistics matches a generator's batches
    against them like DeepInversion matches a BN network's. For a classifier without BatchNorm (a DP-SGD model)."""

    def __init__(self, mean: torch.Tensor, var: torch.Tensor):
        super().__init__(len(mean), affine=False, track_running_stats=True)
        self.running_mean.copy_(mean)
        self.running_var.copy_(var)

    def _check_input_dim(self, x):  # any [B, d] or [B, d, ...] input
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class WithFeatureStatistics(nn.Module):
    """A ScatterNet classifier (models/scatternet.py) whose flattened scattering features pass a RecordedStatistics
    layer: the same logits, and a BN-statistics target for the generator's `srr` loss."""

    def __init__(self, model: nn.Module, mean: torch.Tensor, var: torch.Tensor):
        super().__init__()
        if not hasattr(model, "scatter"):
            raise ModelError("feature statistics are recorded on a ScatterNet model's scattering features "
                             f"(scatter-linear and its prior variants), not on {type(model).__name__}")
        self.model, self.statistics = model, RecordedStatistics(mean, var)

    def _features_in(self, x: torch.Tensor) -> torch.Tensor:
        # the statistics are of the normalised scattering coefficients, before any prior projection: a whitened
        # projection's coordinates have near-fixed statistics on any images, which give a generator nothing to match
        s = self.model.normalised_scattering(x)
        return self.model.project(self.statistics(s.flatten(1)).view_as(s))

    @property
    def classifier(self) -> nn.Module:
        return self.model.classifier

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.head[:-1](self._features_in(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.head(self._features_in(x))


def datafree_loss(classifier: nn.Module, x: torch.Tensor, kind: str, alpha: float, beta: float,
                  bn: BatchNormStatistics | None = None, targets: torch.Tensor | None = None,
                  outputs: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The papers' generator losses; with `targets` (class targets), the one-hot term aims at the class each
    sample was made for instead of the classifier's own argmax (DAFL's pseudo-label). `outputs`: the
    classifier's (logits, features) on x when the caller already has them."""
    logits, feats = outputs if outputs is not None else logits_and_features(classifier, x)
    logits, feats = logits.float(), feats.float()
    one_hot = F.cross_entropy(logits, logits.argmax(1) if targets is None else targets)
    mean_p = F.softmax(logits, dim=1).mean(0)
    neg_entropy = (mean_p * torch.log(mean_p + 1e-12)).sum()
    if kind == "dgd":
        activation = -feats.abs().mean()
    elif kind == "dpdfd":
        activation = -(feats.norm(dim=1) / math.sqrt(feats.shape[1])).mean()
    else:
        activation = bn.pop()
    loss = one_hot + alpha * neg_entropy + beta * activation
    return loss, {"one_hot": float(one_hot.detach()), "entropy": float(-neg_entropy.detach()),
                  "activation": float(activation.detach())}


# DFAD's student in the loop (generator.adversarial_weight), composed with the papers' terms by train_generator
def disagreement(source_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """DFAD's adversarial objective, which the generator maximises: the mean L1 distance between the source's and
    the student's predictions. On probabilities (DFAD uses logits) it is bounded by 2 and cannot grow by
    inflating logits."""
    return (F.softmax(source_logits.float(), 1) - F.softmax(student_logits.float(), 1)).abs().sum(1).mean()


def distillation_loss(student_logits: torch.Tensor, source_logits: torch.Tensor) -> torch.Tensor:
    """KL(source ‖ student) on one batch: how the adversarial student learns the source's soft answer."""
    return F.kl_div(F.log_softmax(student_logits.float(), 1), F.softmax(source_logits.float(), 1),
                    reduction="batchmean")


class GeneratorCollapseWarning(UserWarning):
    """A data-free generator whose samples the classifier spreads over few classes (mode collapse)."""


# A balanced generator's samples give a mean softmax (over a batch) near the uniform one; below this share, warn
# (research log, "Notes that left the code: engine/datafree.py")
COLLAPSE_ENTROPY_SHARE = 0.8


def class_balance(final: dict, num_classes: int) -> float | None:
    """The entropy of the classifier's mean prediction on the last round's batches, as a share of ln K
    (1: uniform over the classes; None when the loss does not log it)."""
    entropy = final.get("entropy")
    if entropy is None or num_classes < 2:
        return None
    return float(entropy) / math.log(num_classes)


def warn_if_collapsed(final: dict, num_classes: int, where: str) -> float | None:
    """Warn (GeneratorCollapseWarning) when the generator's last round shows mode collapse; return the share."""
    share = class_balance(final, num_classes)
    if share is not None and share < COLLAPSE_ENTROPY_SHARE:
        warnings.warn(f"{where}: the generator looks mode-collapsed: the entropy of the classifier's mean "
                      f"prediction on its samples is {share:.2f} of the maximum (ln {num_classes}) at the end of "
                      f"training (balanced generators reach 0.9 or more). Labels drawn on its samples will be "
                      f"dominated by few classes; retrain it with another seed (run.seed) or schedule.",
                      GeneratorCollapseWarning, stacklevel=2)
    return share


# -------------------------------------------------------------------------------------------- training
def build_generator(cfg: GeneratorTraining, channels: int, image_size: int, *, output_norm: bool = False,
                    num_classes: int = 0) -> nn.Module:
    # output_norm is passed only when set, so that the registry kwargs (and the saved metadata) of the
    # generator stages cached before it existed stay as they were
    extra = {"output_norm": True} if output_norm else {}
    if cfg.class_targets:
        extra["num_classes"] = num_classes
    return create_model("dafl-generator", kind="generator", latent_dim=cfg.latent_dim, out_channels=channels,
                        image_size=image_size, width=cfg.width, **extra)


def train_generator(classifier: nn.Module, cfg: GeneratorTraining, env: Env, *, channels: int, image_size: int,
                    run: RunDir | None = None, num_classes: int = 0) -> tuple[nn.Module, dict]:
    """Train a DAFL generator against the fixed `classifier` (its weights are never updated), with the student in
    the loop where the config asks for it."""
    classifier = env.place(classifier).eval().requires_grad_(False)
    torch.manual_seed(env.generator(streams.GENERATOR_LATENT, -1).initial_seed())
    if cfg.class_targets and num_classes < 2:
        raise ConfigError("generator.class_targets needs the number of classes (train_generator(num_classes=K))")
    generator = env.place(build_generator(cfg, channels, image_size, num_classes=num_classes)).train()
    optimizer = make_optimizer(generator.parameters(), "adam", lr=cfg.lr)
    modules, optimizers = {"generator": generator}, {"generator": optimizer}
    if cfg.adversarial_weight:  # DFAD's student in the loop; checkpointed with the generator so resume is exact
        if num_classes < 2:
            raise ConfigError("generator.adversarial_weight needs the number of classes "
                              "(train_generator(num_classes=K))")
        torch.manual_seed(env.generator(streams.GENERATOR_ADVERSARY).initial_seed())
        modules["adversary"] = env.place(create_model("paper-cnn", kind="classifier", in_channels=channels,
                                                      num_classes=num_classes, image_size=image_size)).train()
        optimizers["adversary"] = make_optimizer(modules["adversary"].parameters(), "adam", lr=1e-3)
    alpha, beta = cfg.weights
    bn = BatchNormStatistics(classifier) if cfg.loss == "srr" else None
    decay_every = cfg.lr_decay_every * cfg.steps_per_round  # steps

    def round_fields(done: int) -> dict:  # the round and the rate of the step just done
        return {"round": math.ceil(done / cfg.steps_per_round),
                "lr": cfg.lr * step_decay_factor(done - 1, decay_every, cfg.lr_decay)}

    loop = TrainingLoop(steps=cfg.total_steps, env=env, run=run, checkpoint="generator-checkpoint",
                        title=f"generator ({cfg.loss})", log_stage="generator", modules=modules, optimizers=optimizers,
                        schedules={"generator": make_step_schedule(optimizer, decay_every, cfg.lr_decay)},
                        eval_every=cfg.steps_per_round, checkpoint_every=cfg.checkpoint_every,
                        entry_fields=round_fields)
    try:
        for step in loop:
            z = draw_latent(generator, cfg.batch_size, env.generator(streams.GENERATOR_LATENT, step))
            with env.autocast():
                x = generator(z.to(env.device))
                outputs = logits_and_features(classifier, x)
                loss, parts = datafree_loss(classifier, x, cfg.loss, alpha, beta, bn, outputs=outputs,
                                            targets=latent_labels(generator, z.to(env.device)))
            if "adversary" not in modules:
                loop.update(loss, {"loss": float(loss.detach()), **parts})
                continue
            # DFAD (Fang et al. 2019): the generator seeks samples on which the student still differs from the
            # source, and the student then learns the source's answer on those very samples
            adversary = modules["adversary"]
            with env.autocast():
                gap = disagreement(outputs[0], adversary(x))
            loss = loss - cfg.adversarial_weight * gap
            loop.optimize(loss, name="generator")
            with env.autocast():
                imitation = distillation_loss(adversary(x.detach()), outputs[0].detach())
            loop.optimize(imitation, name="adversary")  # drops what the generator's loss left on the student first
            loop.record({"loss": float(loss.detach()), **parts, "disagreement": float(gap.detach()),
                         "imitation": float(imitation.detach())}, loss=float(loss.detach()))
    finally:
        if bn is not None:
            bn.remove()
    result = loop.finish()
    classifier.requires_grad_(True)
    return generator, {"wall_seconds": round(result.wall_seconds, 1), "steps": result.steps,
                       "alpha": alpha, "beta": beta, "final": result.history[-1] if result.history else {}}


def draw_latent(generator: nn.Module, n: int, rng: torch.Generator) -> torch.Tensor:
    """n inputs for `generator`: its own sampler (noise, and a class for a conditional one), else N(0, I)."""
    if hasattr(generator, "sample_latent"):
        return generator.sample_latent(n, generator=rng)
    return torch.randn(n, generator.latent_dim, generator=rng)


def latent_labels(generator: nn.Module, z: torch.Tensor) -> torch.Tensor | None:
    """The classes a conditional generator's inputs ask for; None for an unconditional one."""
    return generator.latent_labels(z) if hasattr(generator, "latent_labels") else None


@torch.no_grad()
def generate(generator: nn.Module, n: int, env: Env, *, batch_size: int = 500, stream: int = 0,
             quantise: bool = True, latents: torch.Tensor | None = None) -> torch.Tensor:
    """n synthetic images [n, C, H, W]: uint8 (quantised like real images, clamped to [-1, 1] first), or, with
    ``quantise=False``, the generator's float output as is. A generator ending in a non-affine BatchNorm
    (`DAFLGenerator(output_norm=True)`) emits values outside [-1, 1]; models trained on its raw output
    should be fed the floats. The latent codes are drawn from stream SYNTHETIC (`stream`, batch), or are the
    caller's `latents` [n, latent_dim] (a method that keeps its own latent stream, SRR's stage codes).

    The generator stays in train mode (BatchNorm on batch statistics), its running statistics put back afterwards:
    sampling leaves it as it was, whether its samples were drawn in this run or read from the stage cache."""
    generator.train()
    buffers = {name: b.clone() for name, b in generator.named_buffers()}
    out = []
    try:
        for i, start in enumerate(range(0, n, batch_size)):
            m = min(batch_size, n - start)
            if latents is not None:
                z = latents[start:start + m]
            else:
                z = draw_latent(generator, m, env.generator(streams.SYNTHETIC, stream, i))
            with env.autocast():
                x = generator(z.to(env.device)).float()
            out.append((to_uint8(x) if quantise else x).cpu())
    finally:
        for name, b in generator.named_buffers():
            b.copy_(buffers[name])
    return torch.cat(out).contiguous()
