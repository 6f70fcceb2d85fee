"""DPDFD (Liu et al., IJCAI 2023): model conversion by differentially private data-free distillation.

Alg. 1 (one teacher), per iteration t (lines 11-14; `_datafree_step`):

    z -> x = G(z) (B synthetic samples) -> teacher and student logits -> L_T (DKD with the teacher's argmax)
    -> per-sample gradients g_i = dL_T/ds_i w.r.t. the student's LOGITS (methods.dkd, vectorised)
    -> A_{C,sigma}: normalise each g_i to norm C, add N(0, sigma^2 C^2 I), divide by B (privacy.mechanisms)
    -> y_s = s - gamma * g~  -> student step on L_S(s, y_s)
    -> generator step on L_S + L_G (Eq. 5) with the (updated) student as a fixed discriminator.

Alg. 2: n teachers on disjoint partitions, g~_i = (1/n)(sum_j normalised g_ij + N(0, sigma^2 C^2 I)) (/B).
Alg. 3: private data directly (real inputs, real labels, CE), Poisson sampling with rate B/N, no generator.

Readings and choices (see docs/privacy.md for the privacy side):

* L_S. The paper's text says cross-entropy; the default is L2, 1/2 sum_i ||s_i - y_s,i||^2, whose gradient
  w.r.t. s_i is exactly gamma * g~_i, so the student update is the noisy gradient back-propagated. "ce" is the
  soft cross-entropy against softmax(y_s).
* Alternation: the student is updated first; L_S + L_G for the generator are then computed with the UPDATED
  student on the same synthetic batch and the same (noisy) target y_s. The student's weights are frozen during
  the generator step (the student is the discriminator); the teacher is never consulted by the generator step,
  so student AND generator are post-processing of the noisy gradients.
* L_G (Eq. 5) = w_ce * CE(s, argmax s) + alpha * sum_k pbar_k log pbar_k - beta * RMS(student features):
  as in engine.datafree ("dpdfd"), the activation term REWARDS high activation (the paper writes +beta||f||,
  its text and DAFL mean the opposite) and is divided by sqrt(d). w_ce, alpha, beta = 1 (paper); setting one
  to 0 is the Table 5 ablation.
* Iterations. T = the largest number of steps whose epsilon, under the budget's accounting (section `budget`,
  default strict), fits the target (privacy.calibration.max_steps); optionally capped (CPU presets). With
  ``calibrate_sigma`` the cap is the step count and sigma is the least noise that fits the target in that many
  steps: the budget is then spent exactly, with fewer, less noisy steps than the paper's sigma = 100.
* Privacy ledger. One record per chunk of ``ledger_chunk`` steps, written BEFORE the chunk runs, so a crash
  never loses budget (a chunk is charged in full even if it was interrupted). Its recorded answer is the
  seed of the chunk's Gaussian noise (drawn from the privacy generator, or from the OS with
  ``secure_noise``); the noise of step t is drawn from a generator seeded by (that seed, t). A resumed run
  gets the recorded seed back, so the noise of every step is reused, never redrawn. (Recording the noise
  itself would take B*K floats per step: gigabytes for the paper's ~10^6 steps.)
* The generator (the paper gives none; it builds on DAFL) is DAFL's; ``generator_output_norm`` adds DAFL's final
  non-affine BatchNorm. The presets set it per dataset (measured, docs/results.md): without it a fresh
  generator's near-constant grey images are all "bag" to the Fashion-MNIST teacher and, the generator never
  consulting the teacher, nothing moves it out of that class (quick: 10.00 %; with it 21.87 %); on MNIST the
  same samples already span 6-7 teacher classes and the standardised output hurts (12 % at step 1250 vs 73 %).
* The clip option (Fig. 2) replaces normalisation C g/(||g|| + e) by clipping g min(1, C/||g||); both give
  vectors of norm <= C, so the event and both accountings are unchanged.
"""

from __future__ import annotations

import copy
import hashlib
import math
import secrets
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.config import ClassifierTraining, check_model_name
from privdistill.data.dataset import ImageDataset, to_uint8
from privdistill.engine import streams
from privdistill.engine.cache import Stage
from privdistill.engine.context import Env
from privdistill.engine.datafree import GeneratorTraining, build_generator, logits_and_features
from privdistill.engine.ensemble import TeacherEnsemble, TeacherTraining
from privdistill.engine.loop import LoopResult, TrainingLoop
from privdistill.engine.optim import OPTIMIZERS, SCHEDULES, make_optimizer, set_lr
from privdistill.engine.run import RunDir
from privdistill.engine.teachers import TeacherSpec, load_teacher
from privdistill.engine.trainer import evaluate
from privdistill.errors import BudgetExceededError, ConfigError, PrivacyError
from privdistill.methods.common import MethodAPI, RunRequest
from privdistill.methods.dkd import TEACHER_LOSSES, logit_gradients
from privdistill.methods.runner import Budget, Context, Method, Plan, Report, RunResult, Trained
from privdistill.models import create_model
from privdistill.privacy import calibration
from privdistill.privacy.events import DPDFDSteps
from privdistill.privacy.ledger import PrivacyLedger
from privdistill.privacy.mechanisms import make_generator, privatise
from privdistill.privacy.report import PRIVATE, Pathway, dpdfd_pathways

CHECKPOINT = "dpdfd-checkpoint"


# ============================================================================================ config
@dataclass
class DPDFDConfig:
    """Config section `dpdfd` (paper values as defaults: DPDFD Sec. 5 and appendix). What may be spent
    (epsilon, delta, accounting, max_epsilon) is the `budget` section every method shares."""

    algorithm: int = 1  # 1: one teacher | 2: n disjoint teachers (section dpdfd_teachers) | 3: private data directly
    steps: int = 0  # > 0: exactly this many steps (refused if over budget); 0: as many as the budget allows
    max_steps: int = 0  # cap on the steps the budget allows (CPU presets); 0: no cap
    sigma: float = 100.0
    calibrate_sigma: bool = False  # sigma = the least noise with which the (capped) steps fit the target
    clip_norm: Optional[float] = None  # C; None: the paper's rule, 1e-3 for epsilon <= 1, else 5e-3
    stability: float = 1e-4  # e
    batch_size: int = 256
    granularity: str = "per_sample"  # per_sample | batch_sum (the literal Eq. 4, see docs/privacy.md)
    operation: str = "normalize"  # normalize (the paper) | clip (Fig. 2's comparison)
    teacher_loss: str = "dkd"  # dkd | kl | ce
    temperature: float = 4.0
    dkd_alpha: float = 1.0
    dkd_beta: float = 8.0
    student_loss: str = "l2"  # l2 | ce
    gamma: float = 1.0
    student_model: str = "paper-cnn"
    student_optimizer: str = "adam"  # adam | sgd
    student_lr: float = 1e-3
    student_lr_schedule: str = "constant"  # constant | linear | cosine
    student_momentum: float = 0.9
    generator_init: str = "scratch"  # scratch (covered) | teacher (warm start from dpdfd_generator: NOT covered)
    generator_output_norm: bool = False  # DAFL's final BatchNorm(affine=False) on the generator (see above)
    generator_lr: float = 1e-3
    generator_beta1: float = 0.5
    generator_every: int = 1  # a generator step every k student steps; 0: the generator is never trained
    lg_one_hot: float = 1.0  # Eq. 5 weights: CE on the student's argmax ("CE" of Table 5)
    lg_entropy: float = 1.0  # alpha: class balance ("IE")
    lg_activation: float = 1.0  # beta: feature activation ("Norm")
    eval_every: int = 250
    checkpoint_every: int = 50
    ledger_chunk: int = 100
    secure_noise: bool = False
    variant: Optional[str] = None  # the label used by --record; None: derived from the configuration

    def validate(self) -> None:
        _check(self.algorithm in (1, 2, 3), f"algorithm must be 1, 2 or 3, got {self.algorithm}")
        check_model_name(self.student_model, "dpdfd.student_model")
        _check(self.steps >= 0 and self.max_steps >= 0, "steps and max_steps must be >= 0")
        _check(self.sigma > 0 and self.stability > 0 and self.gamma > 0, "sigma, stability and gamma must be > 0")
        _check(self.clip_norm is None or self.clip_norm > 0, "clip_norm must be > 0")
        _check(self.batch_size >= 1, "batch_size must be >= 1")
        _check(self.granularity in ("per_sample", "batch_sum"), f"unknown granularity {self.granularity!r}")
        _check(self.operation in ("normalize", "clip"), f"operation must be normalize or clip, got {self.operation!r}")
        _check(self.teacher_loss in TEACHER_LOSSES, f"teacher_loss must be one of {TEACHER_LOSSES}")
        _check(self.temperature > 0, "temperature must be > 0")
        _check(self.student_loss in ("l2", "ce"), f"student_loss must be l2 or ce, got {self.student_loss!r}")
        _check(self.student_optimizer in OPTIMIZERS, "student_optimizer must be adam or sgd")
        _check(self.student_lr > 0 and self.generator_lr > 0, "learning rates must be > 0")
        _check(self.student_lr_schedule in SCHEDULES, "unknown student_lr_schedule")
        _check(self.generator_init in ("scratch", "teacher"), "generator_init must be scratch or teacher")
        _check(self.generator_every >= 0, "generator_every must be >= 0")
        _check(min(self.lg_one_hot, self.lg_entropy, self.lg_activation) >= 0, "L_G weights must be >= 0")
        _check(min(self.eval_every, self.checkpoint_every, self.ledger_chunk) >= 1,
               "eval_every, checkpoint_every and ledger_chunk must be >= 1")


def check_budget(cfg: DPDFDConfig, budget: Budget) -> None:
    """What the `dpdfd` section needs from the `budget` section (checked when the run is planned)."""
    _check(budget.epsilon is not None or cfg.steps > 0,
           "give a target epsilon (budget.epsilon, --epsilon) or a number of steps (dpdfd.steps)")
    _check(not cfg.calibrate_sigma or (budget.epsilon is not None and (cfg.steps > 0 or cfg.max_steps > 0)),
           "calibrate_sigma needs a target epsilon (budget.epsilon) and a step count (dpdfd.steps or dpdfd.max_steps)")


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def auto_variant(cfg: DPDFDConfig, accounting: str = "strict") -> str | None:
    """The --record label: given, or derived (multi-teacher / direct, clipping, strict)."""
    if cfg.variant:
        return cfg.variant
    parts = {2: ["multi-teacher"], 3: ["direct"]}.get(cfg.algorithm, [])
    parts += ["clipping"] * (cfg.operation == "clip") + ["strict"] * (accounting == "strict")
    return "-".join(parts) or None


# ============================================================================================== plan
@dataclass
class StepPlan:
    """What a run will spend: T steps of one event, with the noise and norm bound they are priced at."""

    event: DPDFDSteps  # template with steps = T
    steps: int
    sigma: float
    clip_norm: float
    budget_steps: int | None  # what the target allows under the budget's accounting (None: no target)
    notes: list[str] = field(default_factory=list)


def resolved_clip_norm(cfg: DPDFDConfig, budget: Budget) -> float:
    """C: given, or the paper's rule (1e-3 for epsilon <= 1, 5e-3 above)."""
    if cfg.clip_norm is not None:
        return cfg.clip_norm
    return 1e-3 if budget.epsilon is not None and budget.epsilon <= 1 else 5e-3


def make_event(cfg: DPDFDConfig, *, steps: int, sigma: float, clip_norm: float, num_teachers: int = 1,
               num_classes: int | None = None, dataset_size: int | None = None) -> DPDFDSteps:
    return DPDFDSteps(clip_norm=clip_norm, sigma=sigma, batch_size=cfg.batch_size, steps=steps,
                      num_teachers=num_teachers if cfg.algorithm == 2 else 1, granularity=cfg.granularity,
                      algorithm=cfg.algorithm, dataset_size=dataset_size if cfg.algorithm == 3 else None,
                      num_classes=num_classes)


def plan_steps(cfg: DPDFDConfig, budget: Budget, *, num_teachers: int = 1, num_classes: int | None = None,
               dataset_size: int | None = None) -> StepPlan:
    """T (and sigma, with calibrate_sigma) from the target epsilon under the budget's accounting."""
    check_budget(cfg, budget)
    eps, acc, delta = budget.epsilon, budget.accounting, budget.delta
    clip, sigma, notes = resolved_clip_norm(cfg, budget), cfg.sigma, []
    template = make_event(cfg, steps=1, sigma=sigma, clip_norm=clip, num_teachers=num_teachers,
                          num_classes=num_classes, dataset_size=dataset_size)
    if cfg.calibrate_sigma:
        count = cfg.steps or cfg.max_steps
        sigma = calibration.calibrate_noise(template.with_count(count), target_epsilon=eps, delta=delta, accounting=acc)
        template = replace(template, sigma=sigma)
        notes.append(f"sigma calibrated to {sigma:.6g} so that {count} steps spend epsilon {eps:g} "
                     f"({acc} accounting, delta {delta:g}); the paper uses sigma = {cfg.sigma:g}")
    allowed = None if eps is None else calibration.max_steps(template, target_epsilon=eps, delta=delta, accounting=acc)
    steps = cfg.steps or allowed
    if not cfg.steps and cfg.max_steps and steps > cfg.max_steps:
        notes.append(f"the budget allows {steps:,} steps; capped at {cfg.max_steps:,} (dpdfd.max_steps): "
                     "the epsilon spent is below the target")
        steps = cfg.max_steps
    if allowed == 0:
        notes.append(f"no step fits epsilon {eps:g} under {acc} accounting: no training possible")
    return StepPlan(event=template.with_count(steps), steps=steps, sigma=sigma, clip_norm=clip, budget_steps=allowed,
                    notes=notes)


def steps_allowed(event: DPDFDSteps, budget: Budget) -> dict[str, int]:
    """The steps the target epsilon allows under each accounting ({} without a target)."""
    allowed = {}
    for accounting in ("paper", "strict") if budget.epsilon is not None else ():
        try:
            allowed[accounting] = calibration.max_steps(event.with_count(1), target_epsilon=budget.epsilon,
                                                        delta=budget.delta, accounting=accounting)
        except PrivacyError:
            allowed[accounting] = 0
    return allowed


# ============================================================================================ losses
def student_loss(logits: torch.Tensor, anchor: torch.Tensor, step: torch.Tensor, kind: str) -> torch.Tensor:
    """L_S(s, y_s) with y_s = anchor - step (anchor: the detached logits s of the step's first forward pass,
    step: gamma * g~), summed over the batch.

    l2: 1/2 ||s - y_s||^2, written as 1/2 ||(s - anchor) + step||^2 so that at s = anchor its gradient is
    exactly gamma * g~ (forming y_s first would round g~ against logits ~10^3 times larger).
    ce: the soft cross-entropy -sum_k softmax(y_s)_k log softmax(s)_k (the paper's choice)."""
    anchor, step = anchor.detach(), step.detach()
    if kind == "l2":
        return 0.5 * ((logits - anchor) + step).pow(2).sum()
    return -(torch.softmax(anchor - step, -1) * torch.log_softmax(logits, -1)).sum()


def generator_loss(logits: torch.Tensor, feats: torch.Tensor,
                   cfg: DPDFDConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """L_G of Eq. 5 on the STUDENT's outputs (see the module docstring for the signs)."""
    logits, feats = logits.float(), feats.float()
    one_hot = F.cross_entropy(logits, logits.argmax(1))
    mean_p = torch.softmax(logits, 1).mean(0)
    neg_entropy = (mean_p * torch.log(mean_p + 1e-12)).sum()
    activation = -(feats.norm(dim=1) / math.sqrt(feats.shape[1])).mean()
    loss = cfg.lg_one_hot * one_hot + cfg.lg_entropy * neg_entropy + cfg.lg_activation * activation
    return loss, {"lg_one_hot": float(one_hot.detach()), "lg_entropy": float(-neg_entropy.detach()),
                  "lg_activation": float(activation.detach())}


# ===================================================================================== privacy noise
class LedgerChunks:
    """DPDFD's privacy bookkeeping: one ledger spend per chunk of `ledger_chunk` steps, recorded before the chunk
    runs; its recorded answer is the seed of the chunk's noise, so a resumed run reuses the noise it had."""

    def __init__(self, ledger: PrivacyLedger, plan: StepPlan, cfg: DPDFDConfig, env: Env):
        self.ledger, self.plan, self.cfg, self.env = ledger, plan, cfg, env
        self.current: tuple[int, int] | None = None  # (chunk index, seed)

    def seed_for(self, step: int) -> int:
        """The noise seed of `step`'s chunk (spent now if the chunk is new; BudgetExceededError past the limit)."""
        size = self.cfg.ledger_chunk
        index = step // size
        if self.current is None or self.current[0] != index:
            start, stop = index * size, min((index + 1) * size, self.plan.steps)
            answer = self.ledger.spend(f"dpdfd-steps-{start:09d}-{stop:09d}", self.plan.event.with_count(stop - start),
                                       lambda: self._draw_seed(index))
            self.current = (index, int(torch.as_tensor(answer).reshape(-1)[0]))
        return self.current[1]

    def _draw_seed(self, index: int) -> torch.Tensor:
        if self.cfg.secure_noise:
            seed = secrets.randbits(62)
        else:
            gen = make_generator(self.env.generator(streams.DPDFD_NOISE_SEED, index).initial_seed())
            seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        return torch.tensor([seed], dtype=torch.int64)


def noisy_gradients(grads: torch.Tensor, cfg: DPDFDConfig, plan: StepPlan, chunk_seed: int,
                    step: int) -> torch.Tensor:
    """A_{C,sigma} (privacy.mechanisms.privatise) with step t's noise: a generator seeded by (chunk seed, t)."""
    digest = hashlib.blake2b(f"dpdfd-noise:{chunk_seed}:{step}".encode(), digest_size=8).digest()
    generator = make_generator(int.from_bytes(digest, "little") & (2**63 - 1), device=grads.device)
    return privatise(grads, operation=cfg.operation, clip_norm=plan.clip_norm, sigma=plan.sigma,
                     stability=cfg.stability, granularity=cfg.granularity, generator=generator)


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
    """The DPDFD loop: Alg. 1 with a module teacher, Alg. 2 with a TeacherEnsemble, Alg. 3 with `private`.

    Resumable (engine.loop): everything random derives from (seed, step) or from the ledger's recorded seeds."""
    direct = cfg.algorithm == 3
    if (private if direct else teacher) is None:
        raise ConfigError("DPDFD Alg. 3 trains on private data: pass `private`" if direct
                          else "DPDFD Alg. 1/2 need a teacher")
    torch.manual_seed(env.generator(streams.DPDFD_STUDENT_INIT, -1).initial_seed())
    student = env.place(create_model(cfg.student_model, kind="classifier", in_channels=channels,
                                     num_classes=num_classes, image_size=image_size)).train()
    opt_s = make_optimizer(student.parameters(), cfg.student_optimizer, lr=cfg.student_lr,
                           momentum=cfg.student_momentum)
    generator = opt_g = None
    if not direct:
        if init_generator is None:
            torch.manual_seed(env.generator(streams.DPDFD_GENERATOR_INIT, -1).initial_seed())
            init_generator = build_generator(generator_cfg, channels, image_size, output_norm=cfg.generator_output_norm)
        generator = env.place(init_generator).train()
        opt_g = make_optimizer(generator.parameters(), "adam", lr=cfg.generator_lr, betas=(cfg.generator_beta1, 0.999))
        if not isinstance(teacher, TeacherEnsemble):
            teacher = env.place(teacher).eval().requires_grad_(False)

    def evaluation() -> dict[str, Any]:
        accuracy = {} if test is None else {"test_accuracy": evaluate(student, test, env)}
        return {**accuracy, "elapsed": round(loop.wall_seconds(), 1)}

    loop = TrainingLoop(steps=plan.steps, env=env, run=run, checkpoint=CHECKPOINT, title=f"dpdfd alg. {cfg.algorithm}",
                        log_stage="dpdfd", modules={"student": student, "generator": generator},
                        optimizers={"student": opt_s, "generator": opt_g}, eval_every=cfg.eval_every,
                        checkpoint_every=cfg.checkpoint_every, evaluate=evaluation)
    chunks = LedgerChunks(ledger, plan, cfg, env)
    for step in loop:
        try:
            chunk_seed = chunks.seed_for(step)  # the chunk is charged before its first step runs
        except BudgetExceededError as err:
            return DPDFDResult(student, generator, loop.finish(step), f"budget exhausted before step {step}: {err}")
        set_lr(opt_s, cfg.student_lr, cfg.student_lr_schedule, step, plan.steps)
        if direct:
            parts = _direct_step(cfg, plan, env, student, opt_s, private, step, chunk_seed)
        else:
            parts = _datafree_step(cfg, plan, env, student, opt_s, generator, opt_g, teacher, step, chunk_seed)
        loop.record(parts)
    return DPDFDResult(student, generator, loop.finish())


def _datafree_step(cfg: DPDFDConfig, plan: StepPlan, env: Env, student: nn.Module, opt_s, generator: nn.Module, opt_g,
                   teacher, step: int, chunk_seed: int) -> dict[str, float]:
    """One iteration of Alg. 1 (module teacher) or Alg. 2 (TeacherEnsemble), lines 11-14 literally.

    L_S is computed with the student before its update and L_G with the updated student; the generator descends
    d(L_S + L_G)/d(theta_g), each term through its own forward pass. The synthetic batch x is a leaf for both
    student passes, and the two input gradients are summed and back-propagated through the generator once."""
    z = torch.randn(cfg.batch_size, int(getattr(generator, "latent_dim", 100)),
                    generator=env.generator(streams.DPDFD_LATENT, step)).to(env.device)
    train_generator = bool(cfg.generator_every) and (step + 1) % cfg.generator_every == 0
    generator.train()
    with env.autocast(), torch.set_grad_enabled(train_generator):
        x = generator(z)
    x_s = x.detach().requires_grad_(train_generator)
    with torch.no_grad(), env.autocast():
        t_logits = teacher.logits(x_s.detach()) if isinstance(teacher, TeacherEnsemble) else teacher(x_s.detach())
    t_logits = t_logits.float()
    with env.autocast():
        s_logits = student(x_s)
    s_logits = s_logits.float()
    # line 11: per-sample gradients of L_T w.r.t. the student's logits, [B, K] (or [n, B, K]: one per teacher)
    grads = logit_gradients(s_logits, t_logits, kind=cfg.teacher_loss, temperature=cfg.temperature,
                            alpha=cfg.dkd_alpha, beta=cfg.dkd_beta)
    # line 12: normalise and add noise; nothing else of the teacher reaches the student or the generator
    noisy = noisy_gradients(grads, cfg, plan, chunk_seed, step)
    # line 13: y_s = s - gamma * g~ ([K] broadcasts: batch_sum), and a student step on L_S(s, y_s)
    anchor = s_logits.detach()
    ls = student_loss(s_logits, anchor, (cfg.gamma * noisy.to(s_logits.dtype)).expand_as(anchor), cfg.student_loss)
    opt_s.zero_grad(set_to_none=True)
    ls.backward()  # student weights, and dL_S/dx for the generator
    opt_s.step()
    parts = {"student_loss": float(ls.detach())}
    if train_generator:  # line 14
        parts.update(_generator_step(cfg, env, student, x, x_s.grad, opt_g, parts["student_loss"]))
    return parts


def _generator_step(cfg: DPDFDConfig, env: Env, student: nn.Module, x: torch.Tensor, ls_grad_x: torch.Tensor,
                    opt_g, ls_value: float) -> dict[str, float]:
    """The generator descends L_S + L_G: L_G's gradient w.r.t. x through the updated student (its weights frozen:
    the discriminator) plus L_S's (`ls_grad_x`), back-propagated through the generator once."""
    student.requires_grad_(False)
    try:
        x_g = x.detach().requires_grad_(True)
        with env.autocast():
            logits, feats = logits_and_features(student, x_g)
        lg, parts = generator_loss(logits, feats, cfg)
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
        s_logits = student(x)
    s_logits = s_logits.float()
    grads = (torch.softmax(s_logits.detach(), -1) - F.one_hot(y, s_logits.shape[-1]).float())  # dCE/ds, per sample
    # privatise divides by the sampled batch size B_t; use the expected batch size B instead
    noisy = noisy_gradients(grads, cfg, plan, chunk_seed, step) * (len(idx) / cfg.batch_size)
    ls = student_loss(s_logits, s_logits.detach(), (cfg.gamma * noisy).expand_as(s_logits), cfg.student_loss)
    opt_s.zero_grad(set_to_none=True)
    ls.backward()
    opt_s.step()
    return {"student_loss": float(ls.detach()), "batch": float(len(idx))}


# ======================================================================================== the method
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

    def plan(self, ctx: Context, ledger: PrivacyLedger) -> Plan:
        cfg: DPDFDConfig = ctx.section("dpdfd")
        steps = plan_steps(cfg, ctx.budget, num_teachers=ctx.section("dpdfd_teachers").num_teachers,
                           num_classes=ctx.data.num_classes, dataset_size=len(ctx.data.train))
        recorded = sum(e.steps for e in ledger.events() if isinstance(e, DPDFDSteps))
        remaining = steps.event.with_count(max(0, steps.steps - recorded))
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
            _save_samples(copy.deepcopy(result.generator), result.student, ctx.run, ctx.env, data.num_classes)
        num_teachers = ctx.section("dpdfd_teachers").num_teachers if cfg.algorithm == 2 else None
        return Trained(student=result.student, generator=result.generator, baseline_accuracy=teacher.accuracy,
                       wall_seconds=result.loop.wall_seconds,
                       fields={"steps": result.loop.steps, "teacher": teacher.description, "num_teachers": num_teachers,
                               "stopped": result.stopped, "stages": log["stages"],
                               "stage_seconds": round(log["stage_seconds"], 1), "history": result.loop.history})

    def report(self, ctx: Context, plan: Plan, trained: Trained, ledger: PrivacyLedger) -> Report:
        cfg: DPDFDConfig = ctx.section("dpdfd")
        budget, steps = ctx.budget, plan.details["steps"]
        statement = privacy_statement(cfg, {name: r.value for name, r in ledger.epsilon_both().items()}, budget.delta)
        generator_init = cfg.generator_init if cfg.algorithm != 3 else None
        return Report(
            pathways=pathways(cfg), secure_noise=cfg.secure_noise, noise_option="dpdfd.secure_noise",
            statement=statement, extra={"algorithm": cfg.algorithm, "generator_init": generator_init},
            fields={"planned_steps": steps.steps, "steps_allowed": steps_allowed(steps.event, budget),
                    "variant": auto_variant(cfg, budget.accounting), "algorithm": cfg.algorithm,
                    "sigma": round(steps.sigma, 6), "clip_norm": steps.clip_norm, "batch_size": cfg.batch_size,
                    "granularity": cfg.granularity, "operation": cfg.operation, "generator_init": generator_init,
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
        return _Teacher(model, key, evaluate(model, ctx.data.test, ctx.env), spec.describe())
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


def pathways(cfg: DPDFDConfig) -> dict[str, list[Pathway]]:
    """What the epsilon covers, per released artifact (student, generator)."""
    arts = dpdfd_pathways(algorithm=cfg.algorithm)
    if cfg.algorithm in (1, 2) and cfg.generator_init == "teacher":
        warm = Pathway(PRIVATE, "non-private teacher as fixed discriminator of the warm-start generator "
                       "(generator_init=teacher, trained without noise)", "generator weights and the student's "
                       "synthetic inputs", False,
                       "the warm start reads the teacher directly: neither the generator nor the student is DP")
        arts = {"student": arts["student"] + [warm], "generator": arts["generator"] + [warm]}
    return arts


def privacy_statement(cfg: DPDFDConfig, eps: dict[str, float], delta: float) -> str:
    if cfg.algorithm == 3:
        return ("NOT DP as written (Alg. 3 back-propagates through the model's Jacobian at the private inputs, "
                f"which is not privatised); the paper's Theorem 3 figure for these steps is {eps['paper']:.4g} "
                "(it prices the noised gradients only; their subsampled channel is in the privacy report's "
                "details as gradient_channel_epsilon)")
    if cfg.generator_init == "teacher":
        return ("NOT DP: the generator was warm-started against the non-private teacher (generator_init=teacher); "
                f"the noisy-gradient channel alone: ({eps['strict']:.4g}, {delta:g}) strict, "
                f"({eps['paper']:.4g}, {delta:g}) paper")
    return (f"student and generator are post-processing of the noisy output gradients: "
            f"({eps['strict']:.4g}, {delta:g})-DP under strict accounting, ({eps['paper']:.4g}, {delta:g}) as "
            "the paper counts (replace-one)")


def _save_samples(generator: nn.Module, student: nn.Module, run: RunDir, env: Env, num_classes: int) -> None:
    """A grid of generator samples, rows by the STUDENT's prediction (no teacher access: no privacy cost).

    The student labels the generator's raw float output, as it saw it in training; the grid shows the same
    samples clamped to [-1, 1] (an output-BatchNorm generator exceeds that range)."""
    try:
        from privdistill.engine.datafree import generate
        from privdistill.engine.synthetic import save_grid
        from privdistill.engine.trainer import predict_logits

        samples = generate(generator, 500, env, stream=1, quantise=False)
        labels = predict_logits(student, samples, env).argmax(1)
        save_grid(to_uint8(samples), labels, run.path / "samples.png", num_classes=num_classes)
    except ImportError:  # torchvision missing: no grid
        pass


# ======================================================================================== Python API
def run_dpdfd(request: RunRequest, *, teacher: TeacherSpec | None = None, cache: bool = True) -> RunResult:
    """DPDFD end to end (DPDFDMethod on methods.runner): the student, the generator, summary and privacy report."""
    return DPDFDMethod().run(request, cache=cache, teacher=teacher or TeacherSpec())


class DPDFD(MethodAPI):
    """`DPDFD(epsilon=10, teacher=model).fit("mnist")` -> RunResult(student, generator, summary, privacy).

    ``teacher``: an nn.Module, a run directory (str or Path, e.g. from `train baseline`) or a TeacherSpec;
    None: the cached baseline stage trained on ``dataset``. ``epsilon``, ``delta``, ``max_epsilon`` and
    ``accounting`` go to the `budget` section, other keywords to the `dpdfd` section (`algorithm=2`,
    `max_steps=500`, ...); the dataset supplies the test set and the image shape (Alg. 1 and 2 never read its
    training images; Alg. 3 does).
    """

    section = "dpdfd"

    def __init__(self, dataset: str | None = None, *, teacher: nn.Module | str | Path | TeacherSpec | None = None,
                 epsilon: float | None = None, delta: float | None = None, max_epsilon: float | None = None,
                 accounting: str | None = None, cache: bool = True, **options: Any):
        super().__init__(dataset, **options)
        budget = {"epsilon": epsilon, "delta": delta, "max_epsilon": max_epsilon, "accounting": accounting}
        self.overrides.update({f"budget.{key}": value for key, value in budget.items() if value is not None})
        if teacher is None or isinstance(teacher, TeacherSpec):
            self.teacher = teacher or TeacherSpec()
        elif isinstance(teacher, nn.Module):
            self.teacher = TeacherSpec(module=teacher)
        else:
            self.teacher = TeacherSpec(run_dir=str(teacher))
        self.cache = cache

    def fit(self, dataset: str | None = None) -> RunResult:
        return DPDFDMethod().run(self.request(dataset), cache=self.cache, teacher=self.teacher)
