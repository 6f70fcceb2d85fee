"""DPDFD (Liu et al., IJCAI 2023): model conversion by differentially private data-free distillation.

Alg. 1 (one teacher), per iteration t, lines 11-14 (`_datafree_step`):

    z -> x = G(z) (B synthetic samples) -> teacher and student logits -> L_T (DKD with the teacher's argmax)
    -> per-sample gradients g_i = dL_T/ds_i w.r.t. the student's LOGITS (methods.dkd, vectorised)
    -> A_{C,sigma}: normalise each g_i to norm C, add N(0, sigma^2 C^2 I), divide by B (privacy.mechanisms)
    -> y_s = s - gamma * g~  -> student step on L_S(s, y_s)
    -> generator step on L_S + L_G (Eq. 5) with the (updated) student as a fixed discriminator.

Alg. 2: n teachers on disjoint partitions, g~_i = (1/n)(sum_j normalised g_ij + N(0, sigma^2 C^2 I)) (/B).
Alg. 3: private data directly (real inputs, real labels, CE), Poisson sampling with rate B/N, no generator.
The configuration, T and sigma from the budget, the ledger's chunks and what epsilon covers: methods/dpdfd_plan.py.

Readings (in full: research log, "Notes that left the code: methods/dpdfd.py"; privacy side: docs/privacy.md):
* L_S: L2 by default (its gradient w.r.t. s_i is exactly gamma * g~_i), though the text says cross-entropy ("ce").
* The student steps first; the generator's step reads the UPDATED, frozen student and never the teacher, so student
  AND generator are post-processing of the noisy gradients.
* L_G (Eq. 5) REWARDS high activation (methods.dkd.generator_loss); the generator is DAFL's (the paper gives none).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.config import ClassifierTraining
from privdistill.data.dataset import ImageDataset
from privdistill.engine import streams
from privdistill.engine.cache import Stage
from privdistill.engine.context import Env
from privdistill.engine.datafree import (
    GeneratorTraining,
    build_generator,
    draw_latent,
    latent_labels,
    logits_and_features,
)
from privdistill.engine.ensemble import TeacherEnsemble, TeacherTraining
from privdistill.engine.loop import LoopResult, TrainingLoop
from privdistill.engine.optim import make_optimizer, set_lr, weight_average
from privdistill.engine.run import RunDir
from privdistill.engine.synthetic import save_generator_grid
from privdistill.engine.teachers import TeacherSpec, load_teacher
from privdistill.engine.trainer import evaluate
from privdistill.errors import BudgetExceededError, ConfigError
from privdistill.methods.chance import given_teacher_accuracy
from privdistill.methods.common import MethodAPI, RunRequest
from privdistill.methods.dkd import generator_loss, logit_gradients, student_loss
from privdistill.methods.dpdfd_plan import (
    DPDFDConfig,
    LedgerChunks,
    StepPlan,
    auto_variant,
    noisy_gradients,
    pathways,
    plan_steps,
    privacy_statement,
    steps_allowed,
)
from privdistill.methods.runner import Context, Method, Plan, Report, RunResult, Trained
from privdistill.models import create_model
from privdistill.privacy.events import NormalisedGaussian
from privdistill.privacy.ledger import LedgerView, PrivacyLedger
from privdistill.privacy.report import Pathway

CHECKPOINT = "dpdfd-checkpoint"


# ====================================================================================== the algorithm
@dataclass
class DPDFDResult:
    student: nn.Module
    generator: nn.Module | None
    loop: LoopResult  # the steps done, the training time and the history of every invocation
    stopped: str | None = None  # why the run stopped early (budget), if it did


def train_dpdfd(*, cfg: DPDFDConfig, plan: StepPlan, env: Env, ledger: PrivacyLedger,
                teacher: nn.Module | TeacherEnsemble | None, channels: int, num_classes: int, image_size: int,
                generator_cfg: GeneratorTraining, init_generator: nn.Module | None = None,
                private: ImageDataset | None = None, test: ImageDataset | None = None,
                run: RunDir | None = None) -> DPDFDResult:
    """The DPDFD loop: Alg. 1 with a module teacher, Alg. 2 with a TeacherEnsemble, Alg. 3 with `private`. Resumable
    (engine.loop): everything random derives from (seed, step) or from the ledger's recorded seeds."""
    direct = cfg.algorithm == 3
    torch.manual_seed(env.generator(streams.DPDFD_STUDENT_INIT, -1).initial_seed())
    student = env.place(create_model(cfg.student_model, kind="classifier", in_channels=channels,
                                     num_classes=num_classes, image_size=image_size)).train()
    opt_s = make_optimizer(student.parameters(), "adam", lr=cfg.student_lr)
    # the released student: its weights' moving average where dpdfd.student_ema is set (post-processing of the
    # noisy gradients, like the student itself: it spends nothing), else the last iterate as in the paper
    average = weight_average(student, cfg.student_ema)
    released = student if average is None else average.module
    generator = opt_g = None
    if not direct:
        if init_generator is None:
            torch.manual_seed(env.generator(streams.DPDFD_GENERATOR_INIT, -1).initial_seed())
            init_generator = build_generator(generator_cfg, channels, image_size, output_norm=cfg.generator_output_norm,
                                             num_classes=num_classes)
        generator = env.place(init_generator).train()
        opt_g = make_optimizer(generator.parameters(), "adam", lr=cfg.generator_lr, betas=(cfg.generator_beta1, 0.999))
        if not isinstance(teacher, TeacherEnsemble):
            teacher = env.place(teacher).eval().requires_grad_(False)

    def evaluation() -> dict[str, Any]:
        accuracy = {} if test is None else {"test_accuracy": evaluate(released, test, env)}
        if test is not None and average is not None:  # the last iterate beside its average (evaluation only)
            accuracy["last_iterate_accuracy"] = evaluate(student, test, env)
        return {**accuracy, "elapsed": round(loop.wall_seconds(), 1)}

    loop = TrainingLoop(steps=plan.steps, env=env, run=run, checkpoint=CHECKPOINT, title=f"dpdfd alg. {cfg.algorithm}",
                        log_stage="dpdfd", modules={"student": student, "generator": generator, "average": average},
                        optimizers={"student": opt_s, "generator": opt_g}, eval_every=cfg.eval_every,
                        checkpoint_every=cfg.checkpoint_every, evaluate=evaluation)
    chunks = LedgerChunks(ledger, plan, cfg, env)
    for step in loop:
        try:
            chunk_seed = chunks.seed_for(step)  # the chunk is charged before its first step runs
        except BudgetExceededError as err:
            return DPDFDResult(released, generator, loop.finish(step), f"budget exhausted before step {step}: {err}")
        set_lr(opt_s, cfg.student_lr, cfg.student_lr_schedule, step, plan.steps)
        if direct:
            parts = _direct_step(cfg, plan, env, student, opt_s, private, step, chunk_seed)
        else:
            parts = _datafree_step(cfg, plan, env, student, opt_s, generator, opt_g, teacher, step, chunk_seed)
        if average is not None:
            average.update_parameters(student)
        loop.record(parts)
    return DPDFDResult(released, generator, loop.finish())


def _datafree_step(cfg: DPDFDConfig, plan: StepPlan, env: Env, student: nn.Module, opt_s, generator: nn.Module, opt_g,
                   teacher, step: int, chunk_seed: int) -> dict[str, float]:
    """One iteration of Alg. 1 (module teacher) or Alg. 2 (TeacherEnsemble), lines 11-14 literally: L_S with the
    student before its update, L_G with the updated student; x is a leaf for both student passes."""
    z = draw_latent(generator, cfg.batch_size, env.generator(streams.DPDFD_LATENT, step)).to(env.device)
    train_generator = bool(cfg.generator_every) and (step + 1) % cfg.generator_every == 0
    generator.train()
    with env.autocast(), torch.set_grad_enabled(train_generator):
        x = generator(z)
    x_s = x.detach().requires_grad_(train_generator)
    with torch.no_grad(), env.autocast():
        t_logits = teacher.logits(x_s.detach()) if isinstance(teacher, TeacherEnsemble) else teacher(x_s.detach())
    t_logits = t_logits.float()
    with env.autocast():
        s_logits = student(x_s).float()
    # line 11: per-sample gradients of L_T w.r.t. the student's logits, [B, K] (or [n, B, K]: one per teacher)
    grads = logit_gradients(s_logits, t_logits, temperature=cfg.temperature, alpha=cfg.dkd_alpha, beta=cfg.dkd_beta)
    # line 12: normalise and add noise; nothing else of the teacher reaches the student or the generator
    noisy = noisy_gradients(grads, cfg, plan, chunk_seed, step)
    # line 13: y_s = s - gamma * g~, and a student step on L_S(s, y_s)
    anchor = s_logits.detach()
    ls = student_loss(s_logits, anchor, (cfg.gamma * noisy.to(s_logits.dtype)).expand_as(anchor))
    opt_s.zero_grad(set_to_none=True)
    ls.backward()  # student weights, and dL_S/dx for the generator
    opt_s.step()
    parts = {"student_loss": float(ls.detach())}
    if train_generator:  # line 14
        # a conditional generator's classes (dpdfd_generator.class_targets). Off in every recipe: aimed at classes
        # the student does not yet see, the generator makes adversarial images of the student (MNIST ε 10: 10.31 %
        # at 500 steps; research log, "DPDFD's missed class")
        targets = latent_labels(generator, z)
        # None: the paper's L_G; False: absent classes counted only, before dpdfd.revive_classes_from
        revive = step >= cfg.revive_classes_from if cfg.revive_classes_from else None
        parts.update(_generator_step(cfg, env, student, x, x_s.grad, opt_g, parts["student_loss"], targets, revive))
    return parts


def _generator_step(cfg: DPDFDConfig, env: Env, student: nn.Module, x: torch.Tensor, ls_grad_x: torch.Tensor,
                    opt_g, ls_value: float, targets: torch.Tensor | None = None,
                    revive_absent: bool | None = None) -> dict[str, float]:
    """The generator descends L_S + L_G: L_G's gradient w.r.t. x through the updated student (its weights frozen:
    the discriminator) plus L_S's (`ls_grad_x`), back-propagated through the generator once. `targets`: the classes
    a conditional generator was asked for, which L_G's CE aims at instead of the student's argmax."""
    student.requires_grad_(False)
    try:
        x_g = x.detach().requires_grad_(True)
        with env.autocast():
            logits, feats = logits_and_features(student, x_g)
        lg, parts = generator_loss(logits, feats, one_hot_weight=cfg.lg_one_hot, entropy_weight=cfg.lg_entropy,
                                   activation_weight=cfg.lg_activation, targets=targets,
                                   revive_absent=revive_absent)
        (grad_x,) = torch.autograd.grad(lg, x_g)
    finally:
        student.requires_grad_(True)
    opt_g.zero_grad(set_to_none=True)
    x.backward((grad_x + ls_grad_x).to(x.dtype))
    opt_g.step()
    return {**parts, "generator_loss": float(lg.detach()) + ls_value}


def _direct_step(cfg: DPDFDConfig, plan: StepPlan, env: Env, student: nn.Module, opt_s, private: ImageDataset,
                 step: int, chunk_seed: int) -> dict[str, float]:
    """One iteration of Alg. 3: a Poisson sample of the private set (rate B/N), CE with the true labels."""
    mask = torch.rand(len(private), generator=env.generator(streams.DPDFD_SAMPLE, step)) < cfg.batch_size / len(private)
    idx = torch.nonzero(mask).flatten()
    if len(idx) == 0:
        return {"batch": 0.0}
    x, y = private.batch(idx)
    x, y = env.place_batch(x), y.to(env.device)
    with env.autocast():
        s_logits = student(x).float()
    grads = (torch.softmax(s_logits.detach(), -1) - F.one_hot(y, s_logits.shape[-1]).float())  # dCE/ds, per sample
    # privatise divides by the sampled batch size B_t; use the expected batch size B instead
    noisy = noisy_gradients(grads, cfg, plan, chunk_seed, step) * (len(idx) / cfg.batch_size)
    ls = student_loss(s_logits, s_logits.detach(), (cfg.gamma * noisy).expand_as(s_logits))
    opt_s.zero_grad(set_to_none=True)
    ls.backward()
    opt_s.step()
    return {"student_loss": float(ls.detach()), "batch": float(len(idx))}


@dataclass
class _Teacher:
    model: Any = None  # an nn.Module (Alg. 1), a TeacherEnsemble (Alg. 2), None (Alg. 3)
    key: str | None = None  # identifies it for the warm-start generator stage
    accuracy: float | None = None
    description: str | None = None


class DPDFDMethod(Method):
    """DPDFD on the run skeleton (methods.runner): plan T from the budget, get the teacher(s), train, report."""

    name = "dpdfd"
    sections = {"baseline": ClassifierTraining, "dpdfd": DPDFDConfig, "dpdfd_teachers": TeacherTraining,
                "dpdfd_generator": GeneratorTraining}

    def check_end_to_end(self, ctx: Context) -> None:
        """Only noised output gradients leave the teacher(s): end to end as it stands with Alg. 1 or 2 and a
        generator trained from scratch (a warm start reads the teacher without noise; Alg. 3 is not DP)."""
        cfg: DPDFDConfig = ctx.section("dpdfd")
        if cfg.algorithm == 3 or cfg.generator_init == "teacher":
            raise ConfigError("--privacy end-to-end needs dpdfd.algorithm 1 or 2 and dpdfd.generator_init=scratch: "
                              "Alg. 3 is not DP as written and a warm-started generator reads the teacher directly")

    def plan(self, ctx: Context, recorded: LedgerView) -> Plan:
        cfg: DPDFDConfig = ctx.section("dpdfd")
        steps = plan_steps(cfg, ctx.budget, num_teachers=ctx.section("dpdfd_teachers").num_teachers,
                           num_classes=ctx.data.num_classes, dataset_size=len(ctx.data.train))
        done = sum(e.steps for e in recorded.events() if isinstance(e, NormalisedGaussian))
        remaining = steps.event.with_count(max(0, steps.steps - done))
        return Plan(remaining=[remaining] if remaining.steps else [], notes=steps.notes, details={"steps": steps})

    def train(self, ctx: Context, plan: Plan, ledger: PrivacyLedger) -> Trained:
        cfg: DPDFDConfig = ctx.section("dpdfd")
        data, log = ctx.data, {"stages": [], "stage_seconds": 0.0}
        teacher = _teacher(ctx, cfg, log)
        init_generator = None
        if cfg.algorithm in (1, 2) and cfg.generator_init == "teacher":
            if cfg.algorithm == 2:
                raise ConfigError("generator_init=teacher is implemented for one teacher (Alg. 1) only")
            init_generator, _ = _timed(lambda: ctx.stages.generator(teacher.model, teacher.key,
                                                                    ctx.section("dpdfd_generator")), log)
        result = train_dpdfd(cfg=cfg, plan=plan.details["steps"], env=ctx.env, ledger=ledger, teacher=teacher.model,
                             channels=data.channels, num_classes=data.num_classes, image_size=data.image_size[0],
                             generator_cfg=ctx.section("dpdfd_generator"), init_generator=init_generator,
                             private=data.train if cfg.algorithm == 3 else None, test=data.test, run=ctx.run)
        if result.generator is not None:  # drawn from a copy: sampling moves the BatchNorm statistics
            save_generator_grid(copy.deepcopy(result.generator), result.student, ctx.run.path / "samples.png",
                                ctx.env, data.num_classes)
        num_teachers = ctx.section("dpdfd_teachers").num_teachers if cfg.algorithm == 2 else None
        return Trained(student=result.student, generator=result.generator, baseline_accuracy=teacher.accuracy,
                       wall_seconds=result.loop.wall_seconds,
                       fields={"steps": result.loop.steps, "teacher": teacher.description, "num_teachers": num_teachers,
                               "stopped": result.stopped, "stages": log["stages"],
                               "stage_seconds": round(log["stage_seconds"], 1), "history": result.loop.history})

    def pathways(self, ctx: Context, plan: Plan) -> dict[str, list[Pathway]]:
        return pathways(ctx.section("dpdfd"))  # dpdfd_plan's (a method's name is not in scope)

    def report(self, ctx: Context, plan: Plan, trained: Trained, ledger: PrivacyLedger) -> Report:
        cfg: DPDFDConfig = ctx.section("dpdfd")
        budget, steps = ctx.budget, plan.details["steps"]
        statement = privacy_statement(cfg, {name: r.value for name, r in ledger.epsilon_both().items()}, budget.delta)
        generator_init = cfg.generator_init if cfg.algorithm != 3 else None
        return Report(
            pathways=self.pathways(ctx, plan), secure_noise=cfg.secure_noise, noise_option="dpdfd.secure_noise",
            statement=statement, extra={"algorithm": cfg.algorithm, "generator_init": generator_init},
            fields={"planned_steps": steps.steps, "steps_allowed": steps_allowed(steps.event, budget),
                    # a recipe's file name says what it is; the paper recipe's cells, recorded before recipes,
                    # keep their derived labels (never the paper-literal cell's name for a warm-started generator)
                    "variant": (auto_variant(cfg, budget.accounting) if ctx.section("run").recipe == "paper"
                                else cfg.variant), "algorithm": cfg.algorithm,
                    "sigma": round(steps.sigma, 6), "clip_norm": steps.clip_norm, "batch_size": cfg.batch_size,
                    "granularity": "per_sample", "operation": cfg.operation, "generator_init": generator_init,
                    "privacy": statement, "total_seconds": round(time.perf_counter() - ctx.started, 1)})


def _teacher(ctx: Context, cfg: DPDFDConfig, log: dict) -> _Teacher:
    """Alg. 1: the given teacher, else the cached baseline stage; Alg. 2: the cached disjoint teachers; Alg. 3: none."""
    if cfg.algorithm == 3:
        return _Teacher()
    if cfg.algorithm == 2:
        tcfg: TeacherTraining = ctx.section("dpdfd_teachers")
        model, stage = _timed(lambda: ctx.stages.teachers(tcfg), log)
        return _Teacher(model, stage.key, stage.info().get("ensemble_accuracy"),
                        f"{tcfg.num_teachers} {tcfg.model} teachers on disjoint partitions (stage {stage.key})")
    spec: TeacherSpec = ctx.inputs.get("teacher") or TeacherSpec()
    if spec.given():
        model, key = load_teacher(spec, dataset=ctx.dataset, channels=ctx.data.channels,
                                  num_classes=ctx.data.num_classes, device=ctx.env.device)
        accuracy = given_teacher_accuracy(model, ctx.data.test, ctx.env, named=spec.describe() + spec.describe_inputs(),
                                          refuse=ctx.section("run").plan_check == "refuse")
        return _Teacher(model, key, accuracy, spec.describe() + spec.describe_inputs())
    bcfg: ClassifierTraining = ctx.section("baseline")
    model, stage = _timed(lambda: ctx.stages.baseline(bcfg), log)
    return _Teacher(model, stage.key, stage.info().get("test_accuracy"), f"baseline stage {stage.key} ({bcfg.model})")


def _timed(build: Callable[[], tuple[Any, Stage]], log: dict) -> tuple[Any, Stage]:
    """A cached stage, its reference and (when built now, not reused) its build time added to `log`."""
    started = time.perf_counter()
    model, stage = build()
    log["stages"].append(stage.ref())
    log["stage_seconds"] += 0.0 if stage.reused else time.perf_counter() - started
    return model, stage


def run_dpdfd(request: RunRequest, *, teacher: TeacherSpec | None = None, cache: bool = True) -> RunResult:
    """DPDFD end to end (DPDFDMethod on methods.runner): the student, the generator, summary and privacy report."""
    return DPDFDMethod().run(request, cache=cache, teacher=teacher or TeacherSpec())


class DPDFD(MethodAPI):
    """`DPDFD(epsilon=10, teacher=model).fit("mnist")` -> RunResult(student, generator, summary, privacy).

    ``teacher``: see TeacherSpec.of (None: the cached baseline stage trained on ``dataset``). The budget keywords
    go to the `budget` section, others to `dpdfd` (`algorithm=2`, `max_steps=500`, ...). The dataset supplies the
    test set and the image shape (Alg. 1 and 2 never read its training images; Alg. 3 does)."""

    section, method = "dpdfd", DPDFDMethod

    def __init__(self, dataset: str | None = None, *, teacher: nn.Module | str | Path | TeacherSpec | None = None,
                 **options: Any):
        super().__init__(dataset, **options)  # epsilon, max_epsilon, delta, accounting: the budget section
        self.teacher = TeacherSpec.of(teacher)

    def inputs(self) -> dict[str, Any]:
        return {"teacher": self.teacher}
