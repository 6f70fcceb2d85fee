"""DPDFD (Liu et al., IJCAI 2023): model conversion by differentially private data-free distillation.

Alg. 1 (one teacher), per iteration t:

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
* Alternation (Alg. 1 lines 12-14): the student is updated first; L_S + L_G for the generator are then
  computed with the UPDATED student on the same synthetic batch and the same (noisy) target y_s. The student's
  weights are frozen during the generator step (the student is the discriminator); the teacher is never
  consulted by the generator step, so student AND generator are post-processing of the noisy gradients.
* L_G (Eq. 5) = w_ce * CE(s, argmax s) + alpha * sum_k pbar_k log pbar_k - beta * RMS(student features):
  as in engine.datafree ("dpdfd"), the activation term REWARDS high activation (the paper writes +beta||f||,
  its text and DAFL mean the opposite) and is divided by sqrt(d). w_ce, alpha, beta = 1 (paper); setting one
  to 0 is the Table 5 ablation.
* Iterations. T = the largest number of steps whose epsilon, under the chosen accounting, fits the target
  (privacy.calibration.max_steps); optionally capped (CPU presets). With ``calibrate_sigma`` the cap is the
  step count and sigma is the least noise that fits the target in that many steps: the budget is then spent
  exactly, with fewer, less noisy steps than the paper's sigma = 100.
* Privacy ledger. One record per chunk of ``ledger_chunk`` steps, written BEFORE the chunk runs, so a crash
  never loses budget (a chunk is charged in full even if it was interrupted). Its recorded answer is the
  seed of the chunk's Gaussian noise (drawn from the privacy generator, or from the OS with
  ``secure_noise``); the noise of step t is drawn from a generator seeded by (that seed, t). A resumed run
  gets the recorded seed back, so the noise of every step is reused, never redrawn. (Recording the noise
  itself would take B*K floats per step: gigabytes for the paper's ~10^6 steps.)
* The generator (the paper gives none; it builds on DAFL) is DAFL's; ``generator_output_norm`` adds DAFL's final
  non-affine BatchNorm, which our generator otherwise drops. Neither choice suits both datasets, so the
  presets set it per dataset (measured, docs/results.md): without it a fresh generator emits near-constant
  grey images that the Fashion-MNIST teacher calls "bag" one and all, and since the generator never consults
  the teacher (post-processing), nothing moves it out of that class (quick: a constant predictor, 10.00 %;
  with it 21.87 %); on MNIST the same samples already span 6-7 teacher classes and the standardised output
  hurts (12 % at step 1250 against 73 % without).
* The clip option (Fig. 2) replaces normalisation C g/(||g|| + e) by clipping g min(1, C/||g||); both give
  vectors of norm <= C, so the event and both accountings are unchanged.
"""

from __future__ import annotations

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
from privdistill.engine.cache import StageCache
from privdistill.engine.context import Env
from privdistill.engine.datafree import GeneratorTraining, build_generator, logits_and_features
from privdistill.engine.ensemble import TeacherEnsemble, TeacherTraining
from privdistill.engine.progress import progress_bar
from privdistill.engine.run import RunDir
from privdistill.engine.stages import Stages
from privdistill.engine.teachers import TeacherSpec, load_teacher
from privdistill.engine.trainer import evaluate
from privdistill.errors import BudgetExceededError, ConfigError, PrivacyError
from privdistill.methods.common import MethodAPI, Released, RunRequest, finish_run, prepare_run
from privdistill.methods.dkd import TEACHER_LOSSES, logit_gradients
from privdistill.models import create_model
from privdistill.privacy import calibration
from privdistill.privacy.events import DPDFDSteps
from privdistill.privacy.ledger import PrivacyLedger
from privdistill.privacy.mechanisms import make_generator, privatise
from privdistill.privacy.report import PRIVATE, Pathway, dpdfd_pathways, noise_source, write_privacy_json

# random streams (see Env.generator)
_Z_STREAM = 61
_NOISE_SEED_STREAM = 62
_SAMPLE_STREAM = 63
_STUDENT_INIT_STREAM = 64
_GENERATOR_INIT_STREAM = 65

CHECKPOINT = "dpdfd-checkpoint"


# ============================================================================================ config
@dataclass
class DPDFDConfig:
    """Config section `dpdfd` (paper values as defaults: DPDFD Sec. 5 and appendix)."""

    algorithm: int = 1  # 1: one teacher | 2: n disjoint teachers (section dpdfd_teachers) | 3: private data directly
    epsilon: Optional[float] = 10.0  # target epsilon; None: no target (then `steps` must be given)
    delta: float = 1e-5
    accounting: str = "paper"  # the accounting that sets T and enforces the budget: paper | strict
    max_epsilon: Optional[float] = None  # the ledger's hard limit; None: the target epsilon
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
    generator_output_norm: bool = False  # DAFL's final BatchNorm(affine=False) on the generator (see below)
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
        _check(self.epsilon is None or self.epsilon > 0, "epsilon must be > 0")
        _check(0 < self.delta < 1, "delta must lie in (0, 1)")
        _check(self.accounting in ("paper", "strict"), f"accounting must be paper or strict, got {self.accounting!r}")
        _check(self.max_epsilon is None or self.max_epsilon > 0, "max_epsilon must be > 0")
        _check(self.steps >= 0 and self.max_steps >= 0, "steps and max_steps must be >= 0")
        _check(self.epsilon is not None or self.steps > 0,
               "give a target epsilon (dpdfd.epsilon) or a number of steps (dpdfd.steps)")
        _check(not self.calibrate_sigma or (self.epsilon is not None and (self.steps > 0 or self.max_steps > 0)),
               "calibrate_sigma needs a target epsilon and a step count (dpdfd.steps or dpdfd.max_steps)")
        _check(self.sigma > 0 and self.stability > 0 and self.gamma > 0, "sigma, stability and gamma must be > 0")
        _check(self.clip_norm is None or self.clip_norm > 0, "clip_norm must be > 0")
        _check(self.batch_size >= 1, "batch_size must be >= 1")
        _check(self.granularity in ("per_sample", "batch_sum"), f"unknown granularity {self.granularity!r}")
        _check(self.operation in ("normalize", "clip"), f"operation must be normalize or clip, got {self.operation!r}")
        _check(self.teacher_loss in TEACHER_LOSSES, f"teacher_loss must be one of {TEACHER_LOSSES}")
        _check(self.temperature > 0, "temperature must be > 0")
        _check(self.student_loss in ("l2", "ce"), f"student_loss must be l2 or ce, got {self.student_loss!r}")
        _check(self.student_optimizer in ("adam", "sgd"), "student_optimizer must be adam or sgd")
        _check(self.student_lr > 0 and self.generator_lr > 0, "learning rates must be > 0")
        _check(self.student_lr_schedule in ("constant", "linear", "cosine"), "unknown student_lr_schedule")
        _check(self.generator_init in ("scratch", "teacher"), "generator_init must be scratch or teacher")
        _check(self.generator_every >= 0, "generator_every must be >= 0")
        _check(min(self.lg_one_hot, self.lg_entropy, self.lg_activation) >= 0, "L_G weights must be >= 0")
        _check(min(self.eval_every, self.checkpoint_every, self.ledger_chunk) >= 1,
               "eval_every, checkpoint_every and ledger_chunk must be >= 1")

    @property
    def resolved_clip_norm(self) -> float:
        """C: given, or the paper's rule (1e-3 for epsilon <= 1, 5e-3 for 1 < epsilon <= 10; 5e-3 above)."""
        if self.clip_norm is not None:
            return self.clip_norm
        return 1e-3 if self.epsilon is not None and self.epsilon <= 1 else 5e-3


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def auto_variant(cfg: DPDFDConfig) -> str | None:
    if cfg.variant:
        return cfg.variant
    parts = []
    if cfg.algorithm == 2:
        parts.append("multi-teacher")
    elif cfg.algorithm == 3:
        parts.append("direct")
    if cfg.operation == "clip":
        parts.append("clipping")
    if cfg.accounting == "strict":
        parts.append("strict")
    return "-".join(parts) or None


# ====================================================================================== the mechanism
def _noisy_gradients(grads: torch.Tensor, cfg: DPDFDConfig, plan: Plan, chunk_seed: int, step: int) -> torch.Tensor:
    """A_{C,sigma} (privacy.mechanisms.privatise) with this step's noise."""
    return privatise(grads, operation=cfg.operation, clip_norm=plan.clip_norm, sigma=plan.sigma,
                     stability=cfg.stability, granularity=cfg.granularity,
                     generator=step_noise_generator(chunk_seed, step, grads.device))


def step_noise_generator(chunk_seed: int, step: int, device: torch.device) -> torch.Generator:
    """The privacy-noise generator of one step: seeded by the chunk's recorded seed and the step counter."""
    digest = hashlib.blake2b(f"dpdfd-noise:{chunk_seed}:{step}".encode(), digest_size=8).digest()
    return make_generator(int.from_bytes(digest, "little") & (2**63 - 1), device=device)


# =========================================================================================== losses
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


# ============================================================================================ plan
@dataclass
class Plan:
    """What a run will spend: T steps of one event, and what each accounting would allow."""

    event: DPDFDSteps  # template with steps = T
    steps: int
    sigma: float
    clip_norm: float
    budget_steps: int | None  # what the target allows under the chosen accounting (None: no target)
    notes: list[str] = field(default_factory=list)


def make_event(cfg: DPDFDConfig, *, steps: int, sigma: float, clip_norm: float, num_teachers: int = 1,
               num_classes: int | None = None, dataset_size: int | None = None) -> DPDFDSteps:
    return DPDFDSteps(clip_norm=clip_norm, sigma=sigma, batch_size=cfg.batch_size, steps=steps,
                      num_teachers=num_teachers if cfg.algorithm == 2 else 1, granularity=cfg.granularity,
                      algorithm=cfg.algorithm, dataset_size=dataset_size if cfg.algorithm == 3 else None,
                      num_classes=num_classes)


def plan_steps(cfg: DPDFDConfig, *, num_teachers: int = 1, num_classes: int | None = None,
               dataset_size: int | None = None) -> Plan:
    """T (and sigma, with calibrate_sigma) from the target epsilon under cfg.accounting."""
    clip = cfg.resolved_clip_norm
    sigma = cfg.sigma
    notes: list[str] = []
    template = make_event(cfg, steps=1, sigma=sigma, clip_norm=clip, num_teachers=num_teachers,
                          num_classes=num_classes, dataset_size=dataset_size)
    if cfg.calibrate_sigma:
        count = cfg.steps or cfg.max_steps
        sigma = calibration.calibrate_noise(template.with_count(count), target_epsilon=cfg.epsilon, delta=cfg.delta,
                                            accounting=cfg.accounting)
        template = replace(template, sigma=sigma)
        notes.append(f"sigma calibrated to {sigma:.6g} so that {count} steps spend epsilon {cfg.epsilon:g} "
                     f"({cfg.accounting} accounting, delta {cfg.delta:g}); the paper uses sigma = {cfg.sigma:g}")
    budget = None
    if cfg.epsilon is not None:
        budget = calibration.max_steps(template, target_epsilon=cfg.epsilon, delta=cfg.delta, accounting=cfg.accounting)
    if cfg.steps > 0:
        steps = cfg.steps
    else:
        steps = budget
        if cfg.max_steps and steps > cfg.max_steps:
            notes.append(f"the budget allows {steps:,} steps; capped at {cfg.max_steps:,} (dpdfd.max_steps): "
                         "the epsilon spent is below the target")
            steps = cfg.max_steps
    if budget == 0:
        notes.append(f"no step fits epsilon {cfg.epsilon:g} under {cfg.accounting} accounting: no training possible")
    return Plan(event=template.with_count(steps), steps=steps, sigma=sigma, clip_norm=clip, budget_steps=budget,
                notes=notes)


# ==================================================================================== training loop
@dataclass
class DPDFDResult:
    student: nn.Module
    generator: nn.Module | None
    steps_done: int
    wall_seconds: float
    history: list[dict]
    stopped: str | None = None  # why the run stopped early (budget), if it did


def _make_student(cfg: DPDFDConfig, env: Env, channels: int, num_classes: int, size: int) -> nn.Module:
    torch.manual_seed(env.generator(_STUDENT_INIT_STREAM, -1).initial_seed())
    return create_model(cfg.student_model, kind="classifier", in_channels=channels, num_classes=num_classes,
                        image_size=size)


def _student_optimizer(cfg: DPDFDConfig, student: nn.Module) -> torch.optim.Optimizer:
    if cfg.student_optimizer == "adam":
        return torch.optim.Adam(student.parameters(), lr=cfg.student_lr)
    return torch.optim.SGD(student.parameters(), lr=cfg.student_lr, momentum=cfg.student_momentum)


def _lr_factor(cfg: DPDFDConfig, step: int, total: int) -> float:
    if cfg.student_lr_schedule == "linear":
        return max(0.0, 1.0 - step / max(1, total))
    if cfg.student_lr_schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(1, total)))
    return 1.0


class _Chunks:
    """The ledger side of the loop: one spend per chunk of steps, recorded before the chunk runs."""

    def __init__(self, ledger: PrivacyLedger, plan: Plan, cfg: DPDFDConfig, env: Env):
        self.ledger, self.plan, self.cfg, self.env = ledger, plan, cfg, env
        self.current: tuple[int, int] | None = None  # (chunk index, seed)

    def seed_for(self, step: int) -> int:
        k = self.cfg.ledger_chunk
        index = step // k
        if self.current is not None and self.current[0] == index:
            return self.current[1]
        start, stop = index * k, min((index + 1) * k, self.plan.steps)
        event = self.plan.event.with_count(stop - start)

        def draw() -> torch.Tensor:
            if self.cfg.secure_noise:
                seed = secrets.randbits(62)
            else:
                gen = make_generator(self.env.generator(_NOISE_SEED_STREAM, index).initial_seed())
                seed = int(torch.randint(0, 2**62, (1,), generator=gen))
            return torch.tensor([seed], dtype=torch.int64)

        answer = self.ledger.spend(f"dpdfd-steps-{start:09d}-{stop:09d}", event, draw)
        seed = int(torch.as_tensor(answer).reshape(-1)[0])
        self.current = (index, seed)
        return seed


def train_dpdfd(*, cfg: DPDFDConfig, plan: Plan, env: Env, ledger: PrivacyLedger,
                teacher: nn.Module | TeacherEnsemble | None,
                channels: int, num_classes: int, image_size: int, generator_cfg: GeneratorTraining,
                init_generator: nn.Module | None = None, private: ImageDataset | None = None,
                test: ImageDataset | None = None, run: RunDir | None = None,
                on_eval: Callable[[dict], None] | None = None) -> DPDFDResult:
    """The DPDFD loop (Alg. 1 with a module teacher, Alg. 2 with a TeacherEnsemble, Alg. 3 with `private`).

    Resumable: with a run directory it checkpoints atomically every cfg.checkpoint_every steps and continues
    from the last checkpoint; everything random is derived from (seed, step) or from the ledger."""
    direct = cfg.algorithm == 3
    if direct and private is None:
        raise ConfigError("DPDFD Alg. 3 trains on private data: pass `private`")
    if not direct and teacher is None:
        raise ConfigError("DPDFD Alg. 1/2 need a teacher")
    total = plan.steps
    student = env.place(_make_student(cfg, env, channels, num_classes, image_size)).train()
    opt_s = _student_optimizer(cfg, student)
    generator = None
    opt_g = None
    if not direct:
        if init_generator is not None:
            generator = init_generator
        else:
            torch.manual_seed(env.generator(_GENERATOR_INIT_STREAM, -1).initial_seed())
            generator = build_generator(generator_cfg, channels, image_size, output_norm=cfg.generator_output_norm)
        generator = env.place(generator).train()
        opt_g = torch.optim.Adam(generator.parameters(), lr=cfg.generator_lr, betas=(cfg.generator_beta1, 0.999))
        if not isinstance(teacher, TeacherEnsemble):
            teacher = env.place(teacher).eval()
            for p in teacher.parameters():
                p.requires_grad_(False)
    start, elapsed, history = 0, 0.0, []
    state = run.load_checkpoint(CHECKPOINT) if run is not None else None
    if state is not None:
        student.load_state_dict(state["student"])
        opt_s.load_state_dict(state["opt_s"])
        if generator is not None:
            generator.load_state_dict(state["generator"])
            opt_g.load_state_dict(state["opt_g"])
        start, elapsed, history = state["step"], state["elapsed"], state["history"]
    chunks = _Chunks(ledger, plan, cfg, env)
    t0 = time.perf_counter()

    def save(step: int) -> None:
        if run is None:
            return
        run.save_checkpoint({"student": student.state_dict(), "opt_s": opt_s.state_dict(),
                             "generator": generator.state_dict() if generator is not None else None,
                             "opt_g": opt_g.state_dict() if opt_g is not None else None, "step": step,
                             "elapsed": elapsed + time.perf_counter() - t0, "history": history}, CHECKPOINT)

    stopped = None
    window: dict[str, float] = {}
    n_window = 0
    step = start
    with progress_bar(total, f"dpdfd alg. {cfg.algorithm}", enabled=env.progress, completed=start) as bar:
        for step in range(start, total):
            try:
                chunk_seed = chunks.seed_for(step)
            except BudgetExceededError as err:
                stopped = f"budget exhausted before step {step}: {err}"
                break
            for group in opt_s.param_groups:
                group["lr"] = cfg.student_lr * _lr_factor(cfg, step, total)
            if direct:
                parts = _direct_step(cfg, plan, env, student, opt_s, private, step, chunk_seed)
            else:
                parts = _datafree_step(cfg, plan, env, student, opt_s, generator, opt_g, teacher, step, chunk_seed)
            for k, v in parts.items():
                window[k] = window.get(k, 0.0) + v
            n_window += 1
            done = step + 1
            if done % cfg.eval_every == 0 or done == total:
                entry = {"step": done, **{k: v / max(1, n_window) for k, v in window.items()}}
                window, n_window = {}, 0
                if test is not None:
                    entry["test_accuracy"] = evaluate(student, test, env)
                entry["elapsed"] = round(elapsed + time.perf_counter() - t0, 1)
                history.append(entry)
                if run is not None:
                    run.log(stage="dpdfd", **entry)
                if on_eval is not None:
                    on_eval(entry)
            if done % cfg.checkpoint_every == 0 and done < total:
                save(done)
            bar.advance(1, acc=history[-1].get("test_accuracy") if history else None)
        else:
            step = total
    steps_done = step if stopped else total
    wall = elapsed + time.perf_counter() - t0
    if run is not None:
        save(steps_done)
    return DPDFDResult(student=student, generator=generator, steps_done=steps_done, wall_seconds=wall,
                       history=history, stopped=stopped)


def _datafree_step(cfg: DPDFDConfig, plan: Plan, env: Env, student: nn.Module, opt_s, generator: nn.Module, opt_g,
                   teacher, step: int, chunk_seed: int) -> dict[str, float]:
    """One iteration of Alg. 1 (module teacher) or Alg. 2 (TeacherEnsemble).

    Lines 11-14 of Alg. 1, literally: L_S is computed with the student before its update and L_G with the
    updated student; the generator descends d(L_S + L_G)/d(theta_g), each term through its own forward pass.
    The synthetic batch x is a leaf for both student passes, and the two input gradients are summed and
    back-propagated through the generator once."""
    z = torch.randn(cfg.batch_size, generator_latent(generator),
                    generator=env.generator(_Z_STREAM, step)).to(env.device)
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
    grads = logit_gradients(s_logits, t_logits, kind=cfg.teacher_loss, temperature=cfg.temperature,
                            alpha=cfg.dkd_alpha, beta=cfg.dkd_beta)  # [B, K] or [n, B, K]
    noisy = _noisy_gradients(grads, cfg, plan, chunk_seed, step)
    anchor = s_logits.detach()
    step_out = (cfg.gamma * noisy.to(s_logits.dtype)).expand_as(anchor)  # gamma * g~ ([K] broadcasts: batch_sum)
    ls = student_loss(s_logits, anchor, step_out, cfg.student_loss)  # y_s = s - gamma * g~
    opt_s.zero_grad(set_to_none=True)
    ls.backward()  # student weights, and dL_S/dx for the generator
    opt_s.step()
    parts = {"student_loss": float(ls.detach())}
    if train_generator:
        params = list(student.parameters())
        for p in params:
            p.requires_grad_(False)
        try:
            x_g = x.detach().requires_grad_(True)
            with env.autocast():
                s2, f2 = logits_and_features(student, x_g)  # the updated student, fixed: the discriminator
            lg, lg_parts = generator_loss(s2, f2, cfg)
            (grad_x,) = torch.autograd.grad(lg, x_g)
        finally:
            for p in params:
                p.requires_grad_(True)
        opt_g.zero_grad(set_to_none=True)
        x.backward((grad_x + x_s.grad).to(x.dtype))
        opt_g.step()
        parts.update(lg_parts)
        parts["generator_loss"] = float(lg.detach()) + parts["student_loss"]
    return parts


def _direct_step(cfg: DPDFDConfig, plan: Plan, env: Env, student: nn.Module, opt_s, private: ImageDataset,
                 step: int, chunk_seed: int) -> dict[str, float]:
    """One iteration of Alg. 3: a Poisson sample of the private set (rate B/N), CE with the true labels."""
    n = len(private)
    q = cfg.batch_size / n
    mask = torch.rand(n, generator=env.generator(_SAMPLE_STREAM, step)) < q
    idx = torch.nonzero(mask).flatten()
    if len(idx) == 0:
        return {"batch": 0.0}
    x, y = private.batch(idx)
    x, y = env.place_batch(x), y.to(env.device)
    with env.autocast():
        s_logits = student(x)
    s_logits = s_logits.float()
    grads = (torch.softmax(s_logits.detach(), -1) - F.one_hot(y, s_logits.shape[-1]).float())  # dCE/ds, per sample
    noisy = _noisy_gradients(grads, cfg, plan, chunk_seed, step)
    # normalize_and_noise divides by the sampled batch size B_t; use the expected batch size B instead
    noisy = noisy * (len(idx) / cfg.batch_size)
    ls = student_loss(s_logits, s_logits.detach(), (cfg.gamma * noisy).expand_as(s_logits), cfg.student_loss)
    opt_s.zero_grad(set_to_none=True)
    ls.backward()
    opt_s.step()
    return {"student_loss": float(ls.detach()), "batch": float(len(idx))}


def generator_latent(generator: nn.Module) -> int:
    return int(getattr(generator, "latent_dim", 100))


# ======================================================================================= the method
SECTIONS = {"baseline": ClassifierTraining, "dpdfd": DPDFDConfig, "dpdfd_teachers": TeacherTraining,
            "dpdfd_generator": GeneratorTraining}


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


def run_dpdfd(request: RunRequest, *, teacher: TeacherSpec | None = None, cache: bool = True) -> dict[str, Any]:
    """DPDFD end to end: resolve the config, get the teacher(s), plan T from the budget, train, write the
    student, the generator, summary.json and privacy.json. Returns the summary."""
    prep = prepare_run("dpdfd", request, SECTIONS)
    cfg: DPDFDConfig = prep.sections["dpdfd"]
    env, data, run = prep.env, prep.data, prep.run
    teacher = teacher or TeacherSpec()
    stages = Stages(StageCache(enabled=cache), env, data, run)
    stage_refs: list[dict] = []
    stage_seconds = 0.0
    started = time.perf_counter()
    channels, size, k = data.channels, data.image_size[0], data.num_classes

    # --- privacy plan first: refuse to start (before any teacher or generator is built) beyond the budget
    num_teachers = prep.sections["dpdfd_teachers"].num_teachers if cfg.algorithm == 2 else 1
    plan = plan_steps(cfg, num_teachers=num_teachers, num_classes=k, dataset_size=len(data.train))
    max_eps = cfg.max_epsilon if cfg.max_epsilon is not None else cfg.epsilon
    ledger = PrivacyLedger(run.path, max_epsilon=max_eps, accounting=cfg.accounting, delta=cfg.delta)
    recorded = sum(e.steps for e in ledger.events() if isinstance(e, DPDFDSteps))
    remaining = plan.event.with_count(max(0, plan.steps - recorded))
    ledger.check_can_start([remaining] if remaining.steps else [])

    teacher_model: Any = None
    teacher_key = None
    baseline_accuracy = None
    teacher_desc = None
    if cfg.algorithm == 1:
        if teacher.given():
            teacher_model, teacher_key = load_teacher(teacher, dataset=prep.dataset, channels=channels,
                                                      num_classes=k, device=env.device)
            baseline_accuracy = evaluate(teacher_model, data.test, env)
            teacher_desc = teacher.describe()
        else:
            t0 = time.perf_counter()
            teacher_model, stage = stages.baseline(prep.sections["baseline"])
            stage_seconds += 0.0 if stage.reused else time.perf_counter() - t0
            stage_refs.append(stage.ref())
            teacher_key = stage.key
            baseline_accuracy = stage.info().get("test_accuracy")
            teacher_desc = f"baseline stage {stage.key} ({prep.sections['baseline'].model})"
    elif cfg.algorithm == 2:
        tcfg: TeacherTraining = prep.sections["dpdfd_teachers"]
        t0 = time.perf_counter()
        teacher_model, stage = stages.teachers(tcfg)
        stage_seconds += 0.0 if stage.reused else time.perf_counter() - t0
        stage_refs.append(stage.ref())
        teacher_key = stage.key
        info = stage.info()
        baseline_accuracy = info.get("ensemble_accuracy")
        teacher_desc = f"{num_teachers} {tcfg.model} teachers on disjoint partitions (stage {stage.key})"
    gcfg: GeneratorTraining = prep.sections["dpdfd_generator"]
    init_generator = None
    if cfg.algorithm in (1, 2) and cfg.generator_init == "teacher":
        if cfg.algorithm == 2:
            raise ConfigError("generator_init=teacher is implemented for one teacher (Alg. 1) only")
        t0 = time.perf_counter()
        init_generator, gstage = stages.generator(teacher_model, teacher_key, gcfg)
        stage_seconds += 0.0 if gstage.reused else time.perf_counter() - t0
        stage_refs.append(gstage.ref())

    result = train_dpdfd(cfg=cfg, plan=plan, env=env, ledger=ledger, teacher=teacher_model, channels=channels,
                         num_classes=k, image_size=size, generator_cfg=gcfg, init_generator=init_generator,
                         private=data.train if cfg.algorithm == 3 else None, test=data.test, run=run)
    accuracy = evaluate(result.student, data.test, env)
    run.save_weights("student", result.student, metadata={"method": "dpdfd"})
    if result.generator is not None:
        run.save_weights("generator", result.generator, metadata={"method": "dpdfd"})
        _save_samples(result, run, env, k)
    arts = pathways(cfg)
    spent = ledger.epsilon_both()
    eps = {name: float(r.value) for name, r in spent.items()}
    template = plan.event.with_count(1)
    allowed = {}
    if cfg.epsilon is not None:
        for acc in ("paper", "strict"):
            try:
                allowed[acc] = calibration.max_steps(template, target_epsilon=cfg.epsilon, delta=cfg.delta,
                                                     accounting=acc)
            except PrivacyError:
                allowed[acc] = 0
    statement = privacy_statement(cfg, eps, cfg.delta)
    noise = noise_source(cfg.secure_noise, "dpdfd.secure_noise")
    write_privacy_json(run.path, arts, method="dpdfd", noise=noise, extra={
        "algorithm": cfg.algorithm, "generator_init": cfg.generator_init if cfg.algorithm != 3 else None,
        "statement": statement})
    wall = time.perf_counter() - started
    return finish_run(
        prep, request, method="dpdfd", wall_seconds=result.wall_seconds, noise_secure=noise["secure"],
        test_accuracy=round(accuracy, 4),
        baseline_accuracy=None if baseline_accuracy is None else round(float(baseline_accuracy), 4),
        epsilon_paper=_round_eps(eps["paper"]), epsilon_strict=_round_eps(eps["strict"]), delta=cfg.delta,
        not_covered=[p.via for p in arts["student"] if not p.covered],
        target_epsilon=cfg.epsilon, accounting=cfg.accounting, steps=result.steps_done, planned_steps=plan.steps,
        steps_allowed=allowed, variant=auto_variant(cfg), algorithm=cfg.algorithm, sigma=round(plan.sigma, 6),
        clip_norm=plan.clip_norm, batch_size=cfg.batch_size, granularity=cfg.granularity, operation=cfg.operation,
        teacher=teacher_desc, num_teachers=num_teachers if cfg.algorithm == 2 else None,
        generator_init=cfg.generator_init if cfg.algorithm != 3 else None, privacy=statement,
        plan_notes=plan.notes, stopped=result.stopped, stages=stage_refs, stage_seconds=round(stage_seconds, 1),
        total_seconds=round(wall, 1), history=result.history)


def _round_eps(x: float) -> float | str:
    return "inf" if math.isinf(x) else round(x, 6)


def _save_samples(result: DPDFDResult, run: RunDir, env: Env, num_classes: int) -> None:
    """A grid of generator samples, rows by the STUDENT's prediction (no teacher access: no privacy cost).

    The student labels the generator's raw float output, as it saw it in training; the grid shows the same
    samples clamped to [-1, 1] (an output-BatchNorm generator exceeds that range)."""
    try:
        from privdistill.engine.datafree import generate
        from privdistill.engine.synthetic import save_grid
        from privdistill.engine.trainer import predict_logits

        samples = generate(result.generator, 500, env, stream=1, quantise=False)
        labels = predict_logits(result.student, samples, env).argmax(1)
        save_grid(to_uint8(samples), labels, run.path / "samples.png", num_classes=num_classes)
    except ImportError:  # torchvision missing: no grid
        pass


# ======================================================================================== Python API
class DPDFD(MethodAPI):
    """`DPDFD(epsilon=10, teacher=model).fit("mnist")` -> Released(student, generator, summary, privacy).

    ``teacher``: an nn.Module, a run directory (str or Path, e.g. from `train baseline`) or a TeacherSpec;
    None: the cached baseline stage trained on ``dataset``. Other keywords go to the `dpdfd` section
    (`accounting="strict"`, `algorithm=2`, `max_steps=500`, ...); the dataset supplies the test set and the
    image shape (Alg. 1 and 2 never read its training images; Alg. 3 does).
    """

    section = "dpdfd"

    def __init__(self, dataset: str | None = None, *, teacher: nn.Module | str | Path | TeacherSpec | None = None,
                 epsilon: float | None = None, cache: bool = True, **options: Any):
        super().__init__(dataset, epsilon=epsilon, **options)
        if teacher is None or isinstance(teacher, TeacherSpec):
            self.teacher = teacher or TeacherSpec()
        elif isinstance(teacher, nn.Module):
            self.teacher = TeacherSpec(module=teacher)
        else:
            self.teacher = TeacherSpec(run_dir=str(teacher))
        self.cache = cache

    def fit(self, dataset: str | None = None) -> Released:
        return Released.from_run(run_dpdfd(self.request(dataset), teacher=self.teacher, cache=self.cache))
