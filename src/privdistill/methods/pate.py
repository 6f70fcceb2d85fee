"""PATE baselines (Papernot et al. ICLR 2017 and ICLR 2018): teachers on disjoint subsets of the private
data answer queries on public unlabelled data through a noisy aggregator; a student learns from the
answered queries and, semi-supervised, from the rest of the public data.

    public slice       `pate.holdout` examples held out of the training set play PATE's public data
                       (the same split as DGD's Fig. 7 variant, `dgd.inputs=private-holdout`, so the two
                       share one teacher ensemble); the teachers see only the private rest
    teachers           n teachers on disjoint partitions of the private part (cached stage `teachers`)
    aggregation        LNMax (PATE 2017: argmax(votes + Lap(b))), GNMax (PATE 2018: argmax(votes + N(0, σ²))) or
                       Confident-GNMax (PATE 2018 Alg. 1: answer only when max(votes) + N(0, σ1²) >= T)
                       on `queries` public images, spent through the privacy ledger with the vote histograms
    student            cross-entropy on the answered queries + virtual adversarial training (VAT, Miyato et
                       al. 2018, the semi-supervised method PATE 2018 uses for its student) and entropy
                       minimisation on the whole public slice

Privacy: the number of queries is calibrated from the target ε under the data-INDEPENDENT strict accounting
(every Confident-GNMax query priced as answered, since the answered count is unknown beforehand); the headline
ε is the data-independent bound fixed by that plan (Confident-GNMax: every query priced as answered, because the
answered count is chosen by the mechanism itself; counting only the answered ones, as PATE 2018 and the paper
accounting do, is an odometer reading, shown beside it, not a guarantee). The data-dependent bound (PATE 2017 Thm 3 /
PATE 2018 Thm 6, from the recorded vote histograms) is reported beside it as `epsilon_data_dependent`: it is
a function of the private votes and is NOT releasable without PATE 2018's smooth-sensitivity step (not
implemented). The held-out slice's own records get no protection: the ε is for the private part.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.config import check_model_name
from privdistill.data.dataset import DataSplits, ImageDataset, to_float
from privdistill.engine import RunDir, evaluate
from privdistill.engine.cache import StageCache
from privdistill.engine.context import Env
from privdistill.engine.ensemble import TeacherEnsemble, TeacherTraining
from privdistill.engine.stages import Stages
from privdistill.engine.student_loop import StudentLoop, sample_batch
from privdistill.errors import ConfigError
from privdistill.methods.common import RunRequest, finish_run, prepare_run
from privdistill.models import create_model
from privdistill.privacy import calibration, mechanisms
from privdistill.privacy.accounting import EpsilonResult
from privdistill.privacy.events import ConfidentGNMaxQueries, GNMaxQueries, LNMaxQueries, PrivacyEvent, event_from_dict
from privdistill.privacy.ledger import LedgerAnswer, PrivacyLedger
from privdistill.privacy.report import Pathway, noise_source, pate_pathways, write_privacy_json

_QUERY_STREAM, _LABEL_STREAM, _UNLABEL_STREAM, _VAT_STREAM, _INIT_STREAM = 71, 72, 73, 74, 75
AGGREGATIONS = ("lnmax", "gnmax", "confident-gnmax")
QUERY_KEY = "pate/queries"


@dataclass
class PATEConfig:
    """Config section `pate`: the aggregator and the public slice."""

    aggregation: str = "gnmax"  # lnmax (PATE 2017) | gnmax | confident-gnmax (PATE 2018)
    epsilon: float | None = None  # target ε (data-independent, strict) when `queries` is 0
    queries: int = 0  # 0: the most queries the target allows (capped by the public slice)
    calibration: str = "strict"  # accounting used to derive `queries` from ε: strict | paper
    delta: float = 1e-5
    laplace_scale: float = 40.0  # LNMax b (PATE 2017 used 20 = 1/γ; 40 = DGD's 2/ε0, comparable with DGD)
    sigma: float = 40.0  # GNMax σ (PATE 2018, MNIST)
    threshold: float = 200.0  # Confident-GNMax T (PATE 2018, MNIST, 250 teachers)
    sigma1: float = 150.0
    sigma2: float = 40.0
    holdout: int = 10000  # size of the held-out public slice (as dgd.holdout)
    noise_seed: int | None = None
    secure_noise: bool = False

    def validate(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(f"pate.aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.queries < 0:
            raise ConfigError("pate.queries must be >= 0")
        if self.queries == 0 and self.epsilon is None:
            raise ConfigError("give either pate.queries or a target pate.epsilon (--epsilon)")
        if self.epsilon is not None and self.epsilon <= 0:
            raise ConfigError(f"pate.epsilon must be > 0, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ConfigError("pate.delta must lie in (0, 1)")
        if self.calibration not in ("strict", "paper"):
            raise ConfigError("pate.calibration must be strict or paper")
        if min(self.laplace_scale, self.sigma, self.sigma1, self.sigma2) <= 0:
            raise ConfigError("pate noise scales must be > 0")
        if self.holdout < 1:
            raise ConfigError("pate.holdout must be >= 1")


@dataclass
class PATEStudentConfig:
    """Config section `pate_student`: supervised on the answers + VAT and entropy minimisation on the public slice."""

    model: str = "paper-cnn"
    steps: int = 1500
    batch_size: int = 64  # labelled examples per step (all of them when fewer)
    unlabeled_batch_size: int = 128
    lr: float = 1e-3  # Adam, linear decay to 0
    vat_weight: float = 1.0
    vat_eps: float = 2.0  # L2 radius of the adversarial perturbation (images in [-1, 1])
    # finite-difference step of the power iteration. Miyato et al. print 1e-6; with this CNN (logits O(1)) a
    # step that small is lost in fp32 rounding: the "adversarial" direction changes the prediction less than a
    # random one. At 1e-2 it changes it ~70x more (tests/test_pate.py)
    vat_xi: float = 1e-2
    entropy_weight: float = 1.0  # VAT + EntMin (Miyato et al. 2018, Sec. 4)
    semi_supervised: bool = True  # false: the supervised-only ablation
    eval_every: int = 250
    checkpoint_every: int = 100

    def validate(self) -> None:
        if min(self.steps, self.batch_size, self.unlabeled_batch_size) < 1 or self.lr <= 0:
            raise ConfigError("pate_student steps and batch sizes must be >= 1, lr > 0")
        check_model_name(self.model, "pate_student.model")
        if self.vat_eps < 0 or self.vat_xi <= 0 or self.vat_weight < 0 or self.entropy_weight < 0:
            raise ConfigError("pate_student VAT parameters must be >= 0 (vat_xi > 0)")


SECTIONS = {"teachers": TeacherTraining, "pate": PATEConfig, "pate_student": PATEStudentConfig}


# ----------------------------------------------------------------------------------------- privacy plan
def query_event(cfg: PATEConfig, count: int, answered: int | None = None) -> PrivacyEvent:
    if cfg.aggregation == "lnmax":
        return LNMaxQueries(scale=cfg.laplace_scale, count=count)
    if cfg.aggregation == "gnmax":
        return GNMaxQueries(sigma=cfg.sigma, count=count)
    return ConfidentGNMaxQueries(threshold=cfg.threshold, sigma1=cfg.sigma1, sigma2=cfg.sigma2, count=count,
                                 answered=answered)


def plan_queries(cfg: PATEConfig, available: int) -> tuple[int, list[str]]:
    """Number of queries and notes: `pate.queries`, or the most the target ε allows (worst case: every
    Confident-GNMax query answered), capped by the public slice."""
    notes = []
    if cfg.queries > 0:
        n = cfg.queries
    else:
        n = calibration.max_queries(query_event(cfg, 1), target_epsilon=cfg.epsilon, delta=cfg.delta,
                                    accounting=cfg.calibration)
        if n < 1:
            raise ConfigError(f"ε = {cfg.epsilon} at δ = {cfg.delta:g} allows no {cfg.aggregation} query under the "
                              f"{cfg.calibration} accounting with this noise; raise ε or the noise")
    if n > available:
        notes.append(f"{n} queries allowed/asked but the public slice has {available} images: all of them are queried "
                     "(ε below the target)")
        n = available
    return n, notes


def holdout_split(data: DataSplits, holdout: int, env: Env) -> tuple[ImageDataset, ImageDataset]:
    """(private part, public slice): DGD's Fig. 7 split (same stream), so the teacher stage is shared."""
    from privdistill.methods.dgd import _holdout_split

    return _holdout_split(data, holdout, env)


def public_indices(n_train: int, holdout: int, seed: int) -> torch.Tensor:
    """Indices (into the training set) of the public slice of a run with `seed` (for the audits)."""
    env = Env.cpu(seed=seed)
    from privdistill.methods.dgd import _SPLIT_STREAM

    perm = torch.randperm(n_train, generator=env.generator(_SPLIT_STREAM, 1))
    return perm[:holdout].sort().values


def pathways(aggregation: str) -> dict[str, list[Pathway]]:
    student = [p for p in pate_pathways(aggregation=aggregation)["student"] if p.source != "public unlabelled data"]
    student.append(Pathway("held-out slice of the training set (PATE's public data)",
                           "used directly as queries and as the student's unlabelled (VAT) inputs",
                           "the student's inputs", False,
                           "covered only if that slice is genuinely public: its own records get no protection; "
                           "the epsilon is for the private rest"))
    return {"student": student}


# --------------------------------------------------------------------------------------------- method
def run_pate(request: RunRequest, *, max_epsilon: float | None = None, accounting: str = "strict",
             cache: bool = True, variant: str | None = None) -> dict[str, Any]:
    prep = prepare_run("pate", request, SECTIONS)
    s = prep.sections
    cfg: PATEConfig = s["pate"]
    env, run, data = prep.env, prep.run, prep.data
    private, public = holdout_split(data, cfg.holdout, env)
    queries, notes = plan_queries(cfg, len(public))
    ledger = PrivacyLedger(run.path / "ledger.jsonl", max_epsilon=max_epsilon, accounting=accounting, delta=cfg.delta)
    if QUERY_KEY not in ledger:
        ledger.check_can_start([query_event(cfg, queries)])  # worst case: refuse before training teachers

    stages = Stages(StageCache(enabled=cache), env, data, run)
    teachers, teachers_stage = stages.teachers_on(private, s["teachers"])

    order = torch.randperm(len(public), generator=env.generator(_QUERY_STREAM))
    query_images = public.images[order[:queries]]
    labels, answered, event = _answer(ledger, teachers, query_images, cfg, env)
    keep = labels >= 0
    labelled = ImageDataset(query_images[keep], labels[keep], data.num_classes, name="answered queries")
    label_accuracy = (float((labels[keep] == public.labels[order[:queries]][keep]).float().mean())
                      if keep.any() else None)

    st: PATEStudentConfig = s["pate_student"]
    torch.manual_seed(env.generator(_INIT_STREAM).initial_seed())
    student = create_model(st.model, kind="classifier", in_channels=data.channels, num_classes=data.num_classes,
                           image_size=data.image_size[0])
    if len(labelled) == 0:
        raise ConfigError("no query was answered: nothing to train the student on (lower pate.threshold)")
    student, train_stats = train_student(student, labelled, public.images, st, env, run=run, test=data.test)
    accuracy = evaluate(student, data.test, env)
    run.save_weights("student", student, metadata={"method": "pate"})

    noise = noise_source(cfg.secure_noise, "pate.secure_noise")
    write_privacy_json(run.path, pathways(cfg.aggregation), method="pate", noise=noise)
    both = ledger.epsilon_both()
    dependent = ledger.epsilon(accounting="strict", data_dependent=True)
    name = {"lnmax": "LNMax", "gnmax": "GNMax", "confident-gnmax": "Confident-GNMax"}[cfg.aggregation]
    return finish_run(
        prep, request, method="pate", wall_seconds=time.perf_counter() - prep.started, noise_secure=noise["secure"],
        test_accuracy=round(accuracy, 4), baseline_accuracy=None, target_epsilon=cfg.epsilon,
        epsilon_paper=round(both["paper"].value, 4), epsilon_strict=round(both["strict"].value, 4), delta=cfg.delta,
        epsilon_realised_answered_only=realised_answered_only(both["strict"]),
        epsilon_data_dependent=None if dependent.data_dependent is None else round(dependent.data_dependent, 4),
        epsilon_data_dependent_note="PATE data-dependent bound from the recorded votes: a function of the private "
                                    "data, NOT releasable without the smooth-sensitivity step (not implemented)",
        epsilon_covers=f"the teacher-vote channel ({name}) for the private part (all but the held-out public slice)",
        not_covered=[p.via for p in pathways(cfg.aggregation)["student"] if not p.covered],
        aggregation=cfg.aggregation, queries=queries, answered=int(keep.sum()), public_size=len(public),
        private_size=len(private), num_teachers=teachers.num_teachers, label_accuracy=None if label_accuracy is None
        else round(label_accuracy, 4), event=event.to_dict(), plan_notes=notes, variant=variant or _variant(cfg),
        max_epsilon=max_epsilon, accounting=accounting, stages={"teachers": teachers_stage.ref()},
        teachers_stage_info={k: v for k, v in teachers_stage.info().items()
                             if k in ("ensemble_accuracy", "mean_teacher_accuracy", "wall_seconds", "build_seconds")},
        student_training=train_stats)


def realised_answered_only(strict: EpsilonResult) -> float | None:
    """Confident-GNMax: strict ε counting only the answered queries (an odometer reading, not a guarantee)."""
    values = [e.details["epsilon_realised_answered_only"] for e in strict.events
              if "epsilon_realised_answered_only" in e.details]
    return round(values[0], 4) if len(values) == 1 else None


def _variant(cfg: PATEConfig) -> str | None:
    return None if cfg.aggregation == "gnmax" else cfg.aggregation


def _answer(ledger: PrivacyLedger, teachers: TeacherEnsemble, images: torch.Tensor, cfg: PATEConfig,
            env: Env) -> tuple[torch.Tensor, torch.Tensor, PrivacyEvent]:
    """(labels with -1 where not answered, answered mask, the recorded event), through the ledger.

    Confident-GNMax's event carries the number of answered queries, known only once the noise is drawn:
    the answers are computed first, then recorded with that event before anything uses them (a refusal
    by the budget discards them unused). On resume the recorded event and answers are returned."""
    if QUERY_KEY in ledger:
        rec = next(r for r in ledger.records() if r.get("key") == QUERY_KEY)
        event = event_from_dict(rec["event"])
        labels = torch.as_tensor(ledger.spend(QUERY_KEY, event, lambda: None)).long()
        return labels, labels >= 0, event
    votes = []
    for start in range(0, len(images), 500):
        votes.append(teachers.votes(env.place_batch(to_float(images[start:start + 500]))).cpu())
    votes = torch.cat(votes) if votes else torch.zeros(0, 1, dtype=torch.long)
    seed = env.seed if cfg.noise_seed is None else cfg.noise_seed
    gen = mechanisms.make_generator(seed, secure=cfg.secure_noise)
    if cfg.aggregation == "lnmax":
        labels, answered = mechanisms.lnmax(votes, scale=cfg.laplace_scale, generator=gen), None
    elif cfg.aggregation == "gnmax":
        labels, answered = mechanisms.gnmax(votes, sigma=cfg.sigma, generator=gen), None
    else:
        labels, answered = mechanisms.confident_gnmax(votes, threshold=cfg.threshold, sigma1=cfg.sigma1,
                                                      sigma2=cfg.sigma2, generator=gen)
    event = query_event(cfg, len(images), None if answered is None else int(answered.sum()))
    result = LedgerAnswer(answers=labels, votes=votes, answered=answered)
    labels = torch.as_tensor(ledger.spend(QUERY_KEY, event, lambda: result)).long()
    return labels, labels >= 0, event


# ------------------------------------------------------------------------------------------- student
def _kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """Mean KL(p || q) between the softmaxes of two logit batches (p held fixed)."""
    p = F.softmax(p_logits, dim=1)
    return (p * (F.log_softmax(p_logits, dim=1) - F.log_softmax(q_logits, dim=1))).sum(1).mean()


def _unit(d: torch.Tensor) -> torch.Tensor:
    flat = d.flatten(1)
    return (flat / (flat.norm(dim=1, keepdim=True) + 1e-12)).view_as(d)


def vat_loss(model: nn.Module, x: torch.Tensor, logits: torch.Tensor, *, eps: float, xi: float,
             generator: torch.Generator, autocast=None) -> torch.Tensor:
    """Virtual adversarial loss (Miyato et al. 2018): KL between the prediction at x and at x + r_adv, r_adv
    the direction (one power iteration) that changes the prediction most, of L2 norm `eps`."""
    import contextlib

    autocast = autocast or contextlib.nullcontext
    clean = logits.detach().float()
    d = _unit(torch.randn(x.shape, generator=generator).to(x.device)).requires_grad_(True)
    # The power iteration's finite difference is below bf16/fp16 resolution on saturated pixels: under autocast
    # x + xi*d rounds back to x and the KL and its gradient vanish. Probe in fp32, from an fp32 reference.
    with torch.autocast(device_type=x.device.type, enabled=False):
        with torch.no_grad():
            reference = model(x).float()
        dist = _kl(reference, model(x + xi * d).float())
    (grad,) = torch.autograd.grad(dist, d)
    r_adv = eps * _unit(grad.detach())
    with autocast():
        return _kl(clean, model(x + r_adv).float())


def train_student(student: nn.Module, labelled: ImageDataset, unlabelled: torch.Tensor, cfg: PATEStudentConfig,
                  env: Env, *, run: RunDir | None = None, test: ImageDataset | None = None) -> tuple[nn.Module, dict]:
    """CE on `labelled` + VAT + entropy minimisation on `unlabelled` (uint8 images); resumable from
    `student-checkpoint` (every random draw derives from (seed, step))."""
    loop = StudentLoop(student, lr=cfg.lr, steps=cfg.steps, env=env, title="PATE student", log_stage="pate-student",
                       eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every, run=run, test=test,
                       round_parts=True)
    student = loop.student
    for step in loop:
        x, y = labelled.batch(sample_batch(len(labelled), cfg.batch_size, env.generator(_LABEL_STREAM, step)))
        with env.autocast():
            loss = F.cross_entropy(student(env.place_batch(x)).float(), y.to(env.device))
        parts = {"ce": float(loss.detach())}
        if cfg.semi_supervised:
            idx = sample_batch(len(unlabelled), cfg.unlabeled_batch_size, env.generator(_UNLABEL_STREAM, step))
            xu = env.place_batch(to_float(unlabelled[idx]))
            with env.autocast():
                logits_u = student(xu).float()
            vat = vat_loss(student, xu, logits_u, eps=cfg.vat_eps, xi=cfg.vat_xi,
                           generator=env.generator(_VAT_STREAM, step), autocast=env.autocast)
            probs = F.softmax(logits_u, dim=1)
            entropy = -(probs * F.log_softmax(logits_u, dim=1)).sum(1).mean()
            loss = loss + cfg.vat_weight * vat + cfg.entropy_weight * entropy
            parts.update(vat=float(vat.detach()), entropy=float(entropy.detach()))
        loop.update(loss, parts)
    return loop.finish(labelled=len(labelled), unlabelled=len(unlabelled))
