"""SRR: label-DP data-free distillation with selective randomized response (paper 004, Alg. 1).

    teacher φt trained on D (non-private, cached stage `baseline` with the `srr_teacher` section)
    generator φg pre-trained against φt with the SRR loss (Eq. 2: one-hot CE + α·Σ p̄ log p̄ + β·BN-statistics,
        α = 5, β = 10; cached stage `generator`, shared by every ε)
    for i = 1..T:
        D̃(i) = φg(z_i)                              (stage i's synthetic inputs, quantised like real images)
        y_t = φt(D̃(i)), y_s = softmax φs^(i-1)(D̃(i))  (the current student's prediction is the prior)
        L_i = R(y_s, y_t, t), t = 1/(2K)               (selective randomized response; drawn ONCE, recorded in the
                                                        ledger under key "stage-i" before use, reused on resume)
        train φs on (D̃(i), L_i) with L_kd (Eq. 3), fine-tune φg on (D̃(i), L_i)
    release φs^(T)

Settings:
- ``data-free`` (paper Table I): the labels are the teacher's answers on synthetic inputs.
- ``label-dp`` (the label-sensitive setting of Table II): the student is trained on the REAL private inputs,
  whose TRUE labels are protected by the mechanism; the private set is split into T disjoint chunks, chunk i
  is labelled at stage i with the current student as prior. No teacher and no generator are involved (a
  teacher trained on the labels would make every answer depend on every label).

Mechanisms (``srr.mechanism``): ``srr`` (the paper's R), ``rr`` (plain k-ary randomized response, no prior)
and ``rr-prior`` (RRWithPrior, Ghazi et al., NeurIPS 2021, Alg. 2: k-RR restricted to the top-k* classes of
the prior, k* = argmax_k e^ε/(e^ε + k − 1) · Σ_{top k} prior). All three are "k-RR on a candidate set I chosen
without looking at the label, uniform on I if the label is not in I" (plain RR: I = all K classes), so each
released label is ε-DP in the label it hides (docs/privacy.md, SRR strict). Pricing:
- data-free: one private record can change the teacher, hence every label: the strict accounting composes
  over ALL labels drawn from the one teacher (SRRLabels / RRLabels with the label count); the paper's ε is the
  per-label ε, no composition.
- label-dp: every record's label is released once: ε-label-DP under "change one record's label" (parallel
  composition), priced as SRRLabels(setting="label-dp") for all three mechanisms (plain RR and RRWithPrior
  are members of the SRR family above; the ledger record says which mechanism ran).

Readings of the paper where it is ambiguous (see also docs/privacy.md):
- "Return y_t": the one-hot teacher label argmax y_t (releasing the soft output would not be DP).
- Eq. 3 uses ℓ_KL between the student output and the (one-hot) label: KL(onehot ‖ softmax) equals the
  cross-entropy, which is what is computed.
- Eq. 3 sums over D̂(i) only: at stage i the student trains on stage i's samples (``student_data: stage``);
  ``cumulative`` (all samples labelled so far, as in Ghazi et al.'s multi-stage training) and
  ``final_epochs`` (extra epochs on the union after the last stage) are options, off in the presets.
- "fine-tune φg on D̂(i)" with "the loss function ... is L_kd": the generator is fine-tuned by minimising
  Eq. 3 with respect to θg (the stage's latent codes z regenerated through φg, the student fixed, the stage's
  recorded labels as targets): ``finetune: kd``. The paper gives no step count or learning rate. ``kd+srr``
  adds the pre-training loss Eq. 2 against the teacher (keeps the generator on the teacher's statistics);
  ``none`` disables fine-tuning. Either way the generator pathway is not covered by any ε.
- Stage sizes: N synthetic samples split evenly over the T stages (the paper: "iff the size of dataset in
  each stage is the same, their order will have no effect").
- Student: the paper uses DataLens' network for the data-free setting and ResNet-18 for the label-sensitive
  one; we use the paper CNN (DGD/DPDFD's) for both in the quick preset and ResNet-18 for label-dp in the
  paper preset.
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.atomic import atomic_torch_save
from privdistill.config import ClassifierTraining, check_model_name, to_plain
from privdistill.data.dataset import ImageDataset, to_float, to_uint8
from privdistill.engine.augment import augment_batch
from privdistill.engine.cache import StageCache
from privdistill.engine.context import Env
from privdistill.engine.datafree import BatchNormStatistics, GeneratorTraining, datafree_loss
from privdistill.engine.progress import progress_bar
from privdistill.engine.stages import Stages
from privdistill.engine.trainer import evaluate, make_schedule, predict_logits, train_classifier
from privdistill.errors import BudgetExceededError, ConfigError
from privdistill.methods.common import MethodAPI, Released, RunRequest, finish_run, prepare_run
from privdistill.models import create_model
from privdistill.privacy.mechanisms import candidate_sets, release_labels

SETTINGS = ("data-free", "label-dp")
MECHANISMS = ("srr", "rr", "rr-prior")

# random streams (Env.generator); distinct from the trainer's (1, 2) and the generator's (21, 22)
_INIT_STREAM = 71
_LATENT_STREAM = 72
_EPOCH_STREAM = 73
_AUGMENT_STREAM = 74
_FINETUNE_STREAM = 75
_NOISE_STREAM = 76
_PERM_STREAM = 77

CHECKPOINT = "srr-checkpoint"


# ===================================================================================== configuration
@dataclass
class SRRConfig:
    """Config section `srr`: the staged distillation (the teacher is section `srr_teacher`, the generator
    `srr_generator`)."""

    epsilon: float = 10.0  # per label (the paper's ε)
    setting: str = "data-free"  # data-free (Table I) | label-dp (Table II)
    mechanism: str = "srr"  # srr | rr | rr-prior
    stages: int = 20  # T
    num_samples: int = 0  # labels drawn in all: synthetic samples (data-free) or private records (label-dp); 0 = |D|
    threshold: Optional[float] = None  # t; None = 1/(2K)
    delta: float = 1e-5  # for the strict (ε, δ); the paper's ε is pure (δ = 0) per label
    secure_noise: bool = False  # draw the label noise from an OS-seeded generator (not reproducible)
    # student
    student_model: str = "paper-cnn"
    student_model_label_dp: str = ""  # "" = student_model
    batch_size: int = 128
    optimizer: str = "adam"  # adam | sgd
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_schedule: str = "linear"  # over all student steps of the run: linear | cosine | constant
    epochs_per_stage: float = 5.0
    student_data: str = "stage"  # stage (Eq. 3) | cumulative
    final_epochs: float = 0.0  # extra epochs on the union of all labelled samples after the last stage
    augment: str = "none"  # none | shift | flip-shift (label-dp on real images)
    # generator fine-tuning (data-free)
    finetune: str = "kd"  # kd | kd+srr | none
    finetune_steps: int = 5  # per stage
    finetune_lr: float = 1e-4
    finetune_batch_size: int = 128
    # bookkeeping
    eval_every_stages: int = 0  # 0: about 10 evaluations per run
    keep_synthetic: bool = False  # keep each stage's synthetic images in the run directory

    def validate(self) -> None:
        def check(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        check_model_name(self.student_model, "srr.student_model")
        if self.student_model_label_dp:
            check_model_name(self.student_model_label_dp, "srr.student_model_label_dp")
        check(self.setting in SETTINGS, f"setting must be one of {SETTINGS}, got {self.setting!r}")
        check(self.mechanism in MECHANISMS, f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        check(math.isfinite(self.epsilon) and self.epsilon > 0, f"epsilon (per label) must be > 0, got {self.epsilon}")
        check(self.stages >= 1, f"stages must be >= 1, got {self.stages}")
        check(self.num_samples >= 0, "num_samples must be >= 0")
        check(self.threshold is None or 0 <= self.threshold < 1, "threshold must lie in [0, 1)")
        check(0 < self.delta < 1, f"delta must lie in (0, 1), got {self.delta}")
        check(self.batch_size >= 1 and self.finetune_batch_size >= 1, "batch sizes must be >= 1")
        check(self.optimizer in ("adam", "sgd"), f"optimizer must be adam or sgd, got {self.optimizer!r}")
        check(self.lr > 0 and self.finetune_lr > 0, "learning rates must be > 0")
        check(self.lr_schedule in ("linear", "cosine", "constant"), f"unknown lr_schedule {self.lr_schedule!r}")
        check(self.epochs_per_stage > 0, "epochs_per_stage must be > 0")
        check(self.student_data in ("stage", "cumulative"), "student_data must be stage or cumulative")
        check(self.final_epochs >= 0, "final_epochs must be >= 0")
        check(self.augment in ("none", "shift", "flip-shift"), f"unknown augment {self.augment!r}")
        check(self.finetune in ("kd", "kd+srr", "none"), f"finetune must be kd, kd+srr or none, got {self.finetune!r}")
        check(self.finetune_steps >= 0, "finetune_steps must be >= 0")
        check(self.eval_every_stages >= 0, "eval_every_stages must be >= 0")
        check(self.weight_decay >= 0, "weight_decay must be >= 0")

    @property
    def student_for_setting(self) -> str:
        return (self.student_model_label_dp or self.student_model) if self.setting == "label-dp" else self.student_model


def stage_sizes(total: int, stages: int) -> list[int]:
    """N samples split as evenly as possible over T stages (earlier stages take the remainder)."""
    if stages > total:
        raise ConfigError(f"{stages} stages need at least {stages} samples, got {total}")
    base, extra = divmod(total, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


def label_event(cfg: SRRConfig, count: int, num_classes: int):
    """The privacy event of one stage's labels (see the module docstring for why these)."""
    from privdistill.privacy.events import RRLabels, SRRLabels

    if cfg.setting == "data-free" and cfg.mechanism == "rr":
        return RRLabels(epsilon=cfg.epsilon, count=count, num_classes=num_classes)
    return SRRLabels(epsilon=cfg.epsilon, count=count, num_classes=num_classes, setting=cfg.setting)


def default_variant(cfg: SRRConfig) -> str | None:
    parts = []
    if cfg.setting == "label-dp":
        parts.append("label-dp")
    if cfg.mechanism != "srr":
        parts.append(cfg.mechanism)
    return "-".join(parts) or None


# ===================================================================================== the method
@dataclass
class _Plan:
    sizes: list[int]
    train_sizes: list[int]  # samples the student trains on at each stage
    steps: list[int]  # student steps per stage
    batch: list[int]

    @property
    def total_steps(self) -> int:
        return sum(self.steps)


def _plan(cfg: SRRConfig, total: int) -> _Plan:
    sizes = stage_sizes(total, cfg.stages)
    train_sizes, steps, batch = [], [], []
    seen = 0
    for n in sizes:
        seen += n
        m = seen if cfg.student_data == "cumulative" else n
        b = min(cfg.batch_size, m)
        train_sizes.append(m)
        batch.append(b)
        steps.append(max(1, math.ceil(cfg.epochs_per_stage * math.ceil(m / b))))
    return _Plan(sizes, train_sizes, steps, batch)


def _optimizer(params, cfg: SRRConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def _stage_batch(m: int, b: int, stage: int, step: int, env: Env) -> torch.Tensor:
    per_epoch = math.ceil(m / b)
    epoch, pos = divmod(step, per_epoch)
    perm = torch.randperm(m, generator=env.generator(_EPOCH_STREAM, stage, epoch))
    return perm[pos * b:(pos + 1) * b]


@torch.no_grad()
def _generate_stage(generator: nn.Module, z: torch.Tensor, env: Env, batch_size: int = 500) -> torch.Tensor:
    """Stage images as uint8 (quantised like real images; teacher and student see exactly these)."""
    generator.train()  # as while it was trained: BatchNorm with batch statistics
    out = []
    for start in range(0, len(z), batch_size):
        with env.autocast():
            out.append(to_uint8(generator(z[start:start + batch_size].to(env.device)).float()).cpu())
    return torch.cat(out).contiguous()


def _probs(model: nn.Module, images: torch.Tensor, env: Env) -> torch.Tensor:
    return torch.softmax(predict_logits(model, images, env).double(), dim=1)


def train_srr(request: RunRequest, *, max_epsilon: float | None = None, accounting: str = "paper",
              cache: bool = True, variant: str | None = None) -> dict[str, Any]:
    """Run SRR end to end (the Python API behind `privdistill srr`); returns the summary.

    The per-label ε, δ, setting, mechanism and stages are configuration (section `srr`, e.g.
    ``overrides=["srr.epsilon=1"]``); ``max_epsilon`` under ``accounting`` ("paper" or "strict") refuses a
    run whose planned labels would exceed it (before anything is trained) and stops it cleanly otherwise.
    """
    from privdistill.privacy.ledger import LedgerAnswer, PrivacyLedger
    from privdistill.privacy.mechanisms import make_generator
    from privdistill.privacy.report import noise_source, srr_pathways, write_privacy_json

    prep = prepare_run("srr", request, {"srr_teacher": ClassifierTraining, "srr_generator": GeneratorTraining,
                                        "srr": SRRConfig})
    cfg: SRRConfig = prep.sections["srr"]
    teacher_cfg: ClassifierTraining = prep.sections["srr_teacher"]
    gen_cfg: GeneratorTraining = prep.sections["srr_generator"]
    if gen_cfg.loss != "srr":
        raise ConfigError(f"srr_generator.loss must be 'srr' (the paper's BN-statistics loss), got {gen_cfg.loss!r}")
    env, data, run = prep.env, prep.data, prep.run
    num_classes = data.num_classes
    label_dp = cfg.setting == "label-dp"
    total = cfg.num_samples or len(data.train)
    if label_dp and total > len(data.train):
        raise ConfigError(f"label-dp: num_samples {total} exceeds the {len(data.train)} private records "
                          "(each record's label may be released once)")
    plan = _plan(cfg, total)
    started = time.perf_counter()

    # ---------------------------------------------------------------------- budget before any training
    ledger = PrivacyLedger(run.path, max_epsilon=max_epsilon, accounting=accounting, delta=cfg.delta)
    pending = [label_event(cfg, n, num_classes) for i, n in enumerate(plan.sizes) if f"stage-{i + 1}" not in ledger]
    if pending:
        ledger.check_can_start(pending)

    # ------------------------------------------------------------------------------- shared stages
    stages = Stages(StageCache(enabled=cache), env, data, run)
    teacher, teacher_stage = stages.baseline(teacher_cfg)
    teacher_accuracy = float(teacher_stage.info().get("test_accuracy") or evaluate(teacher, data.test, env))
    generator = gen_stage = None
    if not label_dp:
        generator, gen_stage = stages.generator(teacher, teacher_stage.key, gen_cfg)
        generator = env.place(generator)
    for p in teacher.parameters():  # fixed: labels (data-free) and the optional Eq. 2 fine-tuning term
        p.requires_grad_(False)
    stage_refs = {"teacher": {**teacher_stage.ref(), "build_seconds": teacher_stage.info().get("build_seconds")}}
    if gen_stage is not None:
        stage_refs["generator"] = {**gen_stage.ref(), "build_seconds": gen_stage.info().get("build_seconds")}

    # ------------------------------------------------------------------------------------ student
    torch.manual_seed(env.generator(_INIT_STREAM).initial_seed())
    student = env.place(create_model(cfg.student_for_setting, kind="classifier", in_channels=data.channels,
                                     num_classes=num_classes, image_size=data.image_size[0]))
    optimizer = _optimizer(student.parameters(), cfg)
    schedule = make_schedule(optimizer, cfg.lr_schedule, plan.total_steps)
    gen_opt = None
    if generator is not None and cfg.finetune != "none" and cfg.finetune_steps > 0:
        gen_opt = torch.optim.Adam(generator.parameters(), lr=cfg.finetune_lr)
    bn = BatchNormStatistics(teacher) if gen_opt is not None and cfg.finetune == "kd+srr" else None
    alpha, beta = gen_cfg.weights

    order = torch.randperm(len(data.train), generator=env.generator(_PERM_STREAM))[:total] if label_dp else None
    offsets = [sum(plan.sizes[:i]) for i in range(cfg.stages)]
    synthetic_dir = run.path / "synthetic"

    start_stage, elapsed, history, label_log = 0, 0.0, [], []
    state = run.load_checkpoint(CHECKPOINT)
    if state is not None:
        student.load_state_dict(state["student"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        if generator is not None:
            generator.load_state_dict(state["generator"])
        if gen_opt is not None:
            gen_opt.load_state_dict(state["generator_optimizer"])
        start_stage, elapsed, history, label_log = state["stage"], state["elapsed"], state["history"], state["labels"]

    eval_every = cfg.eval_every_stages or max(1, cfg.stages // 10)
    t0 = time.perf_counter()

    def save(stage_done: int) -> None:
        ckpt = {"student": student.state_dict(), "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(), "stage": stage_done,
                "elapsed": elapsed + time.perf_counter() - t0, "history": history, "labels": label_log}
        if generator is not None:
            ckpt["generator"] = generator.state_dict()
        if gen_opt is not None:
            ckpt["generator_optimizer"] = gen_opt.state_dict()
        run.save_checkpoint(ckpt, CHECKPOINT)

    def stage_inputs(i: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(uint8 images, label the mechanism protects, true label if known) of stage i (0-based)."""
        if label_dp:
            idx = order[offsets[i]:offsets[i] + plan.sizes[i]]
            return data.train.images[idx], data.train.labels[idx], data.train.labels[idx]
        # saved before the labels are drawn: a resumed run labels and trains on exactly these images
        path = synthetic_dir / f"stage-{i + 1:04d}.pt"
        if path.is_file():
            images = torch.load(path, map_location="cpu", weights_only=True)
        else:
            images = _generate_stage(generator, _stage_latents(i), env)
            atomic_torch_save(path, images)
        return images, None, None

    def _stage_latents(i: int) -> torch.Tensor:
        return torch.randn(plan.sizes[i], generator.latent_dim, generator=env.generator(_LATENT_STREAM, i))

    def train_student(i: int, images: torch.Tensor, labels: torch.Tensor) -> float:
        student.train()
        m, b, losses = len(images), plan.batch[i], []
        for step in range(plan.steps[i]):
            idx = _stage_batch(m, b, i, step, env)
            x = to_float(images[idx])
            if cfg.augment != "none":
                x = augment_batch(x, cfg.augment, env.generator(_AUGMENT_STREAM, i, step))
            x, y = env.place_batch(x), labels[idx].to(env.device)
            with env.autocast():
                logits = student(x)
            # Eq. 3's KL(onehot(label) || softmax(student)) == cross-entropy
            loss = F.cross_entropy(logits.float(), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(float(loss.detach()))
        return sum(losses) / len(losses)

    def finetune_generator(i: int, labels: torch.Tensor) -> float:
        z_all = _stage_latents(i)
        student.eval()
        for p in student.parameters():
            p.requires_grad_(False)
        generator.train()
        losses = []
        try:
            for step in range(cfg.finetune_steps):
                b = min(cfg.finetune_batch_size, len(z_all))
                idx = torch.randperm(len(z_all), generator=env.generator(_FINETUNE_STREAM, i, step))[:b]
                if bn is not None:
                    bn.losses = []  # drop the statistics the teacher's labelling passes left in the hooks
                with env.autocast():
                    x = generator(z_all[idx].to(env.device))
                    loss = F.cross_entropy(student(x).float(), labels[idx].to(env.device))
                    if bn is not None:
                        extra, _ = datafree_loss(teacher, x, "srr", alpha, beta, bn)
                        loss = loss + extra
                gen_opt.zero_grad(set_to_none=True)
                loss.backward()
                gen_opt.step()
                losses.append(float(loss.detach()))
        finally:
            for p in student.parameters():
                p.requires_grad_(True)
            student.train()
        return sum(losses) / max(1, len(losses))

    def recorded(j: int) -> torch.Tensor:
        """Stage j's (0-based) released labels, read back from the ledger: never re-drawn."""
        def never():
            raise RuntimeError(f"stage {j + 1}'s labels are not in the ledger")
        return torch.as_tensor(ledger.spend(f"stage-{j + 1}", label_event(cfg, plan.sizes[j], num_classes),
                                            never)).long()

    threshold = cfg.threshold if cfg.threshold is not None else 1.0 / (2 * num_classes)
    stopped = None
    try:
        with progress_bar(cfg.stages, f"srr {cfg.setting} ({cfg.mechanism}, ε={cfg.epsilon:g})",
                          enabled=env.progress, completed=start_stage) as bar:
            for i in range(start_stage, cfg.stages):
                images, protected, truth = stage_inputs(i)
                prior = _probs(student, images, env)  # φs^(i-1): the prior, computed before anything else
                if protected is None:  # data-free: the teacher's label on the synthetic input
                    protected = predict_logits(teacher, images, env).argmax(1)

                def draw(prior=prior, protected=protected, i=i) -> LedgerAnswer:
                    gen = (make_generator(secure=True) if cfg.secure_noise
                           else make_generator(int(env.generator(_NOISE_STREAM, i).initial_seed())))
                    labels = release_labels(cfg.mechanism, prior, protected, epsilon=cfg.epsilon,
                                            threshold=threshold, generator=gen)
                    return LedgerAnswer(answers=labels.to(torch.int16 if num_classes < 32768 else torch.int64),
                                        stats={"mechanism": cfg.mechanism, "setting": cfg.setting})

                released = ledger.spend(f"stage-{i + 1}", label_event(cfg, plan.sizes[i], num_classes), draw)
                labels = torch.as_tensor(released).long()
                label_log.append(_label_stats(i, prior, protected, labels, truth, threshold, cfg))

                if cfg.student_data == "cumulative" and i > 0:
                    prev = [stage_inputs(j) for j in range(i)]
                    all_images = torch.cat([p[0] for p in prev] + [images])
                    all_labels = torch.cat([recorded(j) for j in range(i)] + [labels])
                    loss = train_student(i, all_images, all_labels)
                else:
                    loss = train_student(i, images, labels)
                entry = {"stage": i + 1, "train_loss": round(loss, 5),
                         "label_accuracy_vs_teacher" if not label_dp else "label_accuracy_vs_truth":
                             label_log[-1]["correct"]}
                if gen_opt is not None:
                    entry["finetune_loss"] = round(finetune_generator(i, labels), 5)
                if (i + 1) % eval_every == 0 or i + 1 == cfg.stages:
                    entry["test_accuracy"] = round(evaluate(student, data.test, env), 4)
                history.append(entry)
                run.log(stage_name="srr", **entry)
                save(i + 1)
                bar.advance(1, acc=entry.get("test_accuracy"))
    except BudgetExceededError as err:  # cannot happen after check_can_start, unless the ledger was edited
        stopped = str(err)
        raise
    finally:
        if bn is not None:
            bn.remove()

    loop_seconds = elapsed + time.perf_counter() - t0
    if cfg.final_epochs > 0:
        all_images = torch.cat([stage_inputs(j)[0] for j in range(cfg.stages)])
        all_labels = torch.cat([recorded(j) for j in range(cfg.stages)])
        final_cfg = ClassifierTraining(model=cfg.student_for_setting, epochs=cfg.final_epochs,
                                       batch_size=cfg.batch_size, optimizer=cfg.optimizer, lr=cfg.lr * 0.1,
                                       momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                                       lr_schedule=cfg.lr_schedule, augment=cfg.augment, eval_every_epochs=1e9)
        union = ImageDataset(all_images, all_labels, num_classes, name="srr labelled union")
        train_classifier(student, union, cfg=final_cfg, env=env, run=run, checkpoint="srr-final-checkpoint",
                         description="srr final epochs")

    accuracy = evaluate(student, data.test, env)
    run.save_weights("student", student)
    if generator is not None:
        run.save_weights("generator", generator)
    if synthetic_dir.exists() and not cfg.keep_synthetic:
        shutil.rmtree(synthetic_dir, ignore_errors=True)

    both = ledger.epsilon_both()
    eps_paper, eps_strict = both["paper"].value, both["strict"].value
    artifacts = srr_pathways(setting=cfg.setting)
    if label_dp:  # no generator is trained or released in the label-DP setting
        artifacts = {"student": artifacts["student"]}
    noise = noise_source(cfg.secure_noise, "srr.secure_noise")
    write_privacy_json(run.path, artifacts, method="srr", noise=noise,
                       extra={"setting": cfg.setting, "mechanism": cfg.mechanism, "epsilon_per_label": cfg.epsilon,
                              "delta": cfg.delta, "labels": total})
    correct = sum(s["correct"] * s["count"] for s in label_log) / max(1, sum(s["count"] for s in label_log))
    label_field = "label_accuracy_vs_truth" if label_dp else "label_accuracy_vs_teacher"
    summary_fields = dict(
        noise_secure=noise["secure"],
        test_accuracy=round(accuracy, 4), baseline_accuracy=round(teacher_accuracy, 4),
        epsilon_paper=_num(eps_paper), epsilon_strict=_num(eps_strict), delta=cfg.delta,
        not_covered=[p.via for p in artifacts["student"] if not p.covered],
        target_epsilon=cfg.epsilon, variant=variant if variant is not None else default_variant(cfg),
        setting=cfg.setting, mechanism=cfg.mechanism, stages=cfg.stages, num_labels=total,
        threshold=threshold, student_model=cfg.student_for_setting, teacher_model=teacher_cfg.model,
        **{label_field: round(correct, 4)},
        mean_candidate_set_size=round(sum(s["mean_set_size"] * s["count"] for s in label_log) / max(1, total), 3),
        teacher_label_in_set=round(sum(s["label_in_set"] * s["count"] for s in label_log) / max(1, total), 4),
        relation=both["strict"].relation,
        privacy=_privacy_note(cfg, total),
        epsilon_note=("epsilon_paper: pure epsilon-label-DP per label (delta = 0), no composition over labels, "
                      "as the paper states; epsilon_strict: (epsilon, delta) for the private training set "
                      + ("under 'change one record's label' (each label released once)" if label_dp else
                         f"composed over all {total} labels drawn from one teacher (replace-one)")
                      + "; neither covers the teacher -> generator -> synthetic-input pathway" * (not label_dp)),
        label_accuracy_note=("evaluation only: comparing released labels with the "
                             + ("true labels" if label_dp else "teacher's labels")
                             + " reads private information and is not covered by any epsilon"),
        max_epsilon=max_epsilon, accounting=accounting, stages_used=stage_refs,
        loop_seconds=round(loop_seconds, 1), history=history[-12:],
        label_stats_first_last=[label_log[0], label_log[-1]] if label_log else [],
        config={k: v for k, v in to_plain(cfg).items()},
        stopped=stopped)
    wall = elapsed + (time.perf_counter() - started)  # earlier invocations' loop time + this invocation
    # the last checkpoint stays: resuming a finished run re-evaluates it without training again
    return finish_run(prep, request, method="srr", wall_seconds=wall, **summary_fields)


def _label_stats(i: int, prior: torch.Tensor, protected: torch.Tensor, labels: torch.Tensor,
                 truth: torch.Tensor | None, threshold: float, cfg: SRRConfig) -> dict[str, Any]:
    """Evaluation-only statistics of one stage's labels (they read the protected labels)."""
    in_set = candidate_sets(cfg.mechanism, prior, epsilon=cfg.epsilon, threshold=threshold)
    target = truth if truth is not None else protected
    return {"stage": i + 1, "count": int(len(labels)),
            "correct": round(float((labels == target).float().mean()), 5),
            "mean_set_size": round(float(in_set.sum(1).float().mean()), 4),
            "label_in_set": round(float(in_set.gather(1, protected.long()[:, None]).float().mean()), 5),
            "prior_top1_agrees": round(float((prior.argmax(1) == protected).float().mean()), 5)}


def _num(x: float) -> float | str:
    return "inf" if math.isinf(x) else round(x, 6)


def _privacy_note(cfg: SRRConfig, total: int) -> str:
    if cfg.setting == "label-dp":
        return (f"label-DP: each of {total} private records' label released once by {cfg.mechanism} at "
                f"epsilon {cfg.epsilon:g}; the private inputs are used as they are (not protected)")
    return (f"{total} labels by {cfg.mechanism} at epsilon {cfg.epsilon:g} each from one non-private teacher; "
            "the teacher and the generator (trained against it) are not covered by any epsilon")


# ======================================================================================== Python API
class SRR(MethodAPI):
    """`SRR(epsilon=1).fit("mnist")` -> Released(student, generator, summary, privacy).

    Keywords go to the `srr` section (`setting="label-dp"`, `mechanism="rr"`, `stages=40`, ...); anything
    else through `overrides=["srr_generator.rounds=32", ...]`. ``max_epsilon`` under ``accounting`` ("paper": per
    label, or "strict") refuses a run whose planned labels would spend more.
    """

    section = "srr"

    def __init__(self, dataset: str | None = None, *, epsilon: float | None = None, max_epsilon: float | None = None,
                 accounting: str = "paper", cache: bool = True, variant: str | None = None, **options: Any):
        super().__init__(dataset, epsilon=epsilon, **options)
        self.max_epsilon, self.accounting, self.cache, self.variant = max_epsilon, accounting, cache, variant

    def fit(self, dataset: str | None = None) -> Released:
        summary = train_srr(self.request(dataset), max_epsilon=self.max_epsilon, accounting=self.accounting,
                            cache=self.cache, variant=self.variant)
        return Released.from_run(summary)
