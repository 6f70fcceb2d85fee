"""DPDFD's configuration (section `dpdfd`) and its privacy plan: the steps T the budget allows (and sigma), how the
steps are charged to the ledger, and what the epsilon covers. The algorithm itself is methods/dpdfd.py.

* Iterations: T = the most steps whose epsilon fits the target under the budget's accounting (optionally capped);
  with ``calibrate_sigma`` the cap is T and sigma the least noise that fits it.
* Ledger: one record per chunk of ``ledger_chunk`` steps, written BEFORE the chunk runs (charged in full even if
  interrupted); its answer is the seed of the chunk's noise (step t's from (seed, t)), so a resumed run reuses the
  noise, never redraws it. The noise itself would be gigabytes at the paper's ~10^6 steps.
* ``secure_noise``: OpenDP noise and no seed recorded (a seed would let anyone regenerate the noise); a resumed run
  charges the rest of an interrupted chunk again, under its own key, before redrawing it.
* ``generator_output_norm`` (DAFL's final non-affine BatchNorm) is set per dataset (models/generator.py says why).
* The clip option (Fig. 2) clips instead of normalising: both give norm <= C, so the event and ε are unchanged.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field, replace
from typing import Optional

import torch

from privdistill.config import check, check_model_name
from privdistill.engine import streams
from privdistill.engine.context import Env
from privdistill.engine.optim import SCHEDULES
from privdistill.errors import PrivacyError
from privdistill.methods.runner import Budget
from privdistill.privacy import calibration
from privdistill.privacy._checks import check_choice
from privdistill.privacy.events import NormalisedGaussian
from privdistill.privacy.ledger import PrivacyLedger
from privdistill.privacy.mechanisms import SecureNoise, make_generator, privatise
from privdistill.privacy.report import PRIVATE, Pathway


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
    operation: str = "normalize"  # normalize (the paper) | clip (Fig. 2's comparison)
    temperature: float = 4.0
    dkd_alpha: float = 1.0
    dkd_beta: float = 8.0
    gamma: float = 1.0
    student_model: str = "paper-cnn"
    student_lr: float = 1e-3  # Adam
    student_lr_schedule: str = "constant"  # constant | linear | cosine
    student_ema: float = 0.0  # > 0: release an exponential moving average of the student's weights (post-processing)
    generator_init: str = "scratch"  # scratch (covered) | teacher (warm start from dpdfd_generator: NOT covered)
    generator_output_norm: bool = False  # DAFL's final BatchNorm(affine=False) on the generator (see above)
    generator_lr: float = 1e-3
    generator_beta1: float = 0.5
    generator_every: int = 1  # a generator step every k student steps; 0: the generator is never trained
    lg_one_hot: float = 1.0  # Eq. 5 weights: CE on the student's argmax ("CE" of Table 5)
    lg_entropy: float = 1.0  # alpha: class balance ("IE")
    lg_activation: float = 1.0  # beta: feature activation ("Norm")
    # > 0: from this step on, a class the student's argmax leaves out of a generator batch is L_G's CE target of
    # the batch's fair share of samples (methods/dkd.absent_class_targets; not the paper's: generator-side only,
    # post-processing of the student, so it spends nothing). 0: never, as the paper
    revive_classes_from: int = 0
    eval_every: int = 250
    checkpoint_every: int = 50
    ledger_chunk: int = 100
    secure_noise: Optional[bool] = None  # None: run.noise decides (methods/common.py)
    variant: Optional[str] = None  # the label used by --record; None: derived from the configuration

    def validate(self) -> None:
        check(self.algorithm in (1, 2, 3), f"algorithm must be 1, 2 or 3, got {self.algorithm}")
        check_model_name(self.student_model, "dpdfd.student_model")
        check(self.steps >= 0 and self.max_steps >= 0, "steps and max_steps must be >= 0")
        check(self.sigma > 0 and self.stability > 0 and self.gamma > 0, "sigma, stability and gamma must be > 0")
        check(self.clip_norm is None or self.clip_norm > 0, "clip_norm must be > 0")
        check(self.batch_size >= 1, "batch_size must be >= 1")
        check(self.operation in ("normalize", "clip"), f"operation must be normalize or clip, got {self.operation!r}")
        check(self.temperature > 0, "temperature must be > 0")
        check(self.student_lr > 0 and self.generator_lr > 0, "learning rates must be > 0")
        check(self.student_lr_schedule in SCHEDULES, "unknown student_lr_schedule")
        check(0 <= self.student_ema < 1, f"student_ema must lie in [0, 1), got {self.student_ema}")
        check(self.generator_init in ("scratch", "teacher"), "generator_init must be scratch or teacher")
        check(self.generator_every >= 0, "generator_every must be >= 0")
        check(min(self.lg_one_hot, self.lg_entropy, self.lg_activation) >= 0, "L_G weights must be >= 0")
        check(self.revive_classes_from >= 0, "revive_classes_from must be >= 0 (0: never)")
        check(min(self.eval_every, self.checkpoint_every, self.ledger_chunk) >= 1,
               "eval_every, checkpoint_every and ledger_chunk must be >= 1")


def check_budget(cfg: DPDFDConfig, budget: Budget) -> None:
    """What the `dpdfd` section needs from the `budget` section (checked when the run is planned)."""
    check(budget.epsilon is not None or cfg.steps > 0,
           "give a target epsilon (budget.epsilon, --epsilon) or a number of steps (dpdfd.steps)")
    check(not cfg.calibrate_sigma or (budget.epsilon is not None and (cfg.steps > 0 or cfg.max_steps > 0)),
           "calibrate_sigma needs a target epsilon (budget.epsilon) and a step count (dpdfd.steps or dpdfd.max_steps)")


def auto_variant(cfg: DPDFDConfig, accounting: str = "strict") -> str | None:
    """The --record label: given, or derived (multi-teacher / direct, clipping, teacher-generator, strict)."""
    if cfg.variant:
        return cfg.variant
    parts = []
    if cfg.algorithm == 2:
        parts.append("multi-teacher")
    elif cfg.algorithm == 3:
        parts.append("direct")
    if cfg.operation == "clip":
        parts.append("clipping")
    if cfg.algorithm != 3 and cfg.generator_init == "teacher":  # not the paper's generator: never its file name
        parts.append("teacher-generator" + ("-alternating" if cfg.generator_every else ""))
    if accounting == "strict":
        parts.append("strict")
    return "-".join(parts) or None


# ============================================================================================== plan
@dataclass
class StepPlan:
    """What a run will spend: T steps of one event, with the noise and norm bound they are priced at."""

    event: NormalisedGaussian  # template with steps = T
    steps: int
    sigma: float
    clip_norm: float
    notes: list[str] = field(default_factory=list)


def plan_steps(cfg: DPDFDConfig, budget: Budget, *, num_teachers: int = 1, num_classes: int | None = None,
               dataset_size: int | None = None) -> StepPlan:
    """T (and sigma, with calibrate_sigma) from the target epsilon under the budget's accounting."""
    check_budget(cfg, budget)
    eps, acc, delta = budget.epsilon, budget.accounting, budget.delta
    sigma, notes = cfg.sigma, []
    clip = cfg.clip_norm  # C: given, or the paper's rule (1e-3 for epsilon <= 1, 5e-3 above)
    if clip is None:
        clip = 1e-3 if eps is not None and eps <= 1 else 5e-3
    template = NormalisedGaussian(clip_norm=clip, sigma=sigma, batch_size=cfg.batch_size, steps=1,
                                  num_teachers=num_teachers if cfg.algorithm == 2 else 1, algorithm=cfg.algorithm,
                                  dataset_size=dataset_size if cfg.algorithm == 3 else None, num_classes=num_classes)
    if cfg.calibrate_sigma:
        count = cfg.steps or cfg.max_steps
        sigma = calibration.calibrate_noise(template.with_count(count), target_epsilon=eps, delta=delta, accounting=acc)
        template = replace(template, sigma=sigma)
        notes.append(f"sigma calibrated to {sigma:.6g} so that {count} steps spend epsilon {eps:g} "
                     f"({acc} accounting, delta {delta:g}); the paper uses sigma = {cfg.sigma:g}")
    allowed = None if eps is None else calibration.max_count(template, target_epsilon=eps, delta=delta, accounting=acc)
    if cfg.steps > 0:  # exactly as many as asked (the ledger refuses them if they do not fit)
        steps = cfg.steps
    elif cfg.max_steps and allowed > cfg.max_steps:
        notes.append(f"the budget allows {allowed:,} steps; capped at {cfg.max_steps:,} (dpdfd.max_steps): "
                     "the epsilon spent is below the target")
        steps = cfg.max_steps
    else:
        steps = allowed  # check_budget: without dpdfd.steps there is a target
    if allowed == 0:
        notes.append(f"no step fits epsilon {eps:g} under {acc} accounting: no training possible")
    return StepPlan(event=template.with_count(steps), steps=steps, sigma=sigma, clip_norm=clip, notes=notes)


def steps_allowed(event: NormalisedGaussian, budget: Budget) -> dict[str, int]:
    """The steps the target epsilon allows under each accounting ({} without a target)."""
    if budget.epsilon is None:
        return {}
    allowed = {}
    for accounting in ("paper", "strict"):
        try:
            allowed[accounting] = calibration.max_count(event.with_count(1), target_epsilon=budget.epsilon,
                                                        delta=budget.delta, accounting=accounting)
        except PrivacyError:
            allowed[accounting] = 0
    return allowed


# ================================================================================== ledger and noise
class LedgerChunks:
    """DPDFD's privacy bookkeeping: one ledger spend per chunk of `ledger_chunk` steps, recorded before the chunk
    runs; its recorded answer is the seed of the chunk's noise, so a resumed run reuses the noise it had."""

    def __init__(self, ledger: PrivacyLedger, plan: StepPlan, cfg: DPDFDConfig, env: Env):
        self.ledger, self.plan, self.cfg, self.env = ledger, plan, cfg, env
        self.current: tuple[int, int] | None = None  # (chunk index, seed)

    def seed_for(self, step: int) -> int:
        """The noise seed of `step`'s chunk (spent now if the chunk is new; BudgetExceededError past the limit).
        With secure noise there is no seed (SECURE): the chunk is charged all the same, and a chunk this process
        enters after a resume, already charged by the interrupted run, is charged again from `step` on."""
        size = self.cfg.ledger_chunk
        index = step // size
        if self.current is None or self.current[0] != index:
            start, stop = index * size, min((index + 1) * size, self.plan.steps)
            key = f"dpdfd-steps-{start:09d}-{stop:09d}"
            if self.cfg.secure_noise and key in self.ledger:
                redrawn = f"{key}-redrawn-from-{step:09d}"
                attempt = next(a for a in itertools.count(1) if f"{redrawn}-{a}" not in self.ledger)
                start, key = step, f"{redrawn}-{attempt}"
            answer = self.ledger.spend(key, self.plan.event.with_count(stop - start), lambda: self._draw_seed(index))
            self.current = (index, int(torch.as_tensor(answer).reshape(-1)[0]))
        return self.current[1]

    def _draw_seed(self, index: int) -> torch.Tensor:
        """The chunk's noise seed, from the run's privacy stream (SECURE with secure_noise: nothing to record)."""
        if self.cfg.secure_noise:
            return torch.tensor([SECURE], dtype=torch.int64)
        gen = make_generator(self.env.generator(streams.DPDFD_NOISE_SEED, index).initial_seed())
        return torch.tensor([int(torch.randint(0, 2**62, (1,), generator=gen))], dtype=torch.int64)


SECURE = -1  # the recorded "seed" of a chunk whose noise came from OpenDP (it cannot be regenerated)


def noisy_gradients(grads: torch.Tensor, cfg: DPDFDConfig, plan: StepPlan, chunk_seed: int,
                    step: int) -> torch.Tensor:
    """A_{C,sigma} (privacy.mechanisms.privatise) with step t's noise: a generator seeded by (chunk seed, t), or
    OpenDP's samplers with secure noise."""
    if chunk_seed == SECURE:
        generator = SecureNoise()
    else:
        digest = hashlib.blake2b(f"dpdfd-noise:{chunk_seed}:{step}".encode(), digest_size=8).digest()
        generator = make_generator(int.from_bytes(digest, "little") & (2**63 - 1), device=grads.device)
    return privatise(grads, operation=cfg.operation, clip_norm=plan.clip_norm, sigma=plan.sigma,
                     stability=cfg.stability, granularity="per_sample", generator=generator)


# ========================================================================================== report
def dpdfd_pathways(*, algorithm: int = 1) -> dict[str, list[Pathway]]:
    """DPDFD Alg. 1 (one teacher), 2 (n disjoint teachers) or 3 (direct training on private data)."""
    check_choice("algorithm", algorithm, (1, 2, 3))
    if algorithm in (1, 2):
        teachers = "the teacher" if algorithm == 1 else "n disjoint teachers"
        channel = Pathway(PRIVATE, f"{teachers} -> per-sample output gradients normalised to norm C + "
                          "N(0, sigma^2 C^2 I) (A_C,sigma)", "student and generator updates", True,
                          "every access to the teacher goes through the noisy gradients; both models are "
                          "post-processing of them")
        return {"student": [channel,
                            Pathway("noise z and the student", "generator trained against the student",
                                    "the student's synthetic inputs", True, "no private data on this path")],
                "generator": [channel]}
    return {"student": [
        Pathway(PRIVATE, "per-sample output gradients normalised + Gaussian noise, Poisson-sampled",
                "output-space targets of the update", True, "the channel the paper analyses"),
        Pathway(PRIVATE, "back-propagation through the model's Jacobian at the private inputs",
                "student weights", False, "Alg. 3 is not DP as written: this path carries un-noised private data"),
    ]}


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
    """The one-line privacy claim of summary.json and privacy.json (eps: the spent epsilon by accounting)."""
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
