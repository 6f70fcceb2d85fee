"""SRR's configuration (section `srr`) and its privacy pricing: the event a run's labels are charged as and the ε per
label a budget allows; and what that ε covers (its pathways, end to end too, and its summary notes: here rather than
in methods/srr.py, which imports methods/end_to_end.py, which uses them). The algorithm itself is methods/srr.py,
whose docstring says why each label is priced so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from privdistill.config import check, check_model_name
from privdistill.errors import ConfigError
from privdistill.methods.runner import Budget
from privdistill.privacy._checks import check_choice
from privdistill.privacy.calibration import calibrate_noise
from privdistill.privacy.events import RandomizedResponse, RandomizedResponseWithPrior
from privdistill.privacy.mechanisms import LABEL_MECHANISMS
from privdistill.privacy.report import PRIVATE, Pathway

SETTINGS = ("data-free", "label-dp")
MECHANISMS = LABEL_MECHANISMS


@dataclass
class SRRConfig:
    """Config section `srr`: the staged distillation (the teacher is section `srr_teacher`, the generator
    `srr_generator`, ε and δ the `budget`)."""

    setting: str = "data-free"  # data-free (Table I) | label-dp (Table II)
    mechanism: str = "srr"  # srr | rr | rr-prior
    stages: int = 20  # T
    num_samples: int = 0  # labels drawn in all: synthetic samples (data-free) or private records (label-dp); 0 = |D|
    threshold: Optional[float] = None  # t; None = 1/(2K)
    secure_noise: Optional[bool] = None  # None: run.noise decides (methods/common.py)
    variant: Optional[str] = None  # name suffix of the recorded result; None: from setting and mechanism
    # student
    student_model: str = "paper-cnn"
    student_model_label_dp: str = ""  # "" = student_model
    batch_size: int = 128
    lr: float = 1e-3  # Adam
    lr_schedule: str = "linear"  # over all student steps of the run: linear | cosine | constant
    epochs_per_stage: float = 5.0
    student_data: str = "stage"  # stage (Eq. 3) | cumulative
    # ce: Eq. 3 (cross-entropy on the released label); likelihood: the student's probability of the released
    # label under the mechanism (its candidate set and ε known: `released_label_likelihood`), free post-processing
    loss: str = "ce"
    first_stage_fraction: float = 0.0  # share of the N labels drawn at stage 1 (0: N/T, the paper's equal split)
    # ours, off in the presets: an exponential moving average of the student's weights (this decay) is the prior
    # of every later stage and the released model; it reads only released labels, so every ε is unchanged
    student_ema: float = 0.0
    # generator fine-tuning by Eq. 3 (data-free)
    finetune_steps: int = 5  # per stage
    finetune_lr: float = 1e-4
    finetune_batch_size: int = 128
    # bookkeeping
    eval_every_stages: int = 0  # 0: about 10 evaluations per run

    def validate(self) -> None:
        check_model_name(self.student_model, "srr.student_model")
        if self.student_model_label_dp:
            check_model_name(self.student_model_label_dp, "srr.student_model_label_dp")
        check(self.setting in SETTINGS, f"setting must be one of {SETTINGS}, got {self.setting!r}")
        check(self.mechanism in MECHANISMS, f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        check(self.stages >= 1, f"stages must be >= 1, got {self.stages}")
        check(self.num_samples >= 0, "num_samples must be >= 0")
        check(self.threshold is None or 0 <= self.threshold < 1, "threshold must lie in [0, 1)")
        check(self.batch_size >= 1 and self.finetune_batch_size >= 1, "batch sizes must be >= 1")
        check(self.lr > 0 and self.finetune_lr > 0, "learning rates must be > 0")
        check(self.lr_schedule in ("linear", "cosine", "constant"), f"unknown lr_schedule {self.lr_schedule!r}")
        check(self.epochs_per_stage > 0, "epochs_per_stage must be > 0")
        check(self.student_data in ("stage", "cumulative"), "student_data must be stage or cumulative")
        check(self.loss in ("ce", "likelihood", "soft"), f"loss must be ce, likelihood or soft, got {self.loss!r}")
        check(0 <= self.first_stage_fraction < 1, "first_stage_fraction must lie in [0, 1)")
        check(0 <= self.student_ema < 1, "student_ema must lie in [0, 1)")
        check(self.finetune_steps >= 0, "finetune_steps must be >= 0")
        check(self.eval_every_stages >= 0, "eval_every_stages must be >= 0")

    @property
    def student_for_setting(self) -> str:
        return (self.student_model_label_dp or self.student_model) if self.setting == "label-dp" else self.student_model

    @property
    def default_variant(self) -> str | None:
        """The result name's suffix when none is given: label-dp, and the mechanism when it is not SRR."""
        return "-".join(([self.setting] if self.setting == "label-dp" else [])
                        + ([self.mechanism] if self.mechanism != "srr" else [])) or None


def label_event(cfg: SRRConfig, count: int, num_classes: int, epsilon: float):
    """The privacy event of `count` labels at `epsilon` each (see the module docstring for why these)."""
    if cfg.setting == "data-free" and cfg.mechanism == "rr":
        return RandomizedResponse(epsilon=epsilon, count=count, num_classes=num_classes)
    return RandomizedResponseWithPrior(epsilon=epsilon, count=count, num_classes=num_classes, setting=cfg.setting)


def epsilon_per_label(cfg: SRRConfig, budget: Budget, total: int, num_classes: int) -> float:
    """The paper's ε per label that the budget allows for `total` labels (see the module docstring)."""
    if budget.epsilon is None:
        raise ConfigError("SRR needs a target epsilon: --epsilon (budget.epsilon); with --accounting paper it is "
                          "the epsilon per label, with strict the epsilon of the whole run")
    if budget.accounting == "paper":
        return budget.epsilon
    # all stages' labels as one event: how the ledger prices them (merged, label-dp: one parallel release)
    return calibrate_noise(label_event(cfg, total, num_classes, budget.epsilon), target_epsilon=budget.epsilon,
                           delta=budget.delta, accounting="strict")


def srr_pathways(*, setting: str = "data-free", fitted_to: str = "non-private teacher") -> dict[str, list[Pathway]]:
    """SRR (data-free: synthetic inputs) or its label-DP setting (real inputs, labels protected). ``fitted_to``:
    what the pre-trained generator was fitted to."""
    check_choice("setting", setting, ("data-free", "label-dp"))
    if setting == "label-dp":
        return {"student": [
            Pathway(PRIVATE + " (labels)", "selective randomized response, each label released once",
                    "the student's labels", True, "epsilon-label-DP: correct under 'change one label'"),
            Pathway(PRIVATE + " (inputs)", "used directly as training inputs", "student weights", False,
                    "label-DP does not protect the inputs"),
        ]}
    return {
        "student": [
            Pathway(PRIVATE, "non-private teacher -> selective randomized response labels", "the student's labels",
                    True, "strict: composed over every label drawn from the teacher"),
            Pathway(PRIVATE, f"{fitted_to} -> generator (BN-statistics, trained against it, fine-tuned against "
                    "the teacher) -> synthetic inputs", "the student's inputs", False,
                    "the generator is trained against models read without noise"),
        ],
        "generator": [Pathway(PRIVATE, f"{fitted_to} used as fixed discriminator", "generator weights",
                              False, "not covered: the generator is trained against models read without noise")],
    }


def srr_end_to_end_pathways() -> dict[str, list[Pathway]]:
    """Data-free SRR end to end (methods/end_to_end.py): the teacher is a DP-SGD model and the statistics its
    generator matches are released by a Gaussian sum, both in the run's ledger; everything else is post-processing."""
    why = "post-processing of the DP teacher and the DP statistics, both in the ledger"
    return {
        "student": [
            Pathway(PRIVATE, "DP-SGD teacher -> its labels of the synthetic inputs (no further noise needed)",
                    "the student's labels", True, why),
            Pathway(PRIVATE, "DP-SGD teacher + DP feature statistics -> generator (BN-statistics loss) -> synthetic "
                    "inputs", "the student's inputs", True, why),
        ],
        "generator": [Pathway(PRIVATE, "DP-SGD teacher + DP feature statistics used as fixed discriminator",
                              "generator weights", True, why)],
    }


def srr_notes(*, setting: str, mechanism: str, labels: int, epsilon: float) -> dict[str, str]:
    """SRR's summary notes: what its ε covers, and that comparing its labels with the protected ones is not
    covered (`epsilon`: per label)."""
    label_dp = setting == "label-dp"
    if label_dp:
        privacy = (f"label-DP: each of {labels} private records' label released once by {mechanism} at "
                   f"epsilon {epsilon:g}; the private inputs are used as they are (not protected)")
    else:
        privacy = (f"{labels} labels by {mechanism} at epsilon {epsilon:g} each from one non-private teacher; "
                   "the teacher and the generator (trained against it) are not covered by any epsilon")
    return {"privacy": privacy,
            "epsilon_note": ("epsilon_paper: pure epsilon-label-DP per label (delta = 0), no composition over labels, "
                             "as the paper states; epsilon_strict: (epsilon, delta) for the private training set "
                             + ("under 'change one record's label' (each label released once)" if label_dp else
                                f"composed over all {labels} labels drawn from one teacher (replace-one)")
                             + "; neither covers the teacher -> generator -> synthetic-input pathway" * (not label_dp)),
            "label_accuracy_note": ("evaluation only: comparing released labels with the "
                                    + ("true labels" if label_dp else "teacher's labels")
                                    + " reads private information and is not covered by any epsilon")}
