"""Presets that fit the data: the sizes and vote noise a preset sets for MNIST, refitted to a run's dataset.

The presets are written for 60,000 records and 250 teachers; on 1,500 records the same numbers give PATE teachers
that never reach a consensus and a baseline of 47 steps. `fit_to_data` refits them, before anything is planned, by
eight rules:

  teachers          PATE's and DPDFD's: each on >= MIN_PARTITION records; DGD's (a plain noisy argmax): on >=
                    MIN_VOTER_RECORDS, a batch no larger than a share, at most MAX_TEACHER_PASSES steps;
  vote noise        lowered with fewer teachers to the largest at which a unanimous vote is right 90 % of the time
                    (privacy/vote_noise.py), Confident-GNMax's threshold scaled alike; the plan prints both;
  query pool        DGD's pool holds at most POOL_PER_RECORD samples a record (SRR keeps the preset's labels:
                    capping them at N lost 9.8 and 26.4 points on 5k and 1k MNIST: research log, "SRR's labels are not
                    capped");
  generator         DGD's rounds in proportion to N / PRESET_RECORDS, at least GENERATOR_FLOOR of them;
  query choice      DGD's teachers on fewer than CLUSTER_VOTES_BELOW records vote on clusters of the pool;
  short training    at least MIN_STEPS optimiser steps (DP-SGD: MIN_DPSGD_STEPS);
  DP-SGD's recipes  their epochs raised toward MIN_DPSGD_STEPS while each step's noise stays below STEP_NOISE;
  long training     PATE's student at most MAX_STUDENT_PASSES over its public slice.

A value chosen for the run (by_dataset, --config, --set) is never changed, a recipe's only by a rule for a case no
recipe was measured in; on MNIST and Fashion-MNIST every rule is a no-op (tested). Every change is a line of the
plan's notes. Nothing here reads a record's content: only N, which the release discloses anyway. The measurements
behind each constant (experiments/sizing_study.md): research log, "Notes that left the code: methods/sizing.py".
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from privdistill.data.dataset import DataSplits
from privdistill.engine.holdout import holdout_size
from privdistill.methods.srr_schedule import StageSchedule
from privdistill.models import create_model
from privdistill.privacy.accounting import strict_noise_multiplier
from privdistill.privacy.vote_noise import scale_for_accuracy

MIN_PARTITION = 100  # records per PATE / DPDFD teacher: below ~100 records of 10 classes a small CNN is weak
MIN_VOTER_RECORDS = 15  # records per DGD voter: more, weaker voters buy more answers, right about as often down to 15
MAX_TEACHER_PASSES = 100  # a teacher whose share is under a batch: no gain past ~100 passes, a third of the time
# DGD's teachers on shares smaller than this vote on clusters of the pool. At ε 10 on MNIST, cluster votes against
# single samples: 20 records a teacher (5k) 93.95 / 76.80 %, 80 (20k) 93.40 / 85.65 %; 160 (40k) 83.20 / 87.10 %,
# 240 (60k) 72.04 / 95.24 % (research log, "Cluster votes by share")
CLUSTER_VOTES_BELOW = 120
POOL_PER_RECORD = 4  # DGD's pool of queries: larger pools did not teach more on small data and cost build time
# DGD's generator learns from the baseline alone, the largest cost left on small data: rounds in proportion to N
PRESET_RECORDS = 60_000  # what the presets and recipes are written for (MNIST's training set)
GENERATOR_FLOOR = 0.5
MIN_STEPS = 500  # optimiser steps of a classifier trained on the private data (MNIST's quick baseline: 1,875)
MIN_DPSGD_STEPS = 100  # DP-SGD's network gets fewer: at a fixed ε its noise grows with the steps
# A DP-SGD recipe's epochs on fewer records are few steps. At a fixed ε the run's noise-to-signal ratio
# r = σ √d / (B √T) barely moves with T (σ grows as √T), but each step's, r √T, does: steps are added while each
# step's stays at or below STEP_NOISE, up to MIN_DPSGD_STEPS (research log, "DP-SGD's steps on small data")
STEP_NOISE = 0.3
# PATE's student reads its public slice every step: 1,500 steps are 19 passes over MNIST's 10,000 but 820 over 233
MAX_STUDENT_PASSES = 100

# the vote-noise options each aggregator reads, with the noise they are the scale of ("votes": Confident-GNMax's
# threshold test, a share of the teachers)
VOTE_NOISE = {("dgd", "laplace"): {"laplace_scale": "laplace"},
              ("dgd", "gaussian"): {"gaussian_sigma": "gaussian"},
              ("pate", "lnmax"): {"laplace_scale": "laplace"},
              ("pate", "gnmax"): {"sigma": "gaussian"},
              ("pate", "confident-gnmax"): {"sigma2": "gaussian", "threshold": "votes", "sigma1": "votes"}}
UNANIMOUS_ACCURACY = 0.9  # what the refitted vote noise leaves of a unanimous vote (privacy/vote_noise.py)
# the teacher ensemble each vote section counts
ENSEMBLE_OF = {"dgd": "teachers", "pate": "teachers"}
# classifiers trained on the private data (DP-SGD's σ is calibrated for its number of steps afterwards)
PRIVATE_CLASSIFIERS = ("baseline", "srr_teacher", "dpsgd")


def fit_to_data(sections: dict[str, Any], data: DataSplits, *, preset_values: dict[str, dict[str, Any]],
                chosen: set[str], by_recipe: set[str] = frozenset()) -> tuple[dict[str, Any], list[str]]:
    """(the sections with the preset's values fitted to `data`, one note per change). `by_recipe`: those of the
    `chosen` keys only a recipe's general values gave (measured on the built-in data, as they are kept)."""
    fitted = dict(sections)
    notes: list[str] = []
    n = len(data.train)

    def change(section: str, key: str, value: Any, why: str) -> None:
        old = getattr(fitted[section], key)
        if value == old:
            return
        fitted[section] = dataclasses.replace(fitted[section], **{key: value})
        notes.append(f"sized to the data: {section}.{key} {_show(old)} -> {_show(value)}: {why}")

    def free(section: str, key: str, *, over_recipe: bool = False) -> bool:
        # over_recipe: a rule for a case no recipe was measured in refits the recipe's value too
        name = f"{section}.{key}"
        return section in fitted and (name not in chosen or (over_recipe and name in by_recipe))

    for section in ("teachers", "dpdfd_teachers"):
        if section not in fitted:
            continue
        records = _private_records(fitted, n)
        least = MIN_VOTER_RECORDS if section == "teachers" and "dgd" in fitted else MIN_PARTITION
        if free(section, "num_teachers") and records // least < fitted[section].num_teachers:
            change(section, "num_teachers", max(1, records // least),
                   f"at least {least} of the {records:,} private records for each teacher")
        smallest = records // fitted[section].num_teachers
        if free(section, "batch_size") and 0 < smallest < fitted[section].batch_size:
            change(section, "batch_size", smallest, "no larger than the smallest partition")
            # each step now reads a teacher's whole share: the preset's or recipe's steps, written (and measured)
            # for shares larger than a batch, would be as many passes over a few records
            if free(section, "steps", over_recipe=True) and fitted[section].steps > MAX_TEACHER_PASSES:
                change(section, "steps", MAX_TEACHER_PASSES,
                       f"each step reads a teacher's whole share of {smallest} records: at most "
                       f"{MAX_TEACHER_PASSES} passes over it")

    for section in ("dgd", "pate"):
        ensemble = ENSEMBLE_OF[section]
        if section not in fitted or ensemble not in fitted:
            continue
        keys = VOTE_NOISE.get((section, fitted[section].aggregation), {})
        count = fitted[ensemble].num_teachers
        set_for = int(preset_values.get(ensemble, {}).get("num_teachers", count))
        if count >= set_for:
            continue
        for key, distribution in keys.items():
            if not free(section, key):
                continue
            old = getattr(fitted[section], key)
            if distribution == "votes":  # a threshold on the vote count, and the noise of that check
                value = float(f"{old * count / set_for:.4g}")
                why = f"a share of the teachers, set for {set_for}; this run has {count}"
            else:
                fits = scale_for_accuracy(count, data.num_classes, distribution=distribution,
                                          target=UNANIMOUS_ACCURACY)
                value = min(old, float(f"{fits:.3g}"))
                why = (f"set for {set_for} teachers; with {count}, the most noise that leaves a unanimous vote right "
                       f"{UNANIMOUS_ACCURACY:.0%} of the time")
            change(section, key, value, why)

    if "dgd" in fitted:
        _fit_dgd_for_small_data(fitted, n, free, change)

    _fit_training_lengths(fitted, n, free, change)
    _fit_dpsgd_recipe_steps(fitted, data, free, change)
    if notes:
        notes.insert(0, f"sized to the data: the preset is written for 60,000 records, this training set has {n:,}; "
                        "the values below were refitted (a value given with --set or --config never is)")
    return fitted, notes


def _fit_dgd_for_small_data(fitted: dict[str, Any], n: int, free, change) -> None:
    """DGD's query choice, pool and generator (measured: the research log)."""
    # teachers on a few records misread single samples; cluster votes do better (research log)
    teachers = fitted["teachers"].num_teachers
    share = _private_records(fitted, n) // teachers
    if (share < CLUSTER_VOTES_BELOW and free("dgd", "query_selection", over_recipe=True)
            and fitted["dgd"].query_selection == "diverse"):
        change("dgd", "query_selection", "clusters", f"{teachers} teachers of {share} records (fewer than "
               f"{CLUSTER_VOTES_BELOW}): votes on clusters of the pool, not on single samples weak teachers disagree "
               "on (the default recipe's choice at ε <= 2)")
    if free("dgd", "num_synthetic", over_recipe=True) and fitted["dgd"].num_synthetic > POOL_PER_RECORD * n:
        change("dgd", "num_synthetic", POOL_PER_RECORD * n,
               f"a pool of at most {POOL_PER_RECORD} synthetic samples a record to choose the queries from, as the "
               "default recipe's 240,000 for MNIST's 60,000")
    if free("generator", "rounds", over_recipe=True) and n < PRESET_RECORDS:
        rounds = fitted["generator"].rounds
        fewer = max(1, math.ceil(rounds * max(n / PRESET_RECORDS, GENERATOR_FLOOR)))
        if fewer < rounds:
            change("generator", "rounds", fewer, f"in proportion to the {n:,} records against the preset's "
                   f"{PRESET_RECORDS:,}, at least {GENERATOR_FLOOR:.0%} of its rounds")


def _fit_training_lengths(fitted: dict[str, Any], n: int, free, change) -> None:
    """At least MIN_STEPS optimiser steps for the classifiers trained on the private data (MIN_DPSGD_STEPS for
    DP-SGD's, whose σ is calibrated for them afterwards) and for SRR's student over its stages."""
    for section in PRIVATE_CLASSIFIERS:
        cfg = fitted.get(section)
        if (cfg is None or getattr(cfg, "steps", 0) > 0 or not free(section, "epochs")
                or not _trained(fitted, section)):
            continue
        floor = MIN_DPSGD_STEPS if section == "dpsgd" else MIN_STEPS
        if cfg.epochs * n / cfg.batch_size < floor:
            why = f"at least {floor} optimiser steps" + (", σ calibrated for them" if section == "dpsgd" else "")
            change(section, "epochs", type(cfg.epochs)(math.ceil(floor * cfg.batch_size / n)), why)
    if free("pate_student", "steps") and "pate" in fitted:  # VAT and entropy read a batch of the public slice a step
        cfg, pool = fitted["pate_student"], holdout_size(fitted["pate"].holdout, n)
        # the passes the preset makes over MNIST's public slice stay allowed (the paper preset's 256)
        passes = max(MAX_STUDENT_PASSES, cfg.steps * cfg.unlabeled_batch_size
                     / holdout_size(fitted["pate"].holdout, PRESET_RECORDS))
        most = max(MIN_STEPS, math.ceil(passes * pool / cfg.unlabeled_batch_size))
        if cfg.steps > most:
            change("pate_student", "steps", most, f"at most {passes:.0f} passes over the {pool:,} public "
                   f"images its VAT reads (at least {MIN_STEPS} steps)")
    if free("srr", "epochs_per_stage"):  # SRR's student: trained on each stage's labels in turn
        cfg = fitted["srr"]
        steps = sum(StageSchedule.of(cfg, cfg.num_samples or n).steps)
        if steps < MIN_STEPS:
            change("srr", "epochs_per_stage", float(math.ceil(cfg.epochs_per_stage * MIN_STEPS / steps)),
                   f"at least {MIN_STEPS} student steps over the {cfg.stages} stages")


def _trained(fitted: dict[str, Any], section: str) -> bool:
    """Whether the run trains this classifier: end to end, a DP-SGD source (`dp_source`) takes the place of DGD's
    baseline and of SRR's teacher, and label-DP SRR randomises the private labels without a teacher. A plan note
    refitting a model that is never trained would mislead."""
    end_to_end = fitted["budget"].privacy == "end-to-end"
    if section == "srr_teacher":
        return fitted["srr"].setting != "label-dp" and not end_to_end
    if section == "baseline" and "dgd" in fitted:
        return not end_to_end
    return True


def _fit_dpsgd_recipe_steps(fitted: dict[str, Any], data: DataSplits, free, change) -> None:
    """A DP-SGD recipe's epochs (measured on 60,000 records, so not refitted by the steps floor above) raised on
    small data while each step's noise-to-signal ratio stays at or below STEP_NOISE: at ε 10 on 1,500 8 x 8 digits
    its 10 steps gave 80-87 %, 50-100 steps 88-96 %; at ε 1 (each step's ratio 0.9 at 10 steps) more steps lost, and
    the rule adds none there."""
    cfg, budget, n = fitted.get("dpsgd"), fitted.get("budget"), len(data.train)
    if (cfg is None or budget is None or budget.epsilon is None or getattr(cfg, "steps", 0) > 0
            or free("dpsgd", "epochs") or not free("dpsgd", "epochs", over_recipe=True)):
        return  # no recipe epochs, or the user's (or a recipe's measured on this dataset)
    per_epoch = max(1, math.ceil(n / cfg.batch_size))  # Opacus's sample rate 1 / per_epoch, as plan_dpsgd
    steps = per_epoch * cfg.epochs
    if steps >= MIN_DPSGD_STEPS:
        return
    # σ on the strict accounting whatever the run's: its σ is the larger, so the rule adds no more steps than it should
    sigma = strict_noise_multiplier(target_epsilon=budget.epsilon, delta=budget.delta, sample_rate=1.0 / per_epoch,
                                    steps=steps)
    ratio = dpsgd_noise_ratio(sigma, trainable_parameters(cfg.model, data), n / per_epoch, steps)
    target = min(MIN_DPSGD_STEPS, math.floor((STEP_NOISE / ratio) ** 2))
    epochs = math.ceil(target / per_epoch)
    if epochs > cfg.epochs:
        change("dpsgd", "epochs", epochs, f"the recipe's {steps} steps raised to {epochs * per_epoch}: each step's "
               f"noise-to-signal ratio stays at most {STEP_NOISE:g} (it is {ratio * math.sqrt(steps):.2g} at "
               f"{steps} steps), σ calibrated for them")


def trainable_parameters(model: str, data: DataSplits) -> int:
    """d, the trainable parameters of the classifier `model` on `data` (DP-SGD's noise is added to each)."""
    train = data.train
    net = create_model(model, kind="classifier", in_channels=train.channels, num_classes=train.num_classes,
                       image_size=train.image_size[0])
    return sum(p.numel() for p in net.parameters() if p.requires_grad)


def dpsgd_noise_ratio(sigma: float, parameters: int, batch: float, steps: int) -> float:
    """DP-SGD's noise-to-signal ratio over a run: r = σ √d / (B √T) (methods/plan_judge.py)."""
    return sigma * math.sqrt(parameters) / (batch * math.sqrt(steps))


def _private_records(sections: dict[str, Any], n: int) -> int:
    """Records the teachers are partitioned over: the training set less PATE's public slice, or DGD's (Fig. 7)."""
    if "pate" in sections:
        return n - holdout_size(sections["pate"].holdout, n)
    dgd = sections.get("dgd")
    if dgd is not None and dgd.inputs == "private-holdout":
        return n - holdout_size(dgd.holdout, n)
    return n


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
