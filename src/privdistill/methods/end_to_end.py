"""End-to-end privacy (`--privacy end-to-end`, budget.privacy): every pathway from the private data to the released
model priced, under one ledger, within one target (ε, δ).

The model the papers' generators are fed from (DGD's baseline, SRR's teacher) becomes a DP source: a DP-SGD
classifier trained in `<run>/dp-source` (methods/dpsgd.py), so generator, samples, VAE and query choice are
post-processing of a DP model; the method's own channel (DGD's votes) composes with it:

    split rule     the source gets `dp_source.share` of ε and DELTA_SHARE of δ (σ: the least whose PLD
                   ε fits); the channel the most queries / steps whose ε, composed with the source's, fits the target
    composition    the source's (ε_s, δ_s) by PLD plus the channel's ε by RDP at δ − δ_s (basic composition)

DPDFD needs no DP source (only noised gradients leave its teacher; the mode enforces strict accounting, Alg. 1 or 2,
no teacher warm start). Data-free SRR's teacher is the DP source, less `dp_source.statistics_share` for its features'
DP mean and variance (its generator's BN-statistics target); its labels are then post-processing. SRR's label-DP
setting reads the private images directly and cannot be end to end.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from privdistill.config import check, check_augment, check_model_name
from privdistill.engine import streams
from privdistill.engine.datafree import WithFeatureStatistics
from privdistill.engine.run import RunDir
from privdistill.engine.stages import file_digest
from privdistill.errors import ConfigError, RunError
from privdistill.methods.common import RunRequest
from privdistill.methods.dpsgd import run_dpsgd, steps_per_epoch
from privdistill.methods.runner import Plan, Report
from privdistill.methods.srr_plan import srr_end_to_end_pathways
from privdistill.models.scatternet import LINEAR_SCATTERNETS
from privdistill.privacy.accounting import MIN_NOISE_MULTIPLIER, strict_noise_multiplier
from privdistill.privacy.events import SubsampledGaussian
from privdistill.privacy.ledger import LedgerAnswer, PrivacyLedger
from privdistill.privacy.mechanisms import gaussian_feature_statistics, noise_source

END_TO_END = "end-to-end"
SOURCE_KEY = "dp-source"
STATISTICS_KEY = "dp-source/statistics"
#: SRR's default share of the target for the feature statistics: a fifth of ε = 1 leaves their noise well below the
#: features' spread, the teacher most of the budget (docs/research-log.md, "Strict end to end")
STATISTICS_SHARE = 0.2
#: DGD's DP source's share of δ (with feature statistics, split between the two as their ε is)
DELTA_SHARE = 0.5
#: SRR end to end runs no label mechanism: its labels are the DP teacher's own (summary and report say so)
NO_MECHANISM = "none (DP teacher)"


@dataclass
class DPSourceConfig:
    """Config section `dp_source`: the DP-SGD model that replaces a non-private source in end-to-end mode (the
    defaults are DP-SGD's `scatternet` recipe; the end-to-end recipes set their datasets' stronger heads)."""

    share: float = 0.5  # of the target ε (of δ: DELTA_SHARE)
    model: str = "scatter-linear"
    epochs: int = 5
    batch_size: int = 1024
    lr: float = 4.0  # SGD, momentum 0.9, C = 0.1
    # the share of the target ε (and of δ) spent on the DP mean and variance of the source's scattering features
    # (gaussian_feature_statistics), the BN-statistics target of a generator fitted to a source without BatchNorm.
    # None: the method's default (SRR: STATISTICS_SHARE, the teacher the rest, `share` and DELTA_SHARE unused;
    # DGD: none; with a share, the source keeps `share`, the statistics take theirs, the votes the rest)
    statistics_share: Optional[float] = None
    # augmentation multiplicity of the source's DP-SGD (as dpsgd.augment / dpsgd.augment_copies)
    augment: str = "none"
    augment_copies: int = 1

    def validate(self) -> None:
        check(0 < self.share < 1,
              "dp_source.share must lie in (0, 1): the rest of the budget is the method's own channel")
        check(self.statistics_share is None or 0 <= self.statistics_share < 1,
              "dp_source.statistics_share must lie in [0, 1)")
        check_augment(self.augment, "dp_source.augment")
        if self.augment_copies < 1 or (self.augment_copies > 1 and (self.model not in LINEAR_SCATTERNETS
                                                                    or self.augment == "none")):
            raise ConfigError("dp_source.augment_copies must be >= 1; copies need a linear ScatterNet "
                              f"dp_source.model ({', '.join(LINEAR_SCATTERNETS)}) and an augment other than none "
                              "(as dpsgd.augment_copies)")
        if min(self.epochs, self.batch_size) < 1 or self.lr <= 0:
            raise ConfigError("dp_source: epochs and batch_size must be >= 1, lr > 0")
        check_model_name(self.model, "dp_source.model")

    def statistics(self, default: float) -> float:
        """The statistics' share of ε and δ: as set, else the method's `default`."""
        return default if self.statistics_share is None else self.statistics_share


def is_end_to_end(ctx) -> bool:
    return ctx.budget.privacy == END_TO_END


def dgd_source_events(ctx) -> dict[str, SubsampledGaussian]:
    """DGD's end-to-end events before its votes: the DP source at `dp_source.share` of ε, and with
    `dp_source.statistics_share` the DP feature statistics its generator matches. Their δ is the source's
    DELTA_SHARE of δ, split between them as their ε is; the votes get the rest of both."""
    cfg: DPSourceConfig = ctx.section("dp_source")
    statistics = cfg.statistics(0.0)
    if not statistics:
        return {SOURCE_KEY: source_event(ctx)}
    source_delta, statistics_delta = split_delta(ctx.budget.delta * DELTA_SHARE,
                                                 cfg.share / (cfg.share + statistics))
    return {SOURCE_KEY: source_event(ctx, delta=source_delta),
            STATISTICS_KEY: statistics_event(ctx, statistics, statistics_delta)}


def generator_source(ctx, ledger: PrivacyLedger, events: dict, refs: dict, *, secure: bool,
                     share: float | None = None) -> tuple[nn.Module, str]:
    """The model a generator is fitted to, and a key naming its weights: the DP source (end-to-end mode, its event
    under SOURCE_KEY in `events`), else the cached non-private baseline. Its stage reference goes into `refs`."""
    if SOURCE_KEY in events:
        model, key, refs["dp_source"] = train_source(ctx, ledger, events[SOURCE_KEY], secure=secure, share=share)
        return model, key
    baseline, stage = ctx.stages.baseline(ctx.section("baseline"))
    refs["baseline"] = stage.ref()
    return baseline, file_digest(stage.path / "model.safetensors")


def source_event(ctx, share: float | None = None, delta: float | None = None) -> SubsampledGaussian:
    """The DP source's privacy event, computed before anything trains (the nested run calibrates the same σ);
    `share`: of the target ε, `delta`: its δ (defaults: the config's shares)."""
    cfg: DPSourceConfig = ctx.section("dp_source")
    if ctx.budget.epsilon is None:
        raise ConfigError("--privacy end-to-end needs a target --epsilon: the DP source gets a share of it")
    share = cfg.share if share is None else share
    per_epoch = steps_per_epoch(len(ctx.data.train), cfg.batch_size)
    steps = per_epoch * cfg.epochs
    delta = ctx.budget.delta * DELTA_SHARE if delta is None else delta
    sigma = strict_noise_multiplier(target_epsilon=ctx.budget.epsilon * share, delta=delta,
                                    sample_rate=1 / per_epoch, steps=steps)
    return SubsampledGaussian(noise_multiplier=sigma, sample_rate=1 / per_epoch, steps=steps, delta=delta,
                              what=f"DP source ({cfg.model}, DP-SGD)")


def train_source(ctx, ledger: PrivacyLedger, event: SubsampledGaussian, *, secure: bool,
                 share: float | None = None) -> tuple[nn.Module, str, dict]:
    """Spend the source's event, then train it as a nested DP-SGD run (resumed if it was interrupted); returns
    (model, a key naming its weights, a reference for the summary). `share`: of the target ε, as source_event
    was given it (default the config's)."""
    cfg: DPSourceConfig = ctx.section("dp_source")
    run_dir = Path(ctx.run.path) / SOURCE_KEY
    options = ctx.section("run")
    overrides = {f"dpsgd.{k}": getattr(cfg, k) for k in ("model", "epochs", "batch_size", "lr")}
    overrides.update({f"dpsgd.{k}": getattr(cfg, k) for k in ("augment", "augment_copies")
                      if getattr(cfg, k) != getattr(DPSourceConfig, k)})  # as set: older runs resume unchanged
    overrides.update({"dpsgd.momentum": 0.9, "dpsgd.max_grad_norm": 0.1, "dpsgd.optimizer": "sgd",
                      "dpsgd.lr_schedule": "constant", "dpsgd.secure_mode": secure,
                      "budget.epsilon": ctx.budget.epsilon * (cfg.share if share is None else share),
                      "budget.delta": event.delta,
                      "budget.accounting": "strict", "run.seed": options.seed, "run.device": options.device,
                      "run.threads": options.threads, "run.progress": options.progress})

    def train() -> str:
        resume = (run_dir / "config.yaml").is_file()
        result = run_dpsgd(RunRequest(dataset=ctx.dataset, preset=ctx.request.preset, overrides=overrides,
                                      run_dir=str(run_dir), resume=resume))
        acc = result.summary["dpsgd_accounting"]
        if abs(acc["noise_multiplier"] - event.noise_multiplier) > 1e-3 or acc["steps"] != event.steps:
            raise RunError(f"the DP source trained with sigma {acc['noise_multiplier']} and {acc['steps']} steps, "
                           f"not the planned {event.noise_multiplier:.5g} and {event.steps}")
        return file_digest(run_dir / "model.safetensors")

    digest = ledger.spend(SOURCE_KEY, event, train)  # recorded once trained; a resumed run gets the digest back
    source = RunDir(run_dir)
    model, summary = source.load_weights("model").eval(), source.summary()
    ref: dict[str, Any] = {"run_dir": str(run_dir), "weights": str(digest), "epsilon_strict": summary["epsilon_strict"],
                           "delta": event.delta, "test_accuracy": summary["test_accuracy"]}
    return model, str(digest), ref


def floor_notes(events: dict[str, SubsampledGaussian]) -> list[str]:
    """A plan note for each end-to-end event whose σ stopped at the calibration's floor (a share of ε above about
    25): it spends less than its share, and the run reports the smaller ε it spent."""
    return [f"{event.what}: the noise multiplier is at its floor {MIN_NOISE_MULTIPLIER:g} (privacy/accounting.py), "
            "so it spends less than its share of ε" for event in events.values()
            if event.noise_multiplier == MIN_NOISE_MULTIPLIER]


def split_delta(delta: float, share: float) -> tuple[float, float]:
    """(share of δ, the rest), adding up to δ exactly in floating point: the larger part is a product, the smaller
    the difference, which is exact because the larger part lies in [δ/2, δ] (Sterbenz); a plain δ·s + δ·(1 − s)
    can round one unit above δ."""
    big = delta * max(share, 1.0 - share)
    return (big, delta - big) if share >= 0.5 else (delta - big, big)


def statistics_event(ctx, share: float, delta: float) -> SubsampledGaussian:
    """The event of the DP feature statistics (`share` of the target ε, at `delta`): one Gaussian sum of vectors
    of norm <= 1, i.e. a DP-SGD step at q = 1 (privacy.mechanisms.gaussian_feature_statistics)."""
    if ctx.budget.epsilon is None:
        raise ConfigError("--privacy end-to-end needs a target --epsilon: the feature statistics get a share of it")
    sigma = strict_noise_multiplier(target_epsilon=ctx.budget.epsilon * share, delta=delta, sample_rate=1.0, steps=1)
    return SubsampledGaussian(noise_multiplier=sigma, sample_rate=1.0, steps=1, delta=delta,
                              what="DP feature statistics of the source (mean and variance, one Gaussian sum)")


def with_statistics(ctx, ledger: PrivacyLedger, source: nn.Module, event: SubsampledGaussian, *,
                    secure: bool) -> tuple[nn.Module, str]:
    """Release the per-coordinate mean and variance of the DP source's scattering features over the private
    training set (recorded in the ledger before use: a resumed run reads them back, never a second draw), and
    return the source wrapped so that a generator's BN-statistics loss matches them, with a key naming both."""
    env = ctx.env
    # the normalised scattering coefficients, before any prior projection (check_srr makes the source a ScatterNet;
    # without a prior they are the cached features stage it was trained on)
    coefficients = source.scattering_only()

    def release() -> LedgerAnswer:
        feats = ctx.stages.features(coefficients)[0].flatten(1)
        noise = noise_source(None if secure else int(env.generator(streams.DP_STATISTICS).initial_seed()),
                             secure=secure)
        mean, var = gaussian_feature_statistics(feats, noise_multiplier=event.noise_multiplier, generator=noise)
        return LedgerAnswer(answers=torch.stack([mean, var]), stats={"features": int(feats.shape[1])})

    stats = torch.as_tensor(ledger.spend(STATISTICS_KEY, event, release)).float()
    if stats.shape[-1] != coefficients.feature_dim:  # (a run begun before they were read pre-projection)
        raise ConfigError(f"this run's released feature statistics have {stats.shape[-1]} coordinates, but the "
                          f"teacher's scattering has {coefficients.feature_dim}: they were released on "
                          "its projected features by an earlier version; start a new run (the budget they spent "
                          "stays in this run's ledger)")
    key = hashlib.sha256(stats.numpy().tobytes()).hexdigest()[:16]
    return WithFeatureStatistics(source, stats[0], stats[1]).eval(), key


# ------------------------------------------------------------------------------------ data-free SRR
def check_srr(ctx) -> None:
    """Data-free SRR end to end: the teacher is a DP-SGD model trained in the run, and its generator matches
    feature statistics released under DP (a DP model has no BatchNorm statistics to match); the teacher's labels
    are then post-processing, so no label mechanism runs (randomising a DP model's answers protects nothing more).
    The target is split between the teacher and the statistics (srr_plan)."""
    if not ctx.section("dp_source").statistics(STATISTICS_SHARE):
        raise ConfigError("SRR end to end needs dp_source.statistics_share > 0 (default 0.2): its generator "
                          "matches BatchNorm statistics, and a DP-SGD teacher has none; the share pays for "
                          "DP feature statistics instead")
    cfg = ctx.section("srr")
    if cfg.loss not in ("ce", "soft"):
        raise ConfigError("SRR end to end trains on the DP teacher's labels with cross-entropy (srr.loss=ce) or on "
                          "its softmax (soft): no mechanism runs, so there is no release likelihood to fit")
    if cfg.student_data != "stage":
        raise ConfigError("SRR end to end trains each stage on its own samples (srr.student_data=stage): earlier "
                          "stages' labels are not kept in a ledger to train on again")
    check_scatter_source(ctx, "SRR end to end needs a ScatterNet DP teacher")


def check_scatter_source(ctx, need: str) -> None:
    """DP feature statistics are of the scattering coefficients: refused, saying `need`, for another source model."""
    if not ctx.section("dp_source").model.startswith("scatter-"):
        raise ConfigError(f"{need} (a dp_source.model named scatter-*): the DP statistics its generator matches are "
                          "of the scattering coefficients")


def srr_teacher_share(ctx) -> float:
    """The DP teacher's share of ε and δ in SRR end to end: what the statistics leave (no label channel to pay)."""
    return 1.0 - ctx.section("dp_source").statistics(STATISTICS_SHARE)


def srr_plan(ctx, recorded, total: int, schedule):
    """SRR's plan end to end: the DP teacher's and the statistics' events (srr_teacher_share), and no label
    events."""
    rest = srr_teacher_share(ctx)
    statistics = 1.0 - rest
    teacher_delta, statistics_delta = split_delta(ctx.budget.delta, rest)
    events = {SOURCE_KEY: source_event(ctx, share=rest, delta=teacher_delta),
              STATISTICS_KEY: statistics_event(ctx, statistics, statistics_delta)}
    notes = [f"end to end: the DP teacher gets {rest:g} of epsilon {ctx.budget.epsilon:g} (and of delta), the "
             f"feature statistics {statistics:g}; its labels of the synthetic samples are post-processing",
             *floor_notes(events)]
    return Plan(remaining=[e for key, e in events.items() if key not in recorded], notes=notes,
                details={"epsilon_per_label": None, "num_labels": total, "threshold": None, "schedule": schedule,
                         "events": [], "end_to_end": events})


def srr_teacher(ctx, ledger: PrivacyLedger, events: dict, *, secure: bool) -> tuple[nn.Module, dict, str]:
    """SRR's teacher end to end: the DP source (trained here on its share, srr_plan) wrapped with the DP feature
    statistics its generator matches, fixed; with the source's reference and a key naming both for the generator
    stage."""
    refs: dict = {}
    source, key = generator_source(ctx, ledger, events, refs, secure=secure, share=srr_teacher_share(ctx))
    teacher, statistics_key = with_statistics(ctx, ledger, source, events[STATISTICS_KEY], secure=secure)
    teacher = ctx.env.place(teacher).requires_grad_(False)
    return teacher, refs["dp_source"], f"{key}+{statistics_key}"


def srr_report(ctx, total: int, ledger: PrivacyLedger):
    cfg = ctx.section("srr")
    return Report(pathways=srr_end_to_end_pathways(), secure_noise=cfg.secure_noise, noise_option="srr.secure_noise",
                  extra={"setting": cfg.setting, "mechanism": NO_MECHANISM,
                         "delta": ctx.budget.delta, "labels": total},
                  fields={"relation": ledger.epsilon_both()["strict"].relation,
                          "epsilon_covers": "the whole student and generator: DP teacher + DP feature statistics "
                                            "(strict)",
                          "privacy": f"end to end: {total} labels from a DP-SGD teacher (post-processing), inputs "
                                     "from a generator fitted to it and to DP feature statistics"})
