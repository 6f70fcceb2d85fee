"""DGD: discriminative-generative distillation (Ge et al., IEEE TIP 2023; paper 001).

    discriminative stream   baseline φb on all of D;  n teachers φt,i on disjoint subsets D_i
    generative stream       generator φg trained data-free against φb (DGD loss);  N synthetic samples;
                            VAE (c = 32) trained on them
    split                   |D̂s| queries  -> labels l = argmax(votes + Lap(2/ε0))          (Eq. 3)
                            the rest D̂u   -> codes, clipped + Lap(2c/ε1), decoded into triples (x̂, x̂∥, x̂⊥)
    student                 CE on (D̂s, l)  +  ‖h(x̂)−h(x̂⊥)‖² + ‖h(x̂)−h(x̂∥)‖² + Σ φs(x̂) log φs(x̂)   (Eq. 1, 5, 6)

Readings of what the paper leaves open (each configurable):
- "normalized latent codes" + "mapping operator M": codes (the VAE means) are clamped to [−clip, clip] per
  coordinate, perturbed with Lap(2·clip·c/ε1), and M clamps the result back into [−clip, clip] before
  decoding. With ε1 = 0.01 the noise (scale 6400) dominates every code, so the decoded x̂ are essentially
  random decodings of corners of the latent box; `dgd.latent_noise=false` is the ablation without it.
- Perturbations follow TNAR (adversarial, one power iteration) by default; `student.perturbation=random`
  follows the DGD text ("random perturbation noise"). Distances are squared L2 on backbone features with the
  clean features held fixed (as in VAT/TNAR). The entropy term is MINIMISED (mean entropy of φs(x̂)), as
  the text says ("more determinate predictions") and TNAR does; Eq. 6 prints +Σ φs log φs, whose
  minimisation would instead maximise the entropy (a sign slip: with it the quick MNIST student stalled at
  ~65 %, predictions near uniform on the unlabelled triples).
- Eq. 1 adds the energies unweighted and Eq. 6 sums squared feature differences over the backbone width
  (6272 for the paper CNN), which would make the regulariser hundreds of times larger than the CE term. We
  average over feature dimensions (a per-feature mean squared distance); Eq. 6's sum is recovered with
  `student.tangent_weight = student.normal_weight = d`. The weights (default 1) are exposed for ablations.
- DGD+ = GNMax aggregation (σ not given by the paper; default 40, as PATE 2018 for MNIST).
- The student (Eq. 1) is in methods/dgd_student.py.
- The paper draws D̂s at random from the pool (the default); `dgd.query_selection` chooses it instead, reading only
  the generator's source (engine/query_selection.py; ours: a k-center cover teaches more for the same ε).
- The paper releases each query's noisy argmax. `dgd.release=histogram` (ours) releases the whole noisy vote
  histogram votes + noise instead, and the student fits its supervised term to the noisy vote share (counts /
  teachers) by squared error. The data-independent analyses of LNMax and GNMax already price that histogram (one
  changed teacher moves it by (+1, -1); the argmax is post-processing of it), so every ε is unchanged; PATE's
  data-dependent bounds, which price the argmax only, do not apply. The squared error is unbiased for the noise
  (it averages out over the queries); cross-entropy to a target with negative entries would be unbounded.
- The few-label student (ours; engine/few_label.py): `dgd.query_selection=medoids` queries the medoids of k-means
  clusters of `dgd.spread_pool` pool samples, `dgd.labels=spread` spreads the answers over those samples along their
  k-NN graph and the student learns all of them, in the space `dgd.embedding` names (the source model's features,
  on the pathway the generator already takes, or ScatterNet). The default recipe uses it at ε <= 2, where it measured
  a few points better; it cannot do more on synthetic pools, which the teachers read unlike their source
  (docs/research-log.md, "DGD: its synthetic pool does not carry the few labels").
- End to end (`-r end-to-end`), the generator fitted to the DP source can match DP statistics of its features
  (`dp_source.statistics_share`, methods/end_to_end.py), as SRR's does: without them its samples teach only the
  source.
- Fig. 7 variant (`dgd.inputs=private-holdout`): a held-out slice of the private training set replaces the
  generator's data (teachers are trained on the rest); compare with PATE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from privdistill.config import ClassifierTraining
from privdistill.data.dataset import ImageDataset, to_float
from privdistill.engine import evaluate, streams
from privdistill.engine.context import Env
from privdistill.engine.datafree import GeneratorTraining
from privdistill.engine.ensemble import TeacherEnsemble, TeacherTraining, plan_teachers
from privdistill.engine.few_label import embed_pool, medoid_queries, spread_labels
from privdistill.engine.holdout import holdout_size, holdout_split
from privdistill.engine.query_selection import QUERY_SELECTIONS, split_pool
from privdistill.engine.synthesis import query_label_agreement, synthesis_agreement
from privdistill.engine.vae import VAETraining
from privdistill.errors import ConfigError
from privdistill.methods import end_to_end as e2e
from privdistill.methods.common import MethodAPI, RunRequest
from privdistill.methods.dgd_student import StudentConfig, train_student
from privdistill.methods.runner import Budget, Context, Method, Plan, Report, RunResult, Trained
from privdistill.models import create_model
from privdistill.privacy import calibration, mechanisms
from privdistill.privacy._checks import check_choice
from privdistill.privacy.events import GaussianQueries, LaplaceOnSyntheticCodes, LaplaceQueries
from privdistill.privacy.ledger import LedgerAnswer, LedgerView, PrivacyLedger
from privdistill.privacy.report import PRIVATE, Pathway


@dataclass
class DGDConfig:
    """Config section `dgd`: the privacy mechanisms and the data split (the target ε: section `budget`)."""

    queries: int = 0  # |D̂s|; 0: the most the budget's target ε allows under its accounting
    aggregation: str = "laplace"  # laplace (DGD) | gaussian (DGD+)
    laplace_scale: float = 40.0  # b = 2/ε0
    gaussian_sigma: float = 40.0
    latent_noise: bool = True
    epsilon1: float = 0.01
    latent_clip: float = 1.0
    inputs: str = "generator"  # generator | private-holdout (Fig. 7)
    holdout: float = 1 / 6  # the held-out "public" slice for inputs=private-holdout: records, or a fraction below 1
    num_synthetic: int = 0  # 0: as many as the private training set (paper)
    noise_seed: Optional[int] = None  # seed of the privacy noise (default: run seed); secure noise ignores it
    secure_noise: Optional[bool] = None  # None: run.noise decides (methods/common.py)
    variant: Optional[str] = None  # the label --record adds to the result's name (ablations)
    source_labels: bool = False  # end to end only: the DP source labels the unqueried samples (post-processing)
    # which samples of the pool are queried: random (paper) | diverse (a k-center cover per class: reads the model
    # the generator was fitted to; engine/query_selection.py, ours)
    query_selection: str = "random"  # ... | medoids (one per k-means cluster of the spread pool; engine/few_label.py)
    release: str = "argmax"  # argmax (paper: the noisy label) | histogram (the noisy vote histogram; ours)
    # the few-label student (engine/few_label.py, ours): answers (paper: the student learns from the queries) |
    # spread (the answers spread over `spread_pool` samples of the pool along their k-NN graph, and the student
    # learns from all of them)
    labels: str = "answers"
    # the space medoids and spreading use: source (the backbone features of the model the generator was fitted to,
    # read on the generator's own pathway) | scatter (data-independent ScatterNet coefficients)
    embedding: str = "source"
    spread_pool: int = 20_000  # samples of the pool the medoids are chosen from and the labels spread over

    def validate(self) -> None:
        if self.queries < 0:
            raise ConfigError("dgd.queries must be >= 0")
        if self.aggregation not in ("laplace", "gaussian"):
            raise ConfigError("dgd.aggregation must be laplace or gaussian")
        if self.inputs not in ("generator", "private-holdout"):
            raise ConfigError("dgd.inputs must be generator or private-holdout")
        if min(self.laplace_scale, self.gaussian_sigma, self.epsilon1, self.latent_clip, self.holdout) <= 0:
            raise ConfigError("dgd noise scales, epsilon1, latent_clip and holdout must be > 0")
        if self.holdout >= 1:
            self.holdout = int(self.holdout)  # a count of records (below 1: a fraction)
        if self.release not in ("argmax", "histogram"):
            raise ConfigError(f"dgd.release must be argmax or histogram, got {self.release!r}")
        if self.query_selection not in QUERY_SELECTIONS + ("medoids",):
            raise ConfigError(f"dgd.query_selection must be one of {', '.join(QUERY_SELECTIONS + ('medoids',))}")
        if self.labels not in ("answers", "spread"):
            raise ConfigError(f"dgd.labels must be answers or spread, got {self.labels!r}")
        if self.embedding not in ("source", "scatter"):
            raise ConfigError(f"dgd.embedding must be source or scatter, got {self.embedding!r}")
        if self.labels == "spread" and self.source_labels:
            raise ConfigError("dgd.labels=spread and dgd.source_labels=true both label the unqueried samples: choose "
                              "one (end to end, the DP source's own labels are free)")
        if self.spread_pool < 2:
            raise ConfigError("dgd.spread_pool must be at least 2")
        if self.reads_source and self.inputs != "generator":
            raise ConfigError("dgd.query_selection=diverse and dgd.embedding=source read the generator's source "
                              "model; dgd.inputs=private-holdout has none (use random, or embedding=scatter)")

    @property
    def few_label(self) -> bool:
        """Whether the pool is embedded (engine/few_label.py): to choose medoids or to spread the answers."""
        return self.query_selection == "medoids" or self.labels == "spread"

    @property
    def reads_source(self) -> bool:
        """Whether choosing or labelling the samples reads the model the generator was fitted to."""
        return self.query_selection == "diverse" or (self.few_label and self.embedding == "source")


# the ledger keys of the two mechanism uses a run spends budget on
QUERIES_KEY, LATENT_KEY = "dgd/queries", "dgd/latent-codes"


def dgd_pathways(*, aggregation: str = "laplace", inputs: str = "generator",
                 fitted_to: str = "non-private baseline classifier", source_is_dp: bool = False,
                 latent_codes: bool = True, query_selection: str = "random",
                 release: str = "argmax", embedding: str | None = None,
                 spread: bool = False) -> dict[str, list[Pathway]]:
    """DGD (and DGD+ with ``aggregation="gaussian"``). ``latent_codes``: the student reads the VAE's noisy
    codes (Eq. 1's energies), not only the samples themselves. ``query_selection``: how the queried samples are
    chosen (random, or a rule that reads what the generator was fitted to: the same pathway, named).
    ``inputs``: "generator" (the method) or "held-out-private" (Fig. 7 variant: a held-out slice of the private
    set replaces the generator).
    ``fitted_to``: what the generator was fitted to (the baseline, or a DP source end to end).
    ``release``: "argmax" (the noisy label, the paper) or "histogram" (the whole noisy vote histogram, priced
    alike by the data-independent analysis).
    ``embedding``: the space medoid queries and spread labels use ("source": the backbone features of what the
    generator was fitted to, the same pathway; "scatter": data-independent). ``spread``: the answers are spread over
    the pool (post-processing of the answers, the pool and that space).
    ``source_is_dp``: end-to-end mode, the generator fitted to a DP-SGD model whose ε is in the run's ledger:
    the generator and everything made from it are post-processing of a DP model, so these pathways are covered."""
    check_choice("aggregation", aggregation, ("laplace", "gaussian"))
    check_choice("inputs", inputs, ("generator", "held-out-private", "public"))
    check_choice("release", release, ("argmax", "histogram"))
    agg = "Laplace noisy argmax (LNMax)" if aggregation == "laplace" else "Gaussian noisy argmax (GNMax)"
    released = f"{agg} labels" if release == "argmax" else (
        f"{aggregation.capitalize()} noisy vote histograms (whose argmax is {agg.split(' (')[1][:-1]})")
    space = {"source": f"{fitted_to}'s features", "scatter": "a fixed ScatterNet feature space", None: ""}[embedding]
    spread_note = f", spread over the pool along a k-NN graph in {space}" if spread else ""
    student = [Pathway(PRIVATE, f"n teachers on disjoint subsets -> {released} of the queried samples{spread_note}",
                       "labels of the student's supervised set", True,
                       "the vote channel: what epsilon prices")]
    if inputs == "generator":
        why = ("post-processing of the DP source, whose DP-SGD training is in the ledger" if source_is_dp else
               "what the generator is fitted to and the generator are trained on D without noise")
        student += [
            Pathway(PRIVATE, f"{fitted_to} -> data-free generator -> synthetic inputs",
                    "the student's inputs (queried and unlabelled)", source_is_dp, why),
            Pathway(PRIVATE, f"{fitted_to} -> generator -> which samples are queried"
                    + ("" if query_selection == "random" else
                       f"; {query_selection} selection in {space}" if embedding == "scatter" and
                       query_selection == "medoids" else f"; {query_selection} selection reads {fitted_to}")
                    + (f"; the labels spread in {fitted_to}'s features" if spread and embedding == "source" else ""),
                    "the student's query set", source_is_dp, why if source_is_dp else ""),
        ]
        if latent_codes:
            student.insert(2, Pathway(
                PRIVATE, f"{fitted_to} -> generator -> synthetic data -> VAE -> latent codes + Laplace(2c/eps1) -> "
                "decoded triples", "the student's unsupervised regulariser", source_is_dp, why if source_is_dp else
                "the latent noise perturbs codes of synthetic samples; it does not protect private records"))
        generator = [Pathway(PRIVATE, f"{fitted_to} (trained on D) as fixed discriminator",
                             "generator weights", source_is_dp, why if source_is_dp else
                             "not covered: the generator is fitted to models trained without noise")]
        out = {"student": student, "generator": generator}
    elif inputs == "held-out-private":
        student += [Pathway("held-out slice of the private set", "used directly as unlabelled inputs and VAE "
                            "training data", "the student's inputs", False,
                            "covered only if that slice is genuinely public")]
        out = {"student": student}
    else:
        student += [Pathway("public unlabelled data", "inputs and VAE training data", "the student's inputs", True,
                            "public by assumption: nothing to protect")]
        out = {"student": student}
    return out


# ------------------------------------------------------------------------------------------ the method
class DGDMethod(Method):
    name = "dgd"
    sections = {"baseline": ClassifierTraining, "teachers": TeacherTraining, "generator": GeneratorTraining,
                "vae": VAETraining, "dgd": DGDConfig, "student": StudentConfig, "dp_source": e2e.DPSourceConfig}

    def check_end_to_end(self, ctx: Context) -> None:  # the generator fitted to a DP source, its samples the inputs
        e2e.check_generator_end_to_end(ctx, ctx.section("dgd").inputs)
        source = ctx.section("dp_source")
        if source.statistics(0.0):  # the adversarial generator's BN-statistics target, released under DP
            if source.share + source.statistics(0.0) >= 1:
                raise ConfigError(f"dp_source.share {source.share:g} + dp_source.statistics_share "
                                  f"{source.statistics(0.0):g} leave nothing of ε for the teachers' votes: keep "
                                  "their sum below 1")
            if ctx.section("generator").loss != "srr":
                raise ConfigError("dp_source.statistics_share is the target of a BN-statistics generator loss "
                                  "(generator.loss=srr, as the default recipe's); this generator would not read them")
            if not source.model.startswith("scatter-"):
                raise ConfigError("dp_source.statistics_share needs a ScatterNet DP source (a dp_source.model named "
                                  "scatter-*): the DP statistics its generator matches are of the scattering "
                                  "coefficients")

    def summary_name(self, ctx: Context) -> str:
        return "dgd" if ctx.section("dgd").aggregation == "laplace" else "dgd+"

    def plan(self, ctx: Context, recorded: LedgerView) -> Plan:
        """|D̂s| from the target ε (or as given); refused here, before any stage trains, if it cannot fit."""
        cfg: DGDConfig = ctx.section("dgd")
        e2e.check_source_labels(ctx, cfg.source_labels)
        # end to end: the DP source's share (and the DP feature statistics' for its generator), then the votes'
        source = e2e.dgd_source_events(ctx) if e2e.is_end_to_end(ctx) else {}
        reads_codes = ctx.section("student").reads_latent_codes  # ε1 is spent only where the codes are read
        queries = plan_queries(cfg, ctx.budget, fixed=list(source.values()), reads_codes=reads_codes)
        pool_size = ((cfg.num_synthetic or len(ctx.data.train)) if cfg.inputs == "generator"
                     else holdout_size(cfg.holdout, len(ctx.data.train)))
        if queries >= pool_size:  # the pool below has exactly this size
            raise ConfigError(f"{queries} queries leave no unlabelled samples out of {pool_size}")
        events = {QUERIES_KEY: vote_event(cfg, queries), **source}
        if cfg.latent_noise and reads_codes:
            events[LATENT_KEY] = LaplaceOnSyntheticCodes(epsilon1=cfg.epsilon1, dim=ctx.section("vae").latent_dim,
                                                         clip=cfg.latent_clip)
        private = ctx.data.train if cfg.inputs == "generator" else holdout_split(ctx.data, cfg.holdout, ctx.env)[0]
        notes = [plan_teachers(private, ctx.section("teachers"), distribution=cfg.aggregation, option="dgd noise",
                               scale=cfg.laplace_scale if cfg.aggregation == "laplace" else cfg.gaussian_sigma)]
        # on resume the recorded uses are already in the ledger's total: plan only what is still to be spent
        return Plan(remaining=[e for key, e in events.items() if key not in recorded], notes=notes,
                    details={"queries": queries, "events": events, "spread_labels": cfg.labels == "spread",
                             "source_labels": cfg.source_labels})

    def train(self, ctx: Context, plan: Plan, ledger: PrivacyLedger) -> Trained:
        cfg: DGDConfig = ctx.section("dgd")
        env, data, stages, queries = ctx.env, ctx.data, ctx.stages, plan.details["queries"]
        # --- discriminative and generative streams (cached stages)
        generator, baseline, baseline_accuracy, refs, diagnostics = None, None, None, {}, {}
        if cfg.inputs == "generator":
            gcfg: GeneratorTraining = ctx.section("generator")
            # the generator's discriminator: the non-private baseline, or in end-to-end mode a DP-SGD model
            baseline, baseline_key = e2e.generator_source(ctx, ledger, plan.details["events"], refs,
                                                      secure=cfg.secure_noise)
            fitted_to, fitted_key = baseline, baseline_key
            if e2e.STATISTICS_KEY in plan.details["events"]:  # the DP source has no BatchNorm statistics to match
                fitted_to, statistics_key = e2e.with_statistics(ctx, ledger, baseline,
                                                                plan.details["events"][e2e.STATISTICS_KEY],
                                                                secure=cfg.secure_noise)
                fitted_key = f"{baseline_key}+{statistics_key}"
            generator, gen_stage = stages.generator(fitted_to, fitted_key, gcfg)
            pool, pool_stage = stages.synthetic(generator, gen_stage, cfg.num_synthetic or len(data.train))
            source = baseline  # the model the generator was fitted to: what a query selection rule reads
            teachers, teachers_stage = stages.teachers(ctx.section("teachers"))
            baseline_accuracy = evaluate(baseline, data.test, env)
            diagnostics["synthesis_quality"] = synthesis_agreement(pool[:2000], source, baseline, teachers, env,
                                                                   data.num_classes)
            refs.update(generator=gen_stage.ref(), synthetic=pool_stage.ref())
            pool_key = pool_stage.key
        else:  # Fig. 7: a held-out slice of D plays the public unlabelled data; teachers learn on the rest
            private, public = holdout_split(data, cfg.holdout, env)
            teachers, teachers_stage = stages.teachers_on(private, ctx.section("teachers"))
            pool, pool_key, source = public.images, f"holdout:{public.fingerprint()}", None
        student_cfg: StudentConfig = ctx.section("student")
        vae = None
        if student_cfg.reads_latent_codes:  # Eq. 1's energies decode the unqueried samples' latent codes
            vae, vae_stage = stages.vae(pool, pool_key, ctx.section("vae"))
            refs.update(vae=vae_stage.ref())
        refs.update(teachers=teachers_stage.ref())

        # --- split: queries labelled by the noisy aggregation (Eq. 3), the rest as noisy latent codes; the paper
        # draws the queries at random, a selection rule reads only what the generator was fitted to
        spread_pool, embedding = None, None
        if cfg.few_label:  # the queries (and the spread labels) come from a random part of the pool, embedded
            spread_pool = torch.randperm(len(pool), generator=env.generator(streams.DGD_SPLIT))[:cfg.spread_pool]
            if queries > len(spread_pool):
                raise ConfigError(f"{queries} queries do not fit in dgd.spread_pool={cfg.spread_pool}: raise it")
            embedding = embed_pool(pool[spread_pool], env, reader=source if cfg.embedding == "source" else None)
        if cfg.query_selection == "medoids":
            local = medoid_queries(embedding, queries, seed=env.seed)
            rest = torch.ones(len(pool), dtype=torch.bool)
            rest[spread_pool[local]] = False
            queried, unqueried = spread_pool[local], rest.nonzero().squeeze(1)
        else:
            queried, unqueried = split_pool(pool, queries, cfg.query_selection, reader=source, env=env,
                                            rng=env.generator(streams.DGD_SPLIT), num_classes=data.num_classes)
        query_images, rest_images = pool[queried], pool[unqueried]
        noise_seed, fresh = (env.seed if cfg.noise_seed is None else cfg.noise_seed), {}

        def answer_queries() -> LedgerAnswer:
            answer, fresh["votes"] = _aggregate(teachers, query_images, cfg, env, noise_seed)
            return answer

        released = torch.as_tensor(ledger.spend(QUERIES_KEY, plan.details["events"][QUERIES_KEY], answer_queries))
        # the noisy vote share (histogram release) or the noisy label; the share's argmax is GNMax's/LNMax's label
        share = released.float() / teachers.num_teachers if cfg.release == "histogram" else None
        labels = share.argmax(1) if share is not None else released.long()
        if baseline is not None:  # evaluation only: reads the non-private baseline, never released
            diagnostics.update({"query_agreement_with_baseline": query_label_agreement(
                baseline, query_images, labels, fresh.get("votes"), env),
                "query_agreement_note": "evaluation only: compares the teachers' labels on the queried synthetic "
                                        "samples with the non-private baseline's; not covered by any epsilon"})
        codes = (_latent_codes(vae, rest_images, cfg, env, ledger, plan.details["events"].get(LATENT_KEY), noise_seed)
                 if vae is not None else torch.empty(0, ctx.section("vae").latent_dim))

        # --- semi-supervised student (Eq. 1)
        torch.manual_seed(env.generator(streams.DGD_INIT).initial_seed())
        student = create_model(student_cfg.model, kind="classifier", in_channels=data.channels,
                               num_classes=data.num_classes, image_size=data.image_size[0])
        if cfg.labels == "spread":  # the answers spread over the embedded part of the pool: the student learns it all
            position = {int(j): i for i, j in enumerate(spread_pool)}
            local = torch.tensor([position[int(j)] for j in queried])
            share = spread_labels(embedding, local, labels, data.num_classes)
            query_images, labels = pool[spread_pool], share.argmax(1)
            diagnostics["spread_labels"] = {"pool": len(spread_pool), "embedding": cfg.embedding,
                                            "classes": torch.bincount(labels, minlength=data.num_classes).tolist()}
            if baseline is not None:  # evaluation only, as the query agreement above
                diagnostics["spread_labels"]["agreement_with_baseline"] = query_label_agreement(
                    baseline, query_images, labels, None, env)
        query_images, labels = e2e.student_labels(cfg.source_labels, baseline, query_images, labels, rest_images, env)
        labelled = ImageDataset(query_images, labels, data.num_classes, name="queries (noisy labels)")
        if share is not None:  # samples the DP source labelled (dgd.source_labels) keep their label as a one-hot
            share = torch.cat([share, F.one_hot(labels[len(share):], data.num_classes).float()])
        student, train_stats = train_student(student, labelled, codes, vae, student_cfg, env, run=ctx.run,
                                             test=data.test, vote_share=share)
        return Trained(student=student, generator=generator, baseline_accuracy=baseline_accuracy,
                       fields={"stages": refs, "student_training": train_stats, **diagnostics})

    def pathways(self, ctx: Context, plan: Plan) -> dict[str, list[Pathway]]:
        cfg, dp = ctx.section("dgd"), e2e.is_end_to_end(ctx)
        source = "DP source (DP-SGD)" if dp else "non-private baseline classifier"
        pathways = dgd_pathways(aggregation=cfg.aggregation, source_is_dp=dp,
                                inputs="generator" if cfg.inputs == "generator" else "held-out-private",
                                fitted_to=source,
                                latent_codes=ctx.section("student").reads_latent_codes,
                                query_selection=cfg.query_selection, release=cfg.release,
                                embedding=cfg.embedding if cfg.few_label else None, spread=cfg.labels == "spread")
        e2e.add_source_label_pathway(pathways, cfg.source_labels)
        if dp and ctx.section("dp_source").statistics(0.0):
            e2e.add_statistics_pathway(pathways)
        return pathways

    def report(self, ctx: Context, plan: Plan, trained: Trained, ledger: PrivacyLedger) -> Report:
        cfg, dp = ctx.section("dgd"), e2e.is_end_to_end(ctx)
        pathways = self.pathways(ctx, plan)
        latent = LATENT_KEY in plan.details["events"]  # spent ε1: a student with Eq. 1's energies, latent noise on
        statistics = " + DP feature statistics" if e2e.STATISTICS_KEY in plan.details["events"] else ""
        covers = (f"the whole student: DP source{statistics} + teacher votes (strict)" if dp else
                  "the teacher-vote channel only (strict)" + ("; paper adds ε1 for the latent noise" if latent else ""))
        return Report(pathways=pathways, secure_noise=cfg.secure_noise, noise_option="dgd.secure_noise",
                      fields={"epsilon_covers": covers, "queries": plan.details["queries"],
                              "aggregation": cfg.aggregation, "inputs": cfg.inputs, "latent_noise": latent,
                              "query_selection": cfg.query_selection, "release": cfg.release,
                              "labels": cfg.labels, "embedding": cfg.embedding if cfg.few_label else None,
                              "variant": cfg.variant})


def run_dgd(request: RunRequest, *, cache: bool = True) -> RunResult:
    """DGD end to end: the released student and generator, the summary, ε under both accountings."""
    return DGDMethod().run(request, cache=cache)


def vote_event(cfg: DGDConfig, count: int) -> LaplaceQueries | GaussianQueries:
    return (LaplaceQueries(scale=cfg.laplace_scale, count=count) if cfg.aggregation == "laplace"
            else GaussianQueries(sigma=cfg.gaussian_sigma, count=count))


def plan_queries(cfg: DGDConfig, budget: Budget, fixed: list | None = None, reads_codes: bool = True) -> int:
    """|D̂s|: as given, or the most queries whose ε under the budget's accounting fits its target (the paper
    accounting adds ε1 of the latent noise, where the student reads the codes, to the vote channel; the strict one
    prices the vote channel)."""
    if cfg.queries > 0:
        return cfg.queries
    if budget.epsilon is None:
        raise ConfigError("give either dgd.queries (|D̂s|) or a target budget.epsilon (--epsilon)")
    fixed = list(fixed or []) + ([LaplaceOnSyntheticCodes(epsilon1=cfg.epsilon1)]
                                 if cfg.latent_noise and reads_codes and budget.accounting == "paper" else [])
    n = calibration.max_queries(vote_event(cfg, 1), target_epsilon=budget.epsilon, delta=budget.delta,
                                accounting=budget.accounting, fixed=fixed)
    if n < 1:
        raise ConfigError(calibration.no_query_fits(vote_event(cfg, 1), budget, cfg.aggregation, fixed=fixed))
    return n


def _aggregate(teachers: TeacherEnsemble, images: torch.Tensor, cfg: DGDConfig, env: Env,
               seed: int) -> tuple[LedgerAnswer, torch.Tensor]:
    """The release for the ledger and the teachers' vote counts. The ledger keeps the votes (for PATE's optional
    data-dependent bound) only beside an argmax release: that bound does not price a released histogram."""
    votes = torch.cat(list(teachers.iter_votes(images, env)))
    gen = mechanisms.noise_source(seed, secure=cfg.secure_noise)
    distribution, scale = (("laplace", cfg.laplace_scale) if cfg.aggregation == "laplace"
                           else ("gaussian", cfg.gaussian_sigma))
    noisy = mechanisms.noisy_histogram(votes, distribution=distribution, scale=scale, generator=gen)
    # Eq. 3 (LNMax) or GNMax: the argmax of the noisy histogram; or, with dgd.release=histogram, the histogram
    if cfg.release == "histogram":
        return LedgerAnswer(answers=noisy.float()), votes
    return LedgerAnswer(answers=noisy.argmax(1), votes=votes), votes


def _latent_codes(vae: nn.Module, images: torch.Tensor, cfg: DGDConfig, env: Env, ledger: PrivacyLedger,
                  event: LaplaceOnSyntheticCodes | None, seed: int) -> torch.Tensor:
    """VAE means of the unlabelled samples, clipped, perturbed (if enabled) and mapped back into the box."""
    means = []
    with torch.no_grad():
        for start in range(0, len(images), 1000):
            mu, _ = vae.encode(env.place_batch(to_float(images[start:start + 1000])))
            means.append(mu.float().cpu())
    codes = torch.cat(means)
    if not cfg.latent_noise:
        return codes.clamp(-cfg.latent_clip, cfg.latent_clip)

    def perturb():
        gen = mechanisms.noise_source(seed + 1, secure=cfg.secure_noise)
        return mechanisms.laplace_latent_perturbation(codes, clip=cfg.latent_clip, epsilon1=cfg.epsilon1, generator=gen)

    noisy = torch.as_tensor(ledger.spend(LATENT_KEY, event, perturb))
    return noisy.clamp(-cfg.latent_clip, cfg.latent_clip)  # M(·): back into the decoder's input box


# --------------------------------------------------------------------------------------- Python API
class DGD(MethodAPI):
    """`DGD(epsilon=10, queries=1300).fit("mnist")` -> RunResult(student, generator, summary, privacy).

    `epsilon`, `max_epsilon`, `delta` and `accounting` go to the `budget` section (default accounting: strict);
    other keywords to the `dgd` section (`queries=1300`, `aggregation="gaussian"`, `inputs="private-holdout"`,
    `variant=...`); anything else through `overrides={"student.steps": 300, ...}`.
    """

    section, method = "dgd", DGDMethod
