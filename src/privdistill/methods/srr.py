"""SRR: label-DP data-free distillation with selective randomized response (paper 004, Alg. 1).

    teacher φt trained on D (non-private; cached stage `baseline`, section `srr_teacher`)
    generator φg pre-trained against φt (Eq. 2: one-hot CE + α·Σ p̄ log p̄ + β·BN statistics, α = 5, β = 10)
    for i = 1..T:
        D̃(i) = φg(z_i)                              (stage i's synthetic inputs, quantised like real images)
        y_t = φt(D̃(i)), y_s = softmax φs^(i-1)(D̃(i))  (the current student's prediction is the prior)
        L_i = R(y_s, y_t, t), t = 1/(2K)               (drawn once, recorded under "stage-i" before use)
        train φs on (D̃(i), L_i) with L_kd (Eq. 3), fine-tune φg on (D̃(i), L_i)
    release φs^(T)

Settings: ``data-free`` (Table I: the teacher's labels on synthetic inputs) and ``label-dp`` (Table II: the real
private inputs in T disjoint chunks, their true labels protected; no teacher, no generator). Mechanisms
(``srr.mechanism``): ``srr``, ``rr`` (k-RR) and ``rr-prior`` (RRWithPrior, Ghazi et al. 2021), each k-RR on a
candidate set chosen without the label, so each released label is ε-DP in the label it hides.
Privacy: data-free, one record can change the teacher and so every label, so the strict ε composes over all labels
(the paper's ε is per label); label-dp, each label is released once: ε-label-DP under "change one record's label".
Under ``strict`` the per-label ε is the largest whose strict ε fits the target (pricing: methods/srr_plan.py).

Readings where the paper is ambiguous (more: research log, "Notes that left the code: methods/srr.py"):
- "Return y_t": the one-hot argmax (the soft output would not be DP); Eq. 3's ℓ_KL to it is the cross-entropy.
- Eq. 3 sums over D̂(i) only (``student_data: stage``); φg is fine-tuned by Eq. 3 in θg (``finetune_steps``), on
  no ε's pathway. Stage 1's prior is uniform; N synthetic samples split evenly over the T stages.
"""

from __future__ import annotations

import shutil
import time

import torch

from privdistill.config import ClassifierTraining
from privdistill.engine import streams
from privdistill.engine.datafree import GeneratorTraining
from privdistill.engine.trainer import predict_logits
from privdistill.errors import ConfigError
from privdistill.methods import end_to_end as e2e
from privdistill.methods.common import MethodAPI, RunRequest
from privdistill.methods.runner import Context, Method, Plan, Report, RunResult, Trained
from privdistill.methods.srr_plan import (
    SRRConfig,
    epsilon_per_label,
    label_event,
    srr_end_to_end_pathways,
    srr_notes,
    srr_pathways,
)
from privdistill.methods.srr_schedule import StageSchedule
from privdistill.methods.srr_training import SRRTraining, label_stats, stage_key
from privdistill.privacy.ledger import LedgerAnswer, LedgerView, PrivacyLedger
from privdistill.privacy.mechanisms import candidate_sets, noise_source, release_labels
from privdistill.privacy.report import Pathway


class SRRMethod(Method):
    """SRR on the run skeleton (methods/runner.py): plan the labels, run Alg. 1's stages, report."""

    name = "srr"
    sections = {"srr_teacher": ClassifierTraining, "srr_generator": GeneratorTraining, "srr": SRRConfig,
                "dp_source": e2e.DPSourceConfig}

    def check_end_to_end(self, ctx: Context) -> None:  # a DP teacher and DP feature statistics (end_to_end.py)
        if ctx.section("srr").setting != "data-free":
            raise ConfigError("SRR's label-DP setting trains on the private images themselves: it protects labels only "
                              "and cannot be end to end (drop --privacy end-to-end, or use dpsgd)")
        e2e.check_srr(ctx)

    def plan(self, ctx: Context, recorded: LedgerView) -> Plan:
        """The label events of the stages not yet in the ledger, at the per-label ε the budget allows."""
        cfg: SRRConfig = ctx.section("srr")
        generator_loss = ctx.section("srr_generator").loss
        if generator_loss != "srr":
            raise ConfigError("srr_generator.loss must be 'srr' (the paper's BN-statistics loss), "
                              f"got {generator_loss!r}")
        total = cfg.num_samples or len(ctx.data.train)
        if cfg.loss == "soft" and not e2e.is_end_to_end(ctx):
            raise ConfigError("srr.loss=soft trains on the teacher's softmax, which only a DP teacher may give "
                              "(--privacy end-to-end); SRR releases one randomised label a sample")
        if e2e.is_end_to_end(ctx):
            return e2e.srr_plan(ctx, recorded, total, StageSchedule.of(cfg, total))
        num_classes, records = ctx.data.num_classes, len(ctx.data.train)
        capped = cfg.setting == "label-dp" and total > records  # e.g. the preset's 60,000 (all of MNIST) on less data
        total = records if capped else total
        epsilon = epsilon_per_label(cfg, ctx.budget, total, num_classes)
        schedule = StageSchedule.of(cfg, total)
        events = [label_event(cfg, n, num_classes, epsilon) for n in schedule.sizes]
        notes = [f"label-dp: num_samples {cfg.num_samples} > the {records} private records: all of them, one label "
                 "each"] * capped + ([] if ctx.budget.accounting == "paper" else [
            f"epsilon per label {epsilon:.6g}: the largest whose strict epsilon for all {total} labels fits the "
            f"target {ctx.budget.epsilon:g}"])
        threshold = cfg.threshold if cfg.threshold is not None else 1.0 / (2 * num_classes)
        return Plan(remaining=[event for i, event in enumerate(events) if stage_key(i) not in recorded], notes=notes,
                    details={"epsilon_per_label": epsilon, "num_labels": total, "threshold": threshold,
                             "schedule": schedule, "events": events})

    def train(self, ctx: Context, plan: Plan, ledger: PrivacyLedger) -> Trained:
        """Alg. 1's stage loop. One loop step is one stage, checkpointed after it: a resumed run continues after
        the last finished stage, and a stage whose labels were drawn before the interruption reads them back."""
        srr = SRRTraining(ctx, plan, ledger)
        for i in srr.loop:  # for i = 1..T (0-based here)
            images, protected, truth = srr.inputs(i)  # D̃(i) = φg(z_i); label-dp: chunk i of the private set
            prior = stage_prior(srr, i, images)  # y_s = softmax φs^(i-1)(D̃(i)), before anything else
            answers = None  # data-free: the teacher's answers φt(D̃(i)), read again by srr.loss=soft
            if protected is None:
                answers = predict_logits(srr.teacher, images, srr.env)
                protected = answers.argmax(1)  # its label y_t = argmax φt(D̃(i))
            labels, in_set = release_stage_labels(srr, i, prior, protected)  # L_i = R(y_s, y_t, t), and I_i
            stats = label_stats(i, prior, protected, labels, truth, in_set)
            srr.loop.extra["labels"].append(stats)
            sets = srr.stage_sets(i, in_set)  # I_i, kept for the likelihood loss (never read a label)
            loss = srr.train_student(i, *srr.student_data(i, images, labels, sets), answers=answers)  # φs on L_i
            parts = {"train_loss": loss, srr.label_field: stats["correct"]}
            if srr.generator_optimizer is not None:  # fine-tune φg on (D̃(i), L_i)
                parts["finetune_loss"] = srr.finetune_generator(i, labels)
            srr.loop.record(parts)  # evaluation at its cadence, log, checkpoint
        loop = srr.loop.finish()  # the last checkpoint stays: resuming a finished run trains nothing
        shutil.rmtree(srr.synthetic_dir, ignore_errors=True)  # the stage images are kept for a resume only
        # release φs^(T): the runner evaluates it and writes its weights (and the fine-tuned generator's)
        return Trained(student=srr.released, generator=srr.generator, baseline_accuracy=srr.teacher_accuracy,
                       wall_seconds=srr.loop.elapsed + time.perf_counter() - ctx.started,
                       fields=srr.summary_fields(loop.wall_seconds))

    def pathways(self, ctx: Context, plan: Plan) -> dict[str, list[Pathway]]:
        if e2e.is_end_to_end(ctx):
            return srr_end_to_end_pathways()
        # label-dp: no generator is trained or released, so the pathways name the student only
        return srr_pathways(setting=ctx.section("srr").setting)

    def report(self, ctx: Context, plan: Plan, trained: Trained, ledger: PrivacyLedger) -> Report:
        cfg: SRRConfig = ctx.section("srr")
        total, epsilon = plan.details["num_labels"], plan.details["epsilon_per_label"]
        if e2e.is_end_to_end(ctx):
            return e2e.srr_report(ctx, total, ledger)
        notes = srr_notes(setting=cfg.setting, mechanism=cfg.mechanism, labels=total, epsilon=epsilon)
        return Report(pathways=self.pathways(ctx, plan), secure_noise=cfg.secure_noise,
                      noise_option="srr.secure_noise",
                      extra={"setting": cfg.setting, "mechanism": cfg.mechanism, "epsilon_per_label": epsilon,
                             "delta": ctx.budget.delta, "labels": total},
                      fields={"relation": ledger.epsilon_both()["strict"].relation, **notes})


def release_stage_labels(srr: SRRTraining, i: int, prior: torch.Tensor,
                         protected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """L_i = R(y_s, y_t, t) at the per-label ε, drawn with stage i's noise stream (or OS entropy) and recorded in
    the ledger before it is returned (a resumed run gets the recorded labels back, never a second draw), and the
    candidate sets I_i. End to end the teacher is DP: its label is post-processing, nothing left to randomise."""
    cfg = srr.cfg
    if srr.end_to_end:
        return protected, torch.nn.functional.one_hot(protected, prior.shape[1]).bool()

    def draw() -> LedgerAnswer:
        noise = noise_source(None if cfg.secure_noise else int(srr.env.generator(streams.SRR_NOISE, i).initial_seed()),
                             secure=cfg.secure_noise)
        labels = release_labels(cfg.mechanism, prior, protected, epsilon=srr.epsilon, threshold=srr.threshold,
                                generator=noise)
        compact = torch.int16 if prior.shape[1] < 32768 else torch.int64
        return LedgerAnswer(answers=labels.to(compact), stats={"mechanism": cfg.mechanism, "setting": cfg.setting})

    released = torch.as_tensor(srr.ledger.spend(stage_key(i), srr.events[i], draw)).long()
    return released, candidate_sets(cfg.mechanism, prior, epsilon=srr.epsilon, threshold=srr.threshold)


def stage_prior(srr: SRRTraining, i: int, images: torch.Tensor) -> torch.Tensor:
    """y_s = softmax φs^(i-1)(D̃(i)); at stage 1 the uniform prior: an untrained softmax is noise on which
    RRWithPrior would shrink its sets (Ghazi et al.'s stage 1 is plain RR; SRR's R gives I = all either way)."""
    if i == 0:
        return torch.full((len(images), srr.data.num_classes), 1.0 / srr.data.num_classes, dtype=torch.float64)
    return torch.softmax(predict_logits(srr.released, images, srr.env).double(), dim=1)


class SRR(MethodAPI):
    """`SRR(epsilon=1).fit("mnist")` -> RunResult(student, generator, summary, privacy).

    ``epsilon`` is the target under ``accounting`` (default strict: the whole run; "paper": per label),
    ``max_epsilon`` the hard limit (default: the target) and ``delta`` the strict δ (section `budget`). Other
    keywords go to the `srr` section (`setting="label-dp"`, `mechanism="rr"`, `stages=40`, `variant=...`);
    anything else through `overrides=["srr_generator.rounds=32", ...]`.
    """

    section, method = "srr", SRRMethod


def run_srr(request: RunRequest, *, cache: bool = True) -> RunResult:
    """Run SRR end to end (the Python API behind `privdistill srr`); ε and δ are the request's `budget` section."""
    return SRRMethod().run(request, cache=cache)
