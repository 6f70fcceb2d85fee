"""The models, schedule and steps SRR's stage loop is written with (methods/srr.py, `SRRMethod.train`).

`SRRTraining` holds one run's teacher φt, generator φg and student φs with their optimisers, the resumable
stage loop (one step per stage, checkpoint "srr-checkpoint") and the operations of a stage: its inputs D̃(i),
the student's steps on (D̃(i), L_i), the generator's fine-tuning. Every random draw derives from the run's seed
and (stage, epoch, step) counters (engine/streams.py, SRR_*), so a run killed at any point and resumed replays
the same stages; the labels of a stage come from the privacy ledger once drawn (never drawn twice).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from privdistill.atomic import atomic_torch_save
from privdistill.config import ClassifierTraining, to_plain
from privdistill.data.dataset import to_float
from privdistill.engine import streams
from privdistill.engine.datafree import GeneratorTraining, draw_latent, generate
from privdistill.engine.loop import TrainingLoop
from privdistill.engine.optim import make_optimizer, make_schedule, weight_average
from privdistill.engine.trainer import evaluate
from privdistill.methods.end_to_end import NO_MECHANISM, srr_teacher
from privdistill.methods.runner import Context, Plan
from privdistill.methods.srr_schedule import StageSchedule
from privdistill.models import create_model
from privdistill.privacy.ledger import PrivacyLedger
from privdistill.privacy.mechanisms import released_label_likelihood

if TYPE_CHECKING:
    from privdistill.methods.srr_plan import SRRConfig

CHECKPOINT = "srr-checkpoint"


def stage_key(i: int) -> str:
    """The ledger key of stage i's (0-based) labels."""
    return f"stage-{i + 1}"


def label_stats(i: int, prior: torch.Tensor, protected: torch.Tensor, labels: torch.Tensor,
                 truth: torch.Tensor | None, in_set: torch.Tensor) -> dict[str, Any]:
    """Evaluation-only statistics of stage i's labels (they read the protected labels; `in_set`: the
    mechanism's candidate sets I)."""
    target = truth if truth is not None else protected
    return {"stage": i + 1, "count": int(len(labels)),
            "correct": round(float((labels == target).float().mean()), 5),
            "mean_set_size": round(float(in_set.sum(1).float().mean()), 4),
            "label_in_set": round(float(in_set.gather(1, protected.long()[:, None]).float().mean()), 5),
            "prior_top1_agrees": round(float((prior.argmax(1) == protected).float().mean()), 5)}


class SRRTraining:
    """One SRR run's models, optimisers, stage loop and stage operations."""

    def __init__(self, ctx: Context, plan: Plan, ledger: PrivacyLedger):
        self.cfg: SRRConfig = ctx.section("srr")
        self.env, self.data, self.run, self.ledger = ctx.env, ctx.data, ctx.run, ledger
        self.recipe = ctx.section("run").recipe
        self.epsilon, self.threshold = plan.details["epsilon_per_label"], plan.details["threshold"]
        self.schedule: StageSchedule = plan.details["schedule"]
        self.events = plan.details["events"]  # stage i's label event
        self.label_dp = self.cfg.setting == "label-dp"
        self.end_to_end = "end_to_end" in plan.details  # a DP teacher: its labels are used as they are
        self.label_field = "label_accuracy_vs_truth" if self.label_dp else "label_accuracy_vs_teacher"
        self._build_models(ctx, plan.details.get("end_to_end"))
        # label-dp: the order in which the private records are labelled (chunk i at stage i)
        self.order = (torch.randperm(len(self.data.train), generator=self.env.generator(streams.SRR_ORDER))
                      [:sum(self.schedule.sizes)] if self.label_dp else None)
        self.synthetic_dir = self.run.path / "synthetic"
        self.loop = TrainingLoop(
            steps=self.cfg.stages, env=self.env, run=self.run, checkpoint=CHECKPOINT, log_stage="srr",
            title=("srr end to end (labels of a DP teacher)" if self.end_to_end else
                   f"srr {self.cfg.setting} ({self.cfg.mechanism}, ε={self.epsilon:g} per label)"),
            modules={"student": self.student, "generator": self.generator, "average": self.average},
            optimizers={"student": self.optimizer, "generator": self.generator_optimizer},
            schedules={"student": self.lr_schedule}, checkpoint_every=1, round_parts=5,
            eval_every=self.cfg.eval_every_stages or max(1, self.cfg.stages // 10),
            evaluate=lambda: {"test_accuracy": round(evaluate(self.released, self.data.test, self.env), 4)},
            extra={"labels": []})  # each stage's label statistics (SRRMethod.train), resumed with the loop

    def _build_models(self, ctx: Context, end_to_end: dict | None) -> None:
        cfg, env, data = self.cfg, self.env, self.data
        generator_cfg: GeneratorTraining = ctx.section("srr_generator")
        teacher_cfg: ClassifierTraining = ctx.section("srr_teacher")
        self.teacher = self.teacher_accuracy = self.generator = teacher_stage = generator_stage = None
        self.teacher_model = None if self.label_dp else teacher_cfg.model
        self.dp_source = None
        if end_to_end:  # the teacher: a DP-SGD model trained here, with DP feature statistics for the generator
            self.teacher, self.dp_source, key = srr_teacher(ctx, self.ledger, end_to_end, secure=cfg.secure_noise)
            self.teacher_model, self.teacher_accuracy = ctx.section("dp_source").model, self.dp_source["test_accuracy"]
            self.generator, generator_stage = ctx.stages.generator(self.teacher, key, generator_cfg)
            self.generator = env.place(self.generator)
        elif not self.label_dp:  # label-dp: the true labels go through the mechanism; no teacher, no generator
            self.teacher, teacher_stage = ctx.stages.baseline(teacher_cfg)
            self.teacher_accuracy = float(teacher_stage.info().get("test_accuracy")
                                          or evaluate(self.teacher, data.test, env))
            self.generator, generator_stage = ctx.stages.generator(self.teacher, teacher_stage.key, generator_cfg)
            self.generator = env.place(self.generator)
            self.teacher.requires_grad_(False)  # fixed: it only labels
        self.stages_used = {name: {**stage.ref(), "build_seconds": stage.info().get("build_seconds")}
                            for name, stage in (("teacher", teacher_stage), ("generator", generator_stage))
                            if stage is not None}

        torch.manual_seed(env.generator(streams.SRR_INIT).initial_seed())
        self.student = env.place(create_model(cfg.student_for_setting, kind="classifier", in_channels=data.channels,
                                              num_classes=data.num_classes, image_size=data.image_size[0]))
        self.optimizer = make_optimizer(self.student.parameters(), "adam", lr=cfg.lr)
        self.lr_schedule = make_schedule(self.optimizer, cfg.lr_schedule, sum(self.schedule.steps))
        # None unless srr.student_ema is set; with warm-up, as a stage's prior may be read after a few hundred steps
        self.average = weight_average(self.student, cfg.student_ema)
        self.generator_optimizer = (make_optimizer(self.generator.parameters(), "adam", lr=cfg.finetune_lr)
                                    if self.generator is not None and cfg.finetune_steps > 0 else None)

    @property
    def released(self) -> torch.nn.Module:
        """The model later stages read as their prior and the run releases: φs, or the average of its weights."""
        return self.student if self.average is None else self.average.module

    # ------------------------------------------------------------------------------------ stage data
    def inputs(self, i: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Stage i's (0-based) uint8 inputs D̃(i), the label the mechanism protects when it needs no teacher
        (label-dp: the true label) and the true label when known (evaluation only)."""
        if self.label_dp:
            start = sum(self.schedule.sizes[:i])
            idx = self.order[start:start + self.schedule.sizes[i]]
            return self.data.train.images[idx], self.data.train.labels[idx], self.data.train.labels[idx]
        # saved before the labels are drawn: a resumed run labels and trains on exactly these images
        path = self.synthetic_dir / f"stage-{i + 1:04d}.pt"
        if path.is_file():
            return torch.load(path, map_location="cpu", weights_only=True), None, None
        images = generate(self.generator, self.schedule.sizes[i], self.env, latents=self.latents(i))
        atomic_torch_save(path, images)
        return images, None, None

    def latents(self, i: int) -> torch.Tensor:
        """z_i: stage i's latent codes (the same codes again for the generator's fine-tuning)."""
        return draw_latent(self.generator, self.schedule.sizes[i], self.env.generator(streams.SRR_LATENT, i))

    def recorded(self, i: int) -> torch.Tensor:
        """Stage i's released labels, read back from the ledger: never drawn here."""
        def not_drawn():
            raise RuntimeError(f"stage {i + 1}'s labels are not in the ledger")

        return torch.as_tensor(self.ledger.spend(stage_key(i), self.events[i], not_drawn)).long()

    def stage_sets(self, i: int, in_set: torch.Tensor | None = None) -> torch.Tensor | None:
        """Stage i's candidate sets I [n, K] (computed from the prior, never from a label): saved when given, read
        back when not. Only the likelihood loss needs them (for earlier stages too, under `cumulative`)."""
        if self.cfg.loss != "likelihood":
            return None
        path = self.run.path / "label-sets" / f"stage-{i + 1:04d}.pt"
        if in_set is not None:
            atomic_torch_save(path, in_set.cpu())
            return in_set.cpu()
        return torch.load(path, map_location="cpu", weights_only=True)

    def student_data(self, i: int, images: torch.Tensor, labels: torch.Tensor,
                     in_set: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """What φs trains on at stage i: (D̃(i), L_i, I_i), or (cumulative) the inputs, recorded labels and
        (likelihood loss) candidate sets of every stage labelled so far."""
        if self.cfg.student_data != "cumulative":
            return images, labels, in_set
        stages = range(i + 1)
        sets = [self.stage_sets(j) for j in stages]
        return (torch.cat([self.inputs(j)[0] for j in stages]), torch.cat([self.recorded(j) for j in stages]),
                None if sets[0] is None else torch.cat(sets))

    @staticmethod
    def student_loss(logits: torch.Tensor, targets: torch.Tensor, soft: bool = False) -> torch.Tensor:
        """Eq. 3's cross-entropy to the released label (targets [b]) or, soft, to the DP teacher's softmax [b, K];
        or the negative log of the student's probability of the released label, Σ_y p_s(y) P(released | y) (log)."""
        if targets.dim() == 1 or soft:
            return F.cross_entropy(logits, targets)
        return -torch.logsumexp(F.log_softmax(logits, dim=1) + targets, dim=1).mean()

    # ---------------------------------------------------------------------------------------- steps
    def train_student(self, i: int, images: torch.Tensor, labels: torch.Tensor, in_set: torch.Tensor | None = None,
                      answers: torch.Tensor | None = None) -> float:
        """φs's steps at stage i, in seeded epochs over (images, labels) with L_kd (Eq. 3) or the likelihood loss;
        or (soft, end to end only) the DP teacher's softmax of its `answers` on the images, post-processing of a DP
        model; the mean loss."""
        cfg, env, student = self.cfg, self.env, self.student
        targets = labels  # ce: the released labels [n]
        if cfg.loss == "soft":
            targets = answers.float().softmax(1)
        elif cfg.loss == "likelihood":  # their log-likelihood under every true class [n, K]: post-processing
            targets = released_label_likelihood(in_set, labels, epsilon=self.epsilon).clamp(min=1e-300).log().float()
        student.train()
        m, b, losses = len(images), self.schedule.batch[i], []
        per_epoch = math.ceil(m / b)
        for step in range(self.schedule.steps[i]):
            epoch, position = divmod(step, per_epoch)
            perm = torch.randperm(m, generator=env.generator(streams.SRR_EPOCH, i, epoch))
            idx = perm[position * b:(position + 1) * b]
            x, y = env.place_batch(to_float(images[idx])), targets[idx].to(env.device)
            with env.autocast():
                logits = student(x)
            loss = self.student_loss(logits.float(), y, soft=cfg.loss == "soft")
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            self.lr_schedule.step()
            if self.average is not None:
                self.average.update_parameters(student)
            losses.append(float(loss.detach()))
        return sum(losses) / len(losses)

    def finetune_generator(self, i: int, labels: torch.Tensor) -> float:
        """Fine-tune φg on stage i: L_kd (Eq. 3) of the fixed student on φg(z_i) against the stage's labels, with
        respect to θg; the mean loss."""
        z_all, student, generator, env = self.latents(i), self.student, self.generator, self.env
        student.eval()
        student.requires_grad_(False)
        generator.train()
        losses = []
        try:
            for step in range(self.cfg.finetune_steps):
                b = min(self.cfg.finetune_batch_size, len(z_all))
                idx = torch.randperm(len(z_all), generator=env.generator(streams.SRR_FINETUNE, i, step))[:b]
                with env.autocast():
                    x = generator(z_all[idx].to(env.device))
                    loss = F.cross_entropy(student(x).float(), labels[idx].to(env.device))
                self.generator_optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.generator_optimizer.step()
                losses.append(float(loss.detach()))
        finally:
            student.requires_grad_(True)
            student.train()
        return sum(losses) / max(1, len(losses))

    def summary_fields(self, loop_seconds: float) -> dict[str, Any]:
        """The run's SRR fields of summary.json (label statistics are evaluation only: see label_accuracy_note)."""
        cfg, log = self.cfg, self.loop.extra["labels"]
        count = max(1, sum(s["count"] for s in log))

        def mean(key: str) -> float:  # over all labels, weighting each stage by its label count
            return sum(s[key] * s["count"] for s in log) / count

        # the result name's suffix: the one given, else the setting and mechanism when they are not what the recipe's
        # name already says (`-r label-dp` records as srr-D-epsE-label-dp.json, not ...-label-dp-label-dp)
        variant = cfg.variant
        if variant is None:
            variant = None if cfg.default_variant == self.recipe else cfg.default_variant
        # every stage's label statistics with the student's test accuracy after it, where evaluated (each stage with
        # `eval_every_stages: 1`): how the candidate sets and the labels' correctness evolve (evaluation only)
        accuracy = {entry["step"]: entry.get("test_accuracy") for entry in self.loop.history}
        trace = [{**stats, "test_accuracy": accuracy.get(stats["stage"])} for stats in log]
        return dict(epsilon_per_label=self.epsilon,
                    variant=variant,
                    setting=cfg.setting, mechanism=NO_MECHANISM if self.end_to_end else cfg.mechanism,
                    stages=cfg.stages, **({"dp_source": self.dp_source} if self.dp_source else {}),
                    num_labels=sum(self.schedule.sizes), threshold=self.threshold,
                    student_model=cfg.student_for_setting, teacher_model=self.teacher_model,
                    **{self.label_field: round(mean("correct"), 4)},
                    mean_candidate_set_size=round(mean("mean_set_size"), 3),
                    teacher_label_in_set=round(mean("label_in_set"), 4), stages_used=self.stages_used,
                    loop_seconds=round(loop_seconds, 1), history=self.loop.history[-12:],
                    label_stats_first_last=[log[0], log[-1]] if log else [], stage_trace=trace,
                    config=to_plain(cfg),
                    stopped=None)  # kept for readers of summary.json: a budget error mid-run propagates instead
